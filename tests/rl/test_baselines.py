"""The baselines' extras (GRPO's KL, DAPO's dynamic sampling and overlong shaping), advantage
whitening, and the units of the paper's budget: hand computations, float64 references, and a
short trainer run per switch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from config_files import load_config_file
from tiny_trainer import tiny
from vapo_jax import config as config_lib
from vapo_jax import losses
from vapo_jax.rl import advantages as advantages_lib
from vapo_jax.rl import dapo
from vapo_jax.run import learners
from vapo_jax.run import forwards
from vapo_jax.run import trainer as trainer_lib


# ------------------------------------------------------------------------ overlong shaping


def test_overlong_penalty_by_hand():
  # L_max = 10, L_cache = 4: no penalty up to 6 tokens, then −1/4 per token down to −1 at 10.
  got = dapo.overlong_penalty(jnp.array([1, 6, 7, 8, 9, 10, 11, 30]), 10, 4)
  np.testing.assert_allclose(got, [0, 0, -0.25, -0.5, -0.75, -1, -1, -1], atol=1e-7)
  # L_cache = L_max: the ramp starts at 0 tokens.
  np.testing.assert_allclose(dapo.overlong_penalty(jnp.array([0, 2, 4]), 4, 4), [0, -0.5, -1])
  with pytest.raises(ValueError):
    dapo.overlong_penalty(jnp.array([1]), 4, 5)


def test_overlong_cache_scales_dapo_defaults():
  assert dapo.default_cache_len(20480) == 4096  # DAPO's own setting
  assert dapo.default_cache_len(48) == 10       # 48 / 5 = 9.6
  cfg = config_lib.from_config_dict(load_config_file("tiny.py", "dapo"))
  assert cfg.rl.overlong_shaping and cfg.overlong_cache_tokens == 10
  c = load_config_file("tiny.py", "dapo")
  c.rl.overlong_cache_tokens = 7
  assert config_lib.from_config_dict(c).overlong_cache_tokens == 7
  c.rl.overlong_cache_tokens = 49
  with pytest.raises(config_lib.ConfigError, match="rl.overlong_cache_tokens"):
    config_lib.from_config_dict(c)


# ------------------------------------------------------------------------ dynamic sampling


def test_mixed_groups_and_fill_keep_exactly_the_mixed_groups_in_order():
  n = 3
  r0 = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 0.5, 0.5, 0.5], np.float32)  # groups: u m u u
  r1 = np.array([0, 0, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0], np.float32)        # groups: m u m u
  m0, m1 = dapo.mixed_groups(r0, n), dapo.mixed_groups(r1, n)
  np.testing.assert_array_equal(m0, [False, True, False, False])
  np.testing.assert_array_equal(m1, [True, False, True, False])
  # Enough mixed groups over two rounds for 3 of 4: picks the mixed ones in drawing order.
  picks, keep = dapo.fill_groups([m0, m1], 3)
  np.testing.assert_array_equal(picks, [1, 4, 6])
  assert keep.all()
  # A batch of 4: the 3 mixed ones, then the first uniform group, masked out.
  picks, keep = dapo.fill_groups([m0, m1], 4)
  np.testing.assert_array_equal(picks, [1, 4, 6, 0])
  np.testing.assert_array_equal(keep, [True, True, True, False])
  # Only one round: one mixed group, three uniform fillers.
  picks, keep = dapo.fill_groups([m0], 4)
  np.testing.assert_array_equal(picks, [1, 0, 2, 3])
  np.testing.assert_array_equal(keep, [True, False, False, False])
  np.testing.assert_array_equal(dapo.group_rows(np.array([1, 4]), n), [3, 4, 5, 12, 13, 14])
  # The rows picked out of the joined rounds carry the scores of mixed groups only.
  joined = np.concatenate([r0, r1])[dapo.group_rows(np.array([1, 4, 6]), n)].reshape(3, n)
  assert (joined.max(1) > joined.min(1)).all()


# ----------------------------------------------------------------------------- KL (k3)


def _kl_batch(seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-4, -0.05, (3, 6)).astype(np.float32)
  ref = (logp + rng.normal(0, 0.7, logp.shape)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], np.float32)
  logp[mask == 0] = -np.inf  # padding may hold anything
  return logp, ref, mask


@pytest.mark.parametrize("mode", losses.MODES)
def test_kl_penalty_value_and_gradient_match_float64(mode):
  logp, ref, mask = _kl_batch()
  m = mask > 0
  lp = np.where(m, logp.astype(np.float64), 0.0)
  d = np.where(m, ref.astype(np.float64) - lp, 0.0)
  k3 = np.exp(d) - d - 1                    # per token, ≥ 0
  dk3 = np.where(m, 1.0 - np.exp(d), 0.0)   # ∂k3/∂logp
  lens = mask.sum(1)
  if mode == "token":
    want, grad = (k3 * mask).sum() / mask.sum(), dk3 / mask.sum()
  elif mode == "seq_mean_token_mean":
    want = ((k3 * mask).sum(1) / lens).sum() / 3
    grad = dk3 / lens[:, None] / 3
  else:
    want, grad = (k3 * mask).sum() / 3, dk3 / 3

  def loss(x):
    return losses.kl_penalty(x, ref, mask, mode=mode).value

  np.testing.assert_allclose(loss(jnp.asarray(logp)), want, rtol=1e-5)
  g = np.asarray(jax.grad(loss)(jnp.asarray(logp)))
  assert np.isfinite(g).all()
  np.testing.assert_allclose(g, grad, rtol=1e-4, atol=1e-7)
  # k3 is 0 at π_θ = π_ref, and positive otherwise.
  assert float(loss(jnp.asarray(np.where(m, ref, logp)))) == 0.0
  assert want > 0


# ------------------------------------------------------------------ advantage whitening


def test_whitening_uses_valid_tokens_only():
  rng = np.random.default_rng(3)
  adv = rng.normal(2.0, 3.0, (4, 7)).astype(np.float32)
  mask = (np.arange(7)[None] < np.array([[7], [3], [1], [5]])).astype(np.float32)
  adv[mask == 0] = 1e6  # would dominate the statistics if padding leaked in
  x = adv.astype(np.float64)[mask > 0]
  got = np.asarray(losses.masked_whiten(jnp.asarray(adv), jnp.asarray(mask)))
  np.testing.assert_allclose(got[mask > 0], (x - x.mean()) / np.sqrt(x.var() + 1e-8),
                             rtol=1e-5, atol=1e-5)
  assert (got[mask == 0] == 0).all()


def test_whitening_switch_in_compute_advantages():
  cfg = config_lib.from_config_dict(config_lib.default_config_dict())
  ac = forwards.advantage_config(cfg)
  assert ac.whiten  # the default (see config.RLSection.whiten_advantages)
  lengths = jnp.array([5, 9, 3, 7])
  mask = (jnp.arange(9)[None] < lengths[:, None]).astype(jnp.float32)
  scores = jnp.array([1.0, 0.0, 1.0, 0.0])
  values = jnp.asarray(np.random.default_rng(1).uniform(0, 1, (4, 9)), jnp.float32) * mask
  groups = jnp.arange(4) // 2
  on = advantages_lib.compute_advantages(ac, scores, lengths, mask, values, groups)
  off = advantages_lib.compute_advantages(dataclasses.replace(ac, whiten=False), scores,
                                          lengths, mask, values, groups)
  m = np.asarray(mask) > 0
  raw = np.asarray(off.advantages_BxR, np.float64)[m]
  np.testing.assert_allclose(np.asarray(on.advantages_BxR)[m],
                             (raw - raw.mean()) / np.sqrt(raw.var() + 1e-8), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(on.returns_BxR, off.returns_BxR)  # the critic's targets stay
  assert abs(float(on.metrics["adv/mean"])) < 1e-5
  assert abs(float(on.metrics["adv/std"]) - 1) < 1e-3


# ------------------------------------------------------------------- presets and units


def test_baseline_presets():
  grpo = config_lib.from_config_dict(load_config_file("tiny.py", "grpo"))
  dapo_cfg = config_lib.from_config_dict(load_config_file("tiny.py", "dapo"))
  vapo = config_lib.from_config_dict(load_config_file("qwen32b.py"))
  assert grpo.rl.kl_coef == 0.04 and not grpo.rl.dynamic_sampling
  assert not grpo.rl.overlong_shaping and not grpo.rl.whiten_advantages
  assert dapo_cfg.rl.kl_coef == 0 and dapo_cfg.rl.dynamic_sampling
  assert dapo_cfg.rl.overlong_shaping and not dapo_cfg.rl.whiten_advantages
  assert vapo.rl.kl_coef == 0 and not vapo.rl.dynamic_sampling
  assert not vapo.rl.overlong_shaping and vapo.rl.whiten_advantages
  assert learners.policy_hparams(grpo).kl_coef == 0.04


def test_qwen32b_budget_is_the_papers_5000_updates():
  cfg = config_lib.from_config_dict(load_config_file("qwen32b.py"))
  rows = cfg.rl.rollout_prompts * cfg.rl.group_size
  assert rows // cfg.rl.num_minibatches == 512  # mini-batches of 512 responses
  assert cfg.rl_updates == cfg.rl.steps * 16
  assert 5000 <= cfg.rl_updates < 5000 + 16     # the first whole rollout step past 5,000


# -------------------------------------------------------------------- short trainer runs


def critic_free(**overrides):
  """tiny() as a critic-free baseline: 4 prompts × 4 responses, 8-token responses."""
  base = {"rl.advantage_estimator": "group", "value_pretrain.enabled": False, "rl.nll_coef": 0.0,
          "rl.prompts_per_step": 4, "rl.responses_per_prompt": 4, "rl.whiten_advantages": False,
          "mesh.fsdp": 1}
  return tiny(**{**base, **overrides})


def group_advantages(rewards, n, mask):
  g = np.asarray(rewards, np.float64).reshape(-1, n)
  a = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-6)
  return a.reshape(-1)[:, None] * mask


def test_overlong_shaping_reaches_the_advantages():
  cfg = critic_free(**{"rl.overlong_shaping": True, "rl.overlong_cache_tokens": 4})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    t.setup("policy")
    batch, m = t.experience(next(t.state.prompts))
  finally:
    t.close()
  b = jax.device_get(batch)
  lengths = b.response_mask_BxR.sum(1)
  # L_max = 8, L_cache = 4: −(l − 4) / 4 above 4 tokens.
  penalty = np.where(lengths <= 4, 0.0, -(lengths - 4) / 4)
  assert penalty.min() < 0, "no response long enough to be penalised"
  np.testing.assert_allclose(m["reward/overlong_penalty_mean"], penalty.mean(), rtol=1e-5)
  want = group_advantages(b.scores_B + penalty, 4, b.response_mask_BxR)
  np.testing.assert_allclose(b.advantages_BxR, want, rtol=1e-4, atol=1e-4)
  # The batch's scores stay the checker's (0 / 1): the NLL's "correct" is not shaped.
  assert set(np.unique(b.scores_B)) <= {0.0, 1.0}


@pytest.mark.parametrize("reward, rounds", [("trainer_plugins:even_digits", 3),
                                            ("trainer_plugins:problem_parity", 2)])
def test_dynamic_sampling_batch_holds_mixed_groups(reward, rounds):
  # 8 prompts × 2 responses: about half the groups of a round are mixed under even_digits.
  cfg = critic_free(**{"rl.dynamic_sampling": True, "rl.dynamic_sampling_max_rounds": rounds,
                       "reward.fn": reward, "rl.prompts_per_step": 8,
                       "rl.responses_per_prompt": 2})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    t.setup("policy")
    position = t.state.prompts.get_state()
    batch, m = t.experience(next(t.state.prompts))
    drawn = int(m["dynamic/extra_rounds"]) + 1
    # Each extra round took the next prompts of the run's iterator (saved in checkpoints).
    after = t.state.prompts.get_state()
    t.state.prompts.set_state(position)
    for _ in range(drawn):
      next(t.state.prompts)
    assert t.state.prompts.get_state() == after
    um = t.update(batch, stage="rl", step=0, policy=True)
  finally:
    t.close()
  b = jax.device_get(batch)
  n, groups = 2, 8
  scores = b.scores_B.reshape(groups, n)
  kept = b.response_mask_BxR.reshape(groups, n, -1).sum((1, 2)) > 0
  mixed = scores.max(1) > scores.min(1)
  np.testing.assert_array_equal(kept, mixed)  # kept groups are exactly the mixed ones
  assert m["dynamic/masked_groups"] == groups - kept.sum()
  total_mixed = round(m["dynamic/mixed_frac"] * drawn * groups)
  assert kept.sum() == min(total_mixed, groups)
  # It stops as soon as the batch is full, and never draws more than the cap.
  assert drawn <= rounds + 1
  if kept.sum() < groups:
    assert drawn == rounds + 1
  if reward.endswith("problem_parity"):  # every group uniform: all rounds, nothing kept
    assert drawn == rounds + 1 and not kept.any()
    assert um["policy_loss"] == 0.0 and um["policy_grad_norm"] == 0.0
  else:
    assert kept.all() and drawn > 1, "the seed should need an extra round"
    assert um["policy_grad_norm"] > 0


def test_kl_penalty_in_the_policy_loss_and_its_reference_survives_resume(tmp_path):
  cfg = critic_free(**{"rl.kl_coef": 0.5, "rl.steps": 2, "checkpoint.every": 1,
                       "checkpoint.keep": 5, "checkpoint.async_save": False,
                       "metrics.tensorboard": False})
  workdir = str(tmp_path)
  t = trainer_lib.Trainer(cfg, workdir, progress=False)
  try:
    last = t.rl()["history"][-1]
    ref = jax.device_get(t.state.ref_params)
  finally:
    t.close()
  assert last["kl_ref"] > 0  # step 2's policy is two updates away from the reference
  np.testing.assert_allclose(last["policy_loss"], last["pg_loss"] + 0.5 * last["kl_ref"],
                             rtol=1e-5, atol=1e-7)
  # Resumed after RL step 1, the reference is the initial policy, not the current one, and
  # step 2 comes out as it did in the run that never stopped.
  t = trainer_lib.Trainer(cfg, workdir, progress=False)
  try:
    assert t.resume(1) == 1 and t.ctl.stage == "rl" and t.ctl.step == 1
    restored = jax.device_get(t.state.ref_params)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(restored)):
      np.testing.assert_array_equal(a, b)
    current = jax.device_get(t.state.policy_params)
    assert max(float(np.abs(a - b).max())
               for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(current))) > 0
    again = t.rl()["history"]
  finally:
    t.close()
  assert len(again) == 1
  np.testing.assert_allclose(again[0]["kl_ref"], last["kl_ref"], rtol=1e-5)
  np.testing.assert_allclose(again[0]["policy_loss"], last["policy_loss"], rtol=1e-5)


def test_whitening_switch_reaches_the_policy_loss():
  """Through the trainer (critic-free, to keep it short: GAE's whitening is the same code,
  checked above): the batch's advantages are the whitened ones, and the loss changes."""
  out = {}
  for whiten in (False, True):
    t = trainer_lib.Trainer(critic_free(**{"rl.whiten_advantages": whiten}), progress=False)
    try:
      t.setup("policy")
      batch, m = t.experience(next(t.state.prompts))
      um = t.update(batch, stage="rl", step=0, policy=True)
      out[whiten] = jax.device_get(batch), m, um
    finally:
      t.close()
  (b0, _, u0), (b1, m1, u1) = out[False], out[True]
  mask = b0.response_mask_BxR > 0
  np.testing.assert_array_equal(b0.tokens_BxL, b1.tokens_BxL)  # the same rollout
  raw = b0.advantages_BxR.astype(np.float64)[mask]
  np.testing.assert_allclose(b1.advantages_BxR[mask],
                             (raw - raw.mean()) / np.sqrt(raw.var() + 1e-8), rtol=1e-4,
                             atol=1e-4)
  assert abs(m1["adv/mean"]) < 1e-4 and abs(m1["adv/std"] - 1) < 1e-3
  assert abs(u0["pg_loss"] - u1["pg_loss"]) > 1e-6


@pytest.mark.parametrize("field, value, message", [
    ("rl.kl_coef", -0.1, "rl.kl_coef=-0.1: must be >= 0"),
    ("rl.dynamic_sampling_max_rounds", -1, "rl.dynamic_sampling_max_rounds=-1: must be >= 0"),
    ("rl.group_sampling", False, "rl.dynamic_sampling=True: must be False without groups"),
])
def test_baseline_fields_are_checked(field, value, message):
  c = load_config_file("tiny.py", "dapo")
  section, name = field.split(".")
  if field == "rl.group_sampling":  # dapo has no critic: keep the critic-free check quiet
    c.rl.advantage_estimator = "gae"
  c[section][name] = value
  with pytest.raises(config_lib.ConfigError, match=message.replace(".", r"\.")):
    config_lib.from_config_dict(c)
