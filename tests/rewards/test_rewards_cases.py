"""The labelled suite: every case in `reward_cases` gets the expected verdict,
in the strict mode (`Case.equal`) and in the lenient mode
(`Case.lenient_equal`)."""

import os
import time

import pytest

import reward_cases
from vapo_jax import rewards

CASES = reward_cases.ALL_CASES
STRICT = rewards.CheckOptions(mode="strict")
LENIENT = rewards.CheckOptions(mode="lenient")


def test_suite_is_large_and_varied():
  assert len(CASES) >= 800
  assert len(reward_cases.CORPUS_CASES) >= len(CASES) / 2
  assert len({c.category for c in CASES}) >= 10
  assert sum(not c.equal for c in CASES) >= 100
  assert sum(c.hostile for c in CASES) >= 50
  assert sum(c.lenient_equal != c.equal for c in CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[
    f"{c.category}-{i}" for i, c in enumerate(CASES)])
def test_case(case):
  for options, expected in ((STRICT, case.equal),
                            (LENIENT, case.lenient_equal)):
    start = time.perf_counter()
    verdict = rewards.check_answer(case.response, case.reference, options)
    elapsed = time.perf_counter() - start
    assert verdict.correct == expected, (options.mode, verdict, case.reference)
    assert isinstance(verdict.reason, str) and verdict.reason
    assert elapsed < 2.0, elapsed
  assert not os.path.exists(reward_cases.SENTINEL)
