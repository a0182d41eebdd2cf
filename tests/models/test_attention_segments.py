"""Segment ids (packed rows) in the four attention paths, forward and hand-written backward.

Oracle: a float64 jax reference with the explicit rule "query i sees key j iff j <= i,
seg[j] == seg[i] and seg[j] > 0", its values and its autodiff gradients. Plus: a segment's
outputs do not move when another segment's keys/values do, and the blocked paths really
skip key blocks that are entirely padding or another segment (NaNs there stay unread).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.models import attention
from vapo_jax.models.transformer import attention_mask


def _segments(rows, t):
  """[B, T] int32 segment ids from per-row segment lengths (0 = tail padding)."""
  seg = np.zeros((len(rows), t), np.int32)
  for b, lens in enumerate(rows):
    at = 0
    for i, n in enumerate(lens):
      seg[b, at:at + n] = i + 1
      at += n
  return seg


def _inputs(seg, h=4, k=2, dh=8, seed=0):
  b, t = seg.shape
  rng = np.random.RandomState(seed)
  q = rng.randn(b, t, h, dh)
  kk = rng.randn(b, t, k, dh)
  v = rng.randn(b, t, k, dh)
  return q, kk, v


def _visible(seg):
  t = seg.shape[1]
  causal = np.arange(t)[None, :] <= np.arange(t)[:, None]
  same = seg[:, :, None] == seg[:, None, :]
  return causal[None] & same & (seg > 0)[:, None, :]          # [B, T(q), T(k)]


def _reference(q, k, v, vis):
  """float64 attention under an explicit [B, T, S] visibility; rows seeing nothing give 0."""
  h, nk = q.shape[2], k.shape[2]
  kk = jnp.repeat(k, h // nk, axis=2)
  vv = jnp.repeat(v, h // nk, axis=2)
  z = jnp.einsum("bthd,bshd->bhts", q, kk) / np.sqrt(q.shape[-1])
  ok = jnp.asarray(vis)[:, None]
  z = jnp.where(ok, z, -1e300)
  p = jnp.where(ok, jnp.exp(z - jnp.max(z, -1, keepdims=True)), 0.0)
  den = jnp.sum(p, -1, keepdims=True)
  p = p / jnp.where(den > 0, den, 1.0)
  return jnp.einsum("bhts,bshd->bthd", p, vv)


def _paths(seg, block):
  m = jnp.asarray(seg > 0)
  t = seg.shape[1]
  dense_mask = attention_mask(m, t)
  segj = jnp.asarray(seg)
  return {
      "dense": lambda q, k, v: attention.dense_attention(q, k, v, dense_mask, segj),
      "causal_dense": lambda q, k, v: attention.causal_dense_attention(
          q, k, v, dense_mask, segj),
      "blocked": lambda q, k, v: attention.blocked_attention(q, k, v, m, 0, block, segj),
      "causal_blocked": lambda q, k, v: attention.causal_blocked_attention(
          q, k, v, m, block, segj),
  }


ROWS = [[5, 1, 17, 9], [30, 3], [64], [2, 2, 2]]   # T = 70: a full row, tails of padding


@pytest.mark.parametrize("path", ["dense", "causal_dense", "blocked", "causal_blocked"])
def test_segments_float64_reference_values_and_gradients(path):
  seg = _segments(ROWS, 70)
  vis = _visible(seg)
  real = vis.any(-1)                                           # queries that see a key
  with jax.enable_x64(True):
    q, k, v = map(jnp.asarray, _inputs(seg))
    w = jnp.asarray(np.random.RandomState(1).randn(*q.shape)) * real[:, :, None, None]
    fn = _paths(seg, 8)[path]
    got = jax.jit(fn)(q, k, v)
    ref = _reference(q, k, v, vis)
    np.testing.assert_allclose(np.asarray(got) * real[:, :, None, None],
                               np.asarray(ref) * real[:, :, None, None], atol=1e-12)
    loss = lambda f: lambda *a: jnp.sum(f(*a) * w)  # noqa: E731
    g = jax.jit(jax.grad(loss(fn), (0, 1, 2)))(q, k, v)
    g_ref = jax.grad(loss(lambda *a: _reference(*a, vis)), (0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref):
      np.testing.assert_allclose(a, b, atol=1e-11)


@pytest.mark.parametrize("path", ["dense", "causal_dense", "blocked", "causal_blocked"])
def test_a_segment_never_sees_another_segments_keys(path):
  """Changing segment 2's keys and values moves no output (or gradient) of segment 1 or 3."""
  seg = _segments([[12, 20, 9]], 41)
  q, k, v = map(jnp.asarray, _inputs(seg))
  other = jnp.asarray(seg == 2)[:, :, None, None]
  k2 = jnp.where(other, 10.0 * k + 3.0, k)
  v2 = jnp.where(other, -5.0 * v + 1.0, v)
  fn = jax.jit(_paths(seg, 8)[path])
  a, b = np.asarray(fn(q, k, v)), np.asarray(fn(q, k2, v2))
  keep = (seg != 2)[0]
  np.testing.assert_array_equal(a[:, keep], b[:, keep])
  assert not np.allclose(a[:, ~keep], b[:, ~keep])
  gq = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)[:, keep] ** 2)))
  np.testing.assert_allclose(gq(q, k, v), gq(q, k2, v2), rtol=1e-6, atol=1e-6)


def test_without_segments_unchanged_and_segments_of_one_id_equal_the_key_mask():
  """One segment per row (ids = the key mask) gives what the plain kernels give."""
  seg = _segments([[40], [33]], 40)
  q, k, v = map(jnp.asarray, _inputs(seg, seed=3))
  m = jnp.asarray(seg > 0)
  for with_seg, plain in [
      (attention.causal_blocked_attention(q, k, v, m, 8, jnp.asarray(seg)),
       attention.causal_blocked_attention(q, k, v, m, 8)),
      (attention.blocked_attention(q, k, v, m, 0, 8, jnp.asarray(seg)),
       attention.blocked_attention(q, k, v, m, 0, 8))]:
    real = np.asarray(seg > 0)[:, :, None, None]
    np.testing.assert_array_equal(np.asarray(with_seg) * real, np.asarray(plain) * real)


def test_interleaved_segments_still_exact():
  """Ids that do not rise along the row: the block test is only conservative, the mask exact."""
  seg = np.array([[1] * 6 + [2] * 6 + [1] * 6 + [3] * 6 + [2] * 6 + [0] * 2], np.int32)
  vis = _visible(seg)
  real = vis.any(-1)[:, :, None, None]
  with jax.enable_x64(True):
    q, k, v = map(jnp.asarray, _inputs(seg, seed=5))
    ref = np.asarray(_reference(q, k, v, vis)) * real
    for fn in _paths(seg, 4).values():
      np.testing.assert_allclose(np.asarray(jax.jit(fn)(q, k, v)) * real, ref, atol=1e-12)


@pytest.mark.parametrize("path", ["blocked", "causal_blocked"])
def test_blocked_paths_skip_blocks_of_padding_and_other_segments(path):
  """NaN keys/values in blocks that are wholly padding or another segment, in every row, are
  never read: output and gradients stay finite and equal the clean run."""
  t, c = 64, 8
  # Rows of three segments each: [0, 16), [16, 40), [40, 56), then padding [56, 64).
  seg = _segments([[16, 24, 16], [16, 24, 10]], t)
  q, k, v = map(jnp.asarray, _inputs(seg, seed=7))
  fn = jax.jit(_paths(seg, c)[path])
  # Segment 3's queries (slots 40..) can only use key blocks 5, 6 (slots 40..56); blocks
  # 0-4 are segments 1-2 and block 7 is padding in both rows. Poison blocks 0-1 (segment 1)
  # and block 7 (padding) for segment 3's queries: only segment 3's outputs are checked.
  poison = np.zeros((t,), bool)
  poison[0:16] = True
  poison[56:64] = True
  pz = jnp.asarray(poison)[None, :, None, None]
  kn, vn = jnp.where(pz, jnp.nan, k), jnp.where(pz, jnp.nan, v)
  mine = np.asarray(seg[0] == 3)
  # Only the group/blocks that hold segment 3's queries must skip: for the causal path
  # the groups at and after slot 40 do; for the one-group path every query shares one
  # group, so there the poisoned blocks are read unless the whole batch skips them:
  # compare only where the path promises a skip.
  if path == "blocked":
    # One query group covering all queries, which include segment 1's: the padding block
    # 7 is still skipped (no row has a real key there); block 0-1 is not. Poison only 7.
    pz = jnp.asarray(np.arange(t) >= 56)[None, :, None, None]
    kn, vn = jnp.where(pz, jnp.nan, k), jnp.where(pz, jnp.nan, v)
    mine = np.asarray(seg[0] > 0)
  clean, dirty = np.asarray(fn(q, k, v)), np.asarray(fn(q, kn, vn))
  np.testing.assert_array_equal(dirty[:, mine], clean[:, mine])
  w = jnp.asarray(np.random.RandomState(2).randn(*q.shape) * mine[None, :, None, None])
  g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), (0, 1, 2)))
  for a, b in zip(g(q, kn, vn), g(q, k, v)):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_array_equal(a[:, ~poison] if a.shape[1] == t else a,
                                  b[:, ~poison] if b.shape[1] == t else b)


def test_live_block_table_counts():
  """The per-(group, block) verdicts on a packed row: dead = another segment or padding."""
  seg = jnp.asarray(_segments([[16, 24, 16]], 64))
  valid = seg > 0
  k = jnp.zeros((1, 64, 1, 2))
  _, _, valid_b, slot, segs = attention._blocks(k, k, valid, 8, seg)
  q_all = jnp.arange(64, dtype=jnp.int32)
  live = attention._live_blocks(valid_b, slot, segs, q_all, seg)
  np.testing.assert_array_equal(live, [1, 1, 1, 1, 1, 1, 1, 0])   # one group: pad skipped
  q3 = jnp.arange(40, 48, dtype=jnp.int32)                          # a group in segment 3
  live3 = attention._live_blocks(valid_b, slot, segs, q3, seg[:, 40:48])
  np.testing.assert_array_equal(live3, [0, 0, 0, 0, 0, 1, 0, 0])   # later blocks: causal
