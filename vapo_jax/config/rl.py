"""config.rl: the RL stage: its batch, the advantage estimator and VAPO's switches, the
policy and critic losses, the PPO loop, packing, and the baselines' extras.

Read through records built in one place each: `run.forwards.advantage_config` (step 3),
`run.learners.policy_hparams` / `critic_hparams` / `ppo_loop` (step 4), `RLSection.correction`
(the behaviour correction, both steps) and `run.forwards.experience`. What spans sections (the
packed row against the sequence length, α against the token cap, "behaviour" π_old against
the sampler's dtype, L_cache against the cap) is checked in `config.validate`.
"""

import dataclasses

from vapo_jax.config.base import need

# rl.alpha = 0 (auto): α = max(ALPHA_PAPER, AUTO_HORIZON / max_new_tokens). The paper's
# α = 0.05 looks 5% of a response ahead, sized for 1k-20k-token answers; on short answers
# 5% is a token or two and λ_policy = 1 − 1/(α·l) is clipped to 0 below l = 1/α. The auto
# value keeps a horizon α·L of at least AUTO_HORIZON tokens at the cap L (λ ≈ 0.94 at
# half the cap) and the paper's α wherever that is already so (L ≥ 640).
ALPHA_PAPER = 0.05
AUTO_HORIZON = 32.0


@dataclasses.dataclass(frozen=True)
class RLSection:
  # Rollout steps: one sampled batch each, followed by ppo_epochs × num_minibatches optimizer
  # updates of the policy (and critic) — `Config.rl_updates` in all. Papers count the latter.
  steps: int = 100
  prompts_per_step: int = 512
  responses_per_prompt: int = 16
  group_sampling: bool = True
  # The advantage estimator, a key of `rl.advantages.ESTIMATORS`: "gae" (VAPO/PPO: GAE
  # with a critic) or "group" (GRPO/DAPO: group-relative, no critic).
  advantage_estimator: str = "gae"
  policy_loss: str = "ppo"              # a key of `losses.POLICY_LOSSES`: "ppo" (clipped)
  gamma: float = 1.0
  decoupled_gae: bool = True
  lam_critic: float = 1.0
  length_adaptive: bool = True
  # α of λ_policy = 1 − 1/(α·l) (a horizon α·l tokens). 0: auto, sized to the token cap,
  # α = max(0.05, 32 / sampling.max_new_tokens) (`Config.alpha`): the paper's 0.05 at
  # long caps, a horizon of at least 32 tokens at the cap on short ones (tiny, 48: 0.67).
  alpha: float = ALPHA_PAPER
  lam_policy: float = 0.95              # λ_policy when length_adaptive is off
  token_level_loss: bool = True
  clip_higher: bool = True
  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: float = 0.0                # c of dual-clip PPO; 0: off
  nll_coef: float = 0.1                 # μ of the positive-example NLL; 0: off
  nll_threshold: float = 1.0            # a response is correct when its score >= this
  group_std_norm: bool = True           # GRPO: divide by the group's std (without a critic)
  # Whiten advantages over the rollout batch's real response tokens, (A − mean) / std.
  # On: the authors' PPO stack (verl) whitens its GAE advantages, and VAPO's paper is silent,
  # so we follow the stack; it also fixes the PPO term's scale, which μ·NLL is weighed
  # against, whatever the reward scale. GRPO / DAPO presets turn it off (their advantages
  # are already normalised per group, as in their papers).
  whiten_advantages: bool = True
  value_clip: float = 0.0               # PPO value clipping range; 0: off
  # The return scale: rewards r' = reward_scale · r + reward_shift everywhere the advantages
  # and the critic's targets see them (the batch's scores_B, the NLL's, stay the checker's).
  # Rewards {0, 1} -> ±1: reward_scale=2, reward_shift=-1 (NeMo-RL's reward_scaling).
  reward_scale: float = 1.0
  reward_shift: float = 0.0
  # Critic targets standardised: "none", or "running": the critic learns (R - μ) / σ with
  # (μ, σ) running, bias-corrected EMAs (decay value_norm_decay per batch) of the token-
  # weighted return mean and second moment; its outputs are un-standardised, V = σ·v + μ,
  # wherever GAE and the metrics read them. The statistics are those of the batches before
  # (updated after the batch's values are read), checkpointed with the run.
  value_norm: str = "none"
  value_norm_decay: float = 0.9
  ppo_epochs: int = 1
  num_minibatches: int = 1
  micro_batch_size: int = 0             # 0: the whole mini-batch at once
  # Sequence packing in every train pass (old log-probs, values; policy, critic, reward-model
  # and SFT steps; `vapo_jax.packing`, docs/packing.md): each response with its own prompt,
  # unpadded, end to end in rows of packing_row_tokens slots with segment ids, micro-batches
  # of packing_tokens_per_device tokens per device. Exact: the padded path's losses and
  # gradients to float tolerance. False: padded rows of P + R (the oracle in tests).
  packing: bool = True
  packing_row_tokens: int = 0           # 0: max_prompt_tokens + max_new_tokens
  # Tokens per device per micro-batch; the rows per micro-batch (this // the row length) are
  # fixed for a pass, the micro-batch count follows the batch at run time. 0: the padded
  # micro-batch's tokens per device, at most the rows of 1/16 of the pass's sequences.
  packing_tokens_per_device: int = 0
  # Row lengths a packing plan may choose from: S > 1 lets each plan run its batch in rows
  # of ⌈s T / S⌉ (s = 1 .. S, 128-aligned; T = the row length above) where its longest
  # sequence fits, at the same token budget (more, shorter rows), whichever computes the
  # fewest slots (`packing.plan`). 1: always rows of T. More lengths, more compiled shapes.
  packing_row_steps: int = 1
  gae_impl: str = "blocked"
  # The sampler's behaviour log-probs against the recomputed old ones are logged every step
  # (rollout/logp_gap_*, rl/behaviour.py). Optional correction of that gap, a per-token
  # weight on the policy's surrogate: "tis" = min(π_old/π_b, behaviour_cap) (truncated
  # importance sampling), "mask" = drop tokens whose ratio leaves behaviour_band; "none": off.
  behaviour_correction: str = "none"
  behaviour_cap: float = 2.0
  behaviour_band: tuple = (0.5, 2.0)
  # Where the PPO ratio's π_old comes from (`Config.old_logprobs`; tools/step_model counts
  # the policy forward over the rollout that the last three save):
  #   "recompute": a forward of the sampling weights over the rollout (today's default).
  #   "exact": stop_gradient of the update's own log-probs, with no approximation where
  #     every rollout batch takes one optimizer step (rl.ppo_epochs = rl.num_minibatches = 1;
  #     micro-batches are fine: the weights do not move inside a step); a config error
  #     otherwise. The gap metrics and behaviour_correction come from the update's forward.
  #   "auto": "exact" where it is exact, else "recompute".
  #   "behaviour": the sampler's log-probs π_b, so the ratio is π_θ / π_b. Allowed only where
  #     the sampler computes in float32 like the train programs (model.dtype float32 and
  #     the decode copy float32: the gap is float rounding), or with a behaviour_correction,
  #     then taken in the update on r = sg(π_θ) / π_b per mini-batch: "tis" w = min(1, C / r)
  #     (the ratio's weight capped at C), "mask" w = [r in behaviour_band]. No gap metrics.
  old_logprobs: str = "recompute"
  # The baselines' extras (off in VAPO; see PRESETS):
  kl_coef: float = 0.0                  # β of GRPO's k3 KL to the initial policy; 0: off
  dynamic_sampling: bool = False        # DAPO: keep groups of mixed scores, sample to fill
  dynamic_sampling_max_rounds: int = 3  # extra sampling rounds per rollout step at most
  overlong_shaping: bool = False        # DAPO's soft length penalty added to the score
  overlong_cache_tokens: int = 0        # L_cache; 0: max_new_tokens / 5 (DAPO: 4096 of 20480)

  # ---- derived (rl alone; read as cfg.rl.group_size, cfg.rl.rollout_prompts)
  @property
  def group_size(self) -> int:
    """Responses sampled per prompt: responses_per_prompt with group sampling, else 1."""
    return self.responses_per_prompt if self.group_sampling else 1

  @property
  def rollout_prompts(self) -> int:
    """Prompts sampled per step: without group sampling the same generation budget goes to
    responses_per_prompt times more prompts."""
    if self.group_sampling:
      return self.prompts_per_step
    return self.prompts_per_step * self.responses_per_prompt

  @property
  def correction(self):
    """The behaviour correction as the record both steps take (`rl.behaviour.Correction`)."""
    from vapo_jax.rl import behaviour  # pylint: disable=import-outside-toplevel
    return behaviour.Correction(mode=self.behaviour_correction, cap=self.behaviour_cap,
                                band=tuple(self.behaviour_band))

  def check(self) -> None:
    need(self.advantage_estimator in _estimators(), "rl.advantage_estimator",
         self.advantage_estimator, f"one of {sorted(_estimators())}")
    need(self.policy_loss in _policy_losses(), "rl.policy_loss", self.policy_loss,
         f"one of {sorted(_policy_losses())}")
    need(self.steps >= 0, "rl.steps", self.steps, ">= 0")
    need(self.prompts_per_step >= 1, "rl.prompts_per_step", self.prompts_per_step, ">= 1")
    need(self.responses_per_prompt >= 1, "rl.responses_per_prompt", self.responses_per_prompt,
         ">= 1")
    need(uses_critic(self.advantage_estimator) or self.group_size >= 2,
         "rl.responses_per_prompt", self.responses_per_prompt,
         ">= 2 with rl.group_sampling when rl.advantage_estimator="
         f"{self.advantage_estimator!r} (group-relative advantages need a group)")
    need(0 < self.gamma <= 1, "rl.gamma", self.gamma, "in (0, 1]")
    need(0 <= self.lam_critic <= 1, "rl.lam_critic", self.lam_critic, "in [0, 1]")
    need(0 <= self.lam_policy <= 1, "rl.lam_policy", self.lam_policy, "in [0, 1]")
    need(self.alpha >= 0, "rl.alpha", self.alpha,
         ">= 0 (0: auto, sized to sampling.max_new_tokens)")
    need(self.reward_scale != 0, "rl.reward_scale", self.reward_scale, "!= 0")
    need(self.value_norm in VALUE_NORMS, "rl.value_norm", self.value_norm,
         f"one of {VALUE_NORMS}")
    need(0 <= self.value_norm_decay < 1, "rl.value_norm_decay", self.value_norm_decay,
         "in [0, 1)")
    need(0 <= self.eps_low < 1, "rl.eps_low", self.eps_low, "in [0, 1)")
    need(self.eps_high >= 0, "rl.eps_high", self.eps_high, ">= 0")
    need(self.dual_clip == 0 or self.dual_clip > 1, "rl.dual_clip", self.dual_clip,
         "0 (off) or > 1")
    need(self.nll_coef >= 0, "rl.nll_coef", self.nll_coef, ">= 0")
    need(self.value_clip >= 0, "rl.value_clip", self.value_clip, ">= 0 (0: off)")
    need(self.ppo_epochs >= 1, "rl.ppo_epochs", self.ppo_epochs, ">= 1")
    rows = self.rollout_prompts * self.group_size
    need(self.num_minibatches >= 1 and rows % self.num_minibatches == 0, "rl.num_minibatches",
         self.num_minibatches, f"a divisor of the rollout batch ({rows} responses)")
    mini = rows // self.num_minibatches
    micro = self.micro_batch_size
    need(micro >= 0 and (micro == 0 or mini % micro == 0), "rl.micro_batch_size", micro,
         f"0 or a divisor of the mini-batch ({mini} responses)")
    need(self.packing_row_steps >= 1, "rl.packing_row_steps", self.packing_row_steps,
         ">= 1 (1: rows of one length)")
    need(self.gae_impl in ("scan", "associative", "blocked"), "rl.gae_impl", self.gae_impl,
         "scan, associative or blocked")
    need(self.kl_coef >= 0, "rl.kl_coef", self.kl_coef, ">= 0 (0: off)")
    need(self.behaviour_correction in ("none", "tis", "mask"), "rl.behaviour_correction",
         self.behaviour_correction, '"none", "tis" or "mask"')
    need(self.behaviour_cap > 0, "rl.behaviour_cap", self.behaviour_cap, "> 0")
    band = self.behaviour_band
    need(len(band) == 2 and 0 <= band[0] < 1 < band[1], "rl.behaviour_band", band,
         "(lo, hi) with 0 <= lo < 1 < hi")
    need(self.old_logprobs in OLD_LOGPROBS, "rl.old_logprobs", self.old_logprobs,
         f"one of {OLD_LOGPROBS}")
    need(self.old_logprobs != "exact" or (self.ppo_epochs == 1 and self.num_minibatches == 1),
         "rl.old_logprobs", self.old_logprobs,
         '"exact" only with one optimizer step per rollout batch (rl.ppo_epochs = 1 and '
         f'rl.num_minibatches = 1, not {self.ppo_epochs} and {self.num_minibatches}); "auto" '
         'falls back to "recompute"')
    need(not self.dynamic_sampling or self.group_size >= 2, "rl.dynamic_sampling",
         self.dynamic_sampling,
         "False without groups (rl.group_sampling, responses_per_prompt >= 2)")
    need(self.dynamic_sampling_max_rounds >= 0, "rl.dynamic_sampling_max_rounds",
         self.dynamic_sampling_max_rounds, ">= 0")


# rl.value_norm: how the critic's targets are standardised (RLSection's comment).
VALUE_NORMS = ("none", "running")

# rl.old_logprobs: where π_old comes from (RLSection's comment).
OLD_LOGPROBS = ("recompute", "exact", "auto", "behaviour")


def auto_alpha(max_new_tokens: int) -> float:
  """rl.alpha = 0's α: max(ALPHA_PAPER, AUTO_HORIZON / max_new_tokens)."""
  return max(ALPHA_PAPER, AUTO_HORIZON / max_new_tokens)


def uses_critic(advantage_estimator: str) -> bool:
  """Whether the estimator of that name (`rl.advantages.ESTIMATORS`) reads a critic."""
  return _estimators()[advantage_estimator].critic


def _estimators() -> dict:
  from vapo_jax.rl import advantages  # pylint: disable=import-outside-toplevel
  return advantages.ESTIMATORS


def _policy_losses() -> dict:
  from vapo_jax import losses  # pylint: disable=import-outside-toplevel
  return losses.POLICY_LOSSES
