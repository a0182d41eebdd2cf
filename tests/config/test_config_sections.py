"""Each setting has one default, its config section's: the records the steps take are built
from the sections in one place each and declare no defaults of their own, and every field
they hold is the config's value, at the defaults and with every setting moved off them."""

import dataclasses
import inspect

import pytest

from vapo_jax import config as config_lib
from vapo_jax.rl import advantages
from vapo_jax.rl import behaviour
from vapo_jax.rl import dapo
from vapo_jax.rl import experience as experience_lib
from vapo_jax.rl import train_state
from vapo_jax.rl import update
from vapo_jax.run import learners
from vapo_jax.run import forwards

pytestmark = pytest.mark.filterwarnings("ignore:config.rl.alpha")  # α small at the defaults

# Settings moved off their defaults all at once (a valid config: no critic to pretrain with
# group-relative advantages, "behaviour" π_old with a correction, value clipping with one
# replayed batch, L_cache within the cap).
MOVED = {
    "seed": 7, "rl.advantage_estimator": "group", "value_pretrain.enabled": False,
    "sampling.temperature": 0.7, "sampling.prompts_per_call": 128,
    "rl.prompts_per_step": 256, "rl.responses_per_prompt": 4,
    "rl.eps_low": 0.15, "rl.eps_high": 0.3, "rl.dual_clip": 3.0, "rl.token_level_loss": False,
    "rl.nll_coef": 0.2, "rl.nll_threshold": 0.5, "rl.kl_coef": 0.01,
    "rl.old_logprobs": "behaviour", "rl.behaviour_correction": "tis", "rl.behaviour_cap": 3.0,
    "rl.behaviour_band": (0.25, 4.0), "rl.value_clip": 0.3,
    "rl.gamma": 0.99, "rl.decoupled_gae": False, "rl.lam_critic": 0.9,
    "rl.length_adaptive": False, "rl.alpha": 0.1, "rl.lam_policy": 0.9,
    "rl.group_std_norm": False, "rl.whiten_advantages": False, "rl.gae_impl": "scan",
    "rl.reward_scale": 2.0, "rl.reward_shift": -1.0,
    "rl.ppo_epochs": 2, "rl.num_minibatches": 4,
    "rl.overlong_shaping": True, "rl.overlong_cache_tokens": 4,
    "rl.dynamic_sampling": True, "rl.dynamic_sampling_max_rounds": 2,
    "optim.policy_lr": 3e-4, "optim.critic_lr": 4e-4, "optim.sft_lr": 5e-4,
    "optim.critic_head_lr": 6e-4, "optim.warmup_steps": 10, "optim.weight_decay": 0.02,
    "optim.b1": 0.8, "optim.b2": 0.9, "optim.eps": 1e-6, "optim.grad_clip": 0.5,
    "sft.steps": 50,
}


def config(moved: bool) -> config_lib.Config:
  c = config_lib.default_config_dict()
  for dotted, value in (MOVED.items() if moved else ()):
    section, _, name = dotted.rpartition(".")
    (c[section] if section else c)[name] = value
  return config_lib.from_config_dict(c)


def experience(cfg):
  return forwards.experience(cfg, sampler=None, text=None, scorer=None, logprobs=None)


def optimizer_settings(cfg, name, monkeypatch) -> list[dict]:
  """The keyword arguments `learners.optimizer` gives `train_state.make_optimizer`."""
  calls = []
  real = train_state.make_optimizer
  monkeypatch.setattr(train_state, "make_optimizer",
                      lambda lr, **kw: calls.append({"lr": lr, **kw}) or real(lr, **kw))
  learners.optimizer(cfg, name)
  return calls


# (record, field) -> what it must hold, from the config. Every field of every record the
# steps take is a row here (but `NOT_SETTINGS`), so a new field must say where it comes from.
EXPECTED = {
    (update.PolicyHParams, "temperature"): lambda c: c.sampling.temperature,
    (update.PolicyHParams, "eps_low"): lambda c: c.rl.eps_low,
    (update.PolicyHParams, "eps_high"): lambda c: (c.rl.eps_high if c.rl.clip_higher
                                                   else c.rl.eps_low),
    (update.PolicyHParams, "dual_clip"): lambda c: c.rl.dual_clip or None,
    (update.PolicyHParams, "loss_mode"): lambda c: ("token" if c.rl.token_level_loss
                                                    else "seq_mean_token_mean"),
    (update.PolicyHParams, "nll_coef"): lambda c: c.rl.nll_coef,
    (update.PolicyHParams, "nll_threshold"): lambda c: c.rl.nll_threshold,
    (update.PolicyHParams, "kl_coef"): lambda c: c.rl.kl_coef,
    (update.PolicyHParams, "policy_loss"): lambda c: c.rl.policy_loss,
    (update.PolicyHParams, "old_logprobs"): lambda c: c.old_logprobs,
    (update.PolicyHParams, "correction"): lambda c: behaviour.Correction(
        c.rl.behaviour_correction, c.rl.behaviour_cap, tuple(c.rl.behaviour_band)),
    (update.CriticHParams, "value_clip"): lambda c: c.rl.value_clip or None,
    (update.CriticHParams, "loss_mode"): lambda c: "token",
    (update.PPOLoop, "epochs"): lambda c: c.rl.ppo_epochs,
    (update.PPOLoop, "num_minibatches"): lambda c: c.rl.num_minibatches,
    (update.PPOLoop, "minibatch_rows"): lambda c: (c.rl.rollout_prompts * c.rl.group_size
                                                   // c.rl.num_minibatches),
    (update.PPOLoop, "seed"): lambda c: c.seed,
    (advantages.AdvantageConfig, "estimator"): lambda c: c.rl.advantage_estimator,
    (advantages.AdvantageConfig, "gamma"): lambda c: c.rl.gamma,
    (advantages.AdvantageConfig, "decoupled"): lambda c: c.rl.decoupled_gae,
    (advantages.AdvantageConfig, "lam_critic"): lambda c: c.rl.lam_critic,
    (advantages.AdvantageConfig, "length_adaptive"): lambda c: c.rl.length_adaptive,
    (advantages.AdvantageConfig, "alpha"): lambda c: c.rl.alpha or config_lib.auto_alpha(
        c.sampling.max_new_tokens),
    (advantages.AdvantageConfig, "lam_policy"): lambda c: c.rl.lam_policy,
    (advantages.AdvantageConfig, "group_std_norm"): lambda c: c.rl.group_std_norm,
    (advantages.AdvantageConfig, "whiten"): lambda c: c.rl.whiten_advantages,
    (advantages.AdvantageConfig, "gae_impl"): lambda c: c.rl.gae_impl,
    (advantages.AdvantageConfig, "reward_scale"): lambda c: c.rl.reward_scale,
    (advantages.AdvantageConfig, "reward_shift"): lambda c: c.rl.reward_shift,
    (experience_lib.Experience, "temperature"): lambda c: c.sampling.temperature,
    (experience_lib.Experience, "prompts_per_call"): lambda c: c.sampling.prompts_per_call,
    (experience_lib.Experience, "overlong"): lambda c: (
        dapo.Overlong(c.sampling.max_new_tokens, c.rl.overlong_cache_tokens
                      or dapo.default_cache_len(c.sampling.max_new_tokens))
        if c.rl.overlong_shaping else None),
    (experience_lib.Experience, "dynamic_rounds"): lambda c: (
        c.rl.dynamic_sampling_max_rounds if c.rl.dynamic_sampling else -1),
    (experience_lib.Experience, "group_size"): lambda c: (c.rl.responses_per_prompt
                                                          if c.rl.group_sampling else 1),
    (experience_lib.Experience, "correction"): lambda c: behaviour.Correction(
        c.rl.behaviour_correction, c.rl.behaviour_cap, tuple(c.rl.behaviour_band)),
    (experience_lib.Experience, "old_logprobs"): lambda c: c.old_logprobs,
}
# Fields that are no setting: the policy's vocabulary chunk (a memory bound), and what
# Experience is handed at run time (the sampler, the checker, the jitted programs, the move
# to the train mesh).
NOT_SETTINGS = {(update.PolicyHParams, "vocab_chunk")} | {
    (experience_lib.Experience, f) for f in ("sampler", "text", "scorer", "logprobs",
                                             "advantages", "monte_carlo", "place")}
# Settings no config can move (one policy loss is registered; the critic's loss is per token).
FIXED = {(update.PolicyHParams, "policy_loss"), (update.CriticHParams, "loss_mode")}
RECORDS = {
    update.PolicyHParams: learners.policy_hparams,
    update.CriticHParams: learners.critic_hparams,
    update.PPOLoop: learners.ppo_loop,
    advantages.AdvantageConfig: forwards.advantage_config,
    experience_lib.Experience: experience,
}
# make_optimizer's settings: (learner, keyword) -> the config's value.
OPTIMIZER = {
    "lr": {"policy": lambda c: c.optim.policy_lr, "critic": lambda c: c.optim.critic_lr,
           "sft": lambda c: c.optim.sft_lr},
    "warmup_steps": {"policy": lambda c: c.optim.warmup_steps,
                     "sft": lambda c: min(c.optim.warmup_steps, c.sft.steps // 10)},
    **{k: {"policy": (lambda c, k=k: getattr(c.optim, k))}
       for k in ("weight_decay", "b1", "b2", "eps", "grad_clip")},
}


def test_every_field_of_the_step_records_is_a_setting_with_a_source():
  for record in RECORDS:
    for f in dataclasses.fields(record):
      assert (record, f.name) in EXPECTED or (record, f.name) in NOT_SETTINGS, (
          f"{record.__name__}.{f.name}: add where it comes from to EXPECTED")
  assert {f.name for f in dataclasses.fields(behaviour.Correction)} == {"mode", "cap", "band"}
  assert {f.name for f in dataclasses.fields(dapo.Overlong)} == {"max_len", "cache_len"}


def test_the_step_records_declare_no_defaults_of_their_own():
  """A default here would be a second copy of the config's (it was: rl.behaviour_cap's
  (mode, cap, band) in rl/experience.py and rl/update.py, the return scale, the AdamW's)."""
  for record in (*RECORDS, behaviour.Correction, dapo.Overlong):
    for f in dataclasses.fields(record):
      if (record, f.name) in NOT_SETTINGS:
        continue
      assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, (
          f"{record.__name__}.{f.name} has a default; the config's section holds it")
  for p in inspect.signature(train_state.make_optimizer).parameters.values():
    assert p.default is inspect.Parameter.empty, f"make_optimizer({p.name}=...) has a default"


@pytest.mark.parametrize("moved", [False, True], ids=["defaults", "moved"])
def test_the_steps_receive_the_sections_values(moved):
  cfg, base = config(moved), config(False)
  for record, build in RECORDS.items():
    built = build(cfg)
    assert isinstance(built, record)
    for (rec, name), expected in EXPECTED.items():
      if rec is not record:
        continue
      assert getattr(built, name) == expected(cfg), f"{record.__name__}.{name}"
      if moved and (rec, name) not in FIXED:  # the setting was moved, and the record saw it
        assert expected(cfg) != expected(base), f"MOVED leaves {record.__name__}.{name}"


@pytest.mark.parametrize("moved", [False, True], ids=["defaults", "moved"])
def test_the_optimizers_receive_the_sections_values(moved, monkeypatch):
  cfg, base = config(moved), config(False)
  for key, by_learner in OPTIMIZER.items():
    for name, expected in by_learner.items():
      assert optimizer_settings(cfg, name, monkeypatch)[0][key] == expected(cfg), (name, key)
      if moved:
        assert expected(cfg) != expected(base), (name, key)
  # optim.critic_head_lr: the value head's own AdamW beside the body's, clipped once outside.
  calls = optimizer_settings(cfg, "critic", monkeypatch)
  assert [c["lr"] for c in calls] == ([cfg.optim.critic_lr, cfg.optim.critic_head_lr] if moved
                                      else [cfg.optim.critic_lr])
