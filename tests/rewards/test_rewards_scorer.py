"""RewardScorer: batching, plug-ins, timeouts, crashes, hostile inputs."""

import os
import time

import numpy as np
import pytest

import reward_cases
from vapo_jax import rewards

_P = "reward_plugins"


@pytest.fixture(scope="module")
def math_pool():
  with rewards.RewardScorer(num_workers=2, timeout_s=3.0) as scorer:
    yield scorer


def test_default_math_scorer_matches_check_answer(math_pool):
  cases = reward_cases.ALL_CASES
  scores = math_pool.score_batch(["p"] * len(cases),
                                 [c.response for c in cases],
                                 [c.reference for c in cases])
  assert scores.rewards.dtype == np.float32
  assert scores.rewards.shape == (len(cases),)
  assert scores.correct.dtype == bool
  np.testing.assert_array_equal(scores.correct, [c.equal for c in cases])
  assert scores.timeouts == 0 and scores.errors == 0
  assert scores.max_seconds < 3.0
  assert not os.path.exists(reward_cases.SENTINEL)
  m = scores.metrics()
  assert m["reward/timeouts"] == 0 and 0 < m["reward/accuracy"] < 1


def test_hostile_cases_in_workers_are_bounded(math_pool):
  hostile = [c for c in reward_cases.ALL_CASES if c.hostile]
  start = time.monotonic()
  scores = math_pool.score_batch([""] * len(hostile),
                                 [c.response for c in hostile],
                                 [c.reference for c in hostile])
  assert time.monotonic() - start < 20
  assert scores.timeouts == 0
  for c, ok in zip(hostile, scores.correct):
    assert ok == c.equal
  assert not os.path.exists(reward_cases.SENTINEL)


def test_order_is_preserved_across_workers():
  with rewards.RewardScorer(f"{_P}:prompt_aware", num_workers=3,
                            timeout_s=5.0) as scorer:
    n = 50
    scores = scorer.score_batch([str(i) for i in range(n)], ["r"] * n, ["x"] * n)
  np.testing.assert_array_equal(scores.rewards, np.arange(n, dtype=np.float32))


def test_timeouts_and_crashes_are_scored_zero_and_pool_survives():
  with rewards.RewardScorer(f"{_P}:sleepy", num_workers=2,
                            timeout_s=0.5) as scorer:
    responses = ["ok", "hang", "ok", "crash", "spin", "raise", "ok"]
    start = time.monotonic()
    scores = scorer.score_batch([""] * 7, responses, [""] * 7)
    assert time.monotonic() - start < 15
    assert scores.reasons[1] == "timeout" and scores.reasons[4] == "timeout"
    assert scores.reasons[3] == "error:crash"
    assert scores.reasons[5] == "error:ValueError"
    np.testing.assert_array_equal(scores.rewards, [1, 0, 1, 0, 0, 0, 1])
    assert scores.timeouts == 2 and scores.errors == 2
    assert scorer.restarts >= 3
    # The pool still works after the restarts.
    again = scorer.score_batch(["", ""], ["ok", "ok"], ["", ""])
    np.testing.assert_array_equal(again.rewards, [1, 1])
    assert scorer.total_timeouts == 2


def test_in_process_mode_has_a_budget():
  with rewards.RewardScorer(f"{_P}:sleepy", num_workers=0,
                            timeout_s=0.3) as scorer:
    scores = scorer.score_batch(["", "", ""], ["ok", "hang", "raise"],
                                ["", "", ""])
  assert scores.reasons[1] == "timeout"
  assert scores.reasons[2] == "error:ValueError"
  np.testing.assert_array_equal(scores.rewards, [1, 0, 0])
  # A check that raised is not a correct answer (the positive-example loss keys on `correct`).
  np.testing.assert_array_equal(scores.correct, [True, False, False])


def test_batch_metrics_by_hand():
  scores = rewards.scorer.BatchScores(
      rewards=np.asarray([1.0, 0.0, 0.0, 0.5, 0.0], np.float32),
      correct=np.asarray([True, False, False, True, False]),
      reasons=["correct", "no_answer", "malformed_box", "len=1", "empty_box"],
      timeouts=1, errors=2, max_seconds=0.25)
  assert scores.metrics() == {
      "reward/mean": pytest.approx(0.3), "reward/accuracy": pytest.approx(0.4),
      "reward/timeouts": 1.0, "reward/errors": 2.0,
      "reward/no_answer_frac": pytest.approx(3 / 5), "reward/max_check_seconds": 0.25}


@pytest.mark.parametrize("fn,expected,reason", [
    (f"{_P}:always_one", 1.0, "correct"),
    (f"{_P}:with_reason", 0.5, "len=1"),
    (f"{_P}:bad_type", 0.0, "error:TypeError"),
    ("vapo_jax.rewards.math:score", 0.0, "no_answer"),
])
def test_plugin_return_types(fn, expected, reason):
  with rewards.RewardScorer(fn, num_workers=0) as scorer:
    scores = scorer.score_batch(["p"], ["x"], ["y"])
  assert scores.rewards[0] == expected and scores.reasons[0] == reason


def test_plugin_bool_and_verdict():
  assert rewards.to_score(True) == (1.0, True, "correct")
  assert rewards.to_score(False) == (0.0, False, "incorrect")
  v = rewards.check_answer(r"\boxed{2}", "2")
  assert rewards.to_score(v) == (1.0, True, "match:string")
  with pytest.raises(TypeError):
    rewards.to_score(float("nan"))


@pytest.mark.parametrize("spec", [
    "no_colon", "vapo_jax.rewards.math:nope", "no_such_module_xyz:f",
    "vapo_jax.rewards.math:DEFAULT_OPTIONS"])
def test_bad_plugin_spec_fails_early(spec):
  with pytest.raises(ValueError, match="reward fn"):
    rewards.RewardScorer(spec, num_workers=0)


def test_length_mismatch_raises():
  with rewards.RewardScorer(num_workers=0) as scorer:
    with pytest.raises(ValueError, match="lengths differ"):
      scorer.score_batch(["a"], ["b", "c"], ["d"])


def test_one_pool_scores_in_both_modes(math_pool):
  lenient = math_pool.using(rewards.fn_for_mode(rewards.DEFAULT_REWARD_FN,
                                                "lenient"))
  args = (["p", "p"], ["It is 4.", r"\boxed{4}"], ["4", "4"])
  np.testing.assert_array_equal(math_pool.score_batch(*args).rewards, [0, 1])
  np.testing.assert_array_equal(lenient.score_batch(*args).rewards, [1, 1])
  with rewards.RewardScorer(num_workers=0) as scorer:
    view = scorer.using(rewards.LENIENT_REWARD_FN)
    np.testing.assert_array_equal(view.score_batch(*args).rewards, [1, 1])
    with pytest.raises(ValueError, match="reward fn"):
      scorer.using("no_such_module_xyz:f")


def test_fn_for_mode():
  assert rewards.fn_for_mode(rewards.DEFAULT_REWARD_FN, "strict") == (
      rewards.DEFAULT_REWARD_FN)
  assert rewards.fn_for_mode(rewards.DEFAULT_REWARD_FN, "lenient") == (
      rewards.LENIENT_REWARD_FN)
  assert rewards.fn_for_mode(f"{_P}:always_one", "lenient") == f"{_P}:always_one"
  with pytest.raises(ValueError, match="mode"):
    rewards.fn_for_mode(rewards.DEFAULT_REWARD_FN, "loose")


def test_a_timed_out_check_costs_its_limit_and_leaves_no_worker_behind():
  import multiprocessing  # pylint: disable=import-outside-toplevel
  before = {p.pid for p in multiprocessing.active_children()}
  with rewards.RewardScorer(f"{_P}:sleepy", num_workers=2, timeout_s=2.0) as scorer:
    scorer.score_batch(["", ""], ["ok", "ok"], ["", ""])  # workers up and ready
    first = [w.process for w in scorer._workers]  # pylint: disable=protected-access
    start = time.monotonic()
    scores = scorer.score_batch(["", ""], ["spin", "hang"], ["", ""])
    elapsed = time.monotonic() - start
    assert scores.reasons == ["timeout", "timeout"]
    # Both checks ran side by side: about one limit (2 s), not two, nor the 5 s join.
    assert 2.0 <= elapsed < 3.9, elapsed
    # The overrunning workers are dead (not left spinning), and two fresh ones serve.
    assert not any(p.is_alive() for p in first)
    alive = {p.pid for p in multiprocessing.active_children()} - before
    assert len(alive) == 2 and not alive & {p.pid for p in first}
  assert not {p.pid for p in multiprocessing.active_children()} - before
