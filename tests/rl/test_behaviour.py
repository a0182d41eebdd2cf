"""rl.behaviour: the sampler/trainer log-prob gap and its two corrections, against numpy."""

import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.rl import behaviour


def _c(mode, cap=2.0, band=(0.5, 2.0)):
  return behaviour.Correction(mode=mode, cap=cap, band=band)


def _case():
  # Two responses of 4 and 2 tokens; r = π_old / π_b by hand: 1, 2, 0.25, e^0.1 | 3, 1.
  old = np.log(np.array([[0.5, 0.4, 0.05, 0.3], [0.9, 0.2, 0.0 + 1e-3, 0.7]]))
  ratio = np.array([[1.0, 2.0, 0.25, np.exp(0.1)], [3.0, 1.0, 7.0, 5.0]])
  beh = old - np.log(ratio)
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
  return old.astype(np.float32), beh.astype(np.float32), mask, ratio


def test_gap_metrics_by_hand():
  old, beh, mask, ratio = _case()
  got = {k: float(v) for k, v in behaviour.gap_metrics(old, beh, mask, (0.5, 2.0)).items()}
  r = ratio[mask > 0]
  assert got["rollout/logp_gap_abs"] == pytest.approx(np.mean(np.abs(np.log(r))), rel=1e-5)
  assert got["rollout/logp_gap_k3"] == pytest.approx(np.mean(r - 1 - np.log(r)), rel=1e-5)
  assert got["rollout/ratio_outside_frac"] == pytest.approx(2 / 6)  # 0.25 and 3
  # The band is the config's (rl.behaviour_band), the one the masked correction keeps.
  wide = behaviour.gap_metrics(old, beh, mask, (0.2, 4.0))
  assert float(wide["rollout/ratio_outside_frac"]) == pytest.approx(0.0)
  masked = np.asarray(behaviour.correction_weights(old, beh, mask, _c("mask", band=(0.2, 4.0))))
  assert float(wide["rollout/ratio_outside_frac"]) == pytest.approx(
      1 - masked[mask > 0].mean())


def test_corrections_by_hand():
  old, beh, mask, _ = _case()
  tis = np.asarray(behaviour.correction_weights(old, beh, mask, _c("tis", cap=2.5)))
  np.testing.assert_allclose(tis, [[1, 2, 0.25, np.exp(0.1)], [2.5, 1, 0, 0]], rtol=1e-5)
  masked = np.asarray(behaviour.correction_weights(old, beh, mask, _c("mask", band=(0.5, 2.0))))
  np.testing.assert_array_equal(masked, [[1, 1, 0, 1], [0, 1, 0, 0]])
  np.testing.assert_array_equal(
      np.asarray(behaviour.correction_weights(old, beh, mask, _c("none"))), mask)


@pytest.mark.parametrize("mode", behaviour.CORRECTIONS)
def test_no_gap_is_a_no_op(mode):
  old = jnp.log(jnp.linspace(0.05, 0.95, 12, dtype=jnp.float32)).reshape(3, 4)
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)
  np.testing.assert_array_equal(
      np.asarray(behaviour.correction_weights(old, old, mask, _c(mode))), np.asarray(mask))
  gap = behaviour.gap_metrics(old, old, mask, (0.5, 2.0))
  assert all(float(v) == 0.0 for v in gap.values())


def test_unknown_mode():
  with pytest.raises(ValueError, match="correction mode"):
    behaviour.correction_weights(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones((1, 1)),
                                 _c("clip"))


@pytest.mark.parametrize("mode", ["token", "seq_mean_token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_weighting_the_advantages_weights_each_tokens_surrogate(mode, dual_clip):
  """The corrections scale A_t by w_t ≥ 0 (rl.experience): for the clipped (and dual-clip)
  surrogate that is w_t times each token's term, checked here against a float64 sum."""
  from vapo_jax import losses  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  logp = np.log(rng.uniform(0.05, 0.9, (3, 5)))
  old = logp + rng.normal(0, 0.4, (3, 5))
  adv = rng.normal(0, 1, (3, 5))
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], np.float64)
  w = rng.uniform(0, 2.5, (3, 5)) * (rng.uniform(size=(3, 5)) > 0.2)
  eps_low, eps_high = 0.2, 0.28
  r = np.exp(logp - old)
  term = -np.minimum(r * adv, np.clip(r, 1 - eps_low, 1 + eps_high) * adv)
  if dual_clip:
    term = np.where(adv < 0, np.minimum(term, -dual_clip * adv), term)
  per_seq = (term * w * mask).sum(1)
  want = {"token": per_seq.sum(), "seq_mean_token_sum": per_seq.sum(),
          "seq_mean_token_mean": (per_seq / mask.sum(1)).sum()}[mode]
  got = losses.ppo_policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32),
                               jnp.asarray(adv * w, jnp.float32), jnp.asarray(mask, jnp.float32),
                               eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip,
                               mode=mode)
  assert float(got.loss.total) == pytest.approx(want, rel=1e-4, abs=1e-5)
