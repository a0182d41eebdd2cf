"""Hand-written backward passes (models.matmul, attention.dense_attention and its causal
query blocks) against
autodiff, finite differences and a float64 NumPy reference."""

import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np
import pytest

from vapo_jax.models import attention
from vapo_jax.models.matmul import matmul
from vapo_jax.models.transformer import attention_mask


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True):
    yield


@pytest.mark.parametrize("x_shape,w_shape,n_in", [
    ((5, 3), (3, 4), 1),                 # [T, D] @ [D, F]
    ((2, 5, 3), (3, 2, 4), 1),           # btd,dhk->bthk
    ((2, 5, 2, 4), (2, 4, 3), 2),        # bthk,hkd->btd
    ((3,), (3, 6), 1),                   # no leading dims
    ((2, 1, 4, 3), (3, 7), 1),           # several leading dims
])
def test_matmul_equals_einsum_and_finite_differences(x_shape, w_shape, n_in):
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(*x_shape))
  w = jnp.asarray(rng.randn(*w_shape))
  want = jnp.tensordot(x, w, axes=n_in)
  np.testing.assert_allclose(matmul(x, w, n_in), want, rtol=1e-12)
  r = jnp.asarray(rng.randn(*want.shape))

  def loss(f):
    return lambda x, w: jnp.sum(jnp.sin(f(x, w)) * r)

  ours = jax.jit(jax.grad(loss(lambda x, w: matmul(x, w, n_in)), argnums=(0, 1)))(x, w)
  ref = jax.grad(loss(lambda x, w: jnp.tensordot(x, w, axes=n_in)), argnums=(0, 1))(x, w)
  for a, b in zip(ours, ref):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
  check_grads(lambda x, w: matmul(x, w, n_in), (x, w), order=1, modes=["rev"])


def test_matmul_mixed_precision_like_dot_general():
  """bfloat16 inputs with float32 accumulation: float32 out, gradients in the input dtypes."""
  rng = np.random.RandomState(1)
  x = jnp.asarray(rng.randn(4, 6), jnp.bfloat16)
  w = jnp.asarray(rng.randn(6, 5), jnp.bfloat16)
  y = matmul(x, w, 1, jnp.float32)
  assert y.dtype == jnp.float32
  want = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
  np.testing.assert_array_equal(y, want)
  f = lambda fn: lambda x, w: jnp.sum(fn(x, w) ** 2)  # noqa: E731
  ours = jax.grad(f(lambda x, w: matmul(x, w, 1, jnp.float32)), argnums=(0, 1))(x, w)
  ref = jax.grad(f(lambda x, w: jax.lax.dot_general(
      x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)),
                 argnums=(0, 1))(x, w)
  for a, b in zip(ours, ref):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-2, atol=2e-2)


def _numpy_attention(q, k, v, ok):
  """float64 reference: GQA softmax attention, head h uses kv head h // G; a row with no
  visible key averages all values (as jax.nn.dot_product_attention does)."""
  b, t, h, dh = q.shape
  nk = k.shape[2]
  out = np.zeros_like(q)
  for bi in range(b):
    for hi in range(h):
      kh = hi // (h // nk)
      s = q[bi, :, hi] @ k[bi, :, kh].T / np.sqrt(dh)
      s = np.where(ok[bi, 0], s, -1e300)
      s = s - s.max(-1, keepdims=True)
      p = np.exp(s)
      p /= p.sum(-1, keepdims=True)
      out[bi, :, hi] = p @ v[bi, :, kh]
  return out


@pytest.mark.parametrize("b,t,h,nk,dh", [(2, 7, 4, 2, 8), (3, 5, 6, 1, 4), (1, 9, 2, 2, 16),
                                         (2, 4, 8, 8, 2)])
def test_dense_attention_float64_reference_and_gradients(b, t, h, nk, dh):
  rng = np.random.RandomState(b * 100 + t)
  q, k, v = (rng.randn(b, t, n, dh) for n in (h, nk, nk))
  m = np.ones((b, t), np.int32)
  m[0, :3] = 0  # left padding: three query rows see no key at all
  mask = np.asarray(attention_mask(jnp.asarray(m), t))
  got = attention.dense_attention(*map(jnp.asarray, (q, k, v)), jnp.asarray(mask))
  np.testing.assert_allclose(got, _numpy_attention(q, k, v, mask), rtol=1e-10, atol=1e-12)
  check_grads(lambda q, k, v: attention.dense_attention(q, k, v, jnp.asarray(mask)),
              tuple(map(jnp.asarray, (q, k, v))), order=1, modes=["rev"], atol=1e-6,
              rtol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 3e-6), (jnp.bfloat16, 3e-2)])
def test_dense_attention_matches_jax_nn_forward_and_backward(dtype, tol):
  rng = np.random.RandomState(3)
  b, t, h, nk, dh = 2, 6, 4, 2, 8
  q, k, v = (jnp.asarray(rng.randn(b, t, n, dh), dtype) for n in (h, nk, nk))
  m = np.ones((b, t), np.int32)
  m[1, :2] = 0
  mask = attention_mask(jnp.asarray(m), t)
  r = jnp.asarray(rng.randn(b, t, h, dh), jnp.float32)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * r)

  ours = lambda q, k, v: attention.dense_attention(q, k, v, mask)  # noqa: E731
  ref = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask)  # noqa: E731
  assert ours(q, k, v).dtype == dtype
  np.testing.assert_allclose(np.float32(ours(q, k, v)), np.float32(ref(q, k, v)),
                             atol=tol, rtol=tol)
  for a, c in zip(jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v),
                  jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)):
    assert a.dtype == dtype
    np.testing.assert_allclose(np.float32(a), np.float32(c), atol=10 * tol, rtol=10 * tol)


@pytest.mark.parametrize("t,blocks", [(128, 2), (200, 3), (513, 8), (100, 1)])
def test_causal_dense_attention_float64_reference_and_gradients(t, blocks):
  """Query blocks that skip hidden keys: the float64 reference on every row that sees a key,
  and the gradients of the unsplit kernel when the rows that see none get no cotangent."""
  assert attention.causal_query_blocks(t) == blocks
  rng = np.random.RandomState(t)
  b, h, nk, dh = 2, 4, 2, 8
  q, k, v = (jnp.asarray(rng.randn(b, t, n, dh)) for n in (h, nk, nk))
  m = np.ones((b, t), np.int32)
  m[1, :37] = 0  # left padding across the first block boundary
  mask = attention_mask(jnp.asarray(m), t)
  got = attention.causal_dense_attention(q, k, v, mask)
  want = _numpy_attention(*map(np.asarray, (q, k, v)), np.asarray(mask))
  real = m == 1
  np.testing.assert_allclose(np.asarray(got)[real], want[real], rtol=1e-10, atol=1e-12)
  assert np.all(np.isfinite(got))
  r = jnp.asarray(rng.randn(b, t, h, dh) * real[:, :, None, None])

  def loss(fn):
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask)) * r)

  ours = jax.jit(jax.grad(loss(attention.causal_dense_attention), argnums=(0, 1, 2)))(q, k, v)
  ref = jax.grad(loss(attention.dense_attention), argnums=(0, 1, 2))(q, k, v)
  for a, c in zip(ours, ref):
    np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-11)


def test_causal_dense_attention_needs_self_attention_shapes():
  q = jnp.zeros((1, 64, 2, 4))
  k = jnp.zeros((1, 80, 2, 4))
  with pytest.raises(ValueError, match="S = T"):
    attention.causal_dense_attention(q, k, k, jnp.ones((1, 1, 64, 80), bool))


def test_rope_backward_is_the_inverse_rotation():
  """apply_rope's hand-written backward equals autodiff of the same rotation."""
  from vapo_jax.models import layers  # pylint: disable=import-outside-toplevel
  rng = np.random.RandomState(4)
  x = jnp.asarray(rng.randn(2, 5, 3, 8))
  pos = jnp.asarray(rng.randint(0, 50, (2, 5)))
  cos, sin = layers.rope_tables(pos, np.asarray([1.0, 0.3, 0.05, 0.001], np.float32))
  cos, sin = cos.astype(jnp.float64), sin.astype(jnp.float64)
  np.testing.assert_allclose(layers.apply_rope(x, cos, sin), layers._rotate(x, cos, sin))
  r = jnp.asarray(rng.randn(*x.shape))
  ours = jax.grad(lambda x: jnp.sum(layers.apply_rope(x, cos, sin) * r))(x)
  ref = jax.grad(lambda x: jnp.sum(layers._rotate(x, cos, sin) * r))(x)
  np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
  check_grads(lambda x: layers.apply_rope(x, cos, sin), (x,), order=1, modes=["rev"])
