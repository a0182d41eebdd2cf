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
benchmarks/results/train-hlo-2026-12-06-head/README.md). Gradients come from JAX's transpose of
the loop (ppermute's transpose is the reverse ring), so the backward is a ring too.

Used by the model's blocks with `ModelConfig.collective_matmul` (`models.sequence_parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import functools

import jax
import jax.numpy as jnp
from jax import lax


def _dot(a: jax.Array, w: jax.Array) -> jax.Array:
  return a @ w


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
  return all_gather_matmuls(x, [w], axis_name, n)[0]


def all_gather_matmuls(x: jax.Array, ws: Sequence[jax.Array], axis_name: str, n: int,
                       dot: Callable = _dot) -> list[jax.Array]:
  """[all_gather(x) @ w for w in ws] with one ring: each block of x is sent once and
  multiplied by every w (q, k and v, or gate and up, and their LoRA A's, share a ring).

  dot(block [..., t, K], w [K, N]) -> [..., t, N] is the product (`a @ w` by default).
  """
  if n == 1:
    return [dot(x, w) for w in ws]
  i = lax.axis_index(axis_name)
  t = x.shape[-2]
  outs = [jnp.zeros((*x.shape[:-2], n * t, w.shape[-1]), jnp.result_type(x, w)) for w in ws]
  cur = x
  for s in range(n):
    nxt = lax.ppermute(cur, axis_name, _left(n)) if s < n - 1 else None
    at = ((i + s) % n) * t
    outs = [lax.dynamic_update_slice_in_dim(o, dot(cur, w).astype(o.dtype), at,
                                            axis=o.ndim - 2) for o, w in zip(outs, ws)]
    cur = nxt
  return outs


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
  return matmul_reduce_scatters([(a, w)], axis_name, n)


def matmul_reduce_scatters(pairs: Sequence[tuple[jax.Array, jax.Array]], axis_name: str,
                           n: int, dot: Callable = _dot) -> jax.Array:
  """reduce_scatter(Σ_j a_j @ w_j) with one ring: the partial products of every pair are
  added before they travel (a row-parallel projection and its LoRA path, (a A) B, share a
  ring: Σ_shards (a_i W_i + u_i B) = Σ a_i W_i + (Σ u_i) B with u_i = a_i A_i)."""
  if n == 1:
    return functools.reduce(lambda p, q: p + q, [dot(a, w) for a, w in pairs])
  i = lax.axis_index(axis_name)
  big = pairs[0][0].shape[-2]
  if big % n:
    raise ValueError(f"matmul_reduce_scatter: {big} positions do not split into {n} blocks")
  t = big // n
  acc = None
  for s in range(n):
    at = ((i + s + 1) % n) * t
    part = None
    for a, w in pairs:
      p = dot(lax.dynamic_slice_in_dim(a, at, t, axis=a.ndim - 2), w)
      part = p if part is None else part + p
    acc = part if acc is None else acc + part
    if s < n - 1:
      acc = lax.ppermute(acc, axis_name, _left(n))
  return acc
