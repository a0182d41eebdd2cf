"""Finds the final answer in a model response or a reference string.

Two modes (see `MODES`):

* `strict` (the training reward's default): only a *marked* final answer
  counts, and the last marker in the response wins. Markers are
  `\\boxed{...}` / `\\fbox{...}` (nested braces matched; an unclosed box is
  malformed and scores 0 rather than being repaired), GSM8K's `#### x`, and
  answer phrases: "Final Answer: ...", "the (final) answer is ...", a line
  that starts with "Answer". So the Minerva format "Final Answer: The final
  answer is $X$. I hope it is correct." beats an earlier intermediate box,
  and a later box beats an earlier phrase. A phrase whose text holds a box
  yields that box. The text after a phrase runs to the end of its sentence
  outside math, so display math that spans lines (`Answer: \\[ ... \\]`,
  `$$ ... $$`) is kept whole.
* `lenient` (for evaluation): everything strict finds, plus, when there is
  no marker at all, the final unmarked answer -- the last math segment or
  number of the response. (Several boxes that together answer a multi-part
  reference are joined by the checker, which knows the reference; see
  `all_boxes`.)

Only the tail of a very long response is searched, so the cost is bounded.
"""

import dataclasses
import re

from vapo_jax.rewards import normalize

MODES = ("strict", "lenient")

# Final answers live at the end; a megabyte of reasoning before them is not
# searched.
MAX_TAIL_CHARS = 20_000
MAX_ANSWER_CHARS = 1_000
MAX_BOXES = 64

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_HASH_RE = re.compile(r"####[ \t]*")
# The prefix is an atomic group so that "The answer is" never yields "is".
_PHRASE_RE = re.compile(
    r"(?>(?:final\s+answer|the\s+answer|^[ \t>*#]*answer)\**[ \t]*"
    r"(?:is\b|:)?\**[ \t]*[:=]?[ \t]*)",
    re.IGNORECASE | re.MULTILINE)
# "The largest $n$ is 34": a definite description, then the value.
_DESCRIPTION_RE = re.compile(r"^(?:the|our|my)\s", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Extraction:
  """The result of looking for a final answer.

  Attributes:
    answer: the answer text, or None when there is none.
    reason: how it was found (`boxed`, `gsm8k`, `phrase`, `unmarked`) or why
      there is none (`no_answer`, `malformed_box`, `empty_box`,
      `answer_too_long`).
  """
  answer: str | None
  reason: str


def _box_at(text: str, start: int, end: int) -> Extraction:
  """The box whose command ends at `end` (`\\boxed{...}` or `\\boxed 5`)."""
  i = end
  while i < len(text) and text[i] == " ":
    i += 1
  if i < len(text) and text[i] == "{":
    close = normalize.find_group(text, i)
    stray = close < 0
    if stray:
      # `\\boxed{5\\}`: closed by its escaped brace, within bounded work.
      close = normalize.find_group(text, i, stray_close=True, limit=MAX_ANSWER_CHARS)
    if close < 0:
      return Extraction(None, "malformed_box")
    inner = text[i + 1:close - 1]
    if stray:
      inner = inner[:-1]
  else:  # `\boxed 5` form: one token.
    tok = re.match(r"[^\s$]+", text[i:])
    if tok is None:
      return Extraction(None, "malformed_box")
    inner = tok.group(0)
  inner = inner.strip()
  if not inner:
    return Extraction(None, "empty_box")
  return Extraction(inner, "boxed")


def _top_boxes(text: str) -> list[tuple[int, int, str]]:
  """(start, end, content) of the well-formed top-level boxes of `text`: at
  most `MAX_BOXES`, among the last `2 * MAX_BOXES` box commands, each
  searched within `MAX_ANSWER_CHARS` (bounded work on hostile input)."""
  out, pos = [], 0
  for m in list(_BOX_RE.finditer(text))[-2 * MAX_BOXES:]:
    if m.start() < pos:
      continue  # A box inside the previous box.
    window = text[m.start():m.end() + MAX_ANSWER_CHARS + 2]
    found = _box_at(window, 0, m.end() - m.start())
    if found.answer is None:
      continue
    brace = window.find("{", m.end() - m.start())
    close = normalize.find_group(window, brace) if brace >= 0 else -1
    end = m.start() + (close if close > 0 else len(window))
    out.append((m.start(), end, found.answer))
    pos = end
  return out[-MAX_BOXES:]


def all_boxes(response: str) -> list[str]:
  """The contents of the well-formed top-level boxes of a response, in order
  (see `_top_boxes` for the bounds)."""
  return [b[2] for b in _top_boxes(response[-MAX_TAIL_CHARS:])]


# A box whose content is itself a response: it holds a box, an answer
# phrase or inline math delimiters.
_RESPONSE_LIKE = re.compile(
    r"\\(?:boxed|fbox)(?![A-Za-z])|(?<!\\)\$|\\\[|final\s+answer|answer\s*(?:is|:)",
    re.IGNORECASE)


def unwrap_response(response: str, depth: int = 2) -> str:
  """`\\boxed{<a whole response>}` -> that response, when the box is the last
  marker: a harness that boxes a model's whole output must not hide the
  answer markers inside it (at most `depth` levels)."""
  text = response[-MAX_TAIL_CHARS:]
  tops = _top_boxes(text)
  if not tops or depth <= 0:
    return response
  start, end, content = tops[-1]
  if not _RESPONSE_LIKE.search(content) or _marked(text[end:]) is not None:
    return response
  return unwrap_response(content, depth - 1)


def _math_end(text: str, i: int) -> int:
  """Index just past the math segment opening at `i` (or -1 if unclosed)."""
  for opener, closer in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"),
                         ("$", "$")):
    if text.startswith(opener, i):
      j = i + len(opener)
      while True:
        k = text.find(closer, j)
        if k < 0:
          return -1
        if closer == "$" and text[k - 1] == "\\":
          j = k + 1
          continue
        return k + len(closer)
  return i + 1


def _sentence(text: str, start: int, limit: int = 2 * MAX_ANSWER_CHARS) -> str:
  """The text from `start` to the end of its sentence, skipping math.

  A sentence ends at a newline or at a period followed by a space or the end,
  but never inside `$...$`, `$$...$$`, `\\[...\\]` or `\\(...\\)`. Leading
  newlines are skipped, so "Answer:\\n$$x$$" yields the display.
  """
  i = start
  while i < len(text) and text[i] in " \t\n*:":
    i += 1
  begin, stop = i, min(len(text), i + limit)
  while i < stop:
    c = text[i]
    if c == "$" or text.startswith(("\\[", "\\("), i):
      j = _math_end(text, i)
      if j < 0:
        return text[begin:stop]
      i = j
      continue
    if c == "\n":
      break
    if c == "." and (i + 1 == len(text) or text[i + 1] in " \n\t*"):
      break
    i += 1
  return text[begin:i]


def _clean(ans: str) -> str:
  """Drops markdown emphasis, math delimiters and final punctuation."""
  ans = ans.strip().strip("*").strip()
  for opener, closer in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)")):
    if ans.startswith(opener) and ans.endswith(closer) and len(ans) >= 4:
      ans = ans[len(opener):-len(closer)]
  ans = re.sub(r"(?<!\\)\$", " ", ans).strip()  # `$4$ square units`.
  return ans.rstrip(".").strip()


def _describe(ans: str) -> str:
  """`The largest $n$ is 34` -> `34`: the value after the last ` is `
  outside math, when the sentence opens with a definite description."""
  if not _DESCRIPTION_RE.match(ans):
    return ans
  depth, cut = 0, -1
  for m in re.finditer(r"\$|\s(?:is|are|equals)\s", ans):
    if m.group(0) == "$":
      depth ^= 1
    elif depth == 0:
      cut = m.end()
  return ans[cut:] if cut > 0 else ans


def _phrase_answer(text: str, m: re.Match) -> str:
  """The answer that an answer phrase introduces (phrases may nest:
  "Final Answer: The final answer is $5$.")."""
  ans = _sentence(text, m.end())
  for _ in range(3):
    inner = list(_PHRASE_RE.finditer(ans))
    if not inner:
      break
    nested = _sentence(ans, inner[-1].end())
    if not _clean(nested):
      break
    ans = nested
  return _clean(_describe(_clean(ans)))


def _marked(text: str) -> tuple[int, Extraction] | None:
  """The last marked answer in `text`, with its position."""
  best = None
  boxes = list(_BOX_RE.finditer(text))
  if boxes:
    m = boxes[-1]
    best = (m.start(), _box_at(text, m.start(), m.end()))
  hashes = list(_HASH_RE.finditer(text))
  if hashes and (best is None or hashes[-1].start() > best[0]):
    line = text[hashes[-1].end():].split("\n", 1)[0]
    if _clean(line):
      best = (hashes[-1].start(), Extraction(_clean(line), "gsm8k"))
  for m in reversed(list(_PHRASE_RE.finditer(text))[-20:]):
    if best is not None and m.start() <= best[0]:
      break
    raw = _sentence(text, m.end())
    if _BOX_RE.search(raw):
      continue  # "The answer is $\boxed{5}$": the box itself is the marker.
    ans = _phrase_answer(text, m)
    if ans and not (best is not None and _is_prose(ans)):
      best = (m.start(), Extraction(ans, "phrase"))
      break
  return best


def _is_prose(ans: str) -> bool:
  """"correct, as computed above": words and no math, which after a box is
  a comment on it rather than a new answer."""
  words = ans.split()
  return len(words) >= 3 and not re.search(r"[\d$\\=^_]", ans)


# Between two boxes, the end of a sentence or a clause that introduces the
# next: a line break, or `.`, `!`, `?`, `:` before a space or the end.
_SENTENCE_END_RE = re.compile(r"\n|[.!?:](?=\s|$)")
# A hedge joins its boxes with one connective ("or", "and", "not"); more
# words between them are prose ("is wrong, the correct one is", "no wait"):
# a revision, where the last box is the answer.
_MAX_GAP_WORDS = 1
_ALTERNATIVE_RE = re.compile(r"[\s,]*or\s+(-?\d[\d.]*)")


def final_box_group(response: str) -> list[str]:
  """The last box of a response and the boxes before it in the same
  sentence, joined by at most `_MAX_GAP_WORDS` word, in order. `$\\boxed{3}$ or
  $\\boxed{5}$` and `\\boxed{1}\\boxed{2}...` are one group: a hedge or a
  list of guesses. A box in an earlier sentence is a step or a revised
  answer, and is not in the group. A number offered right after the last
  box as an alternative (`\\boxed{2} (or 3)`) makes a group of the two
  (the alternative first, so the box stays last)."""
  text = unwrap_response(response[-MAX_TAIL_CHARS:])
  boxes = _top_boxes(text)
  if not boxes:
    return []
  group = [boxes[-1]]
  # `\\boxed{2} (or 3)`: an alternative right after the box, in its sentence.
  after = re.sub(r"\\[A-Za-z]+|[{}()$\\]", " ", text[boxes[-1][1]:][:200])
  alternative = _ALTERNATIVE_RE.match(after)
  if alternative:
    return [alternative.group(1), boxes[-1][2]]
  for box in reversed(boxes[:-1]):
    gap = text[box[1]:group[-1][0]]
    words = re.findall(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", " ", gap))
    if _SENTENCE_END_RE.search(gap) or len(words) > _MAX_GAP_WORDS:
      break
    group.append(box)
  return [b[2] for b in reversed(group)]


_UNMARKED_RE = re.compile(
    r"\$\$(?:(?!\$\$).)+\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<!\\)\$[^$]+\$"
    r"|-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?", re.DOTALL)


def extract_unmarked(response: str) -> Extraction:
  """The final answer of a response with no marker (lenient mode only).

  Rule: the last math segment or number of the last 600 characters; in a
  segment that states `... = v`, the value after the last `=`.
  """
  text = response[-600:]
  found = None
  for m in _UNMARKED_RE.finditer(text):
    found = m.group(0)
  if found is None:
    return Extraction(None, "no_answer")
  ans = _clean(found).rstrip(",")
  if "=" in ans and not re.search(r"[<>]|\\[lg]e", ans):
    ans = ans.rsplit("=", 1)[1].strip()
  if not ans:
    return Extraction(None, "no_answer")
  return Extraction(ans, "unmarked")


def final_segments(response: str) -> list[str]:
  """The math segments of the last sentence of a response without a marker
  (lenient mode: "The roots are $x = -2$ and $x = 3$." states two parts)."""
  text = response[-600:].rstrip().rstrip(".")
  cut = max(text.rfind("\n"), text.rfind(". "))
  return [_clean(m.group(0)) for m in re.finditer(
      r"\$\$(?:(?!\$\$).)+\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<!\\)\$[^$]+\$",
      text[cut + 1:], re.DOTALL)][-MAX_BOXES:]


def extract_answer(response: str, mode: str = "strict") -> Extraction:
  """Returns the final answer of a model response.

  Args:
    response: untrusted model output of any length.
    mode: `strict` or `lenient` (see the module docstring).

  Returns:
    An `Extraction`; `answer` is None with a reason when the response has
    no (well-formed) final answer.
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  text = unwrap_response(response[-MAX_TAIL_CHARS:])
  best = _marked(text)
  found = best[1] if best is not None else Extraction(None, "no_answer")
  if found.answer is None and found.reason == "no_answer" and mode == "lenient":
    found = extract_unmarked(text)
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
