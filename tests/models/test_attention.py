"""Blocked (flash-style) attention against dense attention and a float64 reference.

Also: the model with blocked attention against dense, activation sharding constraints, and
the compiled train step's temporaries growing linearly (not quadratically) in T.
"""

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
import pytest

from vapo_jax import sharding as shd
from vapo_jax.models import Transformer, positions_from_mask, tiny_config
from vapo_jax.models.attention import blocked_attention, causal_blocked_attention
from vapo_jax.models.transformer import attention_mask
from test_models_transformer import _batch as _model_batch  # left-padded model batch


def _inputs(b=3, t=37, s=None, h=4, k=2, dh=16, seed=0, dtype=np.float32):
  """q [B,T,H,Dh], k/v [B,S,K,Dh] and a left-padded key mask with mixed lengths."""
  s = t if s is None else s
  rng = np.random.RandomState(seed)
  q, kk, v = (rng.randn(b, n, m, dh).astype(dtype)
              for n, m in ((t, h), (s, k), (s, k)))
  mask = np.ones((b, s), np.int32)
  mask[1, :5] = 0
  mask[2, :min(20, s - 1)] = 0
  return q, kk, v, mask


def _reference(q, k, v, mask, q_offset=0):
  """float64 numpy attention; rows with no visible key give 0."""
  b, t, h, dh = q.shape
  s, nk = k.shape[1], k.shape[2]
  kk = np.repeat(k.astype(np.float64), h // nk, axis=2)
  vv = np.repeat(v.astype(np.float64), h // nk, axis=2)
  z = np.einsum("bthd,bshd->bhts", q.astype(np.float64), kk) / np.sqrt(dh)
  vis = ((np.arange(s)[None, :] <= q_offset + np.arange(t)[:, None])[None, None]
         & (mask[:, None, None, :] == 1))
  z = np.where(vis, z, -np.inf)
  zmax = np.max(z, axis=-1, keepdims=True)
  zmax = np.where(np.isfinite(zmax), zmax, 0.0)
  p = np.where(vis, np.exp(z - zmax), 0.0)
  den = p.sum(-1, keepdims=True)
  p = p / np.where(den > 0, den, 1.0)
  return np.einsum("bhts,bshd->bthd", p, vv)


def _real_rows(mask, t, q_offset=0):
  """[B, T] True where query i has at least one visible key."""
  s = mask.shape[1]
  vis = (np.arange(s)[None, :] <= q_offset + np.arange(t)[:, None])[None] & (
      mask[:, None, :] == 1)
  return vis.any(-1)


@pytest.mark.floor
@pytest.mark.parametrize("block", [8, 64])
def test_blocked_equals_dense_values_and_grads(block):
  q, k, v, mask = _inputs()
  t = q.shape[1]
  rows = jnp.asarray(_real_rows(mask, t), jnp.float32)[:, :, None, None]
  w = jnp.asarray(np.random.RandomState(1).randn(*q.shape), jnp.float32) * rows

  def dense(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, mask=attention_mask(mask, t))

  def blocked(q, k, v):
    return blocked_attention(q, k, v, mask, 0, block)

  out_d, out_b = dense(q, k, v), jax.jit(blocked)(q, k, v)
  np.testing.assert_allclose(out_b * rows, out_d * rows, atol=2e-6)
  np.testing.assert_array_equal(np.asarray(out_b)[~_real_rows(mask, t)], 0.0)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * w)  # noqa: E731
  g_d = jax.grad(loss(dense), (0, 1, 2))(q, k, v)
  g_b = jax.jit(jax.grad(loss(blocked), (0, 1, 2)))(q, k, v)
  for a, b in zip(g_b, g_d):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_blocked_float64_matches_reference_with_offset():
  # Queries 7..11 of a cache of 20 slots, of which the first 12 are written.
  q, k, v, mask = _inputs(t=5, s=20, dtype=np.float64)
  mask[:, 12:] = 0
  ref = _reference(q, k, v, mask, q_offset=7)
  with jax.enable_x64(True):
    out = blocked_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                            jnp.asarray(mask), jnp.int32(7), 6)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-12)
    # Gradients in float64 against central differences of the blocked function itself.
    w = np.random.RandomState(2).randn(*q.shape)
    f = lambda kk: jnp.sum(blocked_attention(  # noqa: E731
        jnp.asarray(q), kk, jnp.asarray(v), jnp.asarray(mask), 7, 6) * w)
    kk = jnp.asarray(k)
    g = np.asarray(jax.grad(f)(kk))
    d = np.random.RandomState(3).randn(*k.shape)
    eps = 1e-6
    fd = (f(kk + eps * d) - f(kk - eps * d)) / (2 * eps)
    np.testing.assert_allclose(np.sum(g * d), fd, rtol=1e-7)


def test_blocked_bfloat16_close_to_float64():
  q, k, v, mask = _inputs(seed=4)
  ref = _reference(q, k, v, mask)
  out = blocked_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), mask,
                          block=16)
  assert out.dtype == jnp.bfloat16
  rows = _real_rows(mask, q.shape[1])
  assert np.abs(np.asarray(out, np.float64) - ref)[rows].max() < 0.05


def test_model_blocked_equals_dense():
  tokens, mask = _model_batch()
  m = np.asarray(mask, bool)
  outs = []
  for impl in ("dense", "blocked"):
    cfg = tiny_config(attention_impl=impl, attention_block=4, remat=True)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def loss(state):
      mdl = nnx.merge(graphdef, state)
      h, _ = mdl(tokens, positions_from_mask(mask), mask)
      logits = mdl.logits(h)
      return jnp.sum(jnp.where(mask[..., None] == 1, logits, 0.0) ** 2), logits

    (val, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    outs.append((val, np.asarray(logits)[m], grads))
  (v0, l0, g0), (v1, l1, g1) = outs
  np.testing.assert_allclose(l1, l0, atol=1e-5)
  np.testing.assert_allclose(v1, v0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t,block", [(37, 8), (100, 8), (64, 64)])
def test_causal_blocked_skips_hidden_blocks_same_values_and_grads(t, block):
  """Query groups over key prefixes: the float64 reference, and blocked_attention's values and
  gradients (rows with no visible key: 0 and no gradient, as there)."""
  q, k, v, mask = _inputs(t=t, seed=t)
  rows = _real_rows(mask, t)
  w = jnp.asarray(np.random.RandomState(2).randn(*q.shape), jnp.float32)

  def full(q, k, v):
    return blocked_attention(q, k, v, mask, 0, block)

  def causal(q, k, v):
    return causal_blocked_attention(q, k, v, mask, block)

  out = jax.jit(causal)(q, k, v)
  np.testing.assert_allclose(out, _reference(q, k, v, mask), atol=2e-6)
  np.testing.assert_array_equal(np.asarray(out)[~rows], 0.0)
  np.testing.assert_allclose(out, full(q, k, v), atol=1e-6)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * w)  # noqa: E731
  for a, b in zip(jax.jit(jax.grad(loss(causal), (0, 1, 2)))(q, k, v),
                  jax.grad(loss(full), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_causal_blocked_needs_self_attention_shapes():
  q, k, v, mask = _inputs(t=16, s=24)
  with pytest.raises(ValueError, match="S = T"):
    causal_blocked_attention(q, k, v, mask, 8)


def test_auto_picks_blocked_for_long_sequences_only():
  cfg = tiny_config(attention_block=64)
  assert cfg.attention_impl == "auto"
  assert not cfg.blocked_attention(255, 255) and cfg.blocked_attention(256, 256)
  assert not cfg.blocked_attention(1, 4096)                  # decode step
  assert not tiny_config(attention_impl="dense").blocked_attention(9999, 9999)
  assert tiny_config(attention_impl="blocked").blocked_attention(2, 2)
  with pytest.raises(ValueError, match="attention_impl"):
    tiny_config(attention_impl="flash")


def _train_temp_bytes(t: int, **kw) -> int:
  """Temporaries of a compiled forward+backward of a 2-layer tiny model, batch 1 (the layers
  as a loop: the scan's stacked residuals, linear in T, would blur the attention's part)."""
  cfg = tiny_config(num_layers=2, remat=True, max_position_embeddings=1 << 16,
                    scan_layers=False, **kw)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))

  def loss(state, tokens, mask):
    h, _ = nnx.merge(graphdef, state)(tokens, positions_from_mask(mask), mask)
    return jnp.sum(jnp.square(h))

  tok = jax.ShapeDtypeStruct((1, t), jnp.int32)
  compiled = jax.jit(jax.grad(loss)).lower(state, tok, tok).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_train_step_temporaries_grow_linearly_in_sequence_length():
  # Dense attention holds T x T scores (about 9/16 of them in its 8 causal query blocks at
  # these lengths): doubling T quadruples that part (512 -> 1024: x3.15 in all). The default
  # (auto -> blocked here) holds T x block: doubling T about doubles everything (x2.01).
  blocked = [_train_temp_bytes(t, attention_block=32) for t in (512, 1024)]
  dense = [_train_temp_bytes(t, attention_impl="dense") for t in (512, 1024)]
  assert blocked[1] / blocked[0] < 2.3, blocked
  assert dense[1] / dense[0] > 2.8, dense
  assert blocked[1] < dense[1] / 2, (blocked, dense)


def test_activation_sharding_keeps_rows_on_the_batch_axes():
  # FSDP shards parameters over `embed`; without constraints XLA may shard activations over
  # D and replicate rows (every chip then computes every row). Inside `traced_under` the
  # hidden states stay split by rows.
  mesh = shd.make_mesh(1, 4, 2, devices=jax.devices()[:8])
  cfg = tiny_config(num_layers=1, hidden_size=64, intermediate_size=128, num_heads=4,
                    num_kv_heads=2)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  state_sh = shd.state_shardings(abstract, mesh)
  rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))

  def hidden(state, tokens, mask):
    return nnx.merge(graphdef, state)(tokens, positions_from_mask(mask), mask)[0]

  tok = jax.ShapeDtypeStruct((8, 16), jnp.int32)
  f = jax.jit(shd.traced_under(hidden, mesh), in_shardings=(state_sh, rows, rows))
  text = f.lower(abstract, tok, tok).as_text()
  assert "sharding_constraint" in text or "Sharding" in text
  out = f.lower(abstract, tok, tok).compile().output_shardings
  assert out.spec[0] in ("fsdp", ("fsdp",), ("data", "fsdp")), out
  assert all(a is None for a in tuple(out.spec)[1:]), out
