"""Collective matmuls: a tensor-parallel projection whose communication runs beside its math.

Per shard, inside `jax.shard_map` over a mesh axis of n shards (the tensor axis), with the
residual stream split over that axis on positions (sequence parallelism):

    all_gather_matmul(x, w)      = all_gather(x, positions) @ w       x [..., t, K] -> [..., n t, N]
    matmul_reduce_scatter(a, w)  = reduce_scatter(a @ w, positions)   a [..., n t, K] -> [..., t, N]

The first is a column-parallel projection (q, k, v, gate, up: w holds this shard's output
columns), the second a row-parallel one (o, down: w holds this shard's input rows, and the
shards' partial sums are added). Each is a ring of n steps: a block of t positions moves to
the next shard (`ppermute`) while the block before it multiplies. Written whole
(`all_gather`, `psum_scatter`, or the partitioner's all-reduce of plain tensor parallelism),
the v5p compile keeps the collective synchronous, exposed; as collective-permutes beside
the matmuls it overlaps them (a 4-layer qwen32b toy: 92% of the tensor-parallel bytes
overlapped, exposed bytes per call 2.99 -> 2.02 GB, through these two functions;
`benchmarks/results/train-hlo-2026-12-06-head/cm_probe.py`). Gradients come from JAX's transpose of
the loop (ppermute's transpose is the reverse ring), so the backward is a ring too.

Not yet used by the model: the blocks' projections run under the partitioner today.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _left(n: int) -> list[tuple[int, int]]:
  """The ring: shard i sends to shard i - 1 (mod n)."""
  return [(i, (i - 1) % n) for i in range(n)]


def all_gather_matmul(x: jax.Array, w: jax.Array, axis_name: str, n: int) -> jax.Array:
  """all_gather(x over positions) @ w, overlapped.

  Args:
    x: [..., t, K] this shard's block of t positions (block index = the shard's index on
      `axis_name`).
    w: [K, N] this shard's weight (its output columns).
    axis_name: the mesh axis the positions are split over; n its size.

  Returns:
    [..., n t, N]: every position's x @ w, blocks in shard order.

  At ring step s the shard holds block (i + s) mod n and sends it on while it multiplies.
  """
  if n == 1:
    return x @ w
  i = lax.axis_index(axis_name)
  t = x.shape[-2]
  out = jnp.zeros((*x.shape[:-2], n * t, w.shape[-1]), jnp.result_type(x, w))
  cur = x
  for s in range(n):
    nxt = lax.ppermute(cur, axis_name, _left(n)) if s < n - 1 else None
    out = lax.dynamic_update_slice_in_dim(out, cur @ w, ((i + s) % n) * t, axis=out.ndim - 2)
    cur = nxt
  return out


def matmul_reduce_scatter(a: jax.Array, w: jax.Array, axis_name: str, n: int) -> jax.Array:
  """reduce_scatter(a @ w over the shards, split on positions), overlapped.

  Args:
    a: [..., T, K] every position (T = n t), this shard's K (its input rows of w).
    w: [K, N] this shard's rows of the weight.
    axis_name: the mesh axis the shards' partial sums run over; n its size.

  Returns:
    [..., t, N]: this shard's block of positions of Σ_shards a @ w.

  At ring step s shard i adds its partial for block (i + s + 1) mod n to the sum it
  received from shard i + 1 and passes it on; the last step is its own block.
  """
  if n == 1:
    return a @ w
  i = lax.axis_index(axis_name)
  big = a.shape[-2]
  if big % n:
    raise ValueError(f"matmul_reduce_scatter: {big} positions do not split into {n} blocks")
  t = big // n
  acc = None
  for s in range(n):
    block = lax.dynamic_slice_in_dim(a, ((i + s + 1) % n) * t, t, axis=a.ndim - 2)
    part = block @ w
    acc = part if acc is None else acc + part
    if s < n - 1:
      acc = lax.ppermute(acc, axis_name, _left(n))
  return acc
