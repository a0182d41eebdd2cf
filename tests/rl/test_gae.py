"""GAE against an independent float64 reference (a plain loop over each row's real tokens)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import gae as gae_lib

# Written out, not read from gae_lib: a renamed or dropped implementation must fail here,
# not silently shrink the parametrisations below.
IMPLS = ("scan", "associative", "blocked")


@pytest.mark.floor
def test_implementations_are_the_documented_three():
  assert tuple(gae_lib.IMPLEMENTATIONS) == IMPLS


def reference_gae(rewards, values, mask, gamma, lam):
  """float64: compress each row to its real tokens, then the textbook backward recursion."""
  rewards, values, mask = (np.asarray(x, np.float64) for x in (rewards, values, mask))
  lead, t = rewards.shape[:-1], rewards.shape[-1]
  r, v, m = (x.reshape(-1, t) for x in (rewards, values, mask))
  lam = np.broadcast_to(np.asarray(lam, np.float64), lead).reshape(-1)
  adv = np.zeros_like(r)
  for n in range(r.shape[0]):
    idx = np.flatnonzero(m[n] > 0)
    running = 0.0
    for j in reversed(range(len(idx))):
      t_j = idx[j]
      next_v = v[n, idx[j + 1]] if j + 1 < len(idx) else 0.0
      delta = r[n, t_j] + gamma * next_v - v[n, t_j]
      running = delta + gamma * lam[n] * running
      adv[n, t_j] = running
  ret = (adv + v) * m
  return adv.reshape(rewards.shape), ret.reshape(rewards.shape)


def random_batch(seed, b=6, t=29, holes=True, dtype=np.float32):
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=(b, t))
  values = rng.normal(size=(b, t))
  lengths = rng.integers(0, t + 1, size=b)
  lengths[0], lengths[1] = 0, t  # an empty row and a full row
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float64)
  if holes:
    mask[2:] *= rng.random((b - 2, t)) > 0.25  # holes inside rows (e.g. tool output)
  lam = rng.random(b)
  return (rewards.astype(dtype), values.astype(dtype), mask.astype(dtype), lam.astype(dtype))


@pytest.mark.floor
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gamma", [1.0, 0.97])
@pytest.mark.parametrize("holes", [False, True])
def test_matches_float64_reference(impl, gamma, holes):
  for seed in range(3):
    r, v, m, lam = random_batch(seed, holes=holes)
    want_adv, want_ret = reference_gae(r, v, m, gamma, lam)
    adv, ret = gae_lib.gae(r, v, m, gamma=gamma, lam=lam, impl=impl)
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    np.testing.assert_allclose(adv, want_adv, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ret, want_ret, atol=2e-5, rtol=1e-5)
    # Masked positions are exactly zero.
    assert np.all(np.asarray(adv)[m == 0] == 0) and np.all(np.asarray(ret)[m == 0] == 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_long_rows_and_extreme_lambdas(impl):
  # Several block levels of the blocked solver (T > 8**3) and λ at both ends, γλ tiny.
  r, v, m, _ = random_batch(7, b=5, t=700, holes=True)
  lam = np.array([0.0, 1.0, 0.998, 1e-3, 0.5], np.float32)
  want_adv, _ = reference_gae(r, v, m, 0.999, lam)
  adv, _ = gae_lib.gae(r, v, m, gamma=0.999, lam=lam, impl=impl)
  np.testing.assert_allclose(adv, want_adv, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_lambda_one_is_monte_carlo_return(impl):
  r, v, m, _ = random_batch(1, holes=True)
  _, ret = gae_lib.gae(r, v, m, gamma=0.9, lam=1.0, impl=impl)
  # R_t = Σ over later real tokens of γ^(their rank − t's rank)·r: independent of V.
  r64, m64 = r.astype(np.float64), m.astype(np.float64)
  want = np.zeros_like(r64)
  for n in range(r.shape[0]):
    idx = np.flatnonzero(m64[n] > 0)
    for j, t in enumerate(idx):
      want[n, t] = sum(0.9**k * r64[n, s] for k, s in enumerate(idx[j:]))
  np.testing.assert_allclose(ret, want, atol=2e-5, rtol=1e-5)
  _, ret_other_v = gae_lib.gae(r, v * 3 + 1, m, gamma=0.9, lam=1.0, impl=impl)
  np.testing.assert_allclose(ret, ret_other_v, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_lambda_zero_is_td_error(impl):
  r, v, m, _ = random_batch(2, holes=False)
  adv, _ = gae_lib.gae(r, v, m, gamma=0.95, lam=0.0, impl=impl)
  next_v = np.concatenate([v[:, 1:] * m[:, 1:], np.zeros_like(v[:, :1])], axis=1)
  want = (r + 0.95 * next_v - v) * m
  np.testing.assert_allclose(adv, want, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_per_row_lambda_equals_each_row_alone(impl):
  r, v, m, lam = random_batch(3)
  adv, ret = gae_lib.gae(r, v, m, gamma=1.0, lam=lam, impl=impl)
  for i in range(r.shape[0]):
    a_i, r_i = gae_lib.gae(r[i], v[i], m[i], gamma=1.0, lam=float(lam[i]), impl=impl)
    np.testing.assert_allclose(adv[i], a_i, atol=1e-5)
    np.testing.assert_allclose(ret[i], r_i, atol=1e-5)


def test_implementations_agree_under_jit_and_extra_leading_dims():
  r, v, m, lam = random_batch(4, b=12, t=67)
  shape = (3, 4, 67)
  r, v, m, lam = r.reshape(shape), v.reshape(shape), m.reshape(shape), lam.reshape(3, 4)
  outs = []
  for impl in IMPLS:
    eager = gae_lib.gae(r, v, m, gamma=0.99, lam=lam, impl=impl)
    jitted = jax.jit(lambda *a, impl=impl: gae_lib.gae(*a, gamma=0.99, lam=lam, impl=impl))(
        r, v, m)
    np.testing.assert_allclose(eager[0], jitted[0], atol=1e-6)
    assert eager[0].shape == shape
    outs.append(jitted)
  for other in outs[1:]:
    np.testing.assert_allclose(outs[0][0], other[0], atol=2e-5)
    np.testing.assert_allclose(outs[0][1], other[1], atol=2e-5)


def test_bfloat16_inputs_compute_in_float32():
  r, v, m, _ = random_batch(5, b=3, t=300, holes=False)
  rb, vb = r.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  adv, _ = gae_lib.gae(rb, vb, m, gamma=1.0, lam=0.998)
  assert adv.dtype == jnp.float32
  want, _ = reference_gae(np.asarray(rb, np.float64), np.asarray(vb, np.float64), m, 1.0, 0.998)
  np.testing.assert_allclose(adv, want, atol=1e-3, rtol=1e-4)


def test_no_gradient_flows():
  r, v, m, lam = random_batch(6, holes=False)
  grad = jax.grad(lambda v: jnp.sum(gae_lib.gae(r, v, m, lam=lam)[0]))(jnp.asarray(v))
  assert np.all(np.asarray(grad) == 0)


@pytest.mark.floor
def test_length_adaptive_lambda():
  lam = gae_lib.length_adaptive_lambda(jnp.array([0, 1, 20, 100, 1000, 10000]), alpha=0.05)
  np.testing.assert_allclose(lam, [0.0, 0.0, 0.0, 0.8, 0.98, 0.998], atol=1e-6)
  with pytest.raises(ValueError, match="alpha"):
    gae_lib.length_adaptive_lambda(jnp.array([5]), alpha=0.0)


@pytest.mark.floor
def test_decoupled_gae_is_two_gae_calls():
  r, v, m, _ = random_batch(8, holes=False)
  out = gae_lib.decoupled_gae(r, v, m, gamma=1.0, alpha=0.05)
  lengths = m.sum(-1)
  lam = np.clip(1 - 1 / np.maximum(0.05 * lengths, 1.0), 0, 1)
  np.testing.assert_allclose(out.lam_policy, lam, atol=1e-6)
  want_adv, _ = reference_gae(r, v, m, 1.0, lam)
  _, want_ret = reference_gae(r, v, m, 1.0, np.ones_like(lam))
  np.testing.assert_allclose(out.advantages, want_adv, atol=2e-5)
  np.testing.assert_allclose(out.returns, want_ret, atol=2e-5)
  # A constant λ_policy (the "without length-adaptive GAE" ablation) is used as given.
  fixed = gae_lib.decoupled_gae(r, v, m, lam_policy=0.95)
  np.testing.assert_allclose(fixed.lam_policy, np.full(r.shape[0], 0.95), atol=1e-7)


def test_bad_inputs_raise_clear_errors():
  r, v, m, _ = random_batch(9)
  with pytest.raises(ValueError, match="same shape"):
    gae_lib.gae(r, v[:, :-1], m, lam=0.9)
  with pytest.raises(ValueError, match="lam must"):
    gae_lib.gae(r, v, m, lam=np.ones(r.shape[0] + 1))
  with pytest.raises(ValueError, match="impl"):
    gae_lib.gae(r, v, m, lam=0.9, impl="fast")
