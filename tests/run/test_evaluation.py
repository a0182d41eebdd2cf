"""Evaluation metrics on hand-computed verdicts, the padded last batch of prompts, and the
per-problem records (run.eval_records) beside every summary."""

import json
import os

import numpy as np
import pytest

import trainer_plugins
from tiny_trainer import tiny
from vapo_jax.data import shortcuts
from vapo_jax.data import sources
from vapo_jax.run import eval_records
from vapo_jax.run import evaluation
from vapo_jax.run import trainer as trainer_lib

# 5 problems x k = 4 samples (threshold 1: a score >= 1 is correct).
SCORES = np.array([
    [1.0, 1.0, 1.0, 1.0],   # all correct
    [0.0, 0.0, 0.0, 0.0],   # none
    [0.0, 1.0, 0.0, 0.0],   # one, not the first sample
    [0.5, 1.0, 0.0, 1.0],   # two (0.5 is below the threshold)
    [1.0, 0.0, 0.0, 0.0],   # one, the first sample
])


def test_avg_and_pass_at_k_by_hand():
  out = evaluation.accuracy_metrics(SCORES)
  assert set(out) == {"avg@4", "pass@4"}
  assert out["avg@4"] == pytest.approx((4 + 0 + 1 + 2 + 1) / 20)
  assert out["pass@4"] == pytest.approx(4 / 5)  # not first-sample accuracy (2 / 5)
  half = evaluation.accuracy_metrics(SCORES, threshold=0.5)
  assert half["avg@4"] == pytest.approx((4 + 0 + 1 + 3 + 1) / 20)
  assert half["pass@4"] == pytest.approx(4 / 5)


def test_k_is_the_number_of_samples():
  out = evaluation.accuracy_metrics(SCORES[:, :3])
  assert out == pytest.approx({"avg@3": (3 + 0 + 1 + 1 + 1) / 15, "pass@3": 4 / 5})
  one = evaluation.accuracy_metrics(SCORES[:, :1])
  assert one == pytest.approx({"avg@1": 2 / 5, "pass@1": 2 / 5})


def test_avg_at_k_per_kind_by_hand():
  kinds = ["long", "short", "long", "short", "long"]
  out = evaluation.kind_metrics(SCORES, kinds)
  assert out == pytest.approx({"avg@4/long": (4 + 1 + 1) / 12, "avg@4/short": (0 + 2) / 8})
  # The kinds' shares, weighted by their problems, give back the overall avg@k.
  assert (3 * out["avg@4/long"] + 2 * out["avg@4/short"]) / 5 == pytest.approx(
      evaluation.accuracy_metrics(SCORES)["avg@4"])
  with pytest.raises(ValueError, match="4 kinds for 5 problems"):
    evaluation.kind_metrics(SCORES, kinds[:4])


@pytest.mark.parametrize("bad", [np.ones(4), np.ones((3, 0)), np.ones((0, 4))],
                         ids=["1-d", "no-samples", "no-problems"])
def test_malformed_score_matrix_raises(bad):
  with pytest.raises(ValueError, match="problems, k"):
    evaluation.accuracy_metrics(bad)


def test_padded_prompts_do_not_count(tmp_path):
  """5 problems in batches of 4: the last batch, one real prompt, is padded with 3 copies;
  the records hold the 5 real problems, in order, with the verdicts the metrics count."""
  cfg = tiny(**{"reward.fn": "trainer_plugins:problem_parity", "eval.num_examples": 5,
                "eval.batch_prompts": 4, "eval.samples_per_problem": 2,
                "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    examples = t.parts.eval_examples[:5]
    out = t.evaluate(examples, records_path=str(tmp_path / "eval" / "x.jsonl"))
  finally:
    t.close()
  right = np.array([trainer_plugins.problem_parity(ex.problem, "", ex.answer)
                    for ex in examples])
  padded = np.concatenate([right, [right[-1]] * 3])  # what counting the padding would give
  assert padded.mean() != right.mean()  # so this data tells the two apart
  assert out["avg@2"] == pytest.approx(right.mean())
  assert out["pass@2"] == pytest.approx(right.mean())
  assert out["greedy_accuracy"] == pytest.approx(right.mean())

  recs = eval_records.read(str(tmp_path / "eval" / "x.jsonl"))
  assert [r["uid"] for r in recs] == [ex.uid for ex in examples]
  assert [r["index"] for r in recs] == list(range(5))
  assert np.mean([np.mean(r["correct"]) for r in recs]) == pytest.approx(out["avg@2"])
  assert np.mean([r["greedy"] for r in recs]) == pytest.approx(out["greedy_accuracy"])
  assert all(len(r["lengths"]) == 2 == len(r["truncated"]) for r in recs)
  assert all(r["ops"] and r["n_ops"] == len(r["ops"]) for r in recs)  # arithmetic solutions
  assert out["ci95_lo/avg@2"] <= out["avg@2"] <= out["ci95_hi/avg@2"]
  assert out["shortcut/best"] == max(out[f"shortcut/{k}"] for k in shortcuts.SHORTCUTS)


def test_records_are_written_whole_and_replaced(tmp_path):
  """A file is renamed into place (no temporary left) and a repeated evaluation replaces it:
  a resumed run that evaluates again does not duplicate problems."""
  exs = [sources.Example("Ann has 3 apples. She buys 4 more apples.", "7",
                         "3 + 4 = 7\nThe answer is \\boxed{7}.", uid="w/0"),
         sources.Example("What is 2 times 5?", "10", None, uid="h/1")]
  correct = np.array([[True, False], [False, False]])
  recs = eval_records.build(exs, correct, np.array([[5, 9], [3, 4]]), correct & False)
  assert recs[0]["ops"] == ["+"] and recs[0]["n_ops"] == 1 and recs[1]["ops"] is None
  assert recs[0]["shortcuts"]["sum"] and recs[1]["shortcuts"]["product"]
  assert recs[0]["greedy"] is None and recs[1]["lengths"] == [3, 4]
  path = str(tmp_path / "eval" / "rl_step_0.jsonl")
  eval_records.write(path, recs)
  eval_records.write(path, recs)
  assert os.listdir(tmp_path / "eval") == ["rl_step_0.jsonl"]
  assert eval_records.read(path) == recs
  assert eval_records.run_path(str(tmp_path), 20).endswith(os.path.join("eval", "rl_step_20.jsonl"))
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps({"stage": "rl"}) + "\n")
  with pytest.raises(sources.DataError, match="rl_step_0.jsonl:3: not a per-problem"):
    eval_records.read(path)
