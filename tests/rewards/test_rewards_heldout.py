"""The held-out set (`reward_heldout`, written before reading the checker's
code): every case gets its label in the strict mode (`Case.equal`) and the
lenient mode (`Case.lenient_equal`), except the documented exceptions below,
where the disagreement is deliberate policy (README, "Policy")."""

import time

import pytest

import reward_heldout
from vapo_jax import rewards

STRICT = rewards.CheckOptions(mode="strict")
LENIENT = rewards.CheckOptions(mode="lenient")

# (reference, response) -> why the checker deliberately differs from the
# grader's label.
EXCEPTIONS = {
    ("5", r"The answer is \boxed{5}, not \boxed{6}."):
        "hedged_boxes: boxes joined by one word are a hedge; telling "
        "'not' from 'or' would need word lists, and a 0 here is safe",
}


def test_heldout_is_large_and_varied():
  cases = reward_heldout.HELDOUT
  assert len(cases) >= 300
  assert len(reward_heldout.FAMILIES) >= 25
  assert sum(c.hostile for c in cases) >= 30
  keys = {(c.reference, c.response) for c in cases}
  assert set(EXCEPTIONS) <= keys


@pytest.mark.parametrize("case", reward_heldout.HELDOUT, ids=[
    f"{c.category}-{i}" for i, c in enumerate(reward_heldout.HELDOUT)])
def test_heldout_case(case):
  exception = (case.reference, case.response) in EXCEPTIONS
  for options, expected in ((STRICT, case.equal),
                            (LENIENT, case.lenient_equal)):
    start = time.perf_counter()
    verdict = rewards.check_answer(case.response, case.reference, options)
    assert time.perf_counter() - start < 2.0
    if exception:
      assert verdict.correct != expected, "exception no longer needed"
    else:
      assert verdict.correct == expected, (options.mode, verdict,
                                           case.reference)
