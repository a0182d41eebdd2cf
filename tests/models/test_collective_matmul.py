"""models/collective_matmul.py: the ring all-gather matmul and matmul reduce-scatter equal
the whole collectives (values and gradients, float32, against a float64 numpy oracle) on 2
and 4 CPU devices, and lower to collective-permutes only (no all-gather, all-reduce or
reduce-scatter)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from vapo_jax.models import collective_matmul as cm


def _mesh(n):
  if jax.device_count() < n:
    pytest.skip(f"needs {n} devices")
  return Mesh(np.array(jax.devices()[:n]), ("tensor",))


def _data(n, t=3, k=8, m=5, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(2, n * t, k))          # [B, T, K], positions split over the shards
  w = rng.normal(size=(k, n * m))             # column-parallel: shard s holds columns s
  a = rng.normal(size=(2, n * t, n * m))      # row-parallel input: shard s holds K block s
  w2 = rng.normal(size=(n * m, k))            # row-parallel: shard s holds rows s
  return x, w, a, w2


def _ring(mesh, n):
  ag = jax.shard_map(functools.partial(cm.all_gather_matmul, axis_name="tensor", n=n),
                     mesh=mesh, in_specs=(P(None, "tensor", None), P(None, "tensor")),
                     out_specs=P(None, None, "tensor"))
  rs = jax.shard_map(functools.partial(cm.matmul_reduce_scatter, axis_name="tensor", n=n),
                     mesh=mesh, in_specs=(P(None, None, "tensor"), P("tensor", None)),
                     out_specs=P(None, "tensor", None))
  return ag, rs


@pytest.mark.floor
@pytest.mark.parametrize("n", [2, 4])
def test_values_and_gradients_equal_the_whole_matmul(n):
  mesh = _mesh(n)
  ag, rs = _ring(mesh, n)
  x, w, a, w2 = _data(n)
  f32 = lambda *v: [jnp.asarray(u, jnp.float32) for u in v]  # noqa: E731
  np.testing.assert_allclose(ag(*f32(x, w)), x @ w, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(rs(*f32(a, w2)), a @ w2, rtol=1e-5, atol=1e-5)
  # A loss through both, as a block uses them: rs(act(ag(x))) with a fixed cotangent.
  ct = np.random.default_rng(1).normal(size=(2, n * 3, x.shape[-1]))

  def ring_loss(x, w, w2):
    return jnp.sum(rs(jnp.tanh(ag(x, w)), w2) * ct)

  def whole_loss(x, w, w2):
    return jnp.sum((jnp.tanh(x @ w) @ w2) * ct)
  with jax.default_matmul_precision("highest"):
    got = jax.grad(ring_loss, argnums=(0, 1, 2))(*f32(x, w, w2))
  with jax.enable_x64(True):
    want = jax.grad(whole_loss, argnums=(0, 1, 2))(x, w, w2)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, np.asarray(r), rtol=2e-4, atol=2e-4)


def test_one_shard_is_a_plain_matmul():
  x, w, a, w2 = _data(1)
  np.testing.assert_allclose(cm.all_gather_matmul(x, w, "tensor", 1), x @ w)
  np.testing.assert_allclose(cm.matmul_reduce_scatter(a, w2, "tensor", 1), a @ w2)


def test_the_rings_lower_to_collective_permutes_only():
  n = 4
  mesh = _mesh(n)
  ag, rs = _ring(mesh, n)
  x, w, a, w2 = (jnp.asarray(u, jnp.float32) for u in _data(n))
  for fn, args in ((ag, (x, w)), (rs, (a, w2))):
    for prog in (jax.jit(fn), jax.jit(jax.grad(lambda *v, f=fn: jnp.sum(f(*v)), (0, 1)))):
      text = prog.lower(*args).compile().as_text()
      assert "collective-permute" in text
      for op in ("all-gather", "all-reduce", "reduce-scatter"):
        assert f" {op}(" not in text and f" {op}-start(" not in text, op


def test_positions_that_do_not_split_are_refused():
  mesh = _mesh(2)
  f = jax.shard_map(functools.partial(cm.matmul_reduce_scatter, axis_name="tensor", n=2),
                    mesh=mesh, in_specs=(P(None, None, "tensor"), P("tensor", None)),
                    out_specs=P(None, "tensor", None))
  with pytest.raises(ValueError, match="do not split"):
    f(jnp.ones((1, 3, 4)), jnp.ones((4, 2)))
