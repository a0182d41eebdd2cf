"""The run configuration: `ml_collections.ConfigDict` at the edge, frozen dataclasses inside.

An experiment is one file in `configs/` whose `get_config(preset)` returns a ConfigDict with
the sections below. `main.py` turns it into a :class:`Config` with :func:`from_config_dict`,
which checks every field — unknown names, wrong types, values out of range — and raises a
:class:`ConfigError` naming the field before anything is compiled. Library code only ever
sees the frozen dataclasses.

One file per section (`config/rl.py`: `RLSection`, …): its fields with their defaults and
comments, and its `check()`; `validate` runs each section's check, then the checks that span
sections. Each default is written there only: the records the steps take
(`update.PolicyHParams`, `advantages.AdvantageConfig`, `behaviour.Correction`, …) have none
and are built from the sections in one place each (`run.learners`, `run.forwards`).

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
import warnings
from typing import Any

import ml_collections

from vapo_jax.config import base
from vapo_jax.config.base import ConfigError, need
from vapo_jax.config.checkpoint import CheckpointSection
from vapo_jax.config.compile import CompileSection
from vapo_jax.config.data import DataSection
from vapo_jax.config.eval import EvalSection
from vapo_jax.config.faults import FaultsSection
from vapo_jax.config.metrics import MetricsSection
from vapo_jax.config.mesh import MeshSection
from vapo_jax.config.model import LORA_TARGETS, LoraSection, ModelSection
from vapo_jax.config.optim import OptimSection
from vapo_jax.config.presets import PRESETS, apply_preset
from vapo_jax.config.reward import RewardSection
from vapo_jax.config.reward_model import RewardModelSection
from vapo_jax.config.rl import (ALPHA_PAPER, AUTO_HORIZON, OLD_LOGPROBS, VALUE_NORMS,
                                RLSection, auto_alpha, uses_critic)
from vapo_jax.config.sampling import SamplingSection
from vapo_jax.config.sft import SFTSection
from vapo_jax.config.value_pretrain import ValuePretrainSection

__all__ = [
    "ALPHA_PAPER", "AUTO_HORIZON", "LORA_TARGETS", "OLD_LOGPROBS", "PRESETS", "REMOVED",
    "VALUE_NORMS", "CheckpointSection", "CompileSection", "Config", "ConfigError",
    "DataSection", "EvalSection", "FaultsSection", "LoraSection", "MeshSection",
    "MetricsSection", "ModelSection", "OptimSection", "RLSection", "RewardModelSection",
    "RewardSection", "SFTSection", "SamplingSection", "ValuePretrainSection", "apply_preset",
    "auto_alpha", "default_config_dict", "from_command_line", "from_config_dict",
    "to_dict", "uses_critic", "validate",
]


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
  c = ml_collections.ConfigDict(base.to_dict(Config()))
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


def from_config_dict(config: ml_collections.ConfigDict | dict) -> Config:
  """Checks a ConfigDict in full and freezes it into a :class:`Config`.

  Raises:
    ConfigError: naming the first bad field (`config.rl.eps_low=1.5: must be in [0, 1)`).
  """
  if isinstance(config, ml_collections.ConfigDict):
    config = config.to_dict()
  cfg = base.build(Config, config, "config", REMOVED)
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


def to_dict(cfg: Config) -> dict[str, Any]:
  """The config as nested plain dicts (section -> field -> value), e.g. for a logger."""
  return base.to_dict(cfg)


def validate(cfg: Config) -> None:
  """Each section's own checks (`<Section>.check()`, in `Config`'s order), then the ones
  that span sections; raises ConfigError naming the first bad field (and warns when α is
  small against the token cap)."""
  need(cfg.log_every >= 1, "log_every", cfg.log_every, ">= 1")
  for f in dataclasses.fields(cfg):
    section = getattr(cfg, f.name)
    if dataclasses.is_dataclass(section):
      section.check()
  m, d, s, rl, vp = cfg.model, cfg.data, cfg.sampling, cfg.rl, cfg.value_pretrain
  whole = d.max_prompt_tokens + s.max_new_tokens - 1
  need(s.kv_tokens == 0 or s.kv_tokens >= whole, "sampling.kv_tokens", s.kv_tokens,
       f"0 (auto) or >= one whole response, data.max_prompt_tokens + "
       f"sampling.max_new_tokens - 1 = {whole}")
  need(s.prompts_per_call >= 0 and (s.prompts_per_call == 0
                                     or cfg.rl.rollout_prompts % s.prompts_per_call == 0),
       "sampling.prompts_per_call", s.prompts_per_call,
       f"0 or a divisor of the prompts per step ({cfg.rl.rollout_prompts})")
  need(vp.replay_batches == 1 or rl.value_clip == 0, "value_pretrain.replay_batches",
       vp.replay_batches, "1 with rl.value_clip > 0 (a replayed batch's old values are "
       "an older critic's)")
  need(not (vp.enabled and not cfg.uses_critic), "value_pretrain.enabled", vp.enabled,
       f"False with rl.advantage_estimator={rl.advantage_estimator!r} (there is no critic "
       "to pretrain)")
  if rl.length_adaptive and cfg.uses_critic and cfg.alpha * s.max_new_tokens < 8:
    warnings.warn(
        f"config.rl.alpha={rl.alpha}: 1/α = {1 / cfg.alpha:.0f} tokens against a cap of "
        f"{s.max_new_tokens}: a response of a quarter of the cap gets λ_policy = 1 − 1/(α·l) "
        "< 0.5 (0 below l = 1/α: the critic's credit reaches the last few tokens only); "
        "size α to the lengths, e.g. rl.alpha=0 (auto: "
        f"{auto_alpha(s.max_new_tokens):.3g} here)", stacklevel=2)
  seq = d.max_prompt_tokens + s.max_new_tokens
  need(rl.packing_row_tokens == 0 or rl.packing_row_tokens >= seq, "rl.packing_row_tokens",
       rl.packing_row_tokens,
       f"0 or >= max_prompt_tokens + max_new_tokens = {seq} (every sequence must fit a row)")
  row = max(rl.packing_row_tokens, seq)
  need(rl.packing_tokens_per_device == 0 or rl.packing_tokens_per_device >= row,
       "rl.packing_tokens_per_device", rl.packing_tokens_per_device,
       f"0 or >= the packed row length ({row} tokens)")
  f32 = m.dtype == "float32" and (s.engine == "static" or s.decode_dtype in ("auto", "float32"))
  need(rl.old_logprobs != "behaviour" or f32 or rl.behaviour_correction != "none",
       "rl.old_logprobs", rl.old_logprobs,
       '"behaviour" only with rl.behaviour_correction "tis" or "mask", or a float32 sampler '
       f'(model.dtype={m.dtype!r}, sampling.decode_dtype={s.decode_dtype!r}); "exact" or '
       '"auto" saves the same pass with no approximation when each batch takes one update')
  need(0 <= rl.overlong_cache_tokens <= s.max_new_tokens, "rl.overlong_cache_tokens",
       rl.overlong_cache_tokens, f"in [0, sampling.max_new_tokens={s.max_new_tokens}]")
