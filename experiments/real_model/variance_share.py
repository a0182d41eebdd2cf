"""How much of the reward's variance a prompt-level value could explain: the between-problem share.

A critic that knew each prompt's true pass rate p_j, and nothing about the response, predicts
V(s_0) = p_j; its explained variance over responses is the share of the reward's variance that
lies between problems (the intra-class correlation of a 0/1 reward):

    share = σ²_b / (σ²_b + σ²_w),   σ²_b = Var_j(p_j),   σ²_w = E_j[p_j (1 − p_j)]

estimated from k samples per problem by one-way ANOVA (unbiased for σ²_b, clipped at 0):
MSB = k Σ_j (p̂_j − p̄)² / (n − 1), MSW = Σ_j Σ_i (x_ji − p̂_j)² / (n (k − 1)),
σ̂²_b = max(0, (MSB − MSW) / k), σ̂²_w = MSW. It bounds what the value at the prompt's last
token can explain; tokens after the answer is written can explain more, but only by
checking the answer, which is the task itself.

    python -m experiments.real_model.variance_share RUNS_DIR [--steps=0,10,20]

RUNS_DIR holds seed*/<row>/eval/rl_step_<N>.jsonl (the evaluation's per-problem records,
`correct`: k booleans per problem; gzipped as .jsonl.gz where kept in the repository), e.g.
experiments/real_model/results/registered-2026-12-05/runs.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os

import numpy as np


def between_share(correct_NxK) -> dict[str, float]:
  """{"mean", "between", "within", "share", "solved_any"} of a [problems, samples] 0/1 array."""
  x = np.asarray(correct_NxK, np.float64)
  n, k = x.shape
  if n < 2 or k < 2:
    raise ValueError(f"need >= 2 problems and >= 2 samples each, got {x.shape}")
  p = x.mean(axis=1)
  msb = k * float(((p - p.mean()) ** 2).sum()) / (n - 1)
  msw = float(((x - p[:, None]) ** 2).sum()) / (n * (k - 1))
  sb = max(0.0, (msb - msw) / k)
  total = sb + msw
  return {"mean": float(x.mean()), "between": sb, "within": msw,
          "share": sb / total if total > 0 else 0.0, "solved_any": float((p > 0).mean())}


def records(path: str) -> np.ndarray:
  """The [problems, k] correctness of one evaluation's per-problem records (JSON lines, or
  gzipped JSON lines when `path` ends in .gz)."""
  with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
    return np.array([[bool(c) for c in json.loads(line)["correct"]] for line in f if line.strip()])


def table(runs_dir: str, steps) -> list[str]:
  """Markdown rows: step, row, and per seed the mean reward and the between-problem share."""
  lines = ["| RL step | row | per seed: reward mean, between-problem share (problems solved "
           "at least once) |", "|---|---|---|"]
  rows = sorted({os.path.basename(os.path.dirname(os.path.dirname(p))) for p in
                 glob.glob(os.path.join(runs_dir, "seed*", "*", "eval", "*.jsonl*"))})
  for step in steps:
    for row in rows:
      cells = []
      for path in sorted(glob.glob(os.path.join(runs_dir, "seed*", row, "eval",
                                                f"rl_step_{step}.jsonl*"))):
        s = between_share(records(path))
        cells.append(f"{100 * s['mean']:.1f}%, {s['share']:.3f} ({100 * s['solved_any']:.0f}%)")
      if cells:
        lines.append(f"| {step} | {row} | " + "; ".join(cells) + " |")
  return lines


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("runs_dir")
  ap.add_argument("--steps", default="0,10,20")
  args = ap.parse_args(argv)
  print("\n".join(table(args.runs_dir, [int(s) for s in args.steps.split(",")])))


if __name__ == "__main__":
  main()
