"""experiments/real_model/variance_share.py: the between-problem share of a 0/1 reward's
variance, on hand-worked cases and against the population value it estimates."""

import gzip
import json

import numpy as np
import pytest

from experiments.real_model import variance_share as vs


def test_all_between_and_all_within():
  # problems either always or never solved: all the variance is between problems
  assert vs.between_share([[1, 1], [0, 0]])["share"] == pytest.approx(1.0)
  # every problem solved half the time: none of it is
  got = vs.between_share([[1, 0], [0, 1], [1, 0]])
  assert got["share"] == 0.0 and got["mean"] == pytest.approx(0.5)
  assert got["solved_any"] == 1.0


def test_a_hand_worked_anova():
  x = [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
  # p = (.5, 0, .75), mean 5/12; MSB = 4 * sum((p - 5/12)^2) / 2; MSW = (1 + 0 + .75) / 9
  p = np.array([0.5, 0.0, 0.75])
  msb = 4 * ((p - 5 / 12) ** 2).sum() / 2
  msw = (4 * 0.25 + 0 + 4 * 0.1875) / 9
  sb = (msb - msw) / 4
  assert vs.between_share(x)["share"] == pytest.approx(sb / (sb + msw))


def test_it_estimates_the_population_share():
  rng = np.random.default_rng(0)
  p = rng.beta(0.5, 4.0, size=20000)          # pass rates, mean 1/9
  x = rng.random((p.size, 4)) < p[:, None]
  truth = p.var() / (p.var() + (p * (1 - p)).mean())
  assert vs.between_share(x)["share"] == pytest.approx(truth, abs=0.01)
  # unpairing the samples from their problems (a shuffle over all draws) loses the share
  flat = x.reshape(-1).copy()
  rng.shuffle(flat)
  assert vs.between_share(flat.reshape(x.shape))["share"] < 0.01


def test_the_table_reads_the_records(tmp_path):
  d = tmp_path / "seed0" / "vapo" / "eval"
  d.mkdir(parents=True)
  recs = [{"correct": [True, True]}, {"correct": [False, False]}]
  (d / "rl_step_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
  lines = vs.table(str(tmp_path), [0])
  assert lines[-1] == "| 0 | vapo | 50.0%, 1.000 (50%) |"
  with pytest.raises(ValueError):
    vs.between_share([[1, 0]])


def test_gzipped_records_are_read_as_the_plain_ones(tmp_path):
  """The records kept in the repository are gzipped (results/registered-2026-12-05/runs)."""
  recs = "".join(json.dumps({"correct": c}) + "\n" for c in ([True, True], [False, True]))
  plain = tmp_path / "plain" / "seed0" / "vapo" / "eval"
  packed = tmp_path / "packed" / "seed0" / "vapo" / "eval"
  plain.mkdir(parents=True)
  packed.mkdir(parents=True)
  (plain / "rl_step_0.jsonl").write_text(recs)
  with gzip.open(packed / "rl_step_0.jsonl.gz", "wt") as f:
    f.write(recs)
  got = vs.table(str(tmp_path / "packed"), [0])
  assert got == vs.table(str(tmp_path / "plain"), [0]) and len(got) == 3
