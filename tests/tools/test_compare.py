"""tools.compare: problems paired by uid across files, rows of several seeds, the intervals
those give (the same as `bootstrap` on the matrices), the shortcut rows, the command."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vapo_jax import bootstrap
from vapo_jax.data import sources
from vapo_jax.data import word_problems as wp
from vapo_jax.run import eval_records
from vapo_jax.tools import compare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXS = wp.word_problems(40, "test", 0, wp.WordSpec(max_ops=2))
RNG = np.random.default_rng(5)
P = RNG.uniform(0, 1, size=40)  # each problem's difficulty, shared by every evaluation


def records(shift: float = 0.0, k: int = 4, greedy: bool = True):
  correct = RNG.uniform(size=(40, k)) < np.clip(P[:, None] + shift, 0, 1)
  return eval_records.build(EXS, correct, np.full((40, k), 30), np.zeros((40, k), bool),
                            correct[:, 0] if greedy else None)


def avg(recs):
  return np.array([np.mean(r["correct"]) for r in recs])


def test_before_after_is_the_paired_bootstrap_of_the_per_problem_scores():
  a, b = records(), records(0.2)
  out = compare.compare([[a], [b]], num_samples=3000, seed=1)
  assert out["problems"] == 40 and out["seeds"] == [1, 1]
  want = bootstrap.interval(avg(b), avg(a), num_samples=3000, seed=1).as_dict()
  assert out["metrics"]["avg"]["diff"] == want
  assert out["metrics"]["avg"]["rows"][0]["estimate"] == pytest.approx(avg(a).mean())
  assert set(out["metrics"]) == {"avg", "pass", "greedy"}
  assert out == compare.compare([[a], [b]], num_samples=3000, seed=1)  # deterministic
  # Shortcuts of the same problems (the rebalanced held-out: none above 5%).
  assert out["shortcuts"]["best"] <= 0.05 and "template" in out["shortcuts"]


def test_problems_are_matched_by_uid_not_by_line():
  a, b = records(), records(0.2)
  shuffled = list(reversed(b))[5:]  # another order, and 5 problems missing
  out = compare.compare([[a], [shuffled]], metrics=("avg",), num_samples=2000)
  kept = [r["uid"] for r in a if r["uid"] in {s["uid"] for s in shuffled}]
  assert out["problems"] == 35 == len(kept)
  by_uid = {r["uid"]: r for r in b}
  want = bootstrap.interval(avg([by_uid[u] for u in kept]),
                            avg([r for r in a if r["uid"] in kept]), num_samples=2000)
  assert out["metrics"]["avg"]["diff"] == want.as_dict()
  other = [dict(r, problem=r["problem"] + " Really?") if i == 3 else r for i, r in enumerate(b)]
  with pytest.raises(sources.DataError, match="different texts"):
    compare.compare([[a], [other]])
  with pytest.raises(sources.DataError, match="share no problem"):
    compare.compare([[a], [[dict(r, uid="x" + r["uid"]) for r in b]]])


def test_rows_of_several_seeds_and_missing_greedy():
  row_a = [records(), records(), records()]
  row_b = [records(0.1, greedy=False), records(0.1, greedy=False)]
  out = compare.compare([row_a, row_b], num_samples=2000, by_ops=True)
  assert out["seeds"] == [3, 2] and "greedy" not in out["metrics"]
  want = bootstrap.interval(np.stack([avg(r) for r in row_b]),
                            np.stack([avg(r) for r in row_a]), num_samples=2000)
  assert out["metrics"]["avg"]["diff"] == want.as_dict()
  assert sum(g["problems"] for g in out["by_ops"].values()) == 40
  table = compare.format_table(out, ("grpo", "vapo"))
  assert "vapo − grpo" in table and "shortcuts on these problems" in table


def test_the_command(tmp_path):
  a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
  eval_records.write(a, records())
  eval_records.write(b, records(0.2))
  cmd = [sys.executable, "-m", "vapo_jax.tools.compare", a, b, "--samples=500",
         f"--json={tmp_path / 'out.json'}", "--labels=before,after"]
  run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "after − before" in run.stdout and "avg" in run.stdout
  result = json.load(open(tmp_path / "out.json"))
  assert result["files"] == [[a], [b]] and result["problems"] == 40
  with open(b, "a", encoding="utf-8") as f:
    f.write("{not json\n")
  run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2 and run.stderr.strip().startswith("error:")
  assert "b.jsonl:41" in run.stderr
