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


def test_seeds_with_problems_of_their_own_pair_seed_by_seed():
  """A held-out split drawn per seed (uids word/<seed>/test/i): seed s of one row is paired with
  seed s of the other on seed s's problems; the interval is `bootstrap` on the [seeds,
  problems] matrices aligned that way (problems once for both rows, seeds per row)."""
  def seed_records(seed, shift):
    exs = wp.word_problems(40, "test", seed, wp.WordSpec(max_ops=2))
    assert exs[0].uid.startswith(f"word/{seed}/")
    correct = RNG.uniform(size=(40, 4)) < np.clip(P[:, None] + shift, 0, 1)
    return eval_records.build(exs, correct, np.full((40, 4), 30), np.zeros((40, 4), bool),
                              correct[:, 0])

  row_a = [seed_records(s, 0.0) for s in (0, 1, 2)]
  row_b = [list(reversed(seed_records(s, 0.2))) for s in (0, 1, 2)]   # another order
  out = compare.compare([row_a, row_b], metrics=("avg",), num_samples=2000)
  assert out["problems"] == 40 and out["seeds"] == [3, 3] and out["problems_per_seed"] == "own"
  order = [[r["uid"] for r in recs] for recs in row_a]
  b_by = [{r["uid"]: r for r in recs} for recs in row_b]
  mat_a = np.stack([avg(r) for r in row_a])
  mat_b = np.stack([avg([b_by[s][u] for u in order[s]]) for s in range(3)])
  want = bootstrap.interval(mat_b, mat_a, num_samples=2000)
  assert out["metrics"]["avg"]["diff"] == want.as_dict()
  assert out["metrics"]["avg"]["diff"]["estimate"] == pytest.approx(mat_b.mean() - mat_a.mean())
  # The shortcuts of every seed's problems; a row alone, seed by seed too.
  assert 0 <= out["shortcuts"]["best"] <= 1
  alone = compare.compare([row_a], metrics=("avg",), num_samples=500)
  assert alone["metrics"]["avg"]["rows"][0]["estimate"] == pytest.approx(mat_a.mean())
  # Seeds that cannot pair: unequal seed counts, or a seed whose problems differ.
  with pytest.raises(sources.DataError, match="different numbers of seeds"):
    compare.compare([row_a, row_b[:2]])
  with pytest.raises(sources.DataError, match="seed by seed they share 40, 0, 40"):
    compare.compare([row_a, [row_b[0], row_b[2], row_b[2]]])
  with pytest.raises(sources.DataError, match="by_ops"):
    compare.compare([row_a, row_b], by_ops=True)


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
