"""Paged KV cache for decoding: a page pool per layer, page tables, live-length attention.

Layout (the one of jax's TPU kernel `jax.experimental.pallas.ops.tpu.ragged_paged_attention`):

  kv_pages  [N, Ps, 2K, Dh]  N pages of Ps token slots; keys at even combined heads (2k),
                             values at odd ones (2k + 1)
  table_SxM int32            row s lists the pages of decode slot s in order; token position
                             p of slot s lives at page table[s, p // Ps], offset p % Ps.
                             Entries past a slot's pages are any value >= N (dropped on
                             write, clipped and masked on read)
  lens_S    int32            tokens in slot s's KV (0: an empty slot)

Decode attention of one query per slot (`decode_attention`), with G = H / K:

  s[b, k, g, p] = q[b, k, g] . K[b, p, k] / sqrt(Dh),   p < lens[b] (else hidden)
  out[b, k, g]  = softmax_p(s) . V[b, :, k]

computed block by block over `pages_per_block` pages with an online softmax, for
ceil(max_b lens[b] / (pages_per_block Ps)) blocks only: a decode step reads the live
length of the longest slot, never the pool or a row's cap. Keys at p >= lens[b] are masked
and their values zeroed before use, so stale KV of a page's previous owner (any finite or
non-finite value) never reaches the output. On TPU `tpu_decode_attention` runs jax's Pallas
kernel on the same arrays.

Slot groups (`slot_group_of`, `in_slot_groups`): jax's Pallas kernel prefetches the whole page
table of a call into scalar memory (1 MiB), so one call takes at most
`SMEM_TABLE_BYTES` / (4 M) slots (182 at M = 1,344). More slots are attended in
G = ceil(S / limit) calls of ceil(S / G) slots each, every call over the same pool:

  out[g·s' : (g+1)·s'] = attend(q[g·s' : ...], kv_pages, lens[g·s' : ...], table[g·s' : ...])

Each slot's output depends on its own query, length and table row only, so the groups give
the one-call result exactly; the projections around the attention still run once over all
S slots (a decode step reads the weights once for all of them).

Decode replicas (`replica_step`): on a mesh whose batch axes (data, fsdp) hold R copies of
the decode weights, slots and pool pages are split R ways over those axes. Replica r owns
slots r S/R .. (r+1) S/R - 1 and pages r N/R .. (r+1) N/R - 1, and its slots' tables list
its pages by local id (0..N/R - 1), so every shard writes and attends over its own part of
the pool in a `shard_map`, with no communication.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from vapo_jax import compat


def combine(k_SxKxDh: jax.Array, v_SxKxDh: jax.Array) -> jax.Array:
  """[S, 2K, Dh] with keys at even and values at odd combined heads."""
  s, k, dh = k_SxKxDh.shape
  return jnp.stack([k_SxKxDh, v_SxKxDh], axis=2).reshape(s, 2 * k, dh)


def write_tokens(kv_pages: jax.Array, kv_Sx2KxDh: jax.Array, table_SxM: jax.Array,
                 pos_S: jax.Array) -> jax.Array:
  """kv_pages with token kv_Sx2KxDh[s] stored at position pos_S[s] of slot s.

  Slots whose page for that position is >= N (no page: an idle slot) write nothing.
  """
  ps = kv_pages.shape[1]
  m = table_SxM.shape[1]
  page_S = jnp.take_along_axis(table_SxM, jnp.clip(pos_S // ps, 0, m - 1)[:, None],
                               axis=1)[:, 0]
  return kv_pages.at[page_S, pos_S % ps].set(kv_Sx2KxDh.astype(kv_pages.dtype),
                                             mode="drop")


def write_prompt(kv_pages: jax.Array, kv_Tx2KxDh: jax.Array, table_M: jax.Array
                 ) -> jax.Array:
  """kv_pages with one sequence's tokens 0..T-1 stored through its page row table_M.

  Positions whose page entry is >= N write nothing.
  """
  ps = kv_pages.shape[1]
  t = kv_Tx2KxDh.shape[0]
  pos_T = jnp.arange(t, dtype=jnp.int32)
  page_T = table_M[jnp.clip(pos_T // ps, 0, table_M.shape[0] - 1)]
  page_T = jnp.where(pos_T // ps < table_M.shape[0], page_T, kv_pages.shape[0])
  return kv_pages.at[page_T, pos_T % ps].set(kv_Tx2KxDh.astype(kv_pages.dtype),
                                             mode="drop")


def decode_attention(q_SxHxDh: jax.Array, kv_pages: jax.Array, lens_S: jax.Array,
                     table_SxM: jax.Array, pages_per_block: int = 8) -> jax.Array:
  """One query per slot over its first lens_S[s] paged tokens; [S, H, Dh] in q's dtype.

  Scores and the softmax in float32; the value dot takes the pages' dtype and sums in
  float32. A slot with lens 0 gives zeros.
  """
  s, h, dh = q_SxHxDh.shape
  n, ps, k2, _ = kv_pages.shape
  k = k2 // 2
  g = h // k
  m = table_SxM.shape[1]
  bp = max(1, min(pages_per_block, m))
  blocks = -(-m // bp)
  table = jnp.pad(table_SxM, ((0, 0), (0, blocks * bp - m)), constant_values=n)
  table = jnp.clip(table, 0, n - 1)  # reads past a slot's pages are masked below
  q_SxKxGxDh = (q_SxHxDh.reshape(s, k, g, dh).astype(jnp.float32)
                * (1.0 / math.sqrt(dh)))
  width = bp * ps
  n_blocks = (jnp.max(lens_S) + width - 1) // width

  def body(i, carry):
    m_SxKxG, l_SxKxG, acc_SxKxGxDh = carry
    pages_Sxbp = jax.lax.dynamic_slice_in_dim(table, i * bp, bp, axis=1)
    blk = kv_pages[pages_Sxbp].reshape(s, width, k2, dh)
    k_SxLxKxDh, v_SxLxKxDh = blk[:, :, 0::2], blk[:, :, 1::2]
    ok_SxL = (i * width + jnp.arange(width))[None, :] < lens_S[:, None]
    v_SxLxKxDh = jnp.where(ok_SxL[:, :, None, None], v_SxLxKxDh, 0)
    sc = jnp.einsum("skgd,slkd->skgl", q_SxKxGxDh.astype(k_SxLxKxDh.dtype), k_SxLxKxDh,
                    preferred_element_type=jnp.float32)
    sc = jnp.where(ok_SxL[:, None, None, :], sc, -jnp.inf)
    m_new = jnp.maximum(m_SxKxG, jnp.max(sc, axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    corr = jnp.exp(m_SxKxG - m_safe)
    p_SxKxGxL = jnp.exp(sc - m_safe[..., None])
    l_SxKxG = l_SxKxG * corr + jnp.sum(p_SxKxGxL, axis=-1)
    acc_SxKxGxDh = acc_SxKxGxDh * corr[..., None] + jnp.einsum(
        "skgl,slkd->skgd", p_SxKxGxL.astype(v_SxLxKxDh.dtype), v_SxLxKxDh,
        preferred_element_type=jnp.float32)
    return m_new, l_SxKxG, acc_SxKxGxDh

  init = (jnp.full((s, k, g), -jnp.inf, jnp.float32), jnp.zeros((s, k, g), jnp.float32),
          jnp.zeros((s, k, g, dh), jnp.float32))
  _, l_SxKxG, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  out = acc / jnp.where(l_SxKxG > 0, l_SxKxG, 1.0)[..., None]
  return out.reshape(s, h, dh).astype(q_SxHxDh.dtype)


def tpu_decode_attention(q_SxHxDh: jax.Array, kv_pages: jax.Array, lens_S: jax.Array,
                         table_SxM: jax.Array, pages_per_block: int = 8,
                         queries_per_block: int = 8, mesh=None, head_axis=None,
                         slot_group: int = 0, **kernel_kw) -> jax.Array:
  """`decode_attention` by jax's ragged paged attention Pallas kernel (TPU only).

  One query per slot: cu_q_lens = 0, 1, ..., S and num_seqs = S. Page entries >= N are
  clipped to valid pages (the kernel reads only pages below lens). The block sizes are
  given, not looked up in the kernel's tuned table (that reads the local device's TPU
  version, so an AOT compile from a CPU host could not use it). On a mesh the kernel runs
  per shard (`shard_map`): heads split over `head_axis` (q heads and combined kv heads
  alike, so each shard keeps its GQA groups), slots and pages replicated. slot_group: slots
  per kernel call (0: the most whose page table fits scalar memory, `slot_group_of`); more
  slots run in several calls (`in_slot_groups`).
  """
  if mesh is not None and mesh.size > 1:
    from jax.sharding import PartitionSpec as P
    fn = functools.partial(tpu_decode_attention, pages_per_block=pages_per_block,
                           queries_per_block=queries_per_block, slot_group=slot_group,
                           **kernel_kw)
    return jax.shard_map(
        fn, mesh=mesh,
        in_specs=(P(None, head_axis, None), P(None, None, head_axis, None), P(), P()),
        out_specs=P(None, head_axis, None), check_vma=False)(
            q_SxHxDh, kv_pages, lens_S, table_SxM)
  group = slot_group or slot_group_of(*table_SxM.shape)
  if group < q_SxHxDh.shape[0]:
    one = functools.partial(tpu_decode_attention, pages_per_block=pages_per_block,
                            queries_per_block=queries_per_block, slot_group=group,
                            **kernel_kw)
    return in_slot_groups(one, q_SxHxDh, kv_pages, lens_S, table_SxM, group)
  rpa = compat.ragged_paged_attention_kernel()
  s, _, dh = q_SxHxDh.shape
  m = table_SxM.shape[1]
  kernel_kw.setdefault("num_kv_pages_per_block", max(
      d for d in range(1, min(pages_per_block, m) + 1) if m % d == 0))
  kernel_kw.setdefault("num_queries_per_block", min(queries_per_block, s))
  table = jnp.clip(table_SxM, 0, kv_pages.shape[0] - 1).astype(jnp.int32)
  return rpa.ragged_paged_attention(
      q_SxHxDh, kv_pages, lens_S.astype(jnp.int32), table,
      jnp.arange(s + 1, dtype=jnp.int32), jnp.array([s], jnp.int32),
      sm_scale=1.0 / math.sqrt(dh), **kernel_kw)


# jax's ragged paged attention prefetches the whole page table (int32 [slots, pages]) into
# the TensorCore's scalar memory, 1 MiB: a v5p compile of 256 slots × 1,344 pages
# (1.38 MB) in one call failed with "Allocation (size=1441792) would exceed memory
# (size=1048576) ... prefetched SMEM operand" (2026-12-04). Kept below it with 64 KiB for its
# other operands; more slots go in groups (`in_slot_groups`).
SMEM_TABLE_BYTES = (1 << 20) - (64 << 10)


def slot_limit(pages_per_slot: int) -> int:
  """The most slots one kernel call takes: SMEM_TABLE_BYTES // (4 · pages_per_slot)."""
  return SMEM_TABLE_BYTES // (4 * max(1, pages_per_slot))


def slot_group_of(slots: int, pages_per_slot: int, limit: int | None = None) -> int:
  """Slots per kernel call for a table of `slots` rows: ceil(S / G) for the fewest calls
  G = ceil(S / limit) (limit: `slot_limit` unless given); S itself when it fits one call."""
  limit = max(1, slot_limit(pages_per_slot) if limit is None else limit)
  calls = -(-slots // limit)
  return -(-slots // max(1, calls))


def in_slot_groups(attend, q_SxHxDh: jax.Array, kv_pages: jax.Array, lens_S: jax.Array,
                   table_SxM: jax.Array, group: int) -> jax.Array:
  """attend(q, kv_pages, lens, table) over consecutive slot groups of `group` slots (the
  last may be shorter), concatenated: [S, H, Dh]. Exact for any attend whose slot s
  depends on row s of q, lens and table only (both paths here)."""
  s = q_SxHxDh.shape[0]
  if group <= 0 or group >= s:
    return attend(q_SxHxDh, kv_pages, lens_S, table_SxM)
  outs = [attend(q_SxHxDh[i:i + group], kv_pages, lens_S[i:i + group],
                 table_SxM[i:i + group]) for i in range(0, s, group)]
  return jnp.concatenate(outs, axis=0)


def table_refusal(slots: int, pages_per_slot: int) -> str | None:
  """Why one replica's page table cannot be prefetched by the kernel even in slot groups
  (one slot's row over the scalar memory), or None. `slots` is kept for the message."""
  need = 4 * pages_per_slot
  if need <= SMEM_TABLE_BYTES:
    return None
  return (f"one slot's page table row of {pages_per_slot} pages ({need / 2**20:.2f} MiB of "
          f"int32; {slots} slots per decode replica) does not fit the kernel's 1 MiB of "
          f"scalar memory")


def tpu_kernel_refusal(num_heads: int, num_kv_heads: int, head_dim: int, dtype,
                       page_size: int = 16) -> str | None:
  """Why jax's Pallas kernel cannot take one shard's decode shapes, or None if it can.

  num_heads, num_kv_heads: per tensor shard. The kernel's own checks decide, by tracing
  `tpu_decode_attention` on abstract arrays (no TPU, no compile): e.g. head_dim must be a
  multiple of 128 (its softmax statistics are 128 lanes wide, broadcast over head_dim), and
  2K combined kv heads must tile XLA's layout for the dtype.
  """
  q = jax.ShapeDtypeStruct((8, num_heads, head_dim), dtype)
  pages = jax.ShapeDtypeStruct((8, page_size, 2 * num_kv_heads, head_dim), dtype)
  lens = jax.ShapeDtypeStruct((8,), jnp.int32)
  table = jax.ShapeDtypeStruct((8, 1), jnp.int32)
  try:
    jax.eval_shape(lambda *a: tpu_decode_attention(*a, pages_per_block=1), q, pages, lens,
                   table)
  except Exception as e:  # pylint: disable=broad-except  (the kernel asserts, or raises)
    why = str(e).strip().split("\n")[0][:200] or type(e).__name__
    return (f"jax's ragged paged attention kernel refuses {num_heads} q heads, "
            f"{num_kv_heads} kv heads, head_dim {head_dim} at {jnp.dtype(dtype).name} per "
            f"shard ({why}{'; head_dim must be a multiple of 128' if head_dim % 128 else ''})")
  return None


def attend(q_SxHxDh: jax.Array, kv_pages: jax.Array, lens_S: jax.Array,
           table_SxM: jax.Array, *, kernel: str = "jax", pages_per_block: int = 8,
           slot_group: int = 0, mesh=None, head_axis=None) -> jax.Array:
  """The decode attention by `kernel`: "jax" (`decode_attention`) or "tpu"
  (`tpu_decode_attention`, per shard of `mesh`, heads over `head_axis`). slot_group: slots
  per call (`in_slot_groups`); 0: one call ("jax"), the kernel's scalar-memory limit
  ("tpu")."""
  if kernel == "tpu":
    return tpu_decode_attention(q_SxHxDh, kv_pages, lens_S, table_SxM,
                                pages_per_block=pages_per_block, mesh=mesh,
                                head_axis=head_axis, slot_group=slot_group)
  one = functools.partial(decode_attention, pages_per_block=pages_per_block)
  return in_slot_groups(one, q_SxHxDh, kv_pages, lens_S, table_SxM, slot_group)


def replica_step(q_SxHxDh: jax.Array, kv_pages: jax.Array, kv_Sx2KxDh: jax.Array,
                 table_SxM: jax.Array, pos_S: jax.Array, lens_S: jax.Array, *, mesh,
                 batch_axes, head_axis=None, kernel: str = "jax", pages_per_block: int = 8,
                 slot_group: int = 0) -> tuple[jax.Array, jax.Array]:
  """`write_tokens` then the decode attention, per shard of `mesh`: (out [S, H, Dh], pages).

  Slots (S) and pool pages (N) are split over `batch_axes`, heads (q heads and combined kv
  heads) over `head_axis`; table_SxM holds page ids local to each slot's shard. kernel,
  slot_group: as `attend` (the groups split each shard's S / R slots).
  """
  from jax.sharding import PartitionSpec as P
  b = tuple(batch_axes) or None

  def local(q, pool, kv, table, pos, lens):
    pool = write_tokens(pool, kv, table, pos)
    out = attend(q, pool, lens, table, kernel=kernel, pages_per_block=pages_per_block,
                 slot_group=slot_group)
    return out, pool

  heads = P(b, head_axis, None)
  pool_spec = P(b, None, head_axis, None)
  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(heads, pool_spec, heads, P(b, None), P(b), P(b)),
      out_specs=(heads, pool_spec), check_vma=False)(
          q_SxHxDh, kv_pages, kv_Sx2KxDh, table_SxM, pos_S, lens_S)
