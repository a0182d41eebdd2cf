"""Causal self-attention of packed rows by jax's Pallas splash attention kernel (TPU).

The train passes' attention (`layers.Attention` without a cache, queries at the key slots)
on TPU: jax's fused splash kernel (`jax.experimental.pallas.ops.tpu.splash_attention`, via
`compat.splash_attention`), forward and backward, with block-skipping tables we build per
row from the segment ids, so that a key block is skipped, per row and per query block,
when it is all padding, holds only other segments, or lies after the query block.

Shapes: B rows, T slots, H query heads, K kv heads (G = H / K, query head h = k G + g),
Dh head width, c the block (queries and keys), n = Tp / c blocks per row, Tp = T rounded
up to c.

Folding. The kernel attends one sequence per call; the B rows are laid end to end as one
sequence of L = B Tp slots (row b's slot i at b Tp + i), queries [H, L, Dh], keys and values
[K, L, Dh]. The kernel's masks are then exactly the row rule:
  - causal, computed in the kernel from the folded slots: key slot <= query slot;
  - segment ids (`SegmentIds`): a real slot of row b with segment s > 0 gets id
    s + b (Tp + 1), unique to its row; a padding query gets -1 and a padding key -2, so a
    padding query sees no key and no query sees a padding key.
A query sees key j iff j <= i, same row, seg[j] == seg[i] > 0: the rule of
`attention.causal_blocked_attention` with `segment_ids`.

Skipping (the kernel's `MaskInfo` tables, built here from the ids, not from a static mask):
query block i of row b runs key block j of the same row iff j <= i and both blocks hold
real slots whose segment-id ranges [min, max] overlap (exact for packed rows, whose ids
rise along the row), or j == i (so every query block runs at least one block and stays
finite). The forward and dq kernels walk, per query block, its live key blocks in order
(`data_next`, `block_mask` = 1 for a live step, 0 for the padding steps, which repeat the
last live block: no new copy); the dk/dv kernel walks, per key block, its live query
blocks. Blocks of other rows are never visited. Grid widths are n (static); the tables
cost 3 x [B n, n] small ints of scalar memory per kernel.

Outputs: a query that sees no key (padding) gets 0 and passes no gradient, as in
`attention.causal_blocked_attention`; every real query matches it up to float rounding.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import compat
from vapo_jax.models import platform

LANES = 128  # the kernel's key blocks are multiples of 128 slots
# The `checkpoint_name` of the kernel's forward residuals (output, log-sum-exp): a selective
# remat that keeps them (`transformer.SAVED`) runs no attention forward in its backward.
RESIDUALS = "splash"
# The backward as jax's fused kernel (dq, dk, dv in one pass over the live blocks: 5 block
# products instead of the separate dq and dk/dv kernels' 7), per row. See `splash_attention`.
FUSED_BWD = True


def block_for(t: int, block: int) -> int:
  """The kernel's block c: `block` rounded down to a multiple of 128 (>= 128), at most T
  rounded up to 128."""
  c = max(LANES, block // LANES * LANES)
  return min(c, -(-t // LANES) * LANES)


def _ranges(seg_BxNxC: jax.Array):
  """(any real, min id, max id) of the real slots of each block, [B, N] each."""
  real = seg_BxNxC > 0
  big = jnp.iinfo(jnp.int32).max
  lo = jnp.min(jnp.where(real, seg_BxNxC, big), axis=-1)
  hi = jnp.max(jnp.where(real, seg_BxNxC, -1), axis=-1)
  return jnp.any(real, axis=-1), lo, hi


def live_blocks(seg_BxTp: jax.Array, c: int) -> jax.Array:
  """Bool [B, n, n]: query block i of row b runs key block j (see the module docstring)."""
  b, tp = seg_BxTp.shape
  n = tp // c
  real, lo, hi = _ranges(seg_BxTp.reshape(b, n, c))
  i = jnp.arange(n)
  meet = ((lo[:, None, :] <= hi[:, :, None]) & (lo[:, :, None] <= hi[:, None, :])
          & real[:, :, None] & real[:, None, :])
  return (meet & (i[None, :] <= i[:, None])[None]) | (i[:, None] == i[None, :])[None]


def _walk(live_BxPxQ: jax.Array):
  """Per (b, p): the q indices with live[b, p, q] in order, then the last one repeated.

  Returns (index [B, P, Q] int32, on [B, P, Q] int32: 1 for a live step, 0 for padding).
  """
  q = live_BxPxQ.shape[-1]
  order = jnp.argsort(~live_BxPxQ, axis=-1, stable=True).astype(jnp.int32)
  count = jnp.sum(live_BxPxQ, axis=-1, dtype=jnp.int32)        # >= 1 (the diagonal)
  step = jnp.arange(q, dtype=jnp.int32)
  on = step[None, None, :] < count[..., None]
  last = jnp.take_along_axis(order, jnp.maximum(count - 1, 0)[..., None], axis=-1)
  return jnp.where(on, order, last), on.astype(jnp.int32)


def _small(x: jax.Array, top: int) -> jax.Array:
  """Scalar-memory tables as the kernel prefers them: int8 / int16 when the values fit."""
  if top <= np.iinfo(np.int8).max:
    return x.astype(jnp.int8)
  if top <= np.iinfo(np.int16).max:
    return x.astype(jnp.int16)
  return x


def _fused_dkv(live_JxI: jax.Array):
  """The fused backward's dk/dv walk of one row: every query block i at grid step i (the
  kernel writes key block j's dq partial at step i's slot), `block_mask` live[i, j]; a dead
  step names the last live query block before it (else the first after), so it copies
  nothing new. Returns (index [1, n (i), n (j)], on [1, n, n]) int32."""
  n = live_JxI.shape[-1]
  i = jnp.arange(n, dtype=jnp.int32)[None, :]
  last = jax.lax.cummax(jnp.where(live_JxI, i, -1), axis=1)
  first = jnp.argmax(live_JxI, axis=1).astype(jnp.int32)[:, None]
  idx = jnp.where(last >= 0, last, first)                         # [j, i]
  return idx.T[None], live_JxI.T[None].astype(jnp.int32)


def mask_infos(seg_BxTp: jax.Array, c: int, fused_bwd: bool = False):
  """The kernel's (forward, dq, dkv) `MaskInfo` tables for the folded rows (traced).

  fused_bwd (one row, B = 1): dq None and the dk/dv tables of the fused backward kernel
  (`_fused_dkv`: a grid of n x n steps per head instead of n per key block's live walk)."""
  mi = compat.splash_attention().mask_info
  b, tp = seg_BxTp.shape
  n = tp // c
  live = live_blocks(seg_BxTp, c)                              # [B, i, j]
  base = (jnp.arange(b, dtype=jnp.int32) * n)[:, None, None]
  # Forward / dq: row (b n + i) walks key blocks; [1, B n, n].
  kv_idx, kv_on = _walk(live)
  fwd = mi.MaskInfo(
      data_next=_small((kv_idx + base).reshape(1, b * n, n), b * n),
      mask_next=None, block_mask=_small(kv_on.reshape(1, b * n, n), 2),
      partial_mask_blocks=None, q_sequence=jnp.arange(b * tp, dtype=jnp.int32))
  if fused_bwd:
    if b != 1:
      raise ValueError(f"the fused backward's tables are per row (B = 1), got B = {b}")
    idx, on = _fused_dkv(live[0].T)
    dkv = mi.MaskInfo(data_next=_small(idx, n), mask_next=None, block_mask=_small(on, 2),
                      partial_mask_blocks=None, q_sequence=jnp.arange(tp, dtype=jnp.int32))
    return fwd, None, dkv
  # dk / dv: column (b n + j) walks query blocks; [1, n (steps), B n].
  q_idx, q_on = _walk(live.swapaxes(1, 2))                     # [B, j, step]
  dkv = mi.MaskInfo(
      data_next=_small((q_idx + base).transpose(2, 0, 1).reshape(n, b * n)[None], b * n),
      mask_next=None,
      block_mask=_small(q_on.transpose(2, 0, 1).reshape(n, b * n)[None], 2),
      partial_mask_blocks=None, q_sequence=jnp.arange(b * tp, dtype=jnp.int32))
  return fwd, fwd, dkv


def _causal(q_ids, kv_ids):
  return q_ids >= kv_ids


def splash_attention(q_BxTxHxDh: jax.Array, k_BxTxKxDh: jax.Array, v_BxTxKxDh: jax.Array,
                     seg_BxT: jax.Array, block: int = 512, interpret: bool = False,
                     fused_bwd: bool | None = None) -> jax.Array:
  """Causal GQA self-attention within segments by the splash kernel; [B, T, H, Dh].

  seg_BxT: int32 segment id per slot (0: padding; one id per row for unpacked rows). On
  one device (call it per shard under `shard_map`). interpret: run the kernel in Pallas
  interpret mode (any backend; tests). fused_bwd (None: `FUSED_BWD`): the backward as one
  kernel (5 block products per live block instead of 7), called per row: its dq partials
  ([n, H, Tp, Dh] per row) grow with the square of the folded length.
  """
  fused_bwd = FUSED_BWD if fused_bwd is None else fused_bwd
  b = q_BxTxHxDh.shape[0]
  if fused_bwd and b > 1:
    return jnp.concatenate([
        splash_attention(q_BxTxHxDh[i:i + 1], k_BxTxKxDh[i:i + 1], v_BxTxKxDh[i:i + 1],
                         seg_BxT[i:i + 1], block, interpret, True) for i in range(b)])
  sa = compat.splash_attention()
  b, t, h, dh = q_BxTxHxDh.shape
  c = block_for(t, block)
  tp = -(-t // c) * c
  seg = jnp.pad(seg_BxT.astype(jnp.int32), ((0, 0), (0, tp - t)))
  real = seg > 0
  row = (jnp.arange(b, dtype=jnp.int32) * (tp + 1))[:, None]
  q_ids = jnp.where(real, seg + row, -1).reshape(-1)
  kv_ids = jnp.where(real, seg + row, -2).reshape(-1)

  def fold(x):  # [B, T, N, Dh] -> [N, B Tp, Dh]
    x = jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, 0)))
    return x.transpose(2, 0, 1, 3).reshape(x.shape[2], b * tp, dh)

  scale = jnp.asarray(1.0 / math.sqrt(dh), q_BxTxHxDh.dtype)
  kernel = sa.make_kernel(*mask_infos(seg, c, fused_bwd), block=c, mask_function=_causal,
                          interpret=interpret, residual_name=RESIDUALS)
  o = kernel(fold(q_BxTxHxDh * scale), fold(k_BxTxKxDh), fold(v_BxTxKxDh),
             sa.kernel.SegmentIds(q=q_ids, kv=kv_ids))
  o = o.reshape(h, b, tp, dh).transpose(1, 2, 0, 3)[:, :t]
  return jnp.where(real[:, :t, None, None], o, 0).astype(q_BxTxHxDh.dtype)


def sharded_splash_attention(q, k, v, seg, block: int = 512, interpret: bool = False,
                             mesh=None, batch_axes=None, head_axis=None):
  """`splash_attention` per shard of `mesh` (`shard_map`): rows split over `batch_axes`,
  query and kv heads over `head_axis` (each shard keeps whole GQA groups). No mesh or one
  device: the kernel directly."""
  fn = functools.partial(splash_attention, block=block, interpret=interpret)
  if mesh is None or mesh.size == 1:
    return fn(q, k, v, seg)
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  heads = P(batch_axes, None, head_axis, None)
  return jax.shard_map(fn, mesh=mesh, in_specs=(heads, heads, heads, P(batch_axes, None)),
                       out_specs=heads, check_vma=False)(q, k, v, seg)


def refusal(num_heads: int, num_kv_heads: int, head_dim: int, dtype, rows: int = 1,
            t: int = 256, block: int = 512, target: str | None = None,
            mesh_rules=None) -> str | None:
  """Why the train passes' self-attention cannot run on the splash kernel here, or None.

  target: the platform traced for (default `platform.target()`); mesh_rules: (mesh, rules)
  of the activation sharding, or None. The kernel's own Python checks decide the rest,
  by tracing `sharded_splash_attention` on abstract arrays (no TPU, no compile).
  """
  return _refusal(num_heads, num_kv_heads, head_dim, jnp.dtype(dtype).name, rows, t, block,
                  target or platform.target(), mesh_rules)


@functools.lru_cache(maxsize=64)
def _refusal(num_heads, num_kv_heads, head_dim, dtype, rows, t, block, target, mesh_rules):
  if target != "tpu":
    return f"{platform.OFF_TPU}, and this program is traced for {target}"
  mesh, batch_axes, head_axis = _layout(mesh_rules, rows, num_heads, num_kv_heads)
  if head_axis == "refuse":
    return (f"{num_kv_heads} kv heads do not split over the mesh like the {num_heads} q "
            "heads (a query head would sit apart from its kv head)")
  shape = lambda n: jax.ShapeDtypeStruct((rows, t, n, head_dim), dtype)  # noqa: E731
  try:
    jax.eval_shape(functools.partial(sharded_splash_attention, block=block, mesh=mesh,
                                     batch_axes=batch_axes, head_axis=head_axis),
                   shape(num_heads), shape(num_kv_heads), shape(num_kv_heads),
                   jax.ShapeDtypeStruct((rows, t), jnp.int32))
  except Exception as e:  # pylint: disable=broad-except  (the kernel asserts, or raises)
    why = str(e).strip().split("\n")[0][:200] or type(e).__name__
    return (f"jax's splash attention refuses {num_heads} q heads, {num_kv_heads} kv heads, "
            f"head_dim {head_dim} at {jnp.dtype(dtype).name} ({why})")
  return None


def _layout(mesh_rules, rows, num_heads, num_kv_heads):
  """(mesh, batch mesh axes, head mesh axis) of the activations; head axis "refuse" when
  q and kv heads would not split alike."""
  if mesh_rules is None:
    return None, None, None
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  mesh, rules = mesh_rules
  batch = shd.logical_to_spec(("batch",), rules, mesh, (rows,))[0]
  heads = shd.logical_to_spec(("heads",), rules, mesh, (num_heads,))[0]
  kv_heads = shd.logical_to_spec(("kv_heads",), rules, mesh, (num_kv_heads,))[0]
  return mesh, batch, (heads if heads == kv_heads else "refuse")


def choose(want: str, num_heads: int, num_kv_heads: int, head_dim: int, dtype,
           rows: int = 1, t: int = 256, block: int = 512, mesh_rules=None,
           log=print, target: str | None = None) -> str:
  """"tpu" (the splash kernel) or "jax" (the pure-JAX paths) for a setting.

  want: "auto" -> "tpu" where `refusal` finds no reason against it (on TPU one line per
  reason says why not, once per process), else "jax"; "jax"; "tpu" -> ValueError with the
  reason where the kernel cannot run.
  """
  return platform.choose_kernel(
      want, lambda: refusal(num_heads, num_kv_heads, head_dim, dtype, rows, t, block, target,
                            mesh_rules),
      "model.attention_kernel",
      "[model] pure-JAX blocked attention in the train passes, not splash", log)


def self_attention(q, k, v, seg, block: int = 512, mesh_rules=None):
  """`sharded_splash_attention` laid out over the activation mesh (`mesh_rules`)."""
  mesh, batch_axes, head_axis = _layout(mesh_rules, q.shape[0], q.shape[2], k.shape[2])
  return sharded_splash_attention(q, k, v, seg, block, mesh=mesh, batch_axes=batch_axes,
                                  head_axis=head_axis)
