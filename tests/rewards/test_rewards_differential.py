"""Differential testing against math-verify on the corpus of `reward_corpus`.

math-verify (a test-time dependency) is the oracle: on every corpus case
where its verdict differs from the label, the difference must be one of the
documented policy classes (`reward_corpus.POLICY`, listed in the README).
Our own checker must equal every label in both modes (checked by
`test_rewards_cases`); here it is also checked that every policy class still
explains at least one disagreement, so the list does not go stale.
"""

import logging

import pytest

import reward_corpus
from vapo_jax import rewards

math_verify = pytest.importorskip("math_verify")


def _math_verify(case) -> bool:
  logging.disable(logging.CRITICAL)
  try:
    gold = math_verify.parse(f"${case.reference}$")
    return bool(math_verify.verify(gold, math_verify.parse(case.response)))
  finally:
    logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def verdicts():
  """math-verify's verdict on every corpus case, in order."""
  return [_math_verify(c) for c in reward_corpus.CASES]


@pytest.fixture(scope="module")
def disagreements(verdicts):
  """Corpus cases where math-verify differs from the lenient label (the mode
  math-verify's own extraction resembles)."""
  return [c for c, mv in zip(reward_corpus.CASES, verdicts)
          if mv != c.lenient_equal]


def test_every_disagreement_is_documented_policy(disagreements):
  undocumented = [(c.category, c.answer, c.reference) for c in disagreements
                  if reward_corpus.policy_of(c) is None]
  assert not undocumented, undocumented


def test_every_policy_class_is_exercised(disagreements):
  seen = {reward_corpus.policy_of(c) for c in disagreements}
  assert set(reward_corpus.POLICY) <= seen, set(reward_corpus.POLICY) - seen


def test_we_agree_with_labels_where_math_verify_disagrees(disagreements):
  lenient = rewards.CheckOptions(mode="lenient")
  for c in disagreements:
    assert rewards.check_answer(c.response, c.reference,
                                lenient).correct == c.lenient_equal, c


def test_agreement_is_high(verdicts):
  agree = sum(mv == c.lenient_equal
              for c, mv in zip(reward_corpus.CASES, verdicts))
  assert agree / len(reward_corpus.CASES) >= 0.9
