"""Fixed rows per micro-batch against the planner it replaced: computed slots and programs.

  python benchmarks/packing_fixed_n.py [--batches=400] [--row=256] [--budgets=256,512,1024,2048]
  python benchmarks/packing_fixed_n.py --head [--budget=512] [--chunks=128,64,32]

Until 2026-12-05 the planner rounded both the rows per micro-batch n and the micro-batch count
K to a lattice (`bucket`: 1-8, 10, 12, 14, 16, 20, ...), so every batch could get a new shape
[n, K, T] and each shape compiled the whole model again. Now n = budget // T is fixed per
pass and K is a loop's trip count (`vapo_jax.packing`): one program per pass and row length.
This prints, on the real-model config's length mix (configs/smollm2_135m.py: prompts of
65-90 tokens, responses gamma(2, mean / 2) capped at 128, rows of P + R = 256; 24 sequences
per update mini-batch, 48 per forward), for each token budget per device, the slots computed
(n K T summed over the batches) relative to the old planner at the config's budget of 8 rows,
the real / computed tokens, and the distinct shapes each would compile. Arithmetic on the
code's own FFD (`packing.first_fit_decreasing`), no timing: any machine gives these figures.

--head: the LM head's positions against the response tokens it must score, at the default
budget's micro-batches: per micro-batch the head runs ceil(count / chunk) chunks of `chunk`
positions on each shard (count: the shard with the most response slots, `policy.packed_logprobs`),
for fixed chunks (the code's is `policy.packed_logprobs`' chunk, 128). Fewer positions are
not less time on a CPU: `benchmarks/head_chunk.py` times the head's forward and backward per
chunk size (each chunk streams the whole [D, V] head weight and its gradient).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo

from vapo_jax import packing  # noqa: E402


def old_bucket(c: int) -> int:
  """The lattice the old planner rounded K and n to: 1-8, 10, 12, 14, 16, 20, 24, ..."""
  if c <= 4:
    return max(1, int(c))
  e = 1
  while 8 * e < c:
    e *= 2
  return next(m * e for m in (4, 5, 6, 7, 8) if m * e >= c)


def old_shape(rows_needed: int, n_max: int) -> tuple[int, int]:
  """(K, n) of the old planner (one shard)."""
  k = old_bucket(-(-rows_needed // n_max))
  return k, min(n_max, old_bucket(-(-rows_needed // k)))


def lengths(rng, b: int, mean: float, cap: int = 128) -> tuple[np.ndarray, np.ndarray]:
  p = np.repeat(rng.integers(65, 91, b // 8), 8)            # 8 responses per prompt
  r = np.minimum(np.maximum(rng.gamma(2.0, mean / 2.0, b).round(), 1), cap).astype(int)
  return p, r


def measure(batches: int, row: int, budgets: list[int], old_rows: int = 8) -> list[dict]:
  out = []
  for pass_name, b in (("update", 24), ("forward", 48)):
    for mean in (25, 55, 88):
      rng = np.random.default_rng(int(mean) * 7 + b)
      batch = [lengths(rng, b, mean) for _ in range(batches)]
      real = sum(int((p + r).sum()) for p, r in batch)
      fills = [len(packing.first_fit_decreasing(p + r, row)[2]) for p, r in batch]
      olds = [old_shape(f, old_rows) for f in fills]
      old_slots = sum(k * n * row for k, n in olds)
      row_out = {"pass": pass_name, "mean": mean, "old_slots": old_slots,
                 "old_real": real / old_slots, "old_shapes": len(set(olds))}
      for budget in budgets:
        spec = packing.PackSpec.from_budget(budget, row)
        plans = [packing.plan(p, r, spec) for p, r in batch]
        slots = sum(int(np.prod(pl.shape)) for pl in plans)
        row_out[budget] = (slots / old_slots, real / slots,
                           len({pl.table_shape for pl in plans}))
      out.append(row_out)
  return out


def head_positions(plans, tables, chunk: int) -> int:
  """Positions the LM head computes over the plans' micro-batches with chunks of `chunk`."""
  total = 0
  for pl, tab in zip(plans, tables):
    n, _, t = pl.table_shape
    head = tab["head"].reshape(pl.shards, n // pl.shards, -1, t).transpose(0, 2, 1, 3)
    counts = (head.reshape(pl.shards, head.shape[1], -1) >= 0).sum(-1)   # [shards, K_cap]
    total += int((-(-counts.max(0) // chunk) * chunk).sum()) * pl.shards
  return total


def measure_head(batches: int, row: int, budget: int, chunks: list[int]) -> list[dict]:
  out = []
  for pass_name, b in (("update", 24), ("forward", 48)):
    for mean in (25, 55, 88):
      rng = np.random.default_rng(int(mean) * 7 + b)
      batch = [lengths(rng, b, mean) for _ in range(batches)]
      spec = packing.PackSpec.from_budget(budget, row)
      plans = [packing.plan(p, r, spec) for p, r in batch]
      tables = [packing.pack_indices(pl, int(p.max()), int((p + r).max()))
                for pl, (p, r) in zip(plans, batch)]
      need = sum(int(r.sum()) for _, r in batch)
      ratios = {c: head_positions(plans, tables, c) / need for c in chunks}
      out.append({"pass": pass_name, "mean": mean, "ratios": ratios})
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", type=int, default=400)
  ap.add_argument("--row", type=int, default=256)
  ap.add_argument("--budgets", default="256,512,1024,2048")
  ap.add_argument("--head", action="store_true", help="the LM head's positions instead")
  ap.add_argument("--budget", type=int, default=512, help="--head: tokens per micro-batch")
  ap.add_argument("--chunks", default="128,64,32", help="--head: fixed chunks to compare")
  a = ap.parse_args(argv)
  if a.head:
    chunks = [int(x) for x in a.chunks.split(",")]
    rows = measure_head(a.batches, a.row, a.budget, chunks)
    print(f"head positions / response tokens, micro-batches of {a.budget} slots")
    print("| pass | response mean | " + " | ".join(f"chunk {c}" for c in chunks) + " |")
    print("|---" * (2 + len(chunks)) + "|")
    for r in rows:
      print(f"| {r['pass']} | {r['mean']} | "
            + " | ".join(f"{r['ratios'][c]:.3f}" for c in chunks) + " |")
    return
  budgets = [int(x) for x in a.budgets.split(",")]
  rows = measure(a.batches, a.row, budgets)
  head = " | ".join(f"n={b // a.row}: slots / old, real, programs" for b in budgets)
  print(f"| pass | response mean | old (n<=8): real, shapes | {head} |")
  print("|---" * (3 + len(budgets)) + "|")
  for r in rows:
    cells = " | ".join(f"{r[b][0]:.3f}, {r[b][1]:.2f}, {r[b][2]}" for b in budgets)
    print(f"| {r['pass']} | {r['mean']} | {r['old_real']:.2f}, {r['old_shapes']} | {cells} |")


if __name__ == "__main__":
  main()
