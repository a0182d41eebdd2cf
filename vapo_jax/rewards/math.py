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
  `empty_reference` -- nothing to compare;
  `ambiguous_boxes` -- the final box is one of a hedge (`\\boxed{3}` or
  `\\boxed{5}`, box spam, `\\boxed{2} (or 3)`), which is no single answer.

Modes (`CheckOptions.mode`): `strict`, the training reward's default, judges
only a marked final answer and the last marker wins (formatting hacks earn
nothing); `lenient`, for evaluation, also accepts the final unmarked answer
of a response with no marker, and several boxes that together state a
multi-part reference (`\\boxed{2}` ... `\\boxed{3}` for `2, 3`). See
`extract` for the extraction rules of each mode.
"""

import dataclasses
import re

from vapo_jax.rewards import answers
from vapo_jax.rewards import extract
from vapo_jax.rewards import forms
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
    mode: `strict` (marked final answers only; the training default) or
      `lenient` (also unmarked final answers and multi-box answers; for
      evaluation).
  """
  limits: latex.Limits = latex.DEFAULT_LIMITS
  tolerance: answers.Tolerance = answers.Tolerance()
  mode: str = "strict"

  def __post_init__(self):
    if self.mode not in extract.MODES:
      raise ValueError(f"CheckOptions.mode must be one of {extract.MODES}, "
                       f"got {self.mode!r}")


DEFAULT_OPTIONS = CheckOptions()
# A multiple-choice letter followed by its value: `(C) 3`, `\\text{(B) } 5`.
_CHOICE_RE = re.compile(
    r"\s*(?:\\(?:text|textbf|mathbf|mathrm)\{\s*)?"
    r"(?:\(([A-E])\)\s*\}?\s*[:.]?|([A-E])\s*\}?\s*[:.])\s*(\S.*)", re.DOTALL)
# A second choice letter in the value: a list of options, not an answer.
_ANOTHER_CHOICE_RE = re.compile(r"\(\s*[A-E]\s*\)|(?<![A-Za-z\\])[A-E]\s*\}?\s*[:.)]")
LENIENT_OPTIONS = CheckOptions(mode="lenient")


def answers_match(answer: str, reference: str,
                  options: CheckOptions = DEFAULT_OPTIONS) -> tuple[bool, str]:
  """Compares two already-extracted answers; returns (equal, reason)."""
  if max(len(answer), len(reference)) > extract.MAX_ANSWER_CHARS:
    if normalize.compact(answer) == normalize.compact(reference):
      return True, "match:string"
    return False, "mismatch:too_large"
  choice = _CHOICE_RE.fullmatch(answer)
  if choice is not None and not _ANOTHER_CHOICE_RE.search(choice.group(3)):
    # "(C) 3", "B: 4": the letter or the value may be the gold.
    for part in (choice.group(1) or choice.group(2), choice.group(3)):
      ok, reason = answers_match(part, reference, options)
      if ok:
        return ok, reason
    return False, "mismatch"
  answer, reference = normalize.degrees_as_radians(answer, reference)
  a, r = normalize.normalize_answer(answer), normalize.normalize_answer(reference)
  if not r:
    return False, "empty_reference"
  if normalize.compact(a) == normalize.compact(r):
    return True, "match:string"
  if normalize.compact(a).lower() == normalize.compact(r).lower() and (
      not any(c.isdigit() for c in r)):
    return True, "match:string"
  forms_verdict = _compare_forms(a, r, options)
  if forms_verdict is not None:
    return forms_verdict
  number_a = forms.number_from_words(a)
  number_r = forms.number_from_words(r)
  if number_a is not None or number_r is not None:
    # `twenty-five`, `\\text{ten}`: a number written in words.
    a = a if number_a is None else str(number_a)
    r = r if number_r is None else str(number_r)
    if normalize.compact(a) == normalize.compact(r):
      return True, "match:equivalent"
  try:
    pa = answers.parse_answer(a, options.limits)
    pr = answers.parse_answer(r, options.limits)
  except latex.TooLarge:
    return False, "mismatch:too_large"
  if answers.equivalent(pa, pr, options.tolerance):
    return True, "match:equivalent"
  # A percentage is also its value as a fraction: `50\\%` is 0.5 as well
  # as 50 (the sign is dropped by `normalize`, so 50 is tried first).
  pct_a, pct_r = normalize.has_percent(answer), normalize.has_percent(reference)
  if pct_a != pct_r:
    try:
      scaled = answers.parse_answer(f"({a if pct_a else r})/100", options.limits)
    except latex.TooLarge:
      return False, "mismatch:too_large"
    if scaled.kind == "expr" and answers.equivalent(
        scaled if pct_a else pa, pr if pct_a else scaled, options.tolerance):
      return True, "match:equivalent"
  return False, "mismatch"


def _compare_forms(a: str, r: str,
                   options: CheckOptions) -> tuple[bool, str] | None:
  """The forms of `forms` (normalised answers): prose, numbers with a base,
  piecewise definitions. None when neither side is such a form."""
  words_a, words_r = forms.prose_words(a), forms.prose_words(r)
  if words_a is not None and words_r is not None and words_a == words_r:
    return True, "match:string"
  based = forms.bases_equal(a, r)
  if based is not None:
    return based, "match:equivalent" if based else "mismatch"
  rows_a, rows_r = forms.piecewise_rows(a), forms.piecewise_rows(r)
  if rows_a is not None and rows_r is not None:
    same = forms.piecewise_equal(
        rows_a, rows_r, lambda x, y: answers_match(x, y, options)[0])
    return same, "match:equivalent" if same else "mismatch"
  return None


def _hedged(response: str, found: extract.Extraction,
            options: CheckOptions) -> bool:
  """Whether the final box shares its sentence with other boxes that state
  a different answer (`$\\boxed{3}$ or $\\boxed{5}$`, box spam): a hedge or
  a list of guesses, which is no single final answer."""
  if found.reason != "boxed":
    return False
  tail = response[-extract.MAX_TAIL_CHARS:]
  last = tail.rfind("box")
  if tail.count("box") < 2 and "or" not in tail[last:]:
    return False  # One box and no alternative after it (the common case).
  group = extract.final_box_group(response)
  if len(group) < 2 or group[-1] != found.answer:
    return False
  last = normalize.compact(group[-1])
  others = {normalize.compact(b) for b in group[:-1]} - {last}
  if not others:
    return False
  if len(others) > 4:
    return True
  return not all(_compare(b, group[-1], options).correct for b in others)


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
  found = extract.extract_answer(response, options.mode)
  ref = extract.extract_reference(reference)
  if found.answer is None:
    verdict = Verdict(False, found.reason, None)
  elif _hedged(response, found, options):
    verdict = Verdict(False, "ambiguous_boxes", found.answer)
  else:
    verdict = _compare(found.answer, ref, options)
  if options.mode == "lenient" and not verdict.correct and (
      found.reason == "boxed" and _is_sentence(found.answer)):
    # A box holding a sentence ("Adding, 5 + 7 = 12."): its final answer.
    inner = extract.extract_unmarked(found.answer)
    if inner.answer is not None:
      again = _compare(inner.answer, ref, options)
      if again.correct:
        return again
  if options.mode == "lenient" and not verdict.correct:
    joined = _joined_boxes(response, ref)
    if joined is not None:
      again = _compare(joined, ref, options)
      if again.correct:
        return Verdict(True, again.reason + ":boxes", joined)
  return verdict


def _is_sentence(text: str) -> bool:
  """Prose that states a value ("Adding, 5 + 7 = 12."): a word of three or
  more letters outside LaTeX commands, and nothing but letters, digits,
  spaces, punctuation and arithmetic (no quotes, brackets or underscores,
  so code never qualifies)."""
  if not re.fullmatch(r"[A-Za-z0-9\s.,;:!?+\-*/=$^{}()\\]+", text):
    return False
  math = re.sub(r"\\[A-Za-z]+\{[^{}]*\}", " ", text)  # `\\text{ and }` is math.
  return bool(re.search(r"(?<![\\A-Za-z])[A-Za-z]{3,}", math))


def _compare(answer: str, ref: str, options: CheckOptions) -> Verdict:
  try:
    ok, reason = answers_match(answer, ref, options)
  except RecursionError:
    ok, reason = False, "mismatch:too_large"
  return Verdict(ok, reason, answer)


def _joined_boxes(response: str, reference: str) -> str | None:
  """Lenient mode: the boxes joined by commas, when the reference lists
  k >= 2 parts and the response has exactly k boxes (more boxes than parts
  is a list of guesses, not an answer); in a response with no marker, the
  math segments of its last sentence, under the same rule."""
  parts = answers.count_parts(normalize.normalize_answer(reference))
  if parts < 2:
    return None
  response = extract.unwrap_response(response)
  boxes = extract.all_boxes(response)
  if not boxes and extract.extract_answer(response).reason == "no_answer":
    boxes = extract.final_segments(response)
  if len(boxes) != parts:
    return None
  return ", ".join(boxes)


def score(prompt: str, response: str, reference: str) -> tuple[float, str]:
  """The default reward plug-in (strict mode): 1.0 for a correct final
  answer, else 0.0."""
  del prompt  # The math reward depends only on the answer.
  verdict = check_answer(response, reference)
  return (1.0 if verdict.correct else 0.0), verdict.reason


def score_lenient(prompt: str, response: str,
                  reference: str) -> tuple[float, str]:
  """The math reward in lenient mode (for evaluation)."""
  del prompt
  verdict = check_answer(response, reference, LENIENT_OPTIONS)
  return (1.0 if verdict.correct else 0.0), verdict.reason
