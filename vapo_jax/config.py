"""The run configuration: `ml_collections.ConfigDict` at the edge, frozen dataclasses inside.

An experiment is one file in `configs/` whose `get_config(preset)` returns a ConfigDict with
the sections below. `main.py` turns it into a :class:`Config` with :func:`from_config_dict`,
which checks every field — unknown names, wrong types, values out of range — and raises a
:class:`ConfigError` naming the field before anything is compiled. Library code only ever
sees the frozen dataclasses.

Each of VAPO's seven changes is one switch (see `PRESETS` for whole rows of the paper's
ablation table, and the plain-PPO / GRPO / DAPO baselines):

  value pretraining      value_pretrain.enabled
  decoupled GAE          rl.decoupled_gae      (critic λ = rl.lam_critic, else the policy's λ)
  length-adaptive GAE    rl.length_adaptive    (λ_policy = 1 − 1/(α·l), else rl.lam_policy)
  token-level loss       rl.token_level_loss   (else the per-sequence mean of token means)
  Clip-Higher            rl.clip_higher        (ε_high = rl.eps_high, else ε_high = ε_low)
  positive-example NLL   rl.nll_coef           (μ; 0 switches it off)
  group sampling         rl.group_sampling     (n responses per prompt, else n prompts × 1)

and the baselines' extras and the advantage scale:

  GRPO's KL penalty      rl.kl_coef            (β; k3 estimator to the initial policy)
  dynamic sampling       rl.dynamic_sampling   (DAPO; ≤ rl.dynamic_sampling_max_rounds more)
  overlong shaping       rl.overlong_shaping   (DAPO; L_cache = rl.overlong_cache_tokens)
  advantage whitening    rl.whiten_advantages  (on by default; off in grpo / dapo)

and the critic's levers (issue 53; all off by default):

  head bias, head lr     model.critic_head_bias, optim.critic_head_lr (−1: critic_lr)
  full fine-tuning       model.critic_lora=False (the critic without LoRA adapters)
  return scale           rl.reward_scale / rl.reward_shift (±1: 2, −1), rl.value_norm
  reused rollouts        value_pretrain.epochs, value_pretrain.replay_batches
  held-out stop rule     value_pretrain.heldout_batches (EV of fresh batches, pooled)
  α sized to lengths     rl.alpha = 0 (auto: `auto_alpha`); a warning when α·max_new_tokens < 8
  diagnostics            metrics.critic_diagnostics (critic/* records)

Units: `rl.steps`, `value_pretrain.*_steps` and `eval.every` count rollout steps (one sampled
batch, then rl.ppo_epochs × rl.num_minibatches optimizer updates); `sft.steps` and
`optim.warmup_steps` count optimizer updates.
"""

import dataclasses
import sys
import types
import typing
import warnings
from typing import Any

import ml_collections


class ConfigError(ValueError):
  """A config field is missing, unknown, of the wrong type, or out of range."""


@dataclasses.dataclass(frozen=True)
class LoraSection:
  # LoRA adapters y = x W + (alpha / rank) x A B on the policy's and the critic's projections
  # (vapo_jax/models/lora.py): only they (and the value head) are trained and held in the
  # optimizer; model.param_dtype="bfloat16" then stores the frozen base in bfloat16.
  rank: int = 0                # 0: off (every weight is trained)
  alpha: float = 16.0
  targets: tuple = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class ModelSection:
  # HF checkpoint: a directory or a Hub id "org/name[@revision]"; "" builds a small model.
  # A GGUF file ("x.gguf" or "pkg:<module>/<file>") is converted once into a cache (hub.py).
  hf_path: str = ""
  tokenizer: str = "char"      # "char" (built-in, for synthetic tasks) or "hf" (hf_path's)
  critic_path: str = ""        # HF reward model / saved critic, a directory or a Hub id
                               # (with critic_start = "path")
  # Where the critic starts: "policy" (the policy's weights + a zero value head),
  # "reward_model" (an outcome reward model this run trains first: the `reward_model` stage,
  # as PPO's critic starts in the paper) or "path" (model.critic_path).
  critic_start: str = "policy"
  # The critic's value head V = <h, w> (+ b with critic_head_bias: a float32 scalar
  # `score_bias`, zero at the start, trained with the head; saved as HF `score.bias`).
  critic_head_bias: bool = False
  # With model.lora.rank > 0: True = the critic trains LoRA adapters (+ its head) like the
  # policy; False = full fine-tuning of the critic (the policy's adapters merged into its
  # copy of the weights, every weight trained; the policy keeps its LoRA).
  critic_lora: bool = True
  init_from: str = ""          # a run's workdir: the policy starts from its newest checkpoint
  # Seed of the fresh model's initialisation and of the SFT batch order (-1: `seed`). Fixed
  # apart from `seed`, every run seed starts from the same SFT policy (`Config.init_seed`).
  init_seed: int = -1
  model_type: str = "qwen2"    # for a model built from the fields below
  hidden_size: int = 128
  intermediate_size: int = 384
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  rope_theta: float = 10000.0
  tie_word_embeddings: bool = True
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  # With remat, the blocks rematerialised (the first ones); the rest keep their activations
  # (a forward pass less each, more memory). -1: all. `tools.compile_check --remat_search`
  # prints the fewest that fit a topology.
  remat_layers: int = -1
  # The blocks under one `lax.scan` over stacked parameters (compile time flat in depth), or
  # a Python loop (models/stacked.py). configs/qwen32b.py keeps the loop: its compile check
  # on v5p-128 did not fit under scan (2026-12-05: critic step 154 GB, 37 GB as a loop).
  scan_layers: bool = True
  attention_impl: str = "auto"  # dense | blocked | auto (blocked from 4 × attention_block keys)
  attention_block: int = 512    # keys per block of the blocked attention
  # The train passes' self-attention: "auto" (jax's Pallas splash kernel on TPU where it
  # takes the shapes, one line says why not; the pure-JAX path on CPU and GPU), "jax", or
  # "tpu" (an error where the kernel cannot run).
  attention_kernel: str = "auto"
  lora: LoraSection = LoraSection()


@dataclasses.dataclass(frozen=True)
class DataSection:
  source: str = "synthetic"    # synthetic | jsonl | parquet | tfds | hf (Hub `datasets`)
  train_path: str = ""         # a file; for tfds / hf a dataset name ("openai/gsm8k[@rev]")
  eval_path: str = ""
  hf_config: str = ""          # data.source="hf": the dataset's config name (gsm8k: "main")
  eval_hf_config: str = ""     # of eval_path ("" = hf_config)
  train_split: str = "train"   # data.source="hf": the splits read
  eval_split: str = "test"
  layout: str = ""             # a named layout of data.LAYOUTS (e.g. "gsm8k", "math") or ""
  eval_layout: str = ""        # layout of eval_path ("" = layout)
  problem_field: str = ""
  answer_field: str = ""
  template: str = "{problem}\n"
  chat_template: bool = False  # wrap the template in the tokenizer's chat template
  max_prompt_tokens: int = 64
  # arithmetic (data.synthetic) | chain (data.chain, long CoT) | chain_or_guess
  # (data.chain_mix: short and long chains, and direct guesses among the SFT targets) |
  # word (data.word_problems: English word problems of min..max_steps operations)
  synthetic_task: str = "arithmetic"
  synthetic_min_steps: int = 2
  synthetic_max_steps: int = 3
  synthetic_max_operand: int = 9
  synthetic_ops: str = "+-*"
  synthetic_max_value: int = 99  # chain task: the running value stays in [0, max_value]
  # chain_or_guess: synthetic_min/max_steps are the short chains'; these the long ones'
  synthetic_long_min_steps: int = 14
  synthetic_long_max_steps: int = 20
  synthetic_short_fraction: float = 0.5   # share of short chains among the problems
  synthetic_guess_fraction: float = 0.15  # share of train problems whose SFT target is a guess
  # Seed of the synthetic train / held-out problems (-1: `seed`): fixed apart from `seed`,
  # every run seed sees the same problems and the same held-out set (`Config.data_seed`).
  seed: int = -1
  num_train: int = 4096
  num_eval: int = 256


@dataclasses.dataclass(frozen=True)
class SamplingSection:
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 64
  # Prompts per sampler call (0: all of a step's prompts at once). The KV cache holds
  # prompts_per_call × n rows of max_prompt_tokens + max_new_tokens slots: at 32B and 20k
  # tokens, 262 kB per token per row, so pods sample a step's 512 prompts in several calls.
  prompts_per_call: int = 0
  # The decode loop runs in this many stretches, each attending over a cache window cut
  # to the slots its steps can reach (1: every step reads all prompt + response slots).
  decode_windows: int = 4
  # The rollout engine (docs/engine.md): "continuous" (decode slots refilled as responses
  # end, a paged KV pool, live-length attention, a decode copy of the weights; the rollout
  # and the evaluation) or "static" (the padded sampler above, one while loop per call until
  # its longest row stops; kept as the test oracle). The compile check lowers the engine's
  # own programs (`continuous.Engine.lowerable`).
  engine: str = "continuous"
  # Decode slots (rows of every decode step); 0: the rows the static sampler would run
  # (prompts per step x n for the rollout, eval.batch_prompts x k for the evaluation).
  slots: int = 0
  page_size: int = 16       # tokens per KV page
  # KV pool in tokens (whole pages). 0: sized from the memory the train state leaves
  # (sampler/kv_pool.py): (1 - kv_headroom) x HBM less the resident train states, reference,
  # rollout batch and decode copy, capped at slots x the pages of one whole response
  # (ceil((max_prompt_tokens + max_new_tokens - 1) / page_size)); on CPU (no HBM figure)
  # the cap. Must hold one whole response.
  kv_tokens: int = 0
  kv_headroom: float = 0.1  # fraction of HBM the pool leaves for the programs' temporaries
  chunk_steps: int = 16     # decode steps per on-device chunk (host work between chunks)
  # Dispatch the next decode chunk before reading the last one back, so the host's work
  # between chunks overlaps the device's (pages reserved two chunks ahead); the tokens are
  # the same either way. Off on a CPU mesh of several devices (it waits for each insert).
  overlap: bool = True
  # The engine prefills each prompt alone, at the smallest bucket that holds it: powers of
  # two from this up to data.max_prompt_tokens (the last bucket), one prefill and one insert
  # compile per bucket. 0: one bucket, data.max_prompt_tokens (every prompt padded to it).
  # The static sampler keeps one bucket (its decode loop compiles per bucket).
  prompt_bucket_min: int = 128
  # Weights the engine decodes with: "auto" = the model's compute dtype (every matmul
  # casts its weight to it anyway, so the copy is exact and, at bf16, half the bytes of
  # the fp32 master); "bfloat16" / "float32" force one.
  decode_dtype: str = "auto"
  # The engine's decode attention: "auto" (jax's Pallas ragged paged attention kernel on
  # TPU where it takes the model's per-shard shapes, e.g. head_dim a multiple of 128; the
  # pure-JAX paged attention elsewhere, one line says why on TPU), "jax", or "tpu" (an
  # error where the kernel cannot run).
  attention_kernel: str = "auto"


@dataclasses.dataclass(frozen=True)
class RewardSection:
  fn: str = "vapo_jax.rewards.math:score"
  # The math checker's extraction mode for training rewards: "strict" (only a marked final
  # answer, the last one wins) or "lenient" (also unmarked / multi-box answers). Other
  # plug-ins have no modes. Evaluation has its own: eval.reward_mode.
  mode: str = "strict"
  num_workers: int = 0         # 0: score in-process (each check still time-bounded)
  timeout_s: float = 5.0


@dataclasses.dataclass(frozen=True)
class OptimSection:
  policy_lr: float = 1e-6
  critic_lr: float = 2e-6
  # The value head's own rate (score, score_bias; for the critic and the reward model), a
  # second AdamW beside the backbone's/adapters' at critic_lr (optax.multi_transform, the
  # same warm-up and clipping over both). -1: none, the head takes critic_lr in one AdamW.
  critic_head_lr: float = -1.0
  sft_lr: float = 1e-3
  warmup_steps: int = 0        # optimizer updates of linear warm-up (each model its own count)
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0


@dataclasses.dataclass(frozen=True)
class SFTSection:
  enabled: bool = False
  steps: int = 0               # optimizer updates (one batch each)
  batch_size: int = 64


@dataclasses.dataclass(frozen=True)
class RewardModelSection:
  """The reward-model stage (runs when model.critic_start = "reward_model")."""
  steps: int = 20              # rollout steps: sample, score, rl.num_minibatches updates each


@dataclasses.dataclass(frozen=True)
class ValuePretrainSection:
  enabled: bool = True
  max_steps: int = 50          # rollout steps (each: rl.ppo_epochs × rl.num_minibatches updates)
  min_steps: int = 1
  stop_value_loss: float = 0.0          # stop once the value loss is below this (0: off)
  stop_explained_variance: float = 1.0  # stop once explained variance reaches this (1: off)
  # Plateau rule (run/stopping.py): stop once the `plateau_smooth`-step moving average of the
  # value loss fell by less than `plateau_tol` (relative) over the last `plateau_window`
  # steps; 0: off. max_steps is the cap; the log says which ended the stage.
  plateau_window: int = 0
  plateau_smooth: int = 3
  plateau_tol: float = 0.02
  # The critic's targets: False = Monte Carlo returns (λ = 1, VAPO); True = GAE returns with
  # the RL stage's λ_policy (the second reading of "without decoupled GAE").
  coupled_gae: bool = False
  # Reuse of rollouts (the policy is frozen here, so old rollouts' Monte Carlo returns stay
  # exact targets): each step trains the critic for `epochs` passes (0: rl.ppo_epochs)
  # over the last `replay_batches` rollout batches (1: the step's own batch only), each
  # batch in rl.num_minibatches mini-batches.
  epochs: int = 0
  replay_batches: int = 1
  # Held-out explained variance, what stop_explained_variance reads: the step's fresh batch
  # is scored by the critic before it trains on it; pooled over the last `heldout_batches`
  # fresh batches (1 - Σ(R - V)² / Σ(R - R̄)² over their tokens; 1: the step's batch alone,
  # Var-based, `losses.explained_variance`).
  heldout_batches: int = 1


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
  alpha: float = 0.05
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


@dataclasses.dataclass(frozen=True)
class MeshSection:
  data: int = 1
  fsdp: int = -1
  tensor: int = 1
  rules: tuple = ()                     # () = vapo_jax.sharding.DEFAULT_RULES
  # The train passes' layout on the same devices (the rollout engine always decodes from
  # `rules`, tensor-parallel replicas): "shared": `rules` too; "fsdp": FSDP over every
  # chip (`sharding.fsdp_only(rules)`: rows and the embed dim over data x fsdp x tensor, no
  # activation all-reduces). The engine's decode copy is resharded from it once per step.
  train_layout: str = "shared"


@dataclasses.dataclass(frozen=True)
class EvalSection:
  every: int = 0                        # rollout steps between evaluations; 0: start, end only
  num_examples: int = 256
  samples_per_problem: int = 4          # k of avg@k and pass@k
  batch_prompts: int = 64
  reward_mode: str = "lenient"          # math checker mode when scoring evaluations
  correct_threshold: float = 1.0        # a sample counts as correct when its score >= this
                                        # (apart from rl.nll_threshold, a training knob)
  short_response_tokens: int = 0        # > 0: also report short_frac, the share of sampled
                                        # responses of at most this many tokens (guesses)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
  """Orbax checkpoints under `workdir/checkpoints` (a run without a workdir saves nothing)."""
  every: int = 50                       # steps (of any stage) between saves; 0: stage ends only
  keep: int = 3                         # newest checkpoints kept
  keep_best: bool = True                # also keep the one with the best eval avg@k
  async_save: bool = True               # write in the background while training goes on
  resume: bool = True                   # continue from the newest good checkpoint in workdir
  # What a resume restores: "all" (everything; a checkpoint that does not fit this run's
  # config stops the run with what differs, and every checkpoint stays where it is) or
  # "weights" (the same, except that when only the optimizer state does not fit — e.g.
  # after optim.grad_clip changed — the model weights alone are restored into freshly
  # built states: the optimizer, its step count and its schedule start over, while the
  # position, prompt iterators, PRNG key and summary are the checkpoint's).
  restore: str = "all"
  save_critic: bool = True              # HF-format critic in workdir/critic after value pretraining


@dataclasses.dataclass(frozen=True)
class FaultsSection:
  max_consecutive_nonfinite: int = 5    # updates skipped in a row (NaN/inf) before the run stops
  handle_sigterm: bool = True           # SIGTERM: checkpoint at the next step boundary, exit
  # Deadlines (seconds, 0 = none) after which a stuck process exits with a message naming
  # the stage, step and operation (exit code 3), instead of hanging: a host-side
  # collective, barrier, checkpoint save/write/restore; one whole step (compile included);
  # and the wait for a step boundary after SIGTERM (a second SIGTERM exits at once).
  collective_timeout_s: float = 1800.0
  step_timeout_s: float = 7200.0
  sigterm_grace_s: float = 900.0


@dataclasses.dataclass(frozen=True)
class MetricsSection:
  tensorboard: bool = True              # event files in workdir/tensorboard/<stage>
  plot: bool = True                     # workdir/curves.png at the end of the run
  wandb: bool = False                   # also log to Weights & Biases (pip install wandb)
  wandb_project: str = "vapo_jax"       # the W&B project
  wandb_name: str = ""                  # the W&B run's name ("": W&B picks one)
  # The critic's diagnostics in value pretraining and RL records (`run.critic_diagnostics`):
  # held-out EV pooled over fresh batches, Spearman ρ over prompts of V(s_0) against the
  # group's mean reward, token-level EV on each response's first and second half.
  critic_diagnostics: bool = False


@dataclasses.dataclass(frozen=True)
class CompileSection:
  """What a run compiles (`run.compiles`): JAX's persistent compilation cache, so a rerun or
  a resumed run loads its programs instead of compiling them again."""
  # False: no persistent cache (JAX_COMPILATION_CACHE_DIR, when set, still wins).
  cache: bool = True
  cache_dir: str = ""                   # "": $XDG_CACHE_HOME/vapo_jax/jax; the user's, private


@dataclasses.dataclass(frozen=True)
class Config:
  seed: int = 0
  log_every: int = 1
  model: ModelSection = ModelSection()
  data: DataSection = DataSection()
  sampling: SamplingSection = SamplingSection()
  reward: RewardSection = RewardSection()
  optim: OptimSection = OptimSection()
  sft: SFTSection = SFTSection()
  reward_model: RewardModelSection = RewardModelSection()
  value_pretrain: ValuePretrainSection = ValuePretrainSection()
  rl: RLSection = RLSection()
  mesh: MeshSection = MeshSection()
  eval: EvalSection = EvalSection()
  checkpoint: CheckpointSection = CheckpointSection()
  faults: FaultsSection = FaultsSection()
  metrics: MetricsSection = MetricsSection()
  compile: CompileSection = CompileSection()

  # ---- derived quantities (one place, so every caller agrees)
  @property
  def responses_per_prompt(self) -> int:
    return self.rl.responses_per_prompt if self.rl.group_sampling else 1

  @property
  def prompts_per_step(self) -> int:
    """Without group sampling the same generation budget goes to n× more prompts."""
    rl = self.rl
    if rl.group_sampling:
      return rl.prompts_per_step
    return rl.prompts_per_step * rl.responses_per_prompt

  @property
  def data_seed(self) -> int:
    """The seed of the synthetic problems (data.seed, else seed)."""
    return self.data.seed if self.data.seed >= 0 else self.seed

  @property
  def init_seed(self) -> int:
    """The seed of the model's initialisation and the SFT order (model.init_seed, else seed)."""
    return self.model.init_seed if self.model.init_seed >= 0 else self.seed

  @property
  def rl_updates(self) -> int:
    """Optimizer updates of the RL stage: rl.steps × ppo_epochs × num_minibatches."""
    return self.rl.steps * self.rl.ppo_epochs * self.rl.num_minibatches

  @property
  def overlong_cache_tokens(self) -> int:
    """L_cache of overlong shaping (L_max = sampling.max_new_tokens)."""
    from vapo_jax.rl import dapo  # pylint: disable=import-outside-toplevel
    return self.rl.overlong_cache_tokens or dapo.default_cache_len(self.sampling.max_new_tokens)

  @property
  def old_logprobs(self) -> str:
    """rl.old_logprobs resolved: "recompute", "exact" or "behaviour" ("auto": "exact" when
    every rollout batch takes one optimizer step, else "recompute")."""
    mode = self.rl.old_logprobs
    if mode == "auto":
      one_step = self.rl.ppo_epochs == 1 and self.rl.num_minibatches == 1
      return "exact" if one_step else "recompute"
    return mode

  @property
  def alpha(self) -> float:
    """α of length-adaptive λ_policy: rl.alpha, or with rl.alpha = 0 (auto) sized to the
    token cap, max(ALPHA_PAPER, AUTO_HORIZON / sampling.max_new_tokens)."""
    return self.rl.alpha or auto_alpha(self.sampling.max_new_tokens)

  @property
  def full_critic(self) -> bool:
    """The critic trains every weight though the policy has LoRA adapters
    (model.critic_lora=False with model.lora.rank > 0)."""
    return self.model.lora.rank > 0 and not self.model.critic_lora

  @property
  def uses_critic(self) -> bool:
    """The advantage estimator reads a critic's values: the run trains a critic."""
    return uses_critic(self.rl.advantage_estimator)

  @property
  def eps_high(self) -> float:
    return self.rl.eps_high if self.rl.clip_higher else self.rl.eps_low

  @property
  def loss_mode(self) -> str:
    return "token" if self.rl.token_level_loss else "seq_mean_token_mean"


def default_config_dict() -> ml_collections.ConfigDict:
  """A ConfigDict holding every field at its default (configs/*.py start from it)."""
  c = ml_collections.ConfigDict(_to_dict(Config()))
  for dotted, (hint, _) in REMOVED.items():  # settable, so that setting one says what to do
    section, name = dotted.split(".")
    c[section][name] = ml_collections.FieldReference(None, field_type=hint)
  return c


# Fields that were removed: section.field -> (its type, what to write instead). Setting one
# (in a config file or on the command line) is an error that says so.
REMOVED: dict[str, tuple[type, str]] = {
    "rl.use_critic": (bool, 'set rl.advantage_estimator="gae" (was True) or "group" (was '
                            'False)'),
}


# rl.alpha = 0 (auto): α = max(ALPHA_PAPER, AUTO_HORIZON / max_new_tokens). The paper's
# α = 0.05 looks 5% of a response ahead, sized for 1k-20k-token answers; on short answers
# 5% is a token or two and λ_policy = 1 − 1/(α·l) is clipped to 0 below l = 1/α. The auto
# value keeps a horizon α·L of at least AUTO_HORIZON tokens at the cap L (λ ≈ 0.94 at
# half the cap) and the paper's α wherever that is already so (L ≥ 640).
ALPHA_PAPER = 0.05
AUTO_HORIZON = 32.0


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


# Whole rows of the paper's ablation table, and the baselines, as field overrides.
PRESETS: dict[str, dict[str, Any]] = {
    "vapo": {},
    # The rows without value pretraining start their critic from a reward model, as in the
    # paper (whose bias on unfinished responses is what value pretraining repairs).
    "no_value_pretrain": {"value_pretrain.enabled": False, "model.critic_start": "reward_model"},
    "no_decoupled_gae": {"rl.decoupled_gae": False},
    # The other reading of "without decoupled GAE": value pretraining coupled too.
    "no_decoupled_gae_vp": {"rl.decoupled_gae": False, "value_pretrain.coupled_gae": True},
    "no_length_adaptive": {"rl.length_adaptive": False},
    "no_clip_higher": {"rl.clip_higher": False},
    "no_token_level_loss": {"rl.token_level_loss": False},
    "no_positive_nll": {"rl.nll_coef": 0.0},
    "no_group_sampling": {"rl.group_sampling": False},
    # Plain PPO (as in the paper's first row): λ = 0.95 for both, per-sequence loss,
    # symmetric clipping, no NLL, no value pretraining, one response per prompt.
    "ppo": {"value_pretrain.enabled": False, "model.critic_start": "reward_model",
            "rl.decoupled_gae": False,
            "rl.length_adaptive": False, "rl.lam_policy": 0.95,
            "rl.token_level_loss": False, "rl.clip_higher": False, "rl.nll_coef": 0.0,
            "rl.group_sampling": False},
    # GRPO: no critic, group-normalised advantages, per-sequence loss, symmetric clipping,
    # k3 KL to the initial (reference) policy with GRPO's β = 0.04.
    "grpo": {"rl.advantage_estimator": "group", "value_pretrain.enabled": False,
             "rl.token_level_loss": False, "rl.clip_higher": False, "rl.nll_coef": 0.0,
             "rl.group_std_norm": True, "rl.whiten_advantages": False, "rl.kl_coef": 0.04},
    # DAPO: GRPO without KL + token-level loss + Clip-Higher + dynamic sampling + overlong
    # reward shaping.
    "dapo": {"rl.advantage_estimator": "group", "value_pretrain.enabled": False,
             "rl.token_level_loss": True, "rl.clip_higher": True, "rl.nll_coef": 0.0,
             "rl.group_std_norm": True, "rl.whiten_advantages": False,
             "rl.dynamic_sampling": True, "rl.overlong_shaping": True},
}


def apply_preset(config: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
  """Applies a named preset (see PRESETS) to a ConfigDict, in place; returns it."""
  if preset not in PRESETS:
    raise ConfigError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
  for dotted, value in PRESETS[preset].items():
    section, name = dotted.split(".")
    config[section][name] = value
  return config


def from_config_dict(config: ml_collections.ConfigDict | dict) -> Config:
  """Checks a ConfigDict in full and freezes it into a :class:`Config`.

  Raises:
    ConfigError: naming the first bad field (`config.rl.eps_low=1.5: must be in [0, 1)`).
  """
  if isinstance(config, ml_collections.ConfigDict):
    config = config.to_dict()
  cfg = _build(Config, config, "config")
  validate(cfg)
  return cfg


def from_command_line(config: ml_collections.ConfigDict) -> Config:
  """`from_config_dict` for a command's --config flag: a bad config ends the command with
  `error: Invalid config: <field and what it must be>` on stderr, exit status 2."""
  try:
    return from_config_dict(config)
  except ConfigError as e:
    sys.stderr.write(f"error: Invalid config: {e}\n")
    sys.exit(2)


# rl.value_norm: how the critic's targets are standardised (RLSection's comment).
VALUE_NORMS = ("none", "running")

# rl.old_logprobs: where π_old comes from (RLSection's comment).
OLD_LOGPROBS = ("recompute", "exact", "auto", "behaviour")


def validate(cfg: Config) -> None:
  """Range and consistency checks; raises ConfigError naming the field."""

  def need(ok, field, value, allowed):
    if not ok:
      raise ConfigError(f"config.{field}={value!r}: must be {allowed}")

  m, d, s, r, o, rl = cfg.model, cfg.data, cfg.sampling, cfg.reward, cfg.optim, cfg.rl
  need(cfg.log_every >= 1, "log_every", cfg.log_every, ">= 1")
  need(m.tokenizer in ("char", "hf"), "model.tokenizer", m.tokenizer, '"char" or "hf"')
  need(m.tokenizer == "char" or m.hf_path, "model.tokenizer", m.tokenizer,
       '"char" unless model.hf_path is set')
  for name in ("param_dtype", "dtype"):
    need(getattr(m, name) in ("float32", "bfloat16", "float16"), f"model.{name}",
         getattr(m, name), "float32, bfloat16 or float16")
  need(m.attention_impl in ("auto", "dense", "blocked"), "model.attention_impl",
       m.attention_impl, "auto, dense or blocked")
  need(m.attention_kernel in ("auto", "jax", "tpu"), "model.attention_kernel",
       m.attention_kernel, "one of auto, jax, tpu")
  need(m.attention_block >= 1, "model.attention_block", m.attention_block, ">= 1")
  need(m.remat_layers >= -1, "model.remat_layers", m.remat_layers, ">= -1 (-1: every block)")
  need(m.lora.rank >= 0, "model.lora.rank", m.lora.rank, ">= 0 (0: no LoRA)")
  need(m.lora.alpha > 0, "model.lora.alpha", m.lora.alpha, "> 0")
  lora_targets = ("q", "k", "v", "o", "gate", "up", "down")
  need(m.lora.rank == 0 or (m.lora.targets and set(m.lora.targets) <= set(lora_targets)),
       "model.lora.targets", m.lora.targets, f"a non-empty subset of {lora_targets}")
  need(m.critic_start in ("policy", "reward_model", "path"), "model.critic_start",
       m.critic_start, '"policy", "reward_model" or "path"')
  need((m.critic_start == "path") == bool(m.critic_path), "model.critic_start", m.critic_start,
       '"path" exactly when model.critic_path is set')
  need(cfg.reward_model.steps >= 1, "reward_model.steps", cfg.reward_model.steps, ">= 1")
  if not m.hf_path:
    need(m.model_type in ("qwen2", "qwen3", "llama"), "model.model_type", m.model_type,
         "qwen2, qwen3 or llama")
    for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      need(getattr(m, name) >= 1, f"model.{name}", getattr(m, name), ">= 1")
    need(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads", m.num_kv_heads,
         f"a divisor of model.num_heads={m.num_heads}")
  need(d.source in ("synthetic", "jsonl", "parquet", "tfds", "hf"), "data.source", d.source,
       "synthetic, jsonl, parquet, tfds or hf")
  need(d.synthetic_task in ("arithmetic", "chain", "chain_or_guess", "word"),
       "data.synthetic_task", d.synthetic_task,
       '"arithmetic", "chain", "chain_or_guess" or "word"')
  need(d.seed >= -1, "data.seed", d.seed, ">= 0, or -1 (the run's seed)")
  need(m.init_seed >= -1, "model.init_seed", m.init_seed, ">= 0, or -1 (the run's seed)")
  need(0 <= d.synthetic_short_fraction <= 1 and 0 <= d.synthetic_guess_fraction < 1,
       "data.synthetic_short_fraction", d.synthetic_short_fraction,
       "in [0, 1] (and data.synthetic_guess_fraction in [0, 1))")
  need(d.source == "synthetic" or d.train_path, "data.train_path", d.train_path,
       f"set for data.source={d.source!r}")
  need("{problem}" in d.template, "data.template", d.template, 'a format string with "{problem}"')
  need(d.max_prompt_tokens >= 1, "data.max_prompt_tokens", d.max_prompt_tokens, ">= 1")
  need(d.num_train >= 1 and d.num_eval >= 1, "data.num_train", d.num_train,
       ">= 1 (and data.num_eval >= 1)")
  need(s.temperature > 0, "sampling.temperature", s.temperature, "> 0")
  need(0 < s.top_p <= 1, "sampling.top_p", s.top_p, "in (0, 1]")
  need(s.top_k >= 0, "sampling.top_k", s.top_k, ">= 0 (0: off)")
  need(s.max_new_tokens >= 1, "sampling.max_new_tokens", s.max_new_tokens, ">= 1")
  need(s.decode_windows >= 1, "sampling.decode_windows", s.decode_windows, ">= 1")
  need(s.attention_kernel in ("auto", "jax", "tpu"), "sampling.attention_kernel",
       s.attention_kernel, "one of auto, jax, tpu")
  need(s.engine in ("continuous", "static"), "sampling.engine", s.engine,
       '"continuous" or "static"')
  for name in ("page_size", "chunk_steps"):
    need(getattr(s, name) >= 1, f"sampling.{name}", getattr(s, name), ">= 1")
  need(s.slots >= 0, "sampling.slots", s.slots, ">= 0 (0: auto)")
  need(s.prompt_bucket_min >= 0, "sampling.prompt_bucket_min", s.prompt_bucket_min,
       ">= 0 (0: one bucket, data.max_prompt_tokens)")
  need(0 <= s.kv_headroom < 1, "sampling.kv_headroom", s.kv_headroom, "in [0, 1)")
  need(s.decode_dtype in ("auto", "bfloat16", "float32"), "sampling.decode_dtype",
       s.decode_dtype, '"auto", "bfloat16" or "float32"')
  whole = d.max_prompt_tokens + s.max_new_tokens - 1
  need(s.kv_tokens == 0 or s.kv_tokens >= whole, "sampling.kv_tokens", s.kv_tokens,
       f"0 (auto) or >= one whole response, data.max_prompt_tokens + "
       f"sampling.max_new_tokens - 1 = {whole}")
  need(s.prompts_per_call >= 0 and (s.prompts_per_call == 0
                                     or cfg.prompts_per_step % s.prompts_per_call == 0),
       "sampling.prompts_per_call", s.prompts_per_call,
       f"0 or a divisor of the prompts per step ({cfg.prompts_per_step})")
  need(":" in r.fn, "reward.fn", r.fn, '"module:function"')
  need(r.num_workers >= 0, "reward.num_workers", r.num_workers, ">= 0")
  need(r.timeout_s > 0, "reward.timeout_s", r.timeout_s, "> 0")
  need(r.mode in ("strict", "lenient"), "reward.mode", r.mode, '"strict" or "lenient"')
  for name in ("policy_lr", "critic_lr", "sft_lr", "weight_decay", "grad_clip"):
    need(getattr(o, name) >= 0, f"optim.{name}", getattr(o, name), ">= 0")
  need(o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, ">= 0")
  need(0 <= o.b1 < 1 and 0 <= o.b2 < 1, "optim.b1", o.b1, "in [0, 1) (and optim.b2 too)")
  need(not cfg.sft.enabled or cfg.sft.steps >= 1, "sft.steps", cfg.sft.steps,
       ">= 1 when sft.enabled")
  need(cfg.sft.batch_size >= 1, "sft.batch_size", cfg.sft.batch_size, ">= 1")
  vp = cfg.value_pretrain
  need(vp.max_steps >= vp.min_steps >= 0, "value_pretrain.min_steps", vp.min_steps,
       f"in [0, value_pretrain.max_steps={vp.max_steps}]")
  need(vp.epochs >= 0, "value_pretrain.epochs", vp.epochs, ">= 0 (0: rl.ppo_epochs)")
  need(vp.replay_batches >= 1, "value_pretrain.replay_batches", vp.replay_batches,
       ">= 1 (1: the step's own batch)")
  need(vp.heldout_batches >= 1, "value_pretrain.heldout_batches", vp.heldout_batches, ">= 1")
  need(vp.replay_batches == 1 or rl.value_clip == 0, "value_pretrain.replay_batches",
       vp.replay_batches, "1 with rl.value_clip > 0 (a replayed batch's old values are "
       "an older critic's)")
  need(o.critic_head_lr >= 0 or o.critic_head_lr == -1, "optim.critic_head_lr",
       o.critic_head_lr, ">= 0, or -1 (optim.critic_lr, one AdamW)")
  need(vp.plateau_window >= 0 and vp.plateau_smooth >= 1 and vp.plateau_tol >= 0,
       "value_pretrain.plateau_window", vp.plateau_window,
       ">= 0 (0: off), with plateau_smooth >= 1 and plateau_tol >= 0")
  need(rl.advantage_estimator in _estimators(), "rl.advantage_estimator",
       rl.advantage_estimator, f"one of {sorted(_estimators())}")
  need(rl.policy_loss in _policy_losses(), "rl.policy_loss", rl.policy_loss,
       f"one of {sorted(_policy_losses())}")
  need(not (vp.enabled and not cfg.uses_critic), "value_pretrain.enabled", vp.enabled,
       f"False with rl.advantage_estimator={rl.advantage_estimator!r} (there is no critic "
       "to pretrain)")
  need(rl.steps >= 0, "rl.steps", rl.steps, ">= 0")
  need(rl.prompts_per_step >= 1, "rl.prompts_per_step", rl.prompts_per_step, ">= 1")
  need(rl.responses_per_prompt >= 1, "rl.responses_per_prompt", rl.responses_per_prompt, ">= 1")
  need(cfg.uses_critic or cfg.responses_per_prompt >= 2, "rl.responses_per_prompt",
       rl.responses_per_prompt, ">= 2 with rl.group_sampling when rl.advantage_estimator="
       f"{rl.advantage_estimator!r} (group-relative advantages need a group)")
  need(0 < rl.gamma <= 1, "rl.gamma", rl.gamma, "in (0, 1]")
  need(0 <= rl.lam_critic <= 1, "rl.lam_critic", rl.lam_critic, "in [0, 1]")
  need(0 <= rl.lam_policy <= 1, "rl.lam_policy", rl.lam_policy, "in [0, 1]")
  need(rl.alpha >= 0, "rl.alpha", rl.alpha, ">= 0 (0: auto, sized to sampling.max_new_tokens)")
  if rl.length_adaptive and cfg.uses_critic and cfg.alpha * s.max_new_tokens < 8:
    warnings.warn(
        f"config.rl.alpha={rl.alpha}: 1/α = {1 / cfg.alpha:.0f} tokens against a cap of "
        f"{s.max_new_tokens}: a response of a quarter of the cap gets λ_policy = 1 − 1/(α·l) "
        "< 0.5 (0 below l = 1/α: the critic's credit reaches the last few tokens only); "
        "size α to the lengths, e.g. rl.alpha=0 (auto: "
        f"{auto_alpha(s.max_new_tokens):.3g} here)", stacklevel=2)
  need(rl.reward_scale != 0, "rl.reward_scale", rl.reward_scale, "!= 0")
  need(rl.value_norm in VALUE_NORMS, "rl.value_norm", rl.value_norm, f"one of {VALUE_NORMS}")
  need(0 <= rl.value_norm_decay < 1, "rl.value_norm_decay", rl.value_norm_decay, "in [0, 1)")
  need(0 <= rl.eps_low < 1, "rl.eps_low", rl.eps_low, "in [0, 1)")
  need(rl.eps_high >= 0, "rl.eps_high", rl.eps_high, ">= 0")
  need(rl.dual_clip == 0 or rl.dual_clip > 1, "rl.dual_clip", rl.dual_clip, "0 (off) or > 1")
  need(rl.nll_coef >= 0, "rl.nll_coef", rl.nll_coef, ">= 0")
  need(rl.value_clip >= 0, "rl.value_clip", rl.value_clip, ">= 0 (0: off)")
  need(rl.ppo_epochs >= 1, "rl.ppo_epochs", rl.ppo_epochs, ">= 1")
  rows = cfg.prompts_per_step * cfg.responses_per_prompt
  need(rl.num_minibatches >= 1 and rows % rl.num_minibatches == 0, "rl.num_minibatches",
       rl.num_minibatches, f"a divisor of the rollout batch ({rows} responses)")
  mini = rows // rl.num_minibatches
  need(rl.micro_batch_size >= 0 and (rl.micro_batch_size == 0 or mini % rl.micro_batch_size == 0),
       "rl.micro_batch_size", rl.micro_batch_size,
       f"0 or a divisor of the mini-batch ({mini} responses)")
  seq = cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
  need(rl.packing_row_tokens == 0 or rl.packing_row_tokens >= seq, "rl.packing_row_tokens",
       rl.packing_row_tokens,
       f"0 or >= max_prompt_tokens + max_new_tokens = {seq} (every sequence must fit a row)")
  need(rl.packing_tokens_per_device == 0
       or rl.packing_tokens_per_device >= max(rl.packing_row_tokens, seq),
       "rl.packing_tokens_per_device", rl.packing_tokens_per_device,
       f"0 or >= the packed row length ({max(rl.packing_row_tokens, seq)} tokens)")
  need(rl.packing_row_steps >= 1, "rl.packing_row_steps", rl.packing_row_steps,
       ">= 1 (1: rows of one length)")
  need(rl.gae_impl in ("scan", "associative", "blocked"), "rl.gae_impl", rl.gae_impl,
       "scan, associative or blocked")
  need(rl.kl_coef >= 0, "rl.kl_coef", rl.kl_coef, ">= 0 (0: off)")
  need(rl.behaviour_correction in ("none", "tis", "mask"), "rl.behaviour_correction",
       rl.behaviour_correction, '"none", "tis" or "mask"')
  need(rl.behaviour_cap > 0, "rl.behaviour_cap", rl.behaviour_cap, "> 0")
  need(len(rl.behaviour_band) == 2 and 0 <= rl.behaviour_band[0] < 1 < rl.behaviour_band[1],
       "rl.behaviour_band", rl.behaviour_band, "(lo, hi) with 0 <= lo < 1 < hi")
  need(rl.old_logprobs in OLD_LOGPROBS, "rl.old_logprobs", rl.old_logprobs,
       f"one of {OLD_LOGPROBS}")
  need(rl.old_logprobs != "exact" or (rl.ppo_epochs == 1 and rl.num_minibatches == 1),
       "rl.old_logprobs", rl.old_logprobs,
       '"exact" only with one optimizer step per rollout batch (rl.ppo_epochs = 1 and '
       f'rl.num_minibatches = 1, not {rl.ppo_epochs} and {rl.num_minibatches}); "auto" '
       'falls back to "recompute"')
  f32 = m.dtype == "float32" and (s.engine == "static" or s.decode_dtype in ("auto", "float32"))
  need(rl.old_logprobs != "behaviour" or f32 or rl.behaviour_correction != "none",
       "rl.old_logprobs", rl.old_logprobs,
       '"behaviour" only with rl.behaviour_correction "tis" or "mask", or a float32 sampler '
       f'(model.dtype={m.dtype!r}, sampling.decode_dtype={s.decode_dtype!r}); "exact" or '
       '"auto" saves the same pass with no approximation when each batch takes one update')
  need(not rl.dynamic_sampling or cfg.responses_per_prompt >= 2, "rl.dynamic_sampling",
       rl.dynamic_sampling, "False without groups (rl.group_sampling, responses_per_prompt >= 2)")
  need(rl.dynamic_sampling_max_rounds >= 0, "rl.dynamic_sampling_max_rounds",
       rl.dynamic_sampling_max_rounds, ">= 0")
  need(0 <= rl.overlong_cache_tokens <= s.max_new_tokens, "rl.overlong_cache_tokens",
       rl.overlong_cache_tokens, f"in [0, sampling.max_new_tokens={s.max_new_tokens}]")
  mesh = cfg.mesh
  sizes = (mesh.data, mesh.fsdp, mesh.tensor)
  need(all(x == -1 or x >= 1 for x in sizes) and sizes.count(-1) <= 1, "mesh", sizes,
       "sizes >= 1 with at most one -1 (data, fsdp, tensor)")
  need(mesh.train_layout in ("shared", "fsdp"), "mesh.train_layout", mesh.train_layout,
       '"shared" (the train passes use mesh.rules) or "fsdp" (FSDP over every chip)')
  for rule in mesh.rules:
    need(isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str),
         "mesh.rules", rule, "(logical name, mesh axes) pairs")
  e = cfg.eval
  need(e.every >= 0, "eval.every", e.every, ">= 0")
  need(e.short_response_tokens >= 0, "eval.short_response_tokens", e.short_response_tokens,
       ">= 0 (0: off)")
  need(e.reward_mode in ("strict", "lenient"), "eval.reward_mode", e.reward_mode,
       '"strict" or "lenient"')
  need(e.num_examples >= 1 and e.samples_per_problem >= 1 and e.batch_prompts >= 1,
       "eval.num_examples", e.num_examples,
       ">= 1 (and eval.samples_per_problem, eval.batch_prompts >= 1)")
  ck = cfg.checkpoint
  need(ck.every >= 0, "checkpoint.every", ck.every, ">= 0 (0: at stage ends only)")
  need(ck.keep >= 1, "checkpoint.keep", ck.keep, ">= 1")
  need(ck.restore in ("all", "weights"), "checkpoint.restore", ck.restore, '"all" or "weights"')
  need(not cfg.metrics.wandb or cfg.metrics.wandb_project.strip(), "metrics.wandb_project",
       cfg.metrics.wandb_project, "a project name when metrics.wandb is on")
  need(cfg.faults.max_consecutive_nonfinite >= 1, "faults.max_consecutive_nonfinite",
       cfg.faults.max_consecutive_nonfinite, ">= 1")
  for name in ("collective_timeout_s", "step_timeout_s", "sigterm_grace_s"):
    value = getattr(cfg.faults, name)
    need(value >= 0, f"faults.{name}", value, ">= 0 (0: no deadline)")


# --------------------------------------------------------------------------- internals


def to_dict(cfg: Config) -> dict[str, Any]:
  """The config as nested plain dicts (section -> field -> value), e.g. for a logger."""
  return _to_dict(cfg)


def _to_dict(obj) -> dict:
  out = {}
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    out[f.name] = _to_dict(value) if dataclasses.is_dataclass(value) else value
  return out


def _build(cls, values: dict, path: str):
  if not isinstance(values, dict):
    raise ConfigError(f"{path} must be a section (a ConfigDict), got {type(values).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  values = dict(values)
  for name in list(values):
    removed = REMOVED.get(f"{path}.{name}".removeprefix("config."))
    if removed is not None:
      if values.pop(name) is not None:
        raise ConfigError(f"{path}.{name} was removed: {removed[1]}")
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ConfigError(f"{path}.{unknown[0]} is not a known field; {path} has: "
                      f"{', '.join(sorted(fields))}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, f in fields.items():
    if name not in values:
      continue
    value, hint, where = values[name], hints[name], f"{path}.{name}"
    if dataclasses.is_dataclass(hint):
      kwargs[name] = _build(hint, value, where)
    else:
      kwargs[name] = _coerce(value, hint, where)
  return cls(**kwargs)


def _coerce(value, hint, where):
  if hint is bool:
    if isinstance(value, bool):
      return value
  elif hint is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
  elif hint is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
  elif hint is str:
    if isinstance(value, str):
      return value
  elif hint is tuple or typing.get_origin(hint) is tuple:
    if isinstance(value, (tuple, list)):
      return tuple(tuple(v) if isinstance(v, list) else v for v in value)
  elif isinstance(hint, types.UnionType):
    return value
  name = getattr(hint, "__name__", str(hint))
  raise ConfigError(f"{where}={value!r}: must be of type {name}, got {type(value).__name__}")
