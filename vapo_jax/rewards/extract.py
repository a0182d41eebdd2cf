"""Finds the final answer in a model response or a reference string.

Order of preference: the last `\\boxed{...}` / `\\fbox{...}` (nested braces
matched; an unclosed box is malformed and scores 0 rather than being
repaired), then GSM8K's `#### answer`, then "the (final) answer is ...".
Only the tail of a very long response is searched, so the cost is bounded.
"""

import dataclasses
import re

from vapo_jax.rewards import normalize

# Final answers live at the end; a megabyte of reasoning before them is not
# searched.
MAX_TAIL_CHARS = 20_000
MAX_ANSWER_CHARS = 1_000

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_HASH_RE = re.compile(r"####\s*([^\n]+)")
# The prefix is an atomic group so that "The answer is" never yields "is".
_PHRASE_RE = re.compile(
    r"(?>(?:final\s+answer|the\s+answer|^[ \t>*#]*answer)\**\s*(?:is\b|:)?"
    r"\**\s*[:=]?\s*)([^\n]+?)\s*(?:\.\s|\.$|$|\n)",
    re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Extraction:
  """The result of looking for a final answer.

  Attributes:
    answer: the answer text, or None when there is none.
    reason: how it was found (`boxed`, `gsm8k`, `phrase`, `plain`) or why
      there is none (`no_answer`, `malformed_box`, `empty_box`,
      `answer_too_long`).
  """
  answer: str | None
  reason: str


def _last_box(text: str) -> Extraction | None:
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  m = matches[-1]
  i = m.end()
  while i < len(text) and text[i] == " ":
    i += 1
  if i < len(text) and text[i] == "{":
    end = normalize.find_group(text, i)
    if end < 0:
      return Extraction(None, "malformed_box")
    inner = text[i + 1:end - 1]
  else:  # `\boxed 5` form: one token.
    tok = re.match(r"[^\s$]+", text[i:])
    if tok is None:
      return Extraction(None, "malformed_box")
    inner = tok.group(0)
  inner = inner.strip()
  if not inner:
    return Extraction(None, "empty_box")
  return Extraction(inner, "boxed")


def _clean_phrase(ans: str) -> str:
  ans = ans.strip().strip("*").strip()
  ans = re.sub(r"^\$+|\$+$", "", ans).strip()
  return ans.rstrip(".").strip()


def extract_answer(response: str) -> Extraction:
  """Returns the final answer of a model response.

  Args:
    response: untrusted model output of any length.

  Returns:
    An `Extraction`; `answer` is None with a reason when the response has
    no (well-formed) final answer.
  """
  text = response[-MAX_TAIL_CHARS:]
  found = _last_box(text)
  if found is None:
    hashes = _HASH_RE.findall(text)
    if hashes:
      found = Extraction(_clean_phrase(hashes[-1]), "gsm8k")
    else:
      phrases = _PHRASE_RE.findall(text)
      phrases = [p for p in phrases if _clean_phrase(p)]
      if phrases:
        answer = phrases[-1]
        for _ in range(3):  # "Final Answer: The final answer is 5."
          inner = _PHRASE_RE.findall(answer)
          if not inner or not _clean_phrase(inner[-1]):
            break
          answer = inner[-1]
        found = Extraction(_clean_phrase(answer), "phrase")
      else:
        return Extraction(None, "no_answer")
  if found.answer is not None:
    if not found.answer:
      return Extraction(None, "no_answer")
    if len(found.answer) > MAX_ANSWER_CHARS:
      return Extraction(None, "answer_too_long")
  return found


def extract_reference(reference: str) -> str:
  """Returns the answer part of a reference (a bare answer, a boxed solution,
  or a GSM8K `####` solution)."""
  if _BOX_RE.search(reference) or "####" in reference:
    found = extract_answer(reference)
    if found.answer is not None:
      return found.answer
  return reference.strip()
