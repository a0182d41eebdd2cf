"""String normalisation of extracted answers before they are compared.

The goal is that two answers a grader would call "the same answer, written
differently" map to the same string or at least to the same parse: LaTeX
spacing and sizing commands, `\\text{}` wrappers, units, degrees, percent
signs, dollar signs, thousands separators, `\\dfrac`, trailing punctuation,
a leading `x =` and mixed numbers. Everything here is regular-expression and
brace-matching work that is linear in the (bounded) answer length.
"""

import re

_WRAPPERS = ("text", "textbf", "textit", "textrm", "mathrm", "mathbf",
             "mathit", "mbox", "operatorname", "textnormal", "mathsf",
             "boldsymbol", "bm", "displaystyle", "hbox")

_DROP = (r"\left", r"\right", r"\bigl", r"\bigr", r"\Bigl", r"\Bigr",
         r"\biggl", r"\biggr", r"\big", r"\Big", r"\bigg", r"\displaystyle",
         r"\textstyle", r"\!", r"\,", r"\;", r"\:", r"\quad", r"\qquad",
         r"\ ", r"\limits", r"\mathstrut", r"\$", "$")

# Sizing commands are dropped; spacing commands and `$` become a space.
_DROP_COMMANDS_RE = re.compile(
    "(?:" + "|".join(re.escape(t) for t in sorted(
        (t for t in _DROP if t.startswith("\\") and t[-1].isalpha()),
        key=len, reverse=True)) + ")(?![A-Za-z])")
_DROP_SYMBOLS_RE = re.compile("|".join(re.escape(t) for t in _DROP if not (
    t.startswith("\\") and t[-1].isalpha())))
_WRAPPER_RE = re.compile(r"\\(" + "|".join(_WRAPPERS) + r")\s*(?=\{)")

_UNITS = set("""
unit units sq square cubic cm centimeter centimeters centimetre centimetres
m meter meters metre metres km kilometer kilometers mm millimeter millimeters
in inch inches ft foot feet yd yard yards mi mile miles mph kmh kph
kg kilogram kilograms g gram grams mg lb lbs pound pounds oz ounce ounces ton
tons s sec second seconds min minute minutes h hr hrs hour hours day days week
weeks month months year years dollar dollars cent cents euro euros
degree degrees deg rad radian radians l liter liters litre litres ml
gallon gallons cup cups people persons students apples marbles books cookies
times ways points
""".split())

_MULTIWORD_UNITS = ("square units", "square feet", "square meters",
                    "square inches", "square centimeters", "cubic units",
                    "cubic feet", "cubic meters", "cubic centimeters",
                    "sq units", "sq ft", "per hour", "miles per hour",
                    "km per hour", "meters per second")


def find_group(text: str, start: int, *, stray_close: bool = False,
               limit: int | None = None) -> int:
  """Returns the index just past the `{...}` group opening at `start`, or -1.

  Escaped braces (`\\{`, `\\}`) do not count towards the nesting. With
  `stray_close`, an escaped `\\}` that closes no `\\{` closes the group when
  it sits at the group's own level (`\\boxed{5\\}`: the closing brace escaped
  by a stray backslash) and the index past it is returned. `limit` bounds the
  characters searched from `start`.
  """
  if start >= len(text) or text[start] != "{":
    return -1
  depth, escaped, i = 0, 0, start
  end = len(text) if limit is None else min(len(text), start + limit)
  while i < end:
    c = text[i]
    if c == "\\":
      if stray_close and i + 1 < len(text):
        if text[i + 1] == "{":
          escaped += 1
        elif text[i + 1] == "}":
          if escaped:
            escaped -= 1
          elif depth == 1:
            return i + 2
      i += 2
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return i + 1
    i += 1
  return -1


def _unwrap(text: str) -> str:
  """Replaces `\\text{...}`-style wrappers by their contents.

  A wrapper whose contents are only a unit (`\\text{ cm}`) is dropped.
  """
  if "\\" not in text:
    return text
  pattern = _WRAPPER_RE
  for _ in range(50):  # Each pass removes one wrapper; answers are short.
    m = pattern.search(text)
    if m is None:
      break
    end = find_group(text, m.end())
    if end < 0:
      text = text[:m.start()] + text[m.end():]
      continue
    inner = text[m.end() + 1:end - 1]
    word = inner.strip().lower()
    if end == len(text) and re.fullmatch(r"[a-z() ]*[a-z][a-z() ]*", word) and (
        re.search(r"[\d}]\s*$", text[:m.start()])) and word not in ("or", "and"):
      # A trailing remark after a value: `\\frac23\\text{ of the pie}`,
      # `1 \\text{ (one)}`.
      text = text[:m.start()]
      continue
    if _is_unit(word) and m.start() > 0:
      inner = ""
      power = re.match(r"\s*\^\s*\{?\s*[23]\s*\}?", text[end:])
      if power:
        end += power.end()
    text = text[:m.start()] + inner + text[end:]
  return text


def _is_unit(word: str) -> bool:
  """`cm`, `square units`, `km/h`, `meters per second`."""
  if word in _MULTIWORD_UNITS:
    return True
  parts = [p for p in re.split(r"\s*/\s*|\s+per\s+|\s+", word) if p]
  return bool(parts) and all(p in _UNITS for p in parts)


def _repeating_decimal(text: str) -> str:
  """`0.1\\overline{6}` -> `\\frac{15}{90}`."""
  def frac(m):
    whole, fixed, rep = m.group(1) or "0", m.group(2), m.group(3)
    if len(whole) + len(fixed) + len(rep) > 60:
      return m.group(0)
    num = int(whole + fixed + rep) - int(whole + fixed)
    den = 10 ** len(fixed) * (10 ** len(rep) - 1)
    return f"\\frac{{{num}}}{{{den}}}"
  return re.sub(r"(?<!\d)(\d*)\.(\d*)\\overline\{(\d+)\}", frac, text)


def _strip_units(text: str) -> str:
  """Drops unit words that follow a number (`5 cm`, `12 square units`)."""
  lowered = text.lower()
  for phrase in _MULTIWORD_UNITS:
    if lowered.endswith(" " + phrase):
      text = text[:-len(phrase) - 1]
      lowered = text.lower()
  for _ in range(3):
    m = re.search(r"(?<=[\d}])\s*([A-Za-z]+)(\^\{?[23]\}?)?\s*$", text)
    if m is None or m.group(1).lower() not in _UNITS:
      break
    if len(m.group(1)) == 1 and not text[:m.start(1)].endswith(" "):
      break  # `5m` is 5 times m; only `5 m` has a unit.
    text = text[:m.start()]
  return text


def _mixed_number(text: str) -> str:
  """`3\\frac{1}{2}`, `2\\frac14`, `2 1/4` -> `(3+1/2)`-style sums (a proper
  fraction after a whole number)."""
  m = re.fullmatch(r"(-?)(\d+)\s*\\frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))",
                   text)
  if m is not None:
    sign, whole = m.group(1), m.group(2)
    num, den = m.group(3) or m.group(4), m.group(5) or m.group(6)
  else:
    m = re.fullmatch(r"(-?)(\d+)\s+(\d+)/(\d+)", text)
    if m is None:
      return text
    sign, whole, num, den = m.groups()
  if int(num) >= int(den) or int(den) == 0:
    return text
  return f"{sign}({whole}+{num}/{den})"


def strip_answer_noise(text: str) -> str:
  """Drops delimiters, sizing and spacing commands, and wrappers."""
  text = text.strip()
  for opener, closer in ((r"\[", r"\]"), (r"\(", r"\)")):
    if text.startswith(opener) and text.endswith(closer):
      text = text[len(opener):-len(closer)]
  # MATH's thousands separators: `10,\!000`, `32,\! 349`, `14{,}916`.
  text = re.sub(r"(?<=\d)\s*(?:\{,\}|,\s*\\!)\s*(?=\d{3}(?!\d))", "", text)
  text = _matrix_env(text)
  text = text.replace("\\\\", "\x1e")  # Keep `\\` (matrix rows) intact.
  text = re.sub(r"\\(d|t|c)frac", r"\\frac", text)
  text = text.replace(r"\leqslant", r"\leq").replace(r"\geqslant", r"\geq")
  text = _unwrap(text)
  if "\\" in text:
    text = _DROP_COMMANDS_RE.sub("", text)
  text = _DROP_SYMBOLS_RE.sub(" ", text)
  text = text.replace("~", " ")
  # One-token subscripts: `x_{1}` -> `x_1`, `1011_{2}` -> `1011_2`.
  text = re.sub(r"_\{\s*(\w+)\s*\}", r"_\1", text)
  return text.replace("\x1e", "\\\\").strip()


def _matrix_env(text: str) -> str:
  """`\\left[\\begin{array}{cc}...\\end{array}\\right]` and every
  `*matrix` environment become one `\\begin{matrix}...\\end{matrix}`; a
  bracket pair around a matrix is its delimiter, not a tuple."""
  if "\\begin" not in text:
    return text
  text = re.sub(r"\\begin\{array\}\s*\{[^{}]*\}", r"\\begin{matrix}", text)
  text = re.sub(r"\\(begin|end)\{(?:array|[pbBvVs]?matrix)\}", r"\\\1{matrix}",
                text)
  text = re.sub(r"(?:\\left)?\s*[\[(]\s*\\begin\{matrix\}", r"\\begin{matrix}",
                text)
  return re.sub(r"\\end\{matrix\}\s*(?:\\right)?\s*[\])]", r"\\end{matrix}",
                text)


def _approx(text: str) -> str:
  """`\\frac{\\sqrt3}{3} \\approx 0.577` states the exact value on the left;
  `x \\approx 11` names the answer on the left and states it on the right."""
  parts = re.split(r"\\approx(?![A-Za-z])|≈", text)
  if len(parts) == 1:
    return text
  left = parts[0].strip()
  if not left or is_name(left) or re.fullmatch(r".*?=\s*", left):
    return parts[-1].strip()
  return left


# A name that labels an answer: letters, decorated or subscripted (`AB`,
# `|AB|`, `V_1:V_2`, `\\frac{NO}{BO}`, `\\angle ABC`, `m\\angle A`); digits
# only inside subscripts.
_NAME_RE = re.compile(
    r"(?:\\(?:angle|triangle|overline|widehat|hat|vec|frac|measuredangle|"
    r"overrightarrow|lvert|rvert|vert|mid|max|min|sup|inf)(?![A-Za-z])"
    r"|\\[A-Za-z]+(?=\s*[=_^{])|[A-Za-z]+|_\{?\\?\w+\}?|[{}|:()'\s])+")


def is_name(text: str) -> bool:
  """Whether `text` only names a quantity (see `_NAME_RE`)."""
  text = text.strip()
  return bool(text) and bool(_NAME_RE.fullmatch(text)) and bool(
      re.search(r"[A-Za-z]", text.replace("\\frac", "")))


def split_label(text: str) -> tuple[str | None, str]:
  """`NAME = value` -> (NAME without spaces, value) when the value has no
  free variables (a single letter outside a command); else (None, text)."""
  m = re.fullmatch(r"([^=<>]+?)=([^=<>]+)", text)
  if m is None or not is_name(m.group(1)):
    return None, text
  value = m.group(2).strip()
  if not value or re.search(r"(?<![\\A-Za-z])[A-Za-z](?![A-Za-z])", value):
    return None, text
  return re.sub(r"\s+", "", m.group(1)), value


def _thousands(text: str) -> str:
  """`12,345,678` and `2,500 square feet`: digit groups joined by commas are
  one number when every comma of the answer sits in such a group and the
  answer is not bracketed (`(1,234)` is a point)."""
  groups = r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d,])"
  if "," not in text or re.match(r"\s*[\[(]|\s*\\\{", text):
    return text
  if "," in re.sub(groups, "", text):
    return text
  return re.sub(groups, lambda m: m.group(0).replace(",", ""), text)


def normalize_answer(text: str) -> str:
  """Normalises an extracted answer for comparison.

  Args:
    text: an answer as extracted from a response or a reference, e.g.
      `\\$1,000.`, `x = \\dfrac{1}{2}`, `45^\\circ`, `3\\frac{1}{2}`.

  Returns:
    A canonical string: no spacing commands, wrappers, units, degree or
    percent signs (`\\%`, `percent`, `pct`), or thousands separators;
    `\\dfrac` -> `\\frac`; `A \\approx B` -> the exact side; a single
    leading name `x =`, `|AB| =`, `V_1:V_2 =` dropped; mixed numbers written
    as a sum; `or` between answers a comma; whitespace collapsed to single
    spaces.
  """
  text = strip_answer_noise(text)
  text = re.sub(r"\\+\s*$", "", text)  # A stray trailing `\\`.
  text = _approx(text)
  # `\\langle 1, 2 \\rangle` is the vector (1, 2).
  text = re.sub(r"\\langle(?![A-Za-z])", "(", text)
  text = re.sub(r"\\rangle(?![A-Za-z])", ")", text)
  # Temperatures: `5^\\circ C`, `5°F`.
  text = re.sub(r"(\^\s*\{?\s*\\circ\s*\}?|°)\s*[CF](?![A-Za-z])", r"\1", text)
  # Degrees (in radians inside trig functions), percent, currency.
  if re.search(r"\\(sin|cos|tan|cot|sec|csc)(?![a-z])", text):
    text = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", r"\\frac{\\pi}{180}", text)
  text = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", text)
  text = re.sub(r"\\(circ|degree)(?![A-Za-z])", "", text)
  text = text.replace("°", "").replace(r"\%", "").replace("%", "")
  text = re.sub(r"(?<=[\d}])\s*(?:per\s*cent|percent|pct)\b\.?", "", text,
                flags=re.I)
  text = re.sub(r"(?<![A-Za-z\\])(rs|usd|eur)\.?\s*(?=\d)", "", text, flags=re.I)
  text = text.replace("€", "").replace("£", "")
  text = text.replace("{,}", "")
  text = _thousands(text)
  text = _strip_units(text)
  text = re.sub(r"(?<=\d)\s*(?:st|nd|rd|th)$", "", text)  # Ordinals: `7th`.
  # A count and its noun (`3 solutions`, `24种`), and "the maximum is 3".
  m = re.fullmatch(r"\s*(-?[\d.,/]+)\s*(?:[a-z]{3,}(?:\s+[a-z]+)*|[\u4e00-\u9fff]+)\s*",
                   text)
  if m:
    text = m.group(1)
  m = re.fullmatch(r"\s*(?:the|an?)\s+[a-z ]+?\s+(?:is|are|equals)\s+(.+)", text,
                   flags=re.IGNORECASE)
  if m:
    text = m.group(1)
  text = _repeating_decimal(text)
  text = re.sub(r"\\varnothing|\\\{\s*\\\}|∅", r"\\emptyset", text)
  # A parameter's range after a general solution: `..., k \\in \\mathbb{Z}`.
  text = re.sub(r",?\s*\(?\s*[a-z]\s*\\in\s*\\mathbb\s*\{?\s*[ZN]\s*\}?\s*\)?\s*$", "",
                text)
  # Set-builder notation states its condition: `\\{x \\mid x > 1\\}`.
  m = re.fullmatch(r"\s*\\\{\s*[A-Za-z]\s*(?:\||\\mid(?![A-Za-z])|:)\s*(.+?)\s*\\\}\s*",
                   text)
  if m:
    text = m.group(1)
  # The real line.
  text = re.sub(r"\\mathbb\s*\{?\s*R\s*\}?|ℝ", r"(-\\infty, \\infty)", text)
  text = re.sub(r"^\s*[A-Za-z]\s*\\in(?![A-Za-z])\s*", "", text)
  # Trailing punctuation and a leading name: "x =", "|AB| =", "V_1:V_2 =".
  text = re.sub(r"[\s.,;:]+$", "", text)
  text = re.sub(r"^[\s.,;:]+(?=\D)", "", text)
  label, value = split_label(text)
  if label is not None and "," not in value:
    text = value
  # `f(x) = ...` and `(x, y) = (...)`: the left side only names the answer.
  text = re.sub(r"^\s*[A-Za-z]\s*\(\s*[A-Za-z]\s*\)\s*=(?=[^=<>]*$)", "", text)
  text = re.sub(r"^\s*\(\s*[A-Za-z](?:\s*,\s*[A-Za-z])+\s*\)\s*=(?=[^=<>]*$)",
                "", text)
  # Multiple-choice letters: (C), \\text{(C)}, C.
  m = re.fullmatch(r"\s*\(?\s*([A-Ea-e])\s*\)\s*", text)
  if m:
    text = m.group(1).upper()
  # "and" between inequalities intersects them (`k \\ge -1 and k \\ne 0`).
  if re.search(r"[<>]|\\(?:le|ge|leq|geq|ne|neq)(?![A-Za-z])", text):
    text = re.sub(r",?\s*(?<![A-Za-z\\])and(?![A-Za-z])\s*", r" \\land ", text)
  # Prose connectives in solution lists, also without spaces (`2or3`).
  text = re.sub(r",?\s*(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])\s*", ", ", text)
  text = re.sub(r"^\s*,\s*|\s*,\s*$", "", text)
  text = _mixed_number(text.strip())
  text = re.sub(r"\s+", " ", text).strip()
  if text.startswith("{") and find_group(text, 0) == len(text):
    text = text[1:-1].strip()
  return text


_DEGREE_RE = re.compile(
    r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])|\s*\\text\{\s*degrees?\s*\}"
    r"|\s+degrees?\b")


def degrees_as_radians(answer: str, reference: str) -> tuple[str, str]:
  """`60^\\circ` against `\\frac{\\pi}{3}`: when one side is in degrees and
  the other is in radians (has `\\pi` and no degree mark), the degree side is
  converted (`x°` -> `x \\cdot \\frac{\\pi}{180}`). Otherwise degree marks are
  dropped later and `60^\\circ` equals `60`."""
  deg_a, deg_r = bool(_DEGREE_RE.search(answer)), bool(_DEGREE_RE.search(reference))
  if deg_a == deg_r:
    return answer, reference
  side, other = (answer, reference) if deg_a else (reference, answer)
  if "\\pi" not in other and "π" not in other:
    return answer, reference
  if re.search(r"\\(sin|cos|tan|cot|sec|csc)(?![a-z])", side):
    return answer, reference  # Degrees inside trig functions are handled later.
  side = "(" + _DEGREE_RE.sub("", side).strip() + r")\cdot\frac{\pi}{180}"
  return (side, reference) if deg_a else (answer, side)


def has_percent(text: str) -> bool:
  """Whether an answer is a percentage (`50\\%`, `50%`, `50 percent`)."""
  return bool(re.search(r"%|(?<=[\d}\s])(?:per\s*cent|percent|pct)\b", text,
                        flags=re.IGNORECASE))


def compact(text: str) -> str:
  """The form used for exact string comparison: no whitespace."""
  return re.sub(r"\s+", "", text)
