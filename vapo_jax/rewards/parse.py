"""Parsing a normalised answer into a structured `Answer` tree.

Sets (`\\{...\\}`), solution lists (`a, b`; `a; b`), tuples and intervals
(`(a, b]`, `(a; b)`), unions (`\\cup`), matrices (any `*matrix`/`array`
environment, and sums and products of them), `\\pm` pairs, relations and
inequalities (solved to intervals by `intervals` when they are in one
variable), and `NAME = value` items that keep their name as a label. Leaves
are built by `latex.parse_latex` (never `eval`); text the grammar does not
know becomes a `text` leaf compared as a string.
"""

import dataclasses
import re
from typing import Any

import sympy

from vapo_jax.rewards import intervals
from vapo_jax.rewards import latex
from vapo_jax.rewards import normalize


@dataclasses.dataclass(frozen=True)
class Answer:
  """A parsed answer.

  `kind` is one of: `expr` (value: sympy expression), `rel` (value: (ops,
  operands)), `interval` (value: (lo, hi, left_closed, right_closed)),
  `tuple` (value: bracket pair such as "()" or "[)", or "M" for a matrix;
  items), `set` (value: "braces" or "list"; items; unordered), `union`
  (items), `text` (value: lower-cased text without spaces). `approx` marks a
  decimal literal; `label` is the name in `NAME = value`.
  """
  kind: str
  value: Any = None
  items: tuple["Answer", ...] = ()
  approx: bool = False
  label: str | None = None


_MATRIX_RE = re.compile(
    r"\\begin\{([pbBvV]?matrix)\}((?:(?!\\begin\{).)*?)\\end\{\1\}", re.DOTALL)


def _split_top(text: str, seps=(",",)) -> list[str]:
  """Splits at separators outside any brackets or braces."""
  parts, depth, start, i = [], 0, 0, 0
  while i < len(text):
    c = text[i]
    if depth == 0 and any(text.startswith(sep, i) for sep in seps):
      sep = next(sep for sep in seps if text.startswith(sep, i))
      parts.append(text[start:i])
      start = i = i + len(sep)
      continue
    if c == "\\" and i + 1 < len(text):
      if text[i + 1] in "{}":
        depth += 1 if text[i + 1] == "{" else -1
      i += 2
      continue
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    i += 1
  parts.append(text[start:])
  return [p.strip() for p in parts]


def _encloses(text: str) -> bool:
  """Whether text[0] is a bracket that closes exactly at text[-1]."""
  depth = 0
  for i, c in enumerate(text):
    if c in "([":
      depth += 1
    elif c in ")]":
      depth -= 1
      if depth == 0:
        return i == len(text) - 1
  return False


def _from_matrix(m) -> Answer:
  """A sympy matrix as nested "M" tuples (a column vector is one tuple)."""
  cells = [[Answer("expr", m[i, j]) for j in range(m.cols)]
           for i in range(m.rows)]
  if m.cols == 1:
    return Answer("tuple", "M", tuple(r[0] for r in cells))
  return Answer("tuple", "M", tuple(Answer("tuple", "M", tuple(r))
                                    for r in cells))


def _from_intervals(pieces) -> Answer:
  items = tuple(Answer("interval", p) for p in pieces)
  if len(items) == 1:
    return items[0]
  return Answer("union", items=items)


def _parse_item(text: str, limits: latex.Limits) -> Answer:
  label, value = normalize.split_label(text)
  if label is not None:
    return dataclasses.replace(_parse_item(value, limits), label=label)
  approx = bool(re.search(r"\d\.\d|(?<![\d.])\.\d", text))
  if r"\pm" in text or r"\mp" in text:
    parts = _split_top(text, (r"\pm", r"\mp"))
    if len(parts) == 2:
      lead = parts[0] or "0"
      return Answer("set", "list", items=(
          _parse_item(f"{lead}+({parts[1]})", limits),
          _parse_item(f"{lead}-({parts[1]})", limits)))
  try:
    out = latex.parse_latex(text, limits)
  except latex.ParseError:
    return Answer("text", re.sub(r"\s+", "", text).lower())
  if isinstance(out, sympy.MatrixBase):
    return _from_matrix(out)
  if isinstance(out, tuple):
    _, ops, operands = out
    if any(isinstance(x, sympy.MatrixBase) for x in operands):
      return Answer("text", re.sub(r"\s+", "", text).lower())
    try:
      pieces = intervals.from_relation(ops, operands)
    except (TypeError, ValueError):
      pieces = None
    if pieces is not None:
      return _from_intervals(pieces)
    return Answer("rel", (ops, operands), approx=approx)
  return Answer("expr", out, approx=approx)


def _conjunction(parts, limits: latex.Limits) -> Answer:
  """`k \\ge -1 \\land k \\ne 0`: the intersection of inequalities in one
  variable; anything else is compared as text."""
  pieces = None
  for part in parts:
    try:
      out = latex.parse_latex(part, limits)
    except latex.ParseError:
      out = None
    solved = intervals.from_relation(out[1], out[2]) if isinstance(
        out, tuple) else None
    if solved is None:
      return Answer("text", re.sub(r"\s+", "", " and ".join(parts)).lower())
    pieces = solved if pieces is None else intervals.intersect(pieces, solved)
    if pieces is None:
      return Answer("text", re.sub(r"\s+", "", " and ".join(parts)).lower())
  return _from_intervals(pieces)


def parse_answer(text: str, limits: latex.Limits = latex.DEFAULT_LIMITS) -> Answer:
  """Parses a normalised answer into an `Answer` tree.

  Raises:
    latex.TooLarge: some part would take unbounded work to build.
  """
  text = text.strip()
  m = _MATRIX_RE.fullmatch(text)
  if m:
    rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
    cells = [tuple(parse_answer(c, limits) for c in r.split("&")) for r in rows]
    if all(len(r) == 1 for r in cells):  # A column vector.
      return Answer("tuple", "M", tuple(r[0] for r in cells))
    return Answer("tuple", "M", tuple(Answer("tuple", "M", r) for r in cells))
  if r"\land" in text:
    return _conjunction(_split_top(text, (r"\land",)), limits)
  for union in (r"\cup", "∪"):
    if union in text:
      parts = _split_top(text, (union,))
      if len(parts) > 1:
        return Answer("union", items=tuple(parse_answer(p, limits) for p in parts))
  if text.startswith(r"\{") and text.endswith(r"\}"):
    inner = text[2:-2]
    return Answer("set", "braces", items=tuple(
        _parse_item(p, limits) for p in _split_top(inner) if p))
  if len(text) >= 2 and text[0] in "([" and text[-1] in ")]" and _encloses(text):
    parts = _split_top(text[1:-1], (",", ";"))
    if len(parts) > 1:
      return Answer("tuple", text[0] + text[-1], items=tuple(
          parse_answer(p, limits) for p in parts))
  parts = _split_top(text, (",", ";"))
  if len(parts) > 1:
    return Answer("set", "list", items=tuple(
        _parse_item(p, limits) for p in parts if p))
  return _parse_item(text, limits)


def count_parts(text: str) -> int:
  """How many answers a normalised reference lists (`2, 3` -> 2; a tuple,
  interval or single value -> 1; `\\{1, 2\\}` -> 2)."""
  text = text.strip()
  if text.startswith(r"\{") and text.endswith(r"\}"):
    return len([p for p in _split_top(text[2:-2]) if p])
  return len([p for p in _split_top(text, (",", ";")) if p])
