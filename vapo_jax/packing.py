"""Sequence packing: each response with its own prompt, unpadded, laid end to end in rows.

The experience batch is `[B, L = P + R]`: row b holds a prompt of p_b real tokens left-padded
to P and a response of l_b real tokens right-padded to R, so its n_b = p_b + l_b real tokens
are the columns [P - p_b, P + l_b) (`sampler.types.rollout_tokens`). Packing puts those
tokens, in order, into rows of T slots:

  packed micro-batch k, row r, slot o_b + j  <-  tokens[b, P - p_b + j],   j in [0, n_b)
  segment id there: 1 + (the segment's index in its row), 0 on padding slots
  position there:   j   (restarts at 0 in each segment, as `positions_from_mask` gives)

and the per-token outputs come back response-aligned: the output for response token t of
row b (predicted by the hidden state of column P + t - 1) sits at slot
s_b + t with s_b = o_b + p_b - 1, so

  out_BxR[b, t] = packed[k_b, r_b, s_b + t] * response_mask[b, t]      (`unpack`).

Layout of packed arrays: `[n, K, T]` (the tables: `[n, K_cap, T]`, below), rows of a
micro-batch first so that, like every other train-batch array, axis 0 is split over the
data-parallel mesh axes; `micro(x, k)` is micro-batch k, `[n, T]`.

The planner (`plan`) is a pure function of the lengths (so every host computes the same
plan), deterministic, and places every sequence exactly once:
  1. first-fit decreasing (ties by row index) of the n_b into rows of T;
  2. a shape: n = D * rows_per_device rows per micro-batch (the per-device token budget
     divided by T), fixed for the pass, and K = ceil(N / n) micro-batches for the N rows
     needed. n never changes with the batch: the compiled programs run a loop over K (a
     traced trip count) on plan tables of a static K_cap = ceil(B / n) micro-batches (a
     row holds at least one of the B sequences, so N <= B), and each (pass, T) compiles
     once, whatever the lengths;
  3. rows go to the K * D (micro-batch, shard) bins of n / D rows each by longest
     processing time first (fullest row to the bin with the fewest tokens, ties to the
     lowest bin), which balances real tokens across shards and micro-batches.
With row steps S > 1 (`PackSpec.row_steps`, rl.packing_row_steps) the row length itself is
chosen per plan: among the S lengths T_s = min(T, ⌈s T / (S a)⌉ a), s = 1 .. S (a =
`PackSpec.align`, 128 slots for long rows), those that hold the batch's longest sequence,
each with rows_per_device = ⌊budget / T_s⌋ for the same per-device token budget, steps 1-3
run and the plan that computes the fewest slots n K T_s is kept (ties: the longer rows): at
most S compiled shapes per pass. So a batch of short sequences runs in short rows with more
of them per micro-batch: early in a long-CoT run (responses ~1k of a 20k cap) rows of the
longest possible sequence wasted ~30% of the update tokens.
Pure numpy and jax (floor 1).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class PackSpec:
  """Packed row length T (the longest), rows per device per micro-batch, data-parallel shards
  D; row_steps S: the plan may pick any of `row_lens()` (1: always T); budget: tokens per
  device a micro-batch may hold (0: rows_per_device T)."""
  row_len: int
  rows_per_device: int
  shards: int = 1
  row_steps: int = 1
  budget: int = 0

  @classmethod
  def from_budget(cls, tokens_per_device: int, row_len: int, shards: int = 1,
                  row_steps: int = 1) -> "PackSpec":
    """rows_per_device = tokens_per_device // row_len (>= 1, else a clear error)."""
    if row_len < 1 or shards < 1 or row_steps < 1:
      raise ValueError(f"row_len={row_len}, shards={shards} and row_steps={row_steps} must "
                       "be >= 1.")
    if tokens_per_device < row_len:
      raise ValueError(f"a token budget of {tokens_per_device} per device holds no packed "
                       f"row of {row_len} tokens; raise the budget or shorten the rows.")
    return cls(row_len, tokens_per_device // row_len, shards, row_steps,
               tokens_per_device if row_steps > 1 else 0)

  @property
  def tokens_per_device(self) -> int:
    return self.budget or self.rows_per_device * self.row_len

  @property
  def align(self) -> int:
    """a: row lengths are multiples of the largest power of two <= min(128, T / S) (128, the
    splash kernel's lane width, for long rows; smaller for tiny test rows)."""
    cap = max(1, min(128, self.row_len // self.row_steps))
    return 1 << (cap.bit_length() - 1)

  def row_lens(self) -> list[int]:
    """The row lengths a plan may use, ascending: T_s = min(T, ⌈s T / (S a)⌉ a)."""
    s_, a, t = self.row_steps, self.align, self.row_len
    return sorted({min(t, -(-(s * t) // (s_ * a)) * a) for s in range(1, s_ + 1)})

  def at(self, row_len: int) -> "PackSpec":
    """The single-length spec of rows of `row_len` slots (one of `row_lens()`), at the same
    per-device token budget."""
    if row_len == self.row_len and self.row_steps == 1:
      return self
    return PackSpec(row_len, self.tokens_per_device // row_len, self.shards)

  @property
  def max_rows(self) -> int:
    """n_max = D * rows_per_device, the rows of a full micro-batch."""
    return self.shards * self.rows_per_device

  def shape(self, rows_needed: int) -> tuple[int, int]:
    """(K, n) for `rows_needed` packed rows: n = max_rows always, K = ceil(rows / n)."""
    return -(-max(int(rows_needed), 1) // self.max_rows), self.max_rows

  def micro_cap(self, sequences: int) -> int:
    """K_cap = ceil(B / n): the static micro-batch axis of the plan tables of a batch of B
    sequences (N <= B rows, so K <= K_cap). What a program compiles for is (n, K_cap, T)."""
    return max(1, -(-int(sequences) // self.max_rows))

  def shapes(self, max_sequences: int) -> list[tuple[int, int]]:
    """Every (K, n) a batch of up to `max_sequences` sequences can get in rows of T (for
    logging; with row steps, `at(T_s).shapes` per row length). One compiled program each T."""
    return [(k, self.max_rows) for k in range(1, self.micro_cap(max_sequences) + 1)]


# The default token budget holds at most 1 / DEFAULT_SHARE of a pass's tokens (its sequences
# at P + R each) per device in a micro-batch: with n fixed, the last micro-batch's empty rows
# are then a few per cent of the pass (benchmarks/packing_fixed_n.py measures it on the real
# model's lengths).
DEFAULT_SHARE = 16
# A forward-only pass (the log-prob and value passes) keeps no activations for a backward,
# and its micro-step's fixed cost (the layer loop, every weight read once per micro-batch)
# weighs on small micro-batches: its micro-batch may hold 1 / FORWARD_SHARE of the pass,
# within the same budget. On this project's 2-core CPU (docs/speed.md, 2026-12-07): the TRL
# bench's reference pass over 16 sequences took 4.83 s at [1, 14, 192] and 3.76 s at
# [4, 4, 192]; the real config's policy pass over 48, 12.1 s at [3, 11, 256] and 11.5 s at
# [8, 4, 256]. The share counts tokens, not sequences: on rows of 512 (four of the bench's
# sequences each) a share of sequences gave [3, 2, 512], half its slots empty (4.16 s in the
# bench against 3.22 s at [1, 4, 512]). The cost: with n fixed, the last micro-batch may
# leave up to a quarter of the pass's slots empty (0.58 real on the tiny mix of
# tests/benchmarks/test_packing_bench.py, 0.92 at 1/16).
FORWARD_SHARE = 4


def spec_for(seq_len: int, rows_per_micro: int, shards: int, row_tokens: int = 0,
             tokens_per_device: int = 0, row_steps: int = 1, pass_rows: int = 0,
             share: int = DEFAULT_SHARE) -> PackSpec:
  """The PackSpec of a pass of `pass_rows` sequences whose padded micro-batch has
  `rows_per_micro` rows of seq_len = P + R: rows of `row_tokens` (0: seq_len) and a budget
  of `tokens_per_device`, `row_steps` row lengths to choose from. The default budget (0) is
  the padded micro-batch's tokens per device, at least one row, and at most the rows that
  hold 1 / (share D) of the pass's pass_rows · seq_len tokens (no cap with pass_rows 0;
  `share`: DEFAULT_SHARE for an update, FORWARD_SHARE for a forward-only pass).
  rl.packing_row_tokens, rl.packing_tokens_per_device and rl.packing_row_steps are the
  overrides (`run.learners.pass_spec`)."""
  row = row_tokens or seq_len
  budget = tokens_per_device
  if not budget:
    budget = max(row, rows_per_micro * seq_len // shards)
    if pass_rows:
      # the rows that hold 1/share of the pass's tokens at their full length P + R (one
      # sequence per row when rows are P + R long; fewer rows when rows are longer)
      budget = min(budget, row * max(1, -(-pass_rows * seq_len // (share * shards * row))))
  return PackSpec.from_budget(budget, row, shards, row_steps)


def row_segments(p: "Plan") -> dict[tuple[int, int], list[tuple[int, int]]]:
  """{(micro-batch k, row r): [(first slot, tokens) of each segment, in slot order]}."""
  out: dict[tuple[int, int], list[tuple[int, int]]] = {}
  n_B = p.prompt_B + p.response_B
  for b in np.lexsort((p.offset_B, p.row_B, p.micro_B)):
    if n_B[b]:
      out.setdefault((int(p.micro_B[b]), int(p.row_B[b])), []).append(
          (int(p.offset_B[b]), int(n_B[b])))
  return out


@dataclasses.dataclass(frozen=True)
class Plan:
  """Where each sequence goes. Arrays [B] (numpy int): micro-batch k_b, row r_b in it,
  first slot o_b, prompt and response real lengths p_b, l_b. Sequences with n_b = 0
  are placed nowhere (k = r = o = 0, and every output of theirs is masked)."""
  micro_B: np.ndarray
  row_B: np.ndarray
  offset_B: np.ndarray
  prompt_B: np.ndarray
  response_B: np.ndarray
  micro_batches: int   # K, the micro-batches that hold rows (run at run time)
  rows: int            # n
  row_len: int         # T
  micro_cap: int = 0   # K_cap >= K, the tables' static micro-batch axis (0: K)
  shards: int = 1      # D: rows n are D blocks of n / D, one per data-parallel shard

  @property
  def shape(self) -> tuple[int, int, int]:
    """[n, K, T]: the packed micro-batches computed."""
    return self.rows, self.micro_batches, self.row_len

  @property
  def table_shape(self) -> tuple[int, int, int]:
    """[n, K_cap, T] of the packed tables (`pack_indices`): what a program compiles for."""
    return self.rows, max(self.micro_cap, self.micro_batches), self.row_len

  @property
  def real_tokens(self) -> int:
    return int(self.prompt_B.sum() + self.response_B.sum())

  @property
  def efficiency(self) -> float:
    """Real tokens / computed tokens (n K T)."""
    return self.real_tokens / float(np.prod(self.shape))

  def metrics(self, name: str) -> dict[str, float]:
    """perf/<name>_token_efficiency (real / computed tokens) and the shape computed: rows
    n, micro-batches K, row length T (perf/<name>_rows, _micro_batches, _row_len)."""
    n, k, t = self.shape
    return {f"perf/{name}_token_efficiency": self.efficiency, f"perf/{name}_rows": float(n),
            f"perf/{name}_micro_batches": float(k), f"perf/{name}_row_len": float(t)}


def first_fit_decreasing(lengths_B: np.ndarray, row_len: int) -> tuple[np.ndarray, np.ndarray,
                                                                        np.ndarray]:
  """(row index [B], offset [B], fill per row [N]) of FFD; n_b = 0 gets row -1."""
  lengths_B = np.asarray(lengths_B, np.int64)
  order = np.lexsort((np.arange(len(lengths_B)), -lengths_B))
  free = np.zeros((0,), np.int64)
  row = np.full(len(lengths_B), -1, np.int64)
  offset = np.zeros(len(lengths_B), np.int64)
  for b in order:
    n = lengths_B[b]
    if n == 0:
      continue
    fits = np.flatnonzero(free >= n)
    if len(fits):
      r = fits[0]
    else:
      r = len(free)
      free = np.append(free, row_len)
    row[b], offset[b] = r, row_len - free[r]
    free[r] -= n
  return row, offset, row_len - free


def _balance(fill_N: np.ndarray, bins: int, slots: int) -> np.ndarray:
  """Bin of each row: fullest rows first, each to the bin with fewest tokens and a free slot."""
  load = np.zeros(bins, np.int64)
  used = np.zeros(bins, np.int64)
  where = np.zeros(len(fill_N), np.int64)
  for i in np.lexsort((np.arange(len(fill_N)), -fill_N)):
    cand = np.where(used < slots, load, np.iinfo(np.int64).max)
    j = int(np.argmin(cand))
    where[i] = j
    load[j] += fill_N[i]
    used[j] += 1
  return where


def plan(prompt_B, response_B, spec: PackSpec) -> Plan:
  """The packing plan of sequences of p_b + l_b tokens (see the module docstring).

  Raises ValueError (naming the row) when a sequence is longer than the row length.
  """
  prompt_B = np.asarray(prompt_B, np.int64)
  response_B = np.asarray(response_B, np.int64)
  n_B = prompt_B + response_B
  if (n_B > spec.row_len).any():
    b = int(np.argmax(n_B > spec.row_len))
    raise ValueError(f"sequence {b} has {n_B[b]} tokens, more than the packed row length "
                     f"{spec.row_len}.")
  if spec.row_steps == 1:
    return _plan_rows(prompt_B, response_B, n_B, spec)
  longest = int(n_B.max(initial=0))
  best = None
  for t in reversed(spec.row_lens()):     # longest first: ties keep the longer rows
    if t < longest:
      break
    p = _plan_rows(prompt_B, response_B, n_B, spec.at(t))
    if best is None or np.prod(p.shape) < np.prod(best.shape):
      best = p
  return best


def _plan_rows(prompt_B, response_B, n_B, spec: PackSpec) -> Plan:
  """Steps 1-3 of the module docstring in rows of spec.row_len."""
  row, offset, fill = first_fit_decreasing(n_B, spec.row_len)
  k, n = spec.shape(len(fill))
  per_bin = n // spec.shards
  where = _balance(fill, k * spec.shards, per_bin)
  # Bin j = (micro-batch j // D, shard j % D); slot order within a bin by row index.
  slot = np.zeros(len(fill), np.int64)
  seen = np.zeros(k * spec.shards, np.int64)
  for i in range(len(fill)):
    slot[i] = seen[where[i]]
    seen[where[i]] += 1
  micro_N = where // spec.shards
  local_N = (where % spec.shards) * per_bin + slot
  placed = row >= 0
  safe = np.where(placed, row, 0)
  return Plan(micro_B=np.where(placed, micro_N[safe] if len(fill) else 0, 0),
              row_B=np.where(placed, local_N[safe] if len(fill) else 0, 0),
              offset_B=np.where(placed, offset, 0), prompt_B=prompt_B,
              response_B=np.where(placed, response_B, 0), micro_batches=k, rows=n,
              row_len=spec.row_len, micro_cap=spec.micro_cap(len(n_B)), shards=spec.shards)


def lengths(mask_BxL, prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(p_B, l_B): real prompt and response tokens of each row of a [B, P + R] mask (host)."""
  m = np.asarray(jax.device_get(mask_BxL)) > 0
  return m[:, :prompt_len].sum(-1), m[:, prompt_len:].sum(-1)


def pack_indices(p: Plan, prompt_len: int, seq_len: int) -> dict[str, np.ndarray]:
  """Host-built gather tables of the packed arrays, int32 [n, K_cap, T] each:

  src: flat index b * L + column into a [B, L] batch (-1 on padding slots),
  segment_ids: 1 + the segment's index in its row (0 on padding), positions: j,
  head: the slots whose output a loss reads (those that predict a response token, s_b + t
  for t < l_b), compacted per shard: a shard's block of n / D rows is read as one flat run
  of (n / D) T slots, and its q-th entry (row q // T, column q % T of the block) holds the
  flat index a T + j of the q-th such slot of the block, ascending (-1 after the last).
  Micro-batches K .. K_cap - 1 are all padding (`Plan.table_shape`).
  """
  n, k, t = p.table_shape
  src = np.full((n, k, t), -1, np.int64)
  seg = np.zeros((n, k, t), np.int32)
  pos = np.zeros((n, k, t), np.int32)
  out = np.zeros((n, k, t), bool)
  count = np.zeros((n, k), np.int32)
  n_B = p.prompt_B + p.response_B
  for b in np.lexsort((p.offset_B, p.row_B, p.micro_B)):
    m = int(n_B[b])
    if m == 0:
      continue
    r, mk, o = p.row_B[b], p.micro_B[b], p.offset_B[b]
    first = b * seq_len + prompt_len - p.prompt_B[b]
    src[r, mk, o:o + m] = first + np.arange(m)
    count[r, mk] += 1
    seg[r, mk, o:o + m] = count[r, mk]
    pos[r, mk, o:o + m] = np.arange(m)
    start = o + p.prompt_B[b] - 1
    out[r, mk, start:start + p.response_B[b]] = True
  d = p.shards
  block = out.reshape(d, n // d, k, t).transpose(0, 2, 1, 3).reshape(d, k, -1)  # [D, K, rT]
  head = np.full(block.shape, -1, np.int64)
  for s in range(d):
    for mk in range(k):
      at = np.flatnonzero(block[s, mk])
      head[s, mk, :len(at)] = at
  head = head.reshape(d, k, n // d, t).transpose(0, 2, 1, 3).reshape(n, k, t)
  return {"src": src.astype(np.int32), "segment_ids": seg, "positions": pos,
          "head": head.astype(np.int32)}


def response_slots(p: Plan) -> dict[str, np.ndarray]:
  """Per-row int32 [B] tables for `unpack`: micro-batch, row, and first output slot s_b."""
  start = p.offset_B + p.prompt_B - 1
  return {"micro_B": p.micro_B.astype(np.int32), "row_B": p.row_B.astype(np.int32),
          "start_B": np.maximum(start, 0).astype(np.int32)}


def gather(x_BxL: jax.Array, src_NxKxT: jax.Array, fill=0) -> jax.Array:
  """The packed array [n, K, T] of a [B, L] batch array (`fill` on padding slots)."""
  flat = x_BxL.reshape(-1)
  vals = jnp.take(flat, jnp.maximum(src_NxKxT, 0), axis=0)
  return jnp.where(src_NxKxT >= 0, vals, jnp.asarray(fill, flat.dtype))


def micro(x_NxKx: jax.Array, k) -> jax.Array:
  """Micro-batch k of a packed array: [n, K, ...] -> [n, ...]."""
  return jnp.take(x_NxKx, k, axis=1)


def unpack(x_NxT: jax.Array, slots: dict, mask_BxR: jax.Array, k=None) -> jax.Array:
  """Response-aligned [B, R] outputs of one packed micro-batch (k) or of all ([n, K, T]).

  out[b, t] = x[r_b, (k_b,) s_b + t] * mask[b, t], and 0 for rows of other micro-batches
  when k is given.
  """
  r = mask_BxR.shape[-1]
  t = x_NxT.shape[-1]
  col = slots["start_B"][:, None] + jnp.arange(r, dtype=jnp.int32)[None, :]
  inside = col < t
  col = jnp.minimum(col, t - 1)
  row = slots["row_B"][:, None]
  if x_NxT.ndim == 3:
    vals = x_NxT[row, slots["micro_B"][:, None], col]
    keep = inside
  else:
    vals = x_NxT[row, col]
    keep = inside & (slots["micro_B"][:, None] == k)
  return jnp.where(keep, vals, 0.0) * mask_BxR


def last_token(x_NxT: jax.Array, slots: dict, response_B: jax.Array, k=None) -> jax.Array:
  """[B]: the output at the last real token of each sequence, x[r_b, s_b + l_b] (the
  prompt's last token for l_b = 0); 0 for rows of other micro-batches when k is given."""
  col = slots["start_B"] + jnp.asarray(response_B, jnp.int32)
  col = jnp.minimum(col, x_NxT.shape[-1] - 1)
  if x_NxT.ndim == 3:
    return x_NxT[slots["row_B"], slots["micro_B"], col]
  return jnp.where(slots["micro_B"] == k, x_NxT[slots["row_B"], col], 0.0)
