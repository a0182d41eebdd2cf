"""Losses against hand-written float64 formulas, and the exact-accumulation property."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import losses


# Written out, not read from losses.MODES: a renamed mode must fail here, not silently be
# tested under its new name against a reference that then takes its other branch.
MODES = ("token", "seq_mean_token_mean", "seq_mean_token_sum")


@pytest.mark.floor
def test_modes_are_the_documented_three():
  assert tuple(losses.MODES) == MODES


def batch(seed=0, b=6, t=11):
  rng = np.random.default_rng(seed)
  logp = -rng.random((b, t)) * 3
  old = logp + rng.normal(scale=0.4, size=(b, t))  # ratios spread well past the clip range
  adv = rng.normal(size=(b, t))
  lengths = rng.integers(1, t + 1, size=b)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  return (logp.astype(np.float32), old.astype(np.float32), adv.astype(np.float32), mask)


def ref_policy_per_token(logp, old, adv, eps_low, eps_high, dual=None):
  ratio = np.exp(logp.astype(np.float64) - old)
  out = np.empty_like(ratio)
  for idx in np.ndindex(ratio.shape):
    r, a = ratio[idx], float(adv[idx])
    val = -min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)
    if dual is not None and a < 0:
      val = min(val, -dual * a)
    out[idx] = val
  return out, ratio


def ref_aggregate(per_token, mask, mode):
  m = mask.astype(np.float64)
  if mode == "token":
    return (per_token * m).sum() / m.sum()
  rows = [i for i in range(m.shape[0]) if m[i].sum() > 0]
  if mode == "seq_mean_token_mean":
    return np.mean([(per_token[i] * m[i]).sum() / m[i].sum() for i in rows])
  return np.mean([(per_token[i] * m[i]).sum() for i in rows])


@pytest.mark.floor
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dual", [None, 3.0])
def test_policy_loss_matches_formula(mode, dual):
  logp, old, adv, mask = batch()
  out = losses.ppo_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28,
                               dual_clip=dual, mode=mode)
  per_token, ratio = ref_policy_per_token(logp, old, adv, 0.2, 0.28, dual)
  np.testing.assert_allclose(out.loss.value, ref_aggregate(per_token, mask, mode), rtol=1e-5)
  real = mask > 0
  low = ((adv < 0) & (ratio < 0.8) & real).sum() / real.sum()
  high = ((adv > 0) & (ratio > 1.28) & real).sum() / real.sum()
  assert low > 0 and high > 0  # the batch exercises both bounds
  np.testing.assert_allclose(out.metrics["clip_frac_low"], low, rtol=1e-6)
  np.testing.assert_allclose(out.metrics["clip_frac_high"], high, rtol=1e-6)
  np.testing.assert_allclose(out.metrics["ratio_max"], ratio[real].max(), rtol=1e-5)
  np.testing.assert_allclose(out.metrics["ratio_min"], ratio[real].min(), rtol=1e-5)
  k3 = np.exp(logp - old.astype(np.float64)) - 1 - (logp - old)
  np.testing.assert_allclose(out.metrics["approx_kl"], k3[real].mean(), rtol=1e-4)


def test_clip_higher_is_asymmetric():
  # ratio 1.25 with A > 0: inside [0.8, 1.28], so not clipped; 1.3 is clipped at 1.28.
  # ratio 0.75 with A < 0: clipped at 0.8 — the lower bound is unchanged.
  logp = np.log(np.array([[1.25, 1.3, 0.75]], np.float32))
  old = np.zeros_like(logp)
  adv = np.array([[1.0, 1.0, -1.0]], np.float32)
  mask = np.ones_like(logp)
  out = losses.ppo_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
  np.testing.assert_allclose(out.loss.total, -(1.25 + 1.28 - 0.8), rtol=1e-6)
  grads = jax.grad(lambda lp: losses.ppo_policy_loss(lp, old, adv, mask).loss.total)(logp)
  # d/dlogp of −ρ·A = −ρ·A for the unclipped token; clipped tokens get no gradient.
  np.testing.assert_allclose(grads, [[-1.25, 0.0, 0.0]], rtol=1e-5, atol=1e-7)
  sym = losses.ppo_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
  np.testing.assert_allclose(sym.loss.total, -(1.2 + 1.2 - 0.8), rtol=1e-6)


def test_masked_positions_are_ignored_even_if_not_finite():
  logp, old, adv, mask = batch(1)
  logp = np.where(mask > 0, logp, -np.inf).astype(np.float32)
  out = losses.ppo_policy_loss(logp, old, adv, mask)
  assert np.isfinite(out.loss.total)
  g = jax.grad(lambda lp: losses.ppo_policy_loss(lp, old, adv, mask).loss.total)(logp)
  assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[mask == 0] == 0)


@pytest.mark.floor
@pytest.mark.parametrize("mode", MODES)
def test_accumulation_over_microbatches_is_exact(mode):
  """Σ micro-batch (total, grad total) / whole-batch count == whole-batch loss and gradient."""
  logp, old, adv, mask = batch(2, b=8, t=13)
  scores = np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32)
  values = np.random.default_rng(3).normal(size=mask.shape).astype(np.float32)
  rets = np.random.default_rng(4).normal(size=mask.shape).astype(np.float32)

  def total_loss(lp, v, sl):
    pol = losses.ppo_policy_loss(lp, old[sl], adv[sl], mask[sl], mode=mode).loss
    nll = losses.positive_nll(lp, mask[sl], scores[sl])
    val = losses.value_loss(v, rets[sl], mask[sl], mode=mode).loss
    return pol, nll, val

  def objective(lp, v, sl, counts):
    pol, nll, val = total_loss(lp, v, sl)
    return pol.total / counts[0] + 0.1 * nll.total / counts[1] + val.total / counts[2]

  whole = slice(None)
  pol, nll, val = total_loss(logp, values, whole)
  counts = (losses.aggregation_count(mask, mode), nll.count, losses.aggregation_count(mask, mode))
  want = pol.value + 0.1 * nll.value + val.value
  want_grads = jax.grad(objective, argnums=(0, 1))(logp, values, whole, counts)

  got, got_grads = 0.0, [np.zeros_like(logp), np.zeros_like(values)]
  parts = [slice(0, 3), slice(3, 4), slice(4, 8)]  # uneven micro-batches
  sums = [losses.LossSum(0.0, 0.0)] * 3
  for sl in parts:
    got += objective(logp[sl], values[sl], sl, counts)
    g = jax.grad(objective, argnums=(0, 1))(logp[sl], values[sl], sl, counts)
    got_grads[0][sl] += g[0]
    got_grads[1][sl] += g[1]
    sums = [s + p for s, p in zip(sums, total_loss(logp[sl], values[sl], sl))]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(got_grads[0], want_grads[0], rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(got_grads[1], want_grads[1], rtol=1e-5, atol=1e-8)
  for s, w in zip(sums, (pol, nll, val)):
    np.testing.assert_allclose(s.total, w.total, rtol=1e-6)
    np.testing.assert_allclose(s.count, w.count, rtol=0)


@pytest.mark.floor
def test_positive_nll():
  logp, _, _, mask = batch(5)
  scores = np.array([1.0, 0.0, 1.0, 0.5, 0.0, 1.0], np.float32)
  out = losses.positive_nll(logp, mask, scores)
  correct = scores >= 1.0
  want = -(logp * mask)[correct].sum() / mask[correct].sum()
  np.testing.assert_allclose(out.value, want, rtol=1e-6)
  # The threshold is a parameter.
  half = losses.positive_nll(logp, mask, scores, threshold=0.5)
  sel = scores >= 0.5
  np.testing.assert_allclose(half.value, -(logp * mask)[sel].sum() / mask[sel].sum(), rtol=1e-6)
  # No correct response: the loss is 0, not NaN, and so is its gradient.
  none = losses.positive_nll(logp, mask, np.zeros_like(scores))
  assert float(none.value) == 0.0 and float(none.count) == 0.0
  g = jax.grad(lambda lp: losses.positive_nll(lp, mask, np.zeros_like(scores)).value)(logp)
  assert np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("lead", [(), (6,), (2, 3)])
@pytest.mark.parametrize("jit", [False, True])
def test_positive_nll_any_leading_dims(lead, jit):
  # [T], [B, T] and [B, G, T] give the float64 sum over correct responses' real tokens.
  rng = np.random.default_rng(7)
  t = 9
  logp = -rng.random(lead + (t,)).astype(np.float32)
  mask = (rng.random(lead + (t,)) < 0.7).astype(np.float32)
  scores = np.where(rng.random(lead) < 0.5, 1.0, 0.0).astype(np.float32)
  if not lead:
    scores = np.float32(1.0)
  fn = jax.jit(losses.positive_nll) if jit else losses.positive_nll
  out = fn(logp, mask, scores)
  w = mask.astype(np.float64) * (np.asarray(scores, np.float64) >= 1.0)[..., None]
  np.testing.assert_allclose(out.total, -(logp.astype(np.float64) * w).sum(), rtol=1e-6)
  np.testing.assert_allclose(out.count, w.sum(), rtol=0)
  with pytest.raises(ValueError, match="without its last"):
    losses.positive_nll(logp, mask, np.ones(lead + (t,), np.float32))


@pytest.mark.floor
def test_value_loss_and_clipping():
  _, _, _, mask = batch(6)
  rng = np.random.default_rng(6)
  v, r, old = (rng.normal(size=mask.shape).astype(np.float32) for _ in range(3))
  plain = losses.value_loss(v, r, mask)
  np.testing.assert_allclose(plain.loss.value, (0.5 * (v - r) ** 2 * mask).sum() / mask.sum(),
                             rtol=1e-6)
  clipped = losses.value_loss(v, r, mask, old_values=old, clip_eps=0.2)
  v_clip = old + np.clip(v - old, -0.2, 0.2)
  per = 0.5 * np.maximum((v - r) ** 2, (v_clip - r) ** 2)
  np.testing.assert_allclose(clipped.loss.value, (per * mask).sum() / mask.sum(), rtol=1e-6)
  with pytest.raises(ValueError, match="old_values"):
    losses.value_loss(v, r, mask, clip_eps=0.2)


@pytest.mark.floor
def test_explained_variance():
  _, _, _, mask = batch(7)
  r = np.random.default_rng(7).normal(size=mask.shape).astype(np.float32)
  np.testing.assert_allclose(losses.explained_variance(r, r, mask), 1.0, atol=1e-6)
  mean = (r * mask).sum() / mask.sum()
  np.testing.assert_allclose(losses.explained_variance(np.full_like(r, mean), r, mask), 0.0,
                             atol=1e-6)
  assert float(losses.explained_variance(r, np.ones_like(r), mask)) == 0.0  # no variance


def test_entropy_and_kl_estimators():
  rng = np.random.default_rng(8)
  logits = rng.normal(size=(3, 5, 17)).astype(np.float32)
  logits[0, 0, :4] = -np.inf  # masked vocabulary rows
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    want = -np.where(p > 0, p * np.log(p), 0).sum(-1)
  np.testing.assert_allclose(losses.entropy_from_logits(logits), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(losses.entropy_from_logits(logits.astype(jnp.bfloat16)), want,
                             rtol=3e-2)
  lp, ref = np.log(np.array([0.2, 0.5])), np.log(np.array([0.4, 0.25]))
  np.testing.assert_allclose(losses.kl_k1(lp, ref), lp - ref, rtol=1e-6)
  np.testing.assert_allclose(losses.kl_k2(lp, ref), 0.5 * (lp - ref) ** 2, rtol=1e-6)
  np.testing.assert_allclose(losses.kl_k3(lp, ref), np.exp(ref - lp) - 1 - (ref - lp),
                             rtol=1e-6)
  # Averaged over samples from π, k1 and k3 both estimate KL(π‖π_ref).
  pi, pref = np.array([0.6, 0.3, 0.1]), np.array([0.3, 0.3, 0.4])
  kl = (pi * np.log(pi / pref)).sum()
  for est in (losses.kl_k1, losses.kl_k3):
    np.testing.assert_allclose((pi * np.asarray(est(np.log(pi), np.log(pref)))).sum(), kl,
                               rtol=1e-5)


def test_masked_whiten_and_bad_mode():
  logp, _, adv, mask = batch(9)
  w = np.asarray(losses.masked_whiten(adv, mask))
  np.testing.assert_allclose(w[mask > 0].mean(), 0.0, atol=1e-5)
  np.testing.assert_allclose(w[mask > 0].std(), 1.0, atol=1e-4)
  assert np.all(w[mask == 0] == 0)
  with pytest.raises(ValueError, match="aggregation mode"):
    losses.ppo_policy_loss(logp, logp, adv, mask, mode="sequence")


def test_masked_whiten_matches_formula_with_and_without_mean_shift():
  _, _, adv, mask = batch(10)
  x, m = adv.astype(np.float64), mask > 0
  mean, var = x[m].mean(), x[m].var()
  for shift_mean, want in ((True, (x - mean) / np.sqrt(var + 1e-8)),
                           (False, (x - mean) / np.sqrt(var + 1e-8) + mean)):
    got = np.asarray(losses.masked_whiten(adv, mask, shift_mean=shift_mean))
    np.testing.assert_allclose(got[m], want[m], rtol=1e-5, atol=1e-6)
    assert np.all(got[~m] == 0)
