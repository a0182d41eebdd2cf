"""The labelled suite: every case in `reward_cases` gets the expected verdict."""

import os
import time

import pytest

import reward_cases
from vapo_jax import rewards

CASES = reward_cases.ALL_CASES


def test_suite_is_large_and_varied():
  assert len(CASES) >= 250
  assert len({c.category for c in CASES}) >= 10
  assert sum(not c.equal for c in CASES) >= 100


@pytest.mark.parametrize("case", CASES, ids=[
    f"{c.category}-{i}" for i, c in enumerate(CASES)])
def test_case(case):
  start = time.perf_counter()
  verdict = rewards.check_answer(case.response, case.reference)
  elapsed = time.perf_counter() - start
  assert verdict.correct == case.equal, (verdict, case.reference)
  assert isinstance(verdict.reason, str) and verdict.reason
  assert elapsed < 2.0, elapsed
  assert not os.path.exists(reward_cases.SENTINEL)
