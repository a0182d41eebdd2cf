"""The default VAPO reward: is the response's final answer the reference?

`check_answer` is pure and in-process: extract the final answer, normalise
both sides, then compare as strings, as numbers and as sympy expressions
parsed without `eval`. All work is bounded by `latex.Limits`, but sympy has
no hard guarantees, so the RL loop runs it through `RewardScorer`, whose
worker processes are killed on timeout.

Reasons in a `Verdict` (the prefix before `:` is stable for metrics):
  `match:string`, `match:equivalent` -- correct;
  `mismatch`, `mismatch:too_large` -- compared and different;
  `no_answer`, `malformed_box`, `empty_box`, `answer_too_long`,
  `empty_reference` -- nothing to compare.
"""

import dataclasses

from vapo_jax.rewards import answers
from vapo_jax.rewards import extract
from vapo_jax.rewards import latex
from vapo_jax.rewards import normalize


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A checker's judgement of one response.

  Attributes:
    correct: whether the final answer equals the reference.
    reason: why (see the module docstring).
    extracted: the final answer found in the response, if any.
  """
  correct: bool
  reason: str
  extracted: str | None = None


@dataclasses.dataclass(frozen=True)
class CheckOptions:
  """Options of the math checker.

  Attributes:
    limits: bounds on parsing and building expressions.
    tolerance: numeric comparison tolerances.
  """
  limits: latex.Limits = latex.DEFAULT_LIMITS
  tolerance: answers.Tolerance = answers.Tolerance()


DEFAULT_OPTIONS = CheckOptions()


def answers_match(answer: str, reference: str,
                  options: CheckOptions = DEFAULT_OPTIONS) -> tuple[bool, str]:
  """Compares two already-extracted answers; returns (equal, reason)."""
  if max(len(answer), len(reference)) > extract.MAX_ANSWER_CHARS:
    if normalize.compact(answer) == normalize.compact(reference):
      return True, "match:string"
    return False, "mismatch:too_large"
  a, r = normalize.normalize_answer(answer), normalize.normalize_answer(reference)
  if not r:
    return False, "empty_reference"
  if normalize.compact(a) == normalize.compact(r):
    return True, "match:string"
  if normalize.compact(a).lower() == normalize.compact(r).lower() and (
      not any(c.isdigit() for c in r)):
    return True, "match:string"
  try:
    pa = answers.parse_answer(a, options.limits)
    pr = answers.parse_answer(r, options.limits)
  except latex.TooLarge:
    return False, "mismatch:too_large"
  if answers.equivalent(pa, pr, options.tolerance):
    return True, "match:equivalent"
  return False, "mismatch"


def check_answer(response: str, reference: str,
                 options: CheckOptions = DEFAULT_OPTIONS) -> Verdict:
  """Judges whether a model response's final answer equals the reference.

  Args:
    response: the model's full response (untrusted; any length).
    reference: the reference answer, bare (`\\frac{1}{2}`) or inside a
      solution with `\\boxed{}` or GSM8K's `####`.
    options: limits and tolerances.

  Returns:
    A `Verdict`. Never raises on any string input and never evaluates the
    text as code.
  """
  found = extract.extract_answer(response)
  if found.answer is None:
    return Verdict(False, found.reason, None)
  ref = extract.extract_reference(reference)
  try:
    ok, reason = answers_match(found.answer, ref, options)
  except RecursionError:
    ok, reason = False, "mismatch:too_large"
  return Verdict(ok, reason, found.answer)


def score(prompt: str, response: str, reference: str) -> tuple[float, str]:
  """The default reward plug-in: 1.0 for a correct final answer, else 0.0."""
  del prompt  # The math reward depends only on the answer.
  verdict = check_answer(response, reference)
  return (1.0 if verdict.correct else 0.0), verdict.reason
