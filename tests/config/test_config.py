"""Config checking, presets, and that each VAPO switch changes exactly what it names."""

import dataclasses
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax.rl import advantages
from vapo_jax.run import learners
from vapo_jax.run import forwards, inputs, meshes, networks, sampling
from config_files import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(ROOT, "configs"))
                                        if f.endswith(".py")))
def test_every_config_file_and_preset_validates(name):
  for preset in config_lib.PRESETS:
    cfg = config_lib.from_config_dict(load_config_file(name, preset))
    assert isinstance(cfg, config_lib.Config)


@pytest.mark.parametrize("field,value,message", [
    ("rl.eps_low", 1.5, "config.rl.eps_low=1.5: must be in [0, 1)"),
    ("rl.alpha", -0.1, "config.rl.alpha=-0.1: must be >= 0 (0: auto"),
    ("rl.num_minibatches", 3, "config.rl.num_minibatches=3: must be a divisor"),
    ("sampling.temperature", 0.0, "config.sampling.temperature"),
    ("sampling.decode_windows", 0, "config.sampling.decode_windows=0: must be >= 1"),
    ("sampling.attention_kernel", "pallas", "config.sampling.attention_kernel='pallas'"),
    ("data.source", "csv", "config.data.source='csv'"),
    ("rl.gae_impl", "fast", "config.rl.gae_impl='fast'"),
    ("model.num_kv_heads", 3, "config.model.num_kv_heads=3"),
    ("reward.fn", "no_colon", "config.reward.fn"),
    ("reward.mode", "loose", "config.reward.mode='loose': must be \"strict\" or \"lenient\""),
    ("eval.reward_mode", "loose", "config.eval.reward_mode='loose'"),
    ("rl.behaviour_correction", "clip", "config.rl.behaviour_correction='clip'"),
    ("rl.behaviour_band", (1.5, 2.0), "config.rl.behaviour_band=(1.5, 2.0)"),
    ("mesh.train_tensor", -1, "config.mesh.train_tensor=-1: must be 0 (the decode mesh)"),
])
def test_bad_values_name_the_field(field, value, message):
  c = load_config_file("tiny.py")
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.from_config_dict(c)
  assert message in str(e.value)


def test_wrong_type_and_unknown_field():
  c = config_lib.default_config_dict().to_dict()
  c["rl"]["steps"] = "ten"
  with pytest.raises(config_lib.ConfigError, match=r"config.rl.steps='ten': must be of type int"):
    config_lib.from_config_dict(c)
  c = config_lib.default_config_dict().to_dict()
  c["rl"]["epsilon"] = 0.2
  with pytest.raises(config_lib.ConfigError, match=r"config.rl.epsilon is not a known field"):
    config_lib.from_config_dict(c)
  with pytest.raises(config_lib.ConfigError, match="unknown preset"):
    config_lib.apply_preset(config_lib.default_config_dict(), "vapo2")


def test_removed_use_critic_says_what_to_write():
  for value in (True, False):
    c = config_lib.default_config_dict()
    c.rl.use_critic = value
    with pytest.raises(config_lib.ConfigError, match=r'config\.rl\.use_critic was removed: set '
                       r'rl\.advantage_estimator="gae" \(was True\) or "group"'):
      config_lib.from_config_dict(c)
  # Unset (the default), it is no field at all.
  cfg = config_lib.from_config_dict(config_lib.default_config_dict())
  assert not hasattr(cfg.rl, "use_critic") and cfg.uses_critic


def test_estimator_and_policy_loss_names_are_checked():
  for field, value, allowed in (("advantage_estimator", "vtrace", "['gae', 'group']"),
                                ("policy_loss", "gspo", "['ppo']")):
    c = config_lib.default_config_dict()
    c.rl[field] = value
    with pytest.raises(config_lib.ConfigError,
                       match=re.escape(f"config.rl.{field}='{value}': must be one of {allowed}")):
      config_lib.from_config_dict(c)


def test_critic_free_preset_needs_groups():
  c = load_config_file("tiny.py", "grpo")
  c.rl.group_sampling = False
  with pytest.raises(config_lib.ConfigError, match="group-relative advantages need a group"):
    config_lib.from_config_dict(c)


def resolved(cfg):
  """Everything the trainer derives from the switches, as a flat dict."""
  out = {f"adv.{k}": v for k, v in dataclasses.asdict(forwards.advantage_config(cfg)).items()}
  hp = dataclasses.asdict(learners.policy_hparams(cfg))
  out.update({f"policy.{k}": v for k, v in hp.items()})
  out["value_pretrain"] = cfg.value_pretrain.enabled and cfg.uses_critic
  out["rollout_prompts"] = cfg.rl.rollout_prompts
  out["group_size"] = cfg.rl.group_size
  return out


@pytest.mark.parametrize("preset,changed", [
    ("no_value_pretrain", {"value_pretrain"}),
    ("no_decoupled_gae", {"adv.decoupled"}),
    ("no_length_adaptive", {"adv.length_adaptive"}),
    ("no_clip_higher", {"policy.eps_high"}),
    ("no_token_level_loss", {"policy.loss_mode"}),
    ("no_positive_nll", {"policy.nll_coef"}),
    ("no_group_sampling", {"rollout_prompts", "group_size"}),
])
def test_each_ablation_changes_exactly_what_it_names(preset, changed):
  base = resolved(config_lib.from_config_dict(load_config_file("qwen32b.py")))
  other = resolved(config_lib.from_config_dict(load_config_file("qwen32b.py", preset)))
  assert {k for k in base if base[k] != other[k]} == changed
  if preset == "no_clip_higher":
    assert other["policy.eps_high"] == other["policy.eps_low"] == 0.2
  if preset == "no_group_sampling":  # same generation budget
    assert (base["rollout_prompts"] * base["group_size"]
            == other["rollout_prompts"] * other["group_size"])


def test_paper_settings_in_qwen32b():
  cfg = config_lib.from_config_dict(load_config_file("qwen32b.py"))
  assert (cfg.rl.rollout_prompts, cfg.rl.group_size) == (512, 16)
  assert cfg.rl.alpha == 0.05 and cfg.rl.lam_critic == 1.0 and cfg.rl.gamma == 1.0
  assert (cfg.rl.eps_low, cfg.eps_high, cfg.rl.nll_coef) == (0.2, 0.28, 0.1)
  assert cfg.loss_mode == "token" and cfg.value_pretrain.enabled


def advantage_config(**changes):
  """The default config's advantage settings, with `changes`."""
  cfg = config_lib.from_config_dict(config_lib.default_config_dict())
  return dataclasses.replace(forwards.advantage_config(cfg), **changes)


def test_length_adaptive_switch_gives_constant_lambda():
  lengths = jnp.array([10, 100, 1000, 4])
  mask = (jnp.arange(1000)[None] < lengths[:, None]).astype(jnp.float32)
  scores = jnp.array([1.0, 0.0, 1.0, 0.0])
  values = jnp.zeros(mask.shape)
  groups = jnp.arange(4) // 2
  on = advantages.compute_advantages(advantage_config(), scores, lengths, mask, values,
                                         groups)
  np.testing.assert_allclose(on.lam_policy_B, [0.0, 0.8, 0.98, 0.0], atol=1e-6)
  off = advantages.compute_advantages(
      advantage_config(length_adaptive=False, lam_policy=0.95), scores, lengths, mask,
      values, groups)
  np.testing.assert_allclose(off.lam_policy_B, 0.95)
  # Decoupled: critic targets are the Monte Carlo returns whatever λ_policy is.
  np.testing.assert_allclose(on.returns_BxR, scores[:, None] * mask, atol=1e-6)
  coupled = advantages.compute_advantages(
      advantage_config(decoupled=False), scores, lengths, mask, values + 0.5, groups)
  # With λ = 0 (short rows) the coupled target bootstraps: R_t = V_{t+1} (+ r on the last).
  np.testing.assert_allclose(coupled.returns_BxR[0, :9], 0.5, atol=1e-6)


def test_group_relative_without_critic():
  lengths = jnp.array([3, 4, 5, 6])
  mask = (jnp.arange(8)[None] < lengths[:, None]).astype(jnp.float32)
  out = advantages.compute_advantages(
      advantage_config(estimator="group", group_std_norm=False, whiten=False),
      jnp.array([1.0, 0.0, 1.0, 1.0]), lengths, mask, None, jnp.array([0, 0, 1, 1]))
  np.testing.assert_allclose(out.advantages_BxR[:, 0], [0.5, -0.5, 0.0, 0.0])
  np.testing.assert_allclose(out.advantages_BxR * (1 - mask), 0.0)


@pytest.mark.parametrize("windows", [1, 3])
def test_sampling_settings_reach_the_run_sampler(windows):
  c = load_config_file("tiny.py")
  c.sampling.decode_windows = windows
  cfg = config_lib.from_config_dict(c)
  mesh, rules = meshes.build_mesh(cfg), meshes.rules_of(cfg)
  text = inputs.build_text(cfg)
  mcfg = networks.fresh_model_config(cfg, text)
  sampler = sampling.build_sampler(cfg, None, mcfg, mesh, rules, text, n=2)
  assert sampler.cfg.decode_windows == windows
  assert sampler.cfg.n_per_prompt == 2
  assert sampler.cfg.max_new_tokens == cfg.sampling.max_new_tokens
