"""Presets: whole rows of the paper's ablation table, and the baselines, as field overrides
of a ConfigDict (`configs/*.py get_config(preset)`)."""

from typing import Any

import ml_collections

from vapo_jax.config.base import ConfigError

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

