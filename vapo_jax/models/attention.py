"""Memory-efficient (blocked, flash-style) causal attention in pure JAX.

Shapes: B batch, T queries, S keys, H query heads, K key/value heads (GQA,
G = H / K query heads per kv head, query head h = k * G + g), Dh head width,
C keys per block, N = ceil(S / C) blocks.

Query i sits at absolute slot `q_offset + i`; key j at slot j. Query i sees
key j iff `j <= q_offset + i` and `kv_mask[b, j]`, the same rule as the dense
mask of `transformer.attention_mask`. With scores s_ij = q_i . k_j / sqrt(Dh)
restricted to visible keys, the output is

  o_i = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij).

The forward pass scans over key blocks with an online softmax: carrying the
running max m_i, normaliser l_i and unnormalised output a_i, each block c does

  m'_i = max(m_i, max_{j in c} s_ij),   r = exp(m_i - m'_i),
  l'_i = r l_i + sum_{j in c} exp(s_ij - m'_i),
  a'_i = r a_i + sum_{j in c} exp(s_ij - m'_i) v_j,

and o_i = a_i / l_i at the end. The backward pass (a `jax.custom_vjp`)
recomputes each block's probabilities from the saved lse, p_ij = exp(s_ij -
lse_i), and with D_i = do_i . o_i accumulates

  dv_j = sum_i p_ij do_i,   ds_ij = p_ij (do_i . v_j - D_i),
  dq_i = sum_j ds_ij k_j / sqrt(Dh),   dk_j = sum_i ds_ij q_i / sqrt(Dh).

Nothing of size T x S is ever held: forward and backward keep O(B H T C)
scores plus O(B H T Dh) carries, and the saved residuals are q, k, v, o and
lse. A query with no visible key (a left-padding slot) gets o_i = 0 and no
gradient (the dense path gives it the mean of all values instead; neither
reaches a real token, whose keys exclude padding).

Packed rows (segment ids). Every kernel here also takes `segment_ids_BxS`,
int32 per slot (0 = padding, s > 0 = the s-th sequence laid in the row), for
self-attention without a cache (queries at the key slots, S = T). Query i then
sees key j iff additionally seg[j] == seg[i] and seg[j] > 0, so a segment never
sees another segment's keys (and a padding query sees nothing). What is
skipped, not merely masked:
  - `causal_blocked_attention`: key blocks after every query of a query group
    (static), and key blocks in which no key can be visible to any query of
    the group in any row: blocks entirely padding, or whose real keys' segment
    ids [min, max] do not meet the group's [min, max] (for packed rows, whose
    ids rise along the row, that is every block of another segment). The test
    is per (group, block) over the whole batch, taken once before the key
    scan, and a skipped block costs a `lax.cond` that does nothing, in the
    forward and the backward pass.
  - `blocked_attention`: the same segment/padding test per key block over all
    queries (it has one query group), plus key blocks after the last query.
  - `dense_attention`, `causal_dense_attention`: the segment rule is one more
    mask term; nothing dynamic is skipped (the causal one skips the static
    causally hidden key ranges only).
  - `splash_causal_attention` (TPU, `model.attention_kernel`): jax's fused Pallas
    splash kernel with block tables built per row and per query block from the
    segment ids (`models.splash_attention`): the key blocks of padding, of other
    segments and after the query block are never visited.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

# Score of a hidden key: finite so that exp(NEG - NEG) stays well defined.
_NEG = -1e30


def _blocks(k_BxSxKxDh: jax.Array, v_BxSxKxDh: jax.Array,
            kv_mask_BxS: jax.Array, block: int, seg_BxS: jax.Array | None = None):
  """Keys, values, key mask, key slots (and key segments) cut into N blocks of C.

  Returns k, v [N, B, C, K, Dh], valid [N, B, C] bool, slot [N, C] int32 and
  seg [N, B, C] int32 (None without segments). S is padded up to N * C with
  hidden keys (segment 0).
  """
  b, s, nk, dh = k_BxSxKxDh.shape
  c = max(1, min(block, s))
  n = -(-s // c)
  pad = n * c - s

  def cut(x):
    x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
    return x.reshape((b, n, c) + x.shape[2:]).swapaxes(0, 1)

  valid = cut(kv_mask_BxS.astype(bool))
  slot = jnp.arange(n * c, dtype=jnp.int32).reshape(n, c)
  segs = None
  if seg_BxS is not None:
    segs = cut(seg_BxS.astype(jnp.int32))
    valid = valid & (segs > 0)
  return cut(k_BxSxKxDh), cut(v_BxSxKxDh), valid, slot, segs


def _visible(valid_BxC: jax.Array, slot_C: jax.Array, qslot_T: jax.Array,
             seg_BxC: jax.Array | None = None, qseg_BxT: jax.Array | None = None
             ) -> jax.Array:
  """Boolean [B, 1, 1, T, C]: key slot <= query slot, key is real [and same segment]."""
  causal_TxC = slot_C[None, :] <= qslot_T[:, None]
  vis = causal_TxC[None, None, None] & valid_BxC[:, None, None, None, :]
  if seg_BxC is not None:
    vis = vis & (seg_BxC[:, None, :] == qseg_BxT[:, :, None])[:, None, None]
  return vis


_BIG = 2 ** 30


def _live_blocks(valid, slot, segs, qslot_T, qseg_BxT):
  """Bool [N]: key block c may hold a key visible to some query (else it is skipped).

  Block c is dead iff its first slot is after the last query, or in every row either
  it has no real key, or (with segments) the real keys' segment ids [kmin, kmax] and
  the real queries' [qmin, qmax] do not overlap. A live verdict is conservative (the
  mask still decides each pair); a dead one is exact: no pair of the block is visible.
  """
  live = slot[:, 0] <= qslot_T[-1]                              # [N]
  if segs is None:
    return live & jnp.any(valid, axis=(1, 2))
  kmin = jnp.min(jnp.where(valid, segs, _BIG), axis=-1)        # [N, B]
  kmax = jnp.max(jnp.where(valid, segs, -1), axis=-1)
  qreal = qseg_BxT > 0
  qmin = jnp.min(jnp.where(qreal, qseg_BxT, _BIG), axis=-1)    # [B]
  qmax = jnp.max(jnp.where(qreal, qseg_BxT, -1), axis=-1)
  meet = (kmin <= qmax[None]) & (qmin[None] <= kmax)           # [N, B]
  return live & jnp.any(meet, axis=1)


def _acc(x: jax.Array):
  """Accumulation dtype: float32, or float64 for float64 inputs."""
  return jnp.promote_types(x.dtype, jnp.float32)


def _scores(q_BxKxGxTxDh, k_BxCxKxDh):
  """s = q k^T / sqrt(Dh), [B, K, G, T, C] in the accumulation dtype."""
  scale = 1.0 / math.sqrt(q_BxKxGxTxDh.shape[-1])
  return jnp.einsum("bkgtd,bckd->bkgtc", q_BxKxGxTxDh, k_BxCxKxDh,
                    preferred_element_type=_acc(q_BxKxGxTxDh)) * scale


def _forward(q, k, v, kv_mask, q_offset, block, seg=None, qseg=None):
  """(o [B, K, G, T, Dh], lse [B, K, G, T]), in the accumulation dtype.

  seg [B, S] / qseg [B, T]: key / query segment ids, or None (no segment rule).
  Key blocks `_live_blocks` rules out are skipped (`lax.cond`).
  """
  b, nk, g, t, dh = q.shape
  acc = _acc(q)
  kb, vb, valid, slot, segs = _blocks(k, v, kv_mask, block, seg)
  qslot = jnp.asarray(q_offset, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
  live = _live_blocks(valid, slot, segs, qslot, qseg)
  segs = valid if segs is None else segs   # a scan operand either way

  def step(carry, k_c, v_c, valid_c, slot_c, seg_c):
    m, l, a = carry
    vis = _visible(valid_c, slot_c, qslot, None if seg is None else seg_c, qseg)
    s = jnp.where(vis, _scores(q, k_c), _NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.where(vis, jnp.exp(s - m_new[..., None]), 0.0)
    r = jnp.exp(m - m_new)
    l = r * l + jnp.sum(p, axis=-1)
    pv = jnp.einsum("bkgtc,bckd->bkgtd", p.astype(v_c.dtype), v_c,
                    preferred_element_type=acc)
    return (m_new, l, r[..., None] * a + pv)

  def body(carry, xs):
    live_c, *rest = xs
    return jax.lax.cond(live_c, step, lambda c, *_: c, carry, *rest), None

  init = (jnp.full((b, nk, g, t), _NEG, acc),
          jnp.zeros((b, nk, g, t), acc),
          jnp.zeros((b, nk, g, t, dh), acc))
  (m, l, a), _ = jax.lax.scan(body, init, (live, kb, vb, valid, slot, segs))
  l_safe = jnp.where(l > 0, l, 1.0)
  return a / l_safe[..., None], m + jnp.log(l_safe)


def _backward(q, k, v, kv_mask, q_offset, block, o, lse, do, seg=None, qseg=None):
  """(dq [B, K, G, T, Dh], dk, dv [B, S, K, Dh]), in the accumulation dtype.

  Skips the key blocks `_forward` skipped (their dk, dv are 0).
  """
  b, s, nk, dh = k.shape
  acc = _acc(q)
  t = q.shape[3]
  kb, vb, valid, slot, segs = _blocks(k, v, kv_mask, block, seg)
  qslot = jnp.asarray(q_offset, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
  live = _live_blocks(valid, slot, segs, qslot, qseg)
  segs = valid if segs is None else segs
  scale = 1.0 / math.sqrt(dh)
  d_i = jnp.sum(do * o, axis=-1)                    # [B, K, G, T]
  do_c = do.astype(v.dtype)
  c = kb.shape[2]

  def skip(dq, *_):
    zero = jnp.zeros((b, c, nk, dh), acc)
    return dq, (zero, zero)

  def body(dq, xs):
    live_c, *rest = xs
    return jax.lax.cond(live_c, step, skip, dq, *rest)

  def step(dq, k_c, v_c, valid_c, slot_c, seg_c):
    vis = _visible(valid_c, slot_c, qslot, None if seg is None else seg_c, qseg)
    p = jnp.where(vis, jnp.exp(_scores(q, k_c) - lse[..., None]), 0.0)
    dv_c = jnp.einsum("bkgtc,bkgtd->bckd", p.astype(v.dtype), do_c,
                      preferred_element_type=acc)
    dp = jnp.einsum("bkgtd,bckd->bkgtc", do_c, v_c,
                    preferred_element_type=acc)
    ds = (p * (dp - d_i[..., None]) * scale).astype(q.dtype)
    dq = dq + jnp.einsum("bkgtc,bckd->bkgtd", ds, k_c,
                         preferred_element_type=acc)
    dk_c = jnp.einsum("bkgtc,bkgtd->bckd", ds, q,
                      preferred_element_type=acc)
    return dq, (dk_c, dv_c)

  dq, (dk, dv) = jax.lax.scan(body, jnp.zeros(q.shape, acc),
                              (live, kb, vb, valid, slot, segs))

  def join(x_NxBxCxKxDh):
    x = x_NxBxCxKxDh.swapaxes(0, 1).reshape((b, -1, nk, dh))
    return x[:, :s]

  return dq, join(dk), join(dv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attend(q, k, v, kv_mask, q_offset, block, seg, qseg):
  return _forward(q, k, v, kv_mask, q_offset, block, seg, qseg)[0]


def _attend_fwd(q, k, v, kv_mask, q_offset, block, seg, qseg):
  o, lse = _forward(q, k, v, kv_mask, q_offset, block, seg, qseg)
  return o, (q, k, v, kv_mask, q_offset, o, lse, seg, qseg)


def _attend_bwd(block, res, do):
  q, k, v, kv_mask, q_offset, o, lse, seg, qseg = res
  dq, dk, dv = _backward(q, k, v, kv_mask, q_offset, block, o, lse, do, seg, qseg)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
          None, None, None, None)


_attend.defvjp(_attend_fwd, _attend_bwd)


def _check_segments(segment_ids, s: int, t: int, what: str):
  if segment_ids is not None and (segment_ids.ndim != 2 or segment_ids.shape[1] != s
                                  or s < t):
    raise ValueError(f"{what}: segment_ids must be [B, S={s}] with S >= T={t}, got "
                     f"{segment_ids.shape}.")


def blocked_attention(q_BxTxHxDh: jax.Array, k_BxSxKxDh: jax.Array,
                      v_BxSxKxDh: jax.Array, kv_mask_BxS: jax.Array,
                      q_offset: jax.Array | int = 0, block: int = 512,
                      segment_ids_BxS: jax.Array | None = None) -> jax.Array:
  """Causal GQA attention over key blocks; [B, T, H, Dh] in q's dtype.

  Args:
    q_BxTxHxDh: queries (RoPE applied), compute dtype.
    k_BxSxKxDh: keys, same dtype; H % K == 0.
    v_BxSxKxDh: values, same dtype.
    kv_mask_BxS: 1/True where key slot j holds a real token.
    q_offset: absolute slot of query 0 (int or traced int32 scalar): query i
      sees key j iff j <= q_offset + i and the key is real.
    block: keys per block C; memory is O(B H T C), and S need not be a
      multiple of it.
    segment_ids_BxS: None, or int32 segment id per key slot (0: padding);
      query i's segment is that of its slot q_offset + i, and it sees key j
      only if seg[j] == its segment and seg[j] > 0. Key blocks with no
      possibly visible key are skipped (see the module docstring).

  Returns:
    softmax(q k^T / sqrt(Dh)) v over the visible keys, 0 for a query that
    sees none. Differentiable in q, k, v with an O(B H T C) backward.
  """
  b, t, h, dh = q_BxTxHxDh.shape
  nk = k_BxSxKxDh.shape[2]
  _check_segments(segment_ids_BxS, k_BxSxKxDh.shape[1], t, "blocked_attention")
  q_offset = jnp.asarray(q_offset, jnp.int32)
  qseg = None
  if segment_ids_BxS is not None:
    segment_ids_BxS = segment_ids_BxS.astype(jnp.int32)
    qseg = jax.lax.dynamic_slice_in_dim(segment_ids_BxS, q_offset, t, axis=1)
  q = q_BxTxHxDh.reshape(b, t, nk, h // nk, dh).transpose(0, 2, 3, 1, 4)
  o = _attend(q, k_BxSxKxDh, v_BxSxKxDh, kv_mask_BxS, q_offset, int(block),
              segment_ids_BxS, qseg)
  return o.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh).astype(
      q_BxTxHxDh.dtype)


def splash_causal_attention(q_BxTxHxDh: jax.Array, k_BxTxKxDh: jax.Array,
                            v_BxTxKxDh: jax.Array, mask: jax.Array,
                            segment_ids_BxT: jax.Array | None = None, block: int = 512,
                            mesh_rules=None, interpret: bool = False) -> jax.Array:
  """`causal_blocked_attention` by jax's splash kernel (TPU; `models.splash_attention`).

  mask: the [B, T] key mask, or the dense [B, 1, T, T] causal mask of
  `transformer.attention_mask` (its last query row is the key mask). Same values as
  `causal_blocked_attention(q, k, v, key_mask, block, segment_ids)` up to float
  rounding (0 for a query that sees no key); mesh_rules: the activation (mesh, rules)
  it runs under (`sharding.activation_mesh`), or None.
  """
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  t = q_BxTxHxDh.shape[1]
  key_mask = (mask if mask.ndim == 2 else mask[:, 0, -1, :]).astype(bool)
  _check_segments(segment_ids_BxT, key_mask.shape[1], t, "splash_causal_attention")
  seg = (jnp.ones(key_mask.shape, jnp.int32) if segment_ids_BxT is None
         else segment_ids_BxT.astype(jnp.int32))
  seg = jnp.where(key_mask, seg, 0)
  if interpret:
    return splash_attention.splash_attention(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, seg,
                                             block, interpret=True)
  return splash_attention.self_attention(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, seg, block,
                                         mesh_rules)


def _query_groups(t: int, block: int, groups: int = 8) -> list[tuple[int, int]]:
  """Up to `groups` query ranges [a, e) covering [0, t), cut at multiples of `block`."""
  c = max(1, min(block, t))
  n_blocks = -(-t // c)
  n = max(1, min(groups, n_blocks))
  cuts = sorted({min(t, round(i * n_blocks / n) * c) for i in range(n + 1)})
  return list(zip(cuts[:-1], cuts[1:]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attend_causal(q, k, v, kv_mask, block, seg):
  return _causal_forward(q, k, v, kv_mask, block, seg)[0]


def _sl(seg, a, e):
  return None if seg is None else seg[:, a:e]


def _causal_forward(q, k, v, kv_mask, block, seg):
  """`_forward` per query group [a, e) over keys [0, e) only (q_offset 0, S = T)."""
  outs, lses = [], []
  for a, e in _query_groups(q.shape[3], block):
    o, lse = _forward(q[:, :, :, a:e], k[:, :e], v[:, :e], kv_mask[:, :e], a, block,
                      _sl(seg, 0, e), _sl(seg, a, e))
    outs.append(o)
    lses.append(lse)
  return jnp.concatenate(outs, axis=3), jnp.concatenate(lses, axis=3)


def _attend_causal_fwd(q, k, v, kv_mask, block, seg):
  o, lse = _causal_forward(q, k, v, kv_mask, block, seg)
  return o, (q, k, v, kv_mask, o, lse, seg)


def _attend_causal_bwd(block, res, do):
  q, k, v, kv_mask, o, lse, seg = res
  acc = _acc(q)
  dqs = []
  dk = jnp.zeros(k.shape, acc)
  dv = jnp.zeros(v.shape, acc)
  for a, e in _query_groups(q.shape[3], block):
    dq_g, dk_g, dv_g = _backward(
        q[:, :, :, a:e], k[:, :e], v[:, :e], kv_mask[:, :e], a, block,
        o[:, :, :, a:e], lse[:, :, :, a:e], do[:, :, :, a:e],
        _sl(seg, 0, e), _sl(seg, a, e))
    dqs.append(dq_g)
    dk = dk.at[:, :e].add(dk_g)
    dv = dv.at[:, :e].add(dv_g)
  return (jnp.concatenate(dqs, axis=3).astype(q.dtype), dk.astype(k.dtype),
          dv.astype(v.dtype), None, None)


_attend_causal.defvjp(_attend_causal_fwd, _attend_causal_bwd)


def causal_blocked_attention(q_BxTxHxDh: jax.Array, k_BxTxKxDh: jax.Array,
                             v_BxTxKxDh: jax.Array, kv_mask_BxT: jax.Array,
                             block: int = 512,
                             segment_ids_BxT: jax.Array | None = None) -> jax.Array:
  """`blocked_attention` for self-attention from slot 0 that skips hidden key blocks.

  Queries and keys share slots 0..T-1 (q_offset = 0, S = T). The queries are
  cut into up to 8 groups [a, e) at multiples of `block`; group g runs the
  blocked kernel over the key blocks [0, e) only, the ones it can see, so the
  work drops from T^2 to about T^2 (n + 1) / (2n) (56% at n = 8 groups), in
  the forward and the backward pass. Same values as `blocked_attention(...,
  q_offset=0, block)` up to float summation order; memory stays O(B H T C),
  and the backward pass saves the same q, k, v, o and lse.

  With `segment_ids_BxT` (int32, 0 = padding) a query sees only keys of its
  own segment, and inside each group the key blocks with no key of the
  group's segments (or only padding) are skipped too: on a packed row of
  segments of length ~n the attention work falls towards sum n^2 / 2 plus a
  block's worth per segment edge.
  """
  b, t, h, dh = q_BxTxHxDh.shape
  nk = k_BxTxKxDh.shape[2]
  if k_BxTxKxDh.shape[1] != t or kv_mask_BxT.shape[-1] != t:
    raise ValueError(f"causal_blocked_attention needs S = T = {t}, got keys "
                     f"{k_BxTxKxDh.shape} and mask {kv_mask_BxT.shape}.")
  _check_segments(segment_ids_BxT, t, t, "causal_blocked_attention")
  seg = None if segment_ids_BxT is None else segment_ids_BxT.astype(jnp.int32)
  q = q_BxTxHxDh.reshape(b, t, nk, h // nk, dh).transpose(0, 2, 3, 1, 4)
  o = _attend_causal(q, k_BxTxKxDh, v_BxTxKxDh, kv_mask_BxT, int(block), seg)
  return o.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh).astype(
      q_BxTxHxDh.dtype)


# ---------------------------------------------------------------------------
# Dense attention with a hand-written backward pass.
#
# Shapes as above, with M = G * T query rows per kv head. Scores are laid out
# [B, K, M, S] so every product is one batched matmul over (b, k) with no
# transposed operand copies:
#   s = q k^T / sqrt(Dh) (hidden keys: -0.7 * float32 max, as in
#   `jax.nn.dot_product_attention`),  p = softmax_S(s),  o = p v,
# and, with D_i = do_i . o_i,
#   dv = p^T do,  ds = p * (do v^T - D) / sqrt(Dh),  dq = ds k,  dk = ds^T q.
# XLA's autodiff of `jax.nn.dot_product_attention` re-laid the [B, H, T, S]
# score tensors between its passes; on the `benchmarks/model_bench.py` config
# this backward is ~3x faster on CPU. Saved for the backward pass: q, k, v, p,
# o and the mask.


def _heads_major(x_BxTxNxDh: jax.Array, nk: int) -> jax.Array:
  """[B, T, N, Dh] -> [B, K, N / K, T, Dh] (head n = k * (N / K) + g)."""
  b, t, n, dh = x_BxTxNxDh.shape
  return x_BxTxNxDh.reshape(b, t, nk, n // nk, dh).transpose(0, 2, 3, 1, 4)


def _heads_minor(x_BxKxGxTxDh: jax.Array) -> jax.Array:
  """Inverse of `_heads_major`: [B, K, G, T, Dh] -> [B, T, K * G, Dh]."""
  b, nk, g, t, dh = x_BxKxGxTxDh.shape
  return x_BxKxGxTxDh.transpose(0, 3, 1, 2, 4).reshape(b, t, nk * g, dh)


_BATCHED = (((3,), (3,)), ((0, 1), (0, 1)))     # [B,K,M,Dh] x [B,K,S,Dh]
_PV = (((3,), (2,)), ((0, 1), (0, 1)))          # [B,K,M,S] x [B,K,S,Dh]
_TN = (((2,), (2,)), ((0, 1), (0, 1)))          # [B,K,M,S] x [B,K,M,Dh]


def _rows(x_BxKxGxTxDh: jax.Array) -> jax.Array:
  """[B, K, G, T, Dh] -> [B, K, M = G * T, Dh] (a copy only for a strided slice)."""
  b, nk, g, t, dh = x_BxKxGxTxDh.shape
  return x_BxKxGxTxDh.reshape(b, nk, g * t, dh)


def _visible_rows(mask_Bx1xTxS: jax.Array, g: int) -> jax.Array:
  """The key mask per score row, boolean [B, 1, G * T, S]."""
  b, _, t, sk = mask_Bx1xTxS.shape
  ok = jnp.broadcast_to(mask_Bx1xTxS.astype(bool)[:, :, None], (b, 1, g, t, sk))
  return ok.reshape(b, 1, g * t, sk)


def _dense_probs(qh, kh, ok_Bx1xMxS):
  """Softmax probabilities [B, K, M, S] in the accumulation dtype."""
  acc = _acc(qh)
  s = jax.lax.dot_general(qh, kh, _BATCHED, preferred_element_type=acc)
  s = s * jnp.asarray(1.0 / math.sqrt(qh.shape[-1]), acc)
  neg = -0.7 * float(jnp.finfo(jnp.float32).max)
  s = jnp.where(ok_Bx1xMxS, s, jnp.asarray(neg, acc))
  return jax.nn.softmax(s, axis=-1)


@jax.custom_vjp
def _dense_core(qh_BxKxGxTxDh: jax.Array, kh_BxKxSxDh: jax.Array,
                vh_BxKxSxDh: jax.Array, mask_Bx1xTxS: jax.Array) -> jax.Array:
  """Dense attention on heads-major operands: o [B, K, G, T, Dh] in q's dtype."""
  return _core_forward(qh_BxKxGxTxDh, kh_BxKxSxDh, vh_BxKxSxDh, mask_Bx1xTxS)[0]


def _core_forward(q5, kh, vh, mask):
  g = q5.shape[2]
  qh = _rows(q5)
  p = _dense_probs(qh, kh, _visible_rows(mask, g))
  o = jax.lax.dot_general(p.astype(vh.dtype), vh, _PV)
  return o.reshape(q5.shape).astype(q5.dtype), (qh, kh, vh, p, o, mask)


def _core_bwd(res, do_BxKxGxTxDh):
  qh, kh, vh, p, o, mask = res
  dh = qh.shape[3]
  g = do_BxKxGxTxDh.shape[2]
  acc = p.dtype
  doh = _rows(do_BxKxGxTxDh).astype(vh.dtype)
  dv = jax.lax.dot_general(p.astype(vh.dtype), doh, _TN, preferred_element_type=acc)
  dp = jax.lax.dot_general(doh, vh, _BATCHED, preferred_element_type=acc)
  d_i = jnp.sum(doh.astype(acc) * o.astype(acc), axis=-1, keepdims=True)
  ds = p * (dp - d_i) * jnp.asarray(1.0 / math.sqrt(dh), acc)
  # A hidden key's score is a constant: no gradient, even in a row that sees
  # no key at all (there p is uniform, not 0).
  ds = jnp.where(_visible_rows(mask, g), ds, 0.0)
  dq = jax.lax.dot_general(ds.astype(kh.dtype), kh, _PV,
                           preferred_element_type=acc)
  dk = jax.lax.dot_general(ds.astype(qh.dtype), qh, _TN,
                           preferred_element_type=acc)
  return (dq.reshape(do_BxKxGxTxDh.shape).astype(qh.dtype), dk.astype(kh.dtype),
          dv.astype(vh.dtype), None)


_dense_core.defvjp(lambda q, k, v, m: _core_forward(q, k, v, m), _core_bwd)


def _heads(q, k, v):
  nk = k.shape[2]
  kh = k.transpose(0, 2, 1, 3)
  vh = v.transpose(0, 2, 1, 3)
  return _heads_major(q, nk), kh, vh


def segment_mask(segment_ids_BxS: jax.Array, t: int) -> jax.Array:
  """Boolean [B, 1, T, S]: key j is real (seg > 0) and in query i's segment.

  Query i sits at slot S - T + i (self-attention: S = T).
  """
  seg = segment_ids_BxS.astype(jnp.int32)
  qseg = seg[:, seg.shape[1] - t:]
  return ((qseg[:, None, :, None] == seg[:, None, None, :])
          & (seg > 0)[:, None, None, :])


def dense_attention(q_BxTxHxDh: jax.Array, k_BxSxKxDh: jax.Array,
                    v_BxSxKxDh: jax.Array, mask_Bx1xTxS: jax.Array,
                    segment_ids_BxS: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(Dh), masked) v, [B, T, H, Dh] in q's dtype.

  Same contract as `jax.nn.dot_product_attention(q, k, v, mask=mask)` (GQA by
  head groups, scores and softmax in float32 or wider, probabilities cast to
  v's dtype before the value product; a query that sees no key gets the mean
  of all values), with the backward pass described above.

  `segment_ids_BxS` (None, or int32 per key slot, 0 = padding; queries at the
  last T slots) adds `segment_mask` to the mask: no key of another segment is
  visible. Nothing is skipped for it (the score matrix stays B x H x T x S).
  """
  _check_segments(segment_ids_BxS, k_BxSxKxDh.shape[1], q_BxTxHxDh.shape[1],
                  "dense_attention")
  if segment_ids_BxS is not None:
    mask_Bx1xTxS = mask_Bx1xTxS.astype(bool) & segment_mask(segment_ids_BxS, q_BxTxHxDh.shape[1])
  qh, kh, vh = _heads(q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh)
  return _heads_minor(_dense_core(qh, kh, vh, mask_Bx1xTxS))


def causal_query_blocks(t: int) -> int:
  """How many query blocks `causal_dense_attention` uses for T = t.

  Blocks of at least 64 queries, at most 8 of them. On the
  `benchmarks/model_bench.py` config (T = 256, 2 CPU cores) the whole train
  step took 3% less time with 4 blocks than unsplit, and 1% less with 8
  blocks of 32 (a scratch A/B in one process; `benchmarks/ab_bench.py` later
  measured the 4-block change at 1.04x, quiet).
  """
  return max(1, min(8, t // 64))


def causal_dense_attention(q_BxTxHxDh: jax.Array, k_BxTxKxDh: jax.Array,
                           v_BxTxKxDh: jax.Array, mask_Bx1xTxT: jax.Array,
                           segment_ids_BxT: jax.Array | None = None) -> jax.Array:
  """`dense_attention` for self-attention under a mask that hides later keys.

  The caller promises mask[b, 0, i, j] = False for every j > i (queries and
  keys at the same slots, as `transformer.attention_mask` builds them without
  a cache). The queries are cut into n = `causal_query_blocks(T)` blocks
  [a, e); a block attends keys [0, e) only, the ones it can see, so the score
  and probability tensors shrink from T^2 to about T^2 (n + 1) / (2n) entries
  (62% of them at n = 4, 56% at n = 8) in both passes:

    o[:, a:e] = dense_attention(q[:, a:e], k[:, :e], v[:, :e], mask[..., a:e, :e])

  The operands are moved to heads-major layout once, not per block. Same
  result as `dense_attention` for every query that sees a key; a query that
  sees none (left padding) gets the mean of the values [0, e) of its block
  instead of all values (neither reaches a real token).

  `segment_ids_BxT` as in `dense_attention` (one more mask term; only the
  static causal ranges are skipped).
  """
  t = q_BxTxHxDh.shape[1]
  if k_BxTxKxDh.shape[1] != t or mask_Bx1xTxT.shape[-1] != t:
    raise ValueError(f"causal_dense_attention needs S = T = {t}, got keys "
                     f"{k_BxTxKxDh.shape} and mask {mask_Bx1xTxT.shape}.")
  _check_segments(segment_ids_BxT, t, t, "causal_dense_attention")
  if segment_ids_BxT is not None:
    mask_Bx1xTxT = mask_Bx1xTxT.astype(bool) & segment_mask(segment_ids_BxT, t)
  n = causal_query_blocks(t)
  qh, kh, vh = _heads(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh)
  edges = [round(i * t / n) for i in range(n + 1)]
  outs = [_dense_core(qh[:, :, :, a:e], kh[:, :, :e], vh[:, :, :e],
                      mask_Bx1xTxT[:, :, a:e, :e])
          for a, e in zip(edges[:-1], edges[1:])]
  return _heads_minor(outs[0] if n == 1 else jnp.concatenate(outs, axis=3))
