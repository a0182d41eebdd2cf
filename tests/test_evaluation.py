"""Evaluation metrics on hand-computed verdicts, and the padded last batch of prompts."""

import numpy as np
import pytest

import trainer_plugins
from test_trainer import tiny
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


def test_padded_prompts_do_not_count():
  """5 problems in batches of 4: the last batch, one real prompt, is padded with 3 copies."""
  cfg = tiny(**{"reward.fn": "trainer_plugins:problem_parity", "eval.num_examples": 5,
                "eval.batch_prompts": 4, "eval.samples_per_problem": 2,
                "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    examples = t.parts.eval_examples[:5]
    out = t.evaluate(examples)
  finally:
    t.close()
  right = np.array([trainer_plugins.problem_parity(ex.problem, "", ex.answer)
                    for ex in examples])
  padded = np.concatenate([right, [right[-1]] * 3])  # what counting the padding would give
  assert padded.mean() != right.mean()  # so this data tells the two apart
  assert out["avg@2"] == pytest.approx(right.mean())
  assert out["pass@2"] == pytest.approx(right.mean())
  assert out["greedy_accuracy"] == pytest.approx(right.mean())
