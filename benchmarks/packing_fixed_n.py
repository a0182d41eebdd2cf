"""Fixed rows per micro-batch against the planner it replaced: computed slots and programs.

  python benchmarks/packing_fixed_n.py [--batches=400] [--row=256] [--budgets=256,512,1024,2048]

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


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", type=int, default=400)
  ap.add_argument("--row", type=int, default=256)
  ap.add_argument("--budgets", default="256,512,1024,2048")
  a = ap.parse_args(argv)
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
