"""FLOPs of the code's loops, counted from shapes (the step model's arithmetic).

Notation: L layers, D width, F MLP width, H query / K kv heads of Dh, V vocabulary (padded
embedding rows included), C = attention_block.

  matmul per token   m = 2 L (D Dh (H + 2K) + H Dh D + 3 D F)      (+ 2 D V for the LM head)
  attention          a = 4 L H Dh per (query, key) pair computed    (q·k and p·v)
  pairs              what the kernels compute (`attention_pairs`): blocked causal = per query
                     group [a, e) of `attention._query_groups`, (e − a) · ⌈e/C⌉ C; causal
                     dense = per `causal_query_blocks` block (e − a) · e; decode = W keys per
                     row at window W
  train pass         fwd + remat fwd + bwd: 4 m − down per token, 4.5 a per pair, 4× head
  splash (TPU)       the train passes' self-attention where `model.attention_kernel` picks
                     jax's Pallas splash kernel (`models.splash_attention`): per row, the
                     live (query block, key block) pairs of its block tables × c² pairs
                     (`splash_blocks`, c = `splash_attention.block_for(T, C)`); train pass
                     fwd + remat fwd + bwd = 1 + 1 + 3.5 a per pair (the dq kernel's three
                     block products qk, do vᵀ, ds k and the dk/dv kernel's four qk, pᵀ do,
                     do vᵀ, dsᵀ q), no score traffic through HBM; with the fused backward
                     (`splash_attention.FUSED_BWD`) 2.5 a (qk, pᵀ do, do vᵀ, dsᵀ q, ds k in
                     one kernel) plus its dq partials through HBM: per row and head
                     n² blocks of c × Dh, written and summed (`splash_dq_bytes`)
  selective remat    `model.remat_selective` blocks keep their matmul outputs: no matmul
                     recompute (3 m per token, no − down); the attention forward is recomputed
                     on the pure-JAX paths (1 a per pair) and not in the splash kernel, whose
                     residuals (output, log-sum-exp) are kept by name

`tests/pod/test_step_model.py` checks these against XLA's cost analysis of the run's own programs
compiled with every loop at one trip.
"""

from __future__ import annotations

import dataclasses

import numpy as np

@dataclasses.dataclass(frozen=True)
class Arch:
  """The shapes the counts need (from a `ModelConfig`)."""
  layers: int
  d: int
  f: int
  h: int
  k: int
  dh: int
  vocab: int
  params: float            # policy parameters (embedding and head counted as stored)
  critic_params: float     # backbone + value head (no LM head)
  block: int               # attention_block C
  impl: str                # "blocked" | "dense" | "auto"
  remat: float             # fraction of blocks rematerialised (model.remat_layers / L)
  untied: bool = True      # the LM head is its own matrix (not the embedding)
  # The train passes' self-attention on the modelled slice: "splash" (jax's Pallas kernel,
  # `model.attention_kernel` auto / tpu where it runs) or "jax" (the pure-JAX paths).
  kernel: str = "jax"
  # Fraction of blocks rematerialised selectively (model.remat_selective / L; part of remat).
  selective: float = 0.0

  @property
  def full_remat(self) -> float:
    """Fraction of blocks that recompute their whole forward (remat - selective)."""
    return self.remat - self.selective

  @classmethod
  def of(cls, m) -> "Arch":
    n = float(m.num_params)
    head = 0 if m.tie_word_embeddings else m.vocab_size * m.hidden_size
    return cls(m.num_layers, m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads,
               m.head_dim, m.vocab_size, n, n - head + m.hidden_size, m.attention_block,
               m.attention_impl, remat_fraction(m), not m.tie_word_embeddings,
               selective=(m.remat_selective if m.remat else 0) / max(1, m.num_layers))

  def splash_score_bytes(self, t: int) -> float:
    """HBM bytes per (pair, head) of the splash kernel's forward: per live block and query
    head it reads a bf16 key and value block (2 c Dh · 2 bytes) for c² pairs, 4 Dh / c;
    its scores stay in VMEM."""
    return 4.0 * self.dh / splash_block(self, t)

  @property
  def matmul(self) -> float:
    """Body matmul FLOPs per token (no LM head)."""
    d, dh = self.d, self.dh
    return 2.0 * self.layers * (d * dh * (self.h + 2 * self.k) + self.h * dh * d
                                + 3 * d * self.f)

  @property
  def decode_weights(self) -> float:
    """Parameters a decode step reads whole (all but an untied input embedding)."""
    return self.params - (self.vocab * self.d if self.untied else 0)

  @property
  def down(self) -> float:
    """The MLP down projection's FLOPs per token: a remat block's recompute skips it (its
    output is the block's, which the backward pass does not need; XLA drops it)."""
    return 2.0 * self.layers * self.d * self.f

  @property
  def head(self) -> float:
    return 2.0 * self.d * self.vocab

  @property
  def pair(self) -> float:
    """Attention FLOPs per (query, key) pair, all layers and heads (forward)."""
    return 4.0 * self.layers * self.h * self.dh

  def kv_bytes(self, itemsize: int = 2) -> float:
    """KV cache bytes per token (all layers, k and v)."""
    return 2.0 * self.layers * self.k * self.dh * itemsize

  def uses_blocked(self, t: int, s: int) -> bool:
    """As `ModelConfig.blocked_attention`."""
    if t < 2 or self.impl == "dense":
      return False
    return self.impl == "blocked" or s >= 4 * self.block


def query_groups(t: int, block: int, groups: int = 8) -> list[tuple[int, int]]:
  """`attention._query_groups` (the blocked causal path's query ranges)."""
  c = max(1, min(block, t))
  n_blocks = -(-t // c)
  n = max(1, min(groups, n_blocks))
  cuts = sorted({min(t, round(i * n_blocks / n) * c) for i in range(n + 1)})
  return list(zip(cuts[:-1], cuts[1:]))


def attention_pairs(arch: Arch, t: int, s: int | None = None, causal: bool = True) -> float:
  """(query, key) pairs one row's attention computes (masked keys in a computed block count)."""
  s = t if s is None else s
  c = arch.block
  if arch.uses_blocked(t, s):
    if causal and s == t:
      return float(sum((e - a) * -(-e // min(c, e)) * min(c, e)
                       for a, e in query_groups(t, c)))
    cc = max(1, min(c, s))
    return float(t * -(-s // cc) * cc)
  if causal and s == t:
    n = max(1, min(8, t // 64))  # attention.causal_query_blocks
    edges = [round(i * t / n) for i in range(n + 1)]
    return float(sum((e - a) * e for a, e in zip(edges[:-1], edges[1:])))
  return float(t * s)


def forward_flops(arch: Arch, rows: int, t: int, head_positions: int, critic: bool = False,
                  causal: bool = True) -> dict:
  """FLOPs of one forward over `rows` rows of t tokens: {"matmul", "attention", "head"}."""
  return {"matmul": rows * t * arch.matmul,
          "attention": rows * attention_pairs(arch, t, t, causal) * arch.pair,
          "head": rows * head_positions * (2.0 * arch.d if critic else arch.head)}


def remat_fraction(m) -> float:
  """The fraction of a `ModelConfig`'s blocks rematerialised (`ModelConfig.remats`)."""
  if not m.remat:
    return 0.0
  return min(m.num_layers, m.remat_layers if m.remat_layers >= 0 else m.num_layers) / max(
      1, m.num_layers)


def train_factors(remat: float, kernel: str = "jax", selective: float = 0.0) -> dict:
  """Multiples of the forward FLOPs in one fwd + bwd (with block remat: one more fwd of the
  rematerialised fraction `remat` of the blocks; True = all). Of those, the fraction
  `selective` keeps its matmul outputs (`transformer.selective_block`): no matmul recompute,
  and in the splash kernel no attention recompute (its residuals are kept). The attention
  backward: 2.5 a per pair on the pure-JAX paths (five pair products), in the splash kernel
  `splash_bwd()`."""
  splash = kernel == "splash"
  bwd = splash_bwd() if splash else 2.5
  r, s = float(remat), float(selective)
  if not 0.0 <= s <= r:
    raise ValueError(f"selective fraction {s} must be within the remat fraction {r}")
  return {"matmul": 3.0 + r - s, "attention": bwd + 1.0 + (r - s if splash else r),
          "head": 4.0}


def splash_bwd() -> float:
  """The splash kernel's backward per pair, in forward units a: 2.5 fused (five block
  products in one kernel), 3.5 split (the dq and dk/dv kernels recompute the scores apart:
  seven); `splash_attention.FUSED_BWD` decides."""
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  return 2.5 if splash_attention.FUSED_BWD else 3.5


def splash_dq_bytes(arch: Arch, t: int) -> float:
  """HBM bytes of the fused backward's dq partials for one row of t slots, all layers and
  query heads: n = ⌈t / c⌉ key blocks each write a bf16 [Tp, Dh] partial that is then read
  back to sum, 2 · n² c Dh · 2 bytes per head (0 with the split backward)."""
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  if not splash_attention.FUSED_BWD:
    return 0.0
  c = splash_block(arch, t)
  n = -(-t // c)
  return 4.0 * n * n * c * arch.dh * arch.h * arch.layers


def splash_block(arch: Arch, t: int) -> int:
  """The splash kernel's block c for rows of t slots (`splash_attention.block_for`)."""
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  return splash_attention.block_for(t, arch.block)


def splash_blocks(segs: list[tuple[int, int]], t: int, c: int) -> int:
  """Live (query block, key block) pairs the splash kernel runs on one row of t slots
  (`splash_attention.live_blocks`): the row padded to n = ⌈t / c⌉ blocks; query block i
  runs key block j iff j <= i and both hold real slots whose segment-id ranges [min, max]
  overlap, or j == i. segs: [(first slot, tokens)] of the row's segments in slot order
  (ids 1, 2, ... along the row, as `packing.pack_indices` numbers them)."""
  n = -(-t // c)
  lo = np.full(n, np.iinfo(np.int64).max)
  hi = np.full(n, -1)
  for sid, (o, m) in enumerate(segs, 1):
    if m > 0:
      b0, b1 = o // c, (o + m - 1) // c + 1
      lo[b0:b1] = np.minimum(lo[b0:b1], sid)
      hi[b0:b1] = np.maximum(hi[b0:b1], sid)
  real = hi >= 0
  meet = ((lo[None, :] <= hi[:, None]) & (lo[:, None] <= hi[None, :])
          & real[:, None] & real[None, :])
  i = np.arange(n)
  live = (meet & (i[None, :] <= i[:, None])) | (i[:, None] == i[None, :])
  return int(live.sum())


def splash_pairs(arch: Arch, segs: list[tuple[int, int]], t: int) -> float:
  """(query, key) pairs the splash kernel computes on one row: live blocks × c²."""
  c = splash_block(arch, t)
  return float(splash_blocks(segs, t, c) * c * c)


def padded_head_positions(r: int, chunk: int = 128) -> int:
  """Positions `policy.chunked_logprobs` projects: R rounded up to whole chunks."""
  c = max(1, min(chunk, r))
  return -(-r // c) * c


def decode_step_flops(arch: Arch, rows: int, window: int) -> float:
  """One decode step over `rows` rows attending `window` cache slots (LM head included)."""
  return rows * (arch.matmul + arch.head + window * arch.pair)


def packed_pairs(arch: Arch, rows: list[list[tuple[int, int]]], t: int) -> float:
  """(query, key) pairs the attention computes on one packed micro-batch of len(rows) rows of
  t slots, rows[r] = [(first slot, tokens), ...] of its segments (`packing.row_segments`).

  Dense paths: every row's `attention_pairs` (segments are a mask term). Blocked causal path
  (`attention._live_blocks`): per query group [a, e) and key block c < ⌈e / C⌉, the block
  is computed for all rows iff in some row the segment ids of its real keys and of the
  group's real queries overlap ([kmin, kmax] ∩ [qmin, qmax]: the predicate is one scalar for
  the whole micro-batch), then (e − a) · C pairs per row. The splash kernel (arch.kernel
  "splash"): its block tables per row, Σ_rows `splash_pairs`.
  """
  n = len(rows)
  if arch.kernel == "splash":
    return sum(splash_pairs(arch, segs, t) for segs in rows)
  if not arch.uses_blocked(t, t):
    return n * attention_pairs(arch, t, t)
  c = max(1, min(arch.block, t))
  groups = query_groups(t, arch.block)
  blocks = -(-t // c)

  def span(segs, lo, hi):
    """(min, max) segment id (1-based) of the real slots in [lo, hi); None if none."""
    ids = [j + 1 for j, (o, m) in enumerate(segs) if o < hi and o + m > lo]
    return (ids[0], ids[-1]) if ids else None

  total = 0.0
  for a, e in groups:
    q = [span(s, a, e) for s in rows]
    for blk in range(min(blocks, -(-e // c))):
      k = [span(s, blk * c, (blk + 1) * c) for s in rows]
      if any(qq and kk and kk[0] <= qq[1] and qq[0] <= kk[1] for qq, kk in zip(q, k)):
        total += n * (e - a) * c
  return total
