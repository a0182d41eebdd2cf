"""Answer forms the expression parser does not read: numbers written in
words, prose answers, numbers with a base subscript, and piecewise
definitions. Each reader is a pure, bounded function of one normalised answer
(no evaluation of the text); `math.answers_match` uses them.
"""

import re

_SMALL = ("zero one two three four five six seven eight nine ten eleven twelve "
          "thirteen fourteen fifteen sixteen seventeen eighteen "
          "nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUE = {w: i for i, w in enumerate(_SMALL)}
_WORD_VALUE.update({w: 10 * (i + 2) for i, w in enumerate(_TENS)})
_SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6,
           "billion": 10**9}


def number_from_words(text: str) -> int | None:
  """`twenty-five`, `one hundred and five`, `negative three`: an integer
  written entirely in English number words, else None."""
  if not text[:1].isalpha():
    return None
  words = re.sub(r"[-\s]+", " ", text.strip().lower().rstrip(".")).split()
  if not words or len(words) > 12:
    return None
  sign = 1
  if words[0] in ("negative", "minus"):
    sign, words = -1, words[1:]
  total = current = 0
  seen = False
  for w in words:
    if w == "and" and seen:
      continue
    if w in _WORD_VALUE:
      current += _WORD_VALUE[w]
      seen = True
    elif w in _SCALES and seen:
      if _SCALES[w] == 100:
        current = max(current, 1) * 100
      else:
        total += max(current, 1) * _SCALES[w]
        current = 0
    else:
      return None
  return sign * (total + current) if seen else None


# Words that carry no content in a prose answer ("There is no solution").
_FILLER = {"a", "an", "the"}
_LEADING = re.compile(r"^(?:there|it|they)\s+(?:is|are|exists?)\s+", re.I)
# Ways of saying that the answer set is empty.
_EMPTY = {("none",), ("no", "solution"), ("no", "real", "solution"),
          ("emptyset",), ("empty", "set"), ("does", "not", "exist"),
          ("dne",)}


def prose_words(text: str) -> tuple[str, ...] | None:
  """A prose answer as a canonical word tuple (lower case, no articles or
  leading "there is", plural -s dropped; every way of saying "no solution"
  is one tuple), or None when the answer holds anything but words."""
  text = text.replace("\\emptyset", "emptyset").strip().rstrip(".")
  if not re.fullmatch(r"[A-Za-z][A-Za-z' ]*", text) or len(text) > 200:
    return None
  text = _LEADING.sub("", text.lower())
  words = []
  for w in text.split():
    if w in _FILLER:
      continue
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
      w = w[:-1]
    words.append(w)
  out = tuple(words)
  return ("emptyset",) if out in _EMPTY else out


_BASED_RE = re.compile(r"([0-9A-Za-z]+)_\(?([0-9]{1,2})\)?")


def based_number(text: str) -> tuple[str, int] | None:
  """`1011_2`, `2A_16`, `123_(4)`: (digits, base) when the digits are valid
  in that base (2..36), else None."""
  m = _BASED_RE.fullmatch(text.strip())
  if m is None:
    return None
  digits, base = m.group(1).upper(), int(m.group(2))
  if not 2 <= base <= 36 or not re.search(r"\d", digits):  # `a_{12}` is a name.
    return None
  try:
    int(digits, base)
  except ValueError:
    return None
  return digits.lstrip("0") or "0", base


def bases_equal(answer: str, reference: str) -> bool | None:
  """A number with a base subscript against one without: the bare digits of
  an answer are read in the reference's base (`1011` for `1011_2`); a
  subscripted answer against a bare decimal reference is compared by value
  (`1011_2` for `11`). None when neither side has a base (or both do: those
  are compared as written)."""
  ba, br = based_number(answer), based_number(reference)
  if (ba is None) == (br is None):
    return None
  if br is not None:  # The reference states the base.
    digits = answer.strip().upper()
    if not re.fullmatch(r"[0-9A-Z]+", digits):
      return None
    return (digits.lstrip("0") or "0") == br[0]
  if not re.fullmatch(r"-?\d+", reference.strip()):
    return None
  return int(ba[0], ba[1]) == int(reference.strip())


_CASES_RE = re.compile(r"\s*\\begin\{cases\}(.*)\\end\{cases\}\s*", re.DOTALL)
MAX_PIECES = 8


def piecewise_rows(text: str) -> list[tuple[str, str]] | None:
  """`\\begin{cases} x & x \\ge 0 \\\\ -x & x < 0 \\end{cases}` as
  [(value, condition), ...] ("if" and trailing punctuation dropped), or None
  when the answer is not one cases environment."""
  m = _CASES_RE.fullmatch(text)
  if m is None or "\\begin{cases}" in m.group(1):
    return None
  rows = []
  for row in m.group(1).split("\\\\"):
    if not row.strip():
      continue
    parts = row.split("&")
    if len(parts) != 2:
      return None
    cond = re.sub(r"^\s*(?:if|for|when)\b\s*|[\s.,;]+$", "", parts[1].strip())
    rows.append((parts[0].strip().rstrip(","), cond))
  return rows if 0 < len(rows) <= MAX_PIECES else None


def piecewise_equal(a_rows, r_rows, match) -> bool:
  """Same number of pieces, and each answer piece matches a distinct
  reference piece in value and in condition (by `match(a, r) -> bool`)."""
  if len(a_rows) != len(r_rows):
    return False
  free = list(range(len(r_rows)))
  for value, cond in a_rows:
    for k in free:
      rv, rc = r_rows[k]
      if match(value, rv) and match(cond, rc):
        free.remove(k)
        break
    else:
      return False
  return True
