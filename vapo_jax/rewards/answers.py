"""Structured answers (sets, tuples, intervals, relations) and equivalence.

`parse_answer` turns a normalised answer string into an `Answer` tree whose
leaves are sympy expressions built by `latex.parse_latex` (never `eval`).
`equivalent` compares two trees: numbers exactly when both are rational,
otherwise to a relative tolerance; expressions with free symbols by exact
cancellation or by evaluating both at fixed sample points; solution lists and
sets as unordered collections; tuples and intervals in order with their
brackets; equations up to a nonzero constant factor.
"""

import dataclasses
import re
from typing import Any

import sympy

from vapo_jax.rewards import latex

_PROBE_POINTS = ((0.5371, 1.2913, -0.7369, 2.1033),
                 (1.7713, -0.4219, 0.9127, -1.3371),
                 (-1.1537, 0.6631, 1.4419, 0.2917),
                 (2.4311, 1.9107, -0.3253, 0.8389),
                 (0.3119, -1.8823, 0.5557, 1.2263))


@dataclasses.dataclass(frozen=True)
class Tolerance:
  """Numeric comparison settings.

  Attributes:
    rel_tol: relative tolerance when either side contains a decimal literal
      (`1.4142136` for `\\sqrt{2}`).
    exact_rel_tol: relative tolerance between exact irrational values
      (`\\sin 15^\\circ` vs `(\\sqrt6-\\sqrt2)/4`), evaluated to 30 digits.
    probe_rel_tol: relative tolerance when comparing expressions with free
      symbols at sample points.
  """
  rel_tol: float = 1e-6
  exact_rel_tol: float = 1e-15
  probe_rel_tol: float = 1e-12


@dataclasses.dataclass(frozen=True)
class Answer:
  """A parsed answer.

  `kind` is one of: `expr` (value: sympy expression), `rel` (value: (ops,
  operands)), `interval` (value: (lo, hi, left_closed, right_closed)),
  `tuple` (value: bracket pair such as "()" or "[)"; items), `set` (items;
  unordered, also used for solution lists), `union` (items), `text` (value:
  lower-cased text without spaces). `approx` marks a decimal literal.
  """
  kind: str
  value: Any = None
  items: tuple["Answer", ...] = ()
  approx: bool = False


_MATRIX_RE = re.compile(
    r"\\begin\{([pbBvV]?matrix)\}(.*?)\\end\{\1\}", re.DOTALL)


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


def _interval_from_rel(ops, operands) -> Answer | None:
  """`x > 3` -> (3, oo); `a <= x < b` -> [a, b); None otherwise."""
  ops = list(ops)
  operands = list(operands)
  if any(op in ("==", "!=") for op in ops):
    return None
  if len(ops) == 1:
    lhs, rhs = operands
    if isinstance(rhs, sympy.Symbol) and lhs.is_number:
      flip = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
      lhs, rhs, ops = rhs, lhs, [flip[ops[0]]]
    if not (isinstance(lhs, sympy.Symbol) and rhs.is_number):
      return None
    op = ops[0]
    if op in (">", ">="):
      return Answer("interval", (rhs, sympy.oo, op == ">=", False))
    return Answer("interval", (-sympy.oo, rhs, False, op == "<="))
  if len(ops) == 2 and isinstance(operands[1], sympy.Symbol):
    lo, hi = operands[0], operands[2]
    if not (lo.is_number and hi.is_number):
      return None
    if all(op in ("<", "<=") for op in ops):
      return Answer("interval", (lo, hi, ops[0] == "<=", ops[1] == "<="))
    if all(op in (">", ">=") for op in ops):
      return Answer("interval", (hi, lo, ops[1] == ">=", ops[0] == ">="))
  return None


def _parse_item(text: str, limits: latex.Limits) -> Answer:
  approx = bool(re.search(r"\d\.\d|(?<![\d.])\.\d", text))
  if r"\pm" in text or r"\mp" in text:
    parts = _split_top(text, (r"\pm", r"\mp"))
    if len(parts) == 2:
      lead = parts[0] or "0"
      return Answer("set", items=(
          _parse_item(f"{lead}+({parts[1]})", limits),
          _parse_item(f"{lead}-({parts[1]})", limits)))
  try:
    out = latex.parse_latex(text, limits)
  except latex.ParseError:
    return Answer("text", re.sub(r"\s+", "", text).lower())
  if isinstance(out, tuple):
    _, ops, operands = out
    interval = _interval_from_rel(ops, operands)
    return interval or Answer("rel", (ops, operands), approx=approx)
  return Answer("expr", out, approx=approx)


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
  for union in (r"\cup", "∪"):
    if union in text:
      parts = _split_top(text, (union,))
      if len(parts) > 1:
        return Answer("union", items=tuple(parse_answer(p, limits) for p in parts))
  if text.startswith(r"\{") and text.endswith(r"\}"):
    inner = text[2:-2]
    return Answer("set", items=tuple(
        _parse_item(p, limits) for p in _split_top(inner) if p))
  if len(text) >= 2 and text[0] in "([" and text[-1] in ")]" and _encloses(text):
    parts = _split_top(text[1:-1])
    if len(parts) > 1:
      return Answer("tuple", text[0] + text[-1], items=tuple(
          parse_answer(p, limits) for p in parts))
  parts = _split_top(text, (",", ";"))
  if len(parts) > 1:
    return Answer("set", items=tuple(_parse_item(p, limits) for p in parts if p))
  return _parse_item(text, limits)


# -- equivalence --------------------------------------------------------------


def _close(x: complex, y: complex, rel_tol: float) -> bool:
  scale = max(abs(x), abs(y))
  return abs(x - y) <= rel_tol * scale or scale == 0


def _numeric(e, subs=None) -> complex | None:
  try:
    v = complex(e.evalf(30, subs=subs) if subs else e.evalf(30))
  except (TypeError, ValueError, ZeroDivisionError, OverflowError):
    return None
  if v != v or abs(v) == float("inf"):
    return None
  return v


def expr_equal(a, b, tol: Tolerance, approx: bool = False) -> bool:
  """Exact-or-numeric equality of two sympy expressions."""
  if a == b:
    return True
  if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(
      sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
    return False
  if a.is_number and b.is_number:
    if a.is_Rational and b.is_Rational and (
        not approx or a.is_Integer or b.is_Integer):
      return False  # Exact and unequal; integers are always compared exactly.
    va, vb = _numeric(a), _numeric(b)
    rel_tol = tol.rel_tol if approx else tol.exact_rel_tol
    return va is not None and vb is not None and _close(va, vb, rel_tol)
  symbols = sorted(a.free_symbols | b.free_symbols, key=lambda s: s.name)
  if len(symbols) > 8:
    return False
  # Evaluate at fixed points first: cheap for any expression the parser
  # accepts, unlike `expand`, which is exponential in the degree.
  agree = 0
  for k, point in enumerate(_PROBE_POINTS):
    subs = {s: point[(i + k) % 4] + 0.173 * i for i, s in enumerate(symbols)}
    va, vb = _numeric(a, subs), _numeric(b, subs)
    if va is None or vb is None:
      continue
    if not _close(va, vb, tol.probe_rel_tol):
      return False
    agree += 1
  if agree >= 3:
    return True
  if not (_cheap_to_expand(a) and _cheap_to_expand(b)):
    return False
  try:
    return sympy.expand(a - b) == 0
  except (TypeError, ValueError, RecursionError):
    return False


def _cheap_to_expand(e) -> bool:
  """Whether `expand(e)` has a small bounded number of terms."""
  for p in e.atoms(sympy.Pow):
    if not p.base.is_Atom and not (p.exp.is_Integer and abs(p.exp) <= 8):
      return False
  return len(e.args) <= 50


def _ratio_constant(e1, e2, tol: Tolerance) -> float | None:
  """Returns c when e1 == c * e2 for a nonzero constant c, else None."""
  symbols = sorted(e1.free_symbols | e2.free_symbols, key=lambda s: s.name)
  ratios = []
  for k, point in enumerate(_PROBE_POINTS):
    subs = {s: point[(i + k) % 4] + 0.173 * i for i, s in enumerate(symbols)}
    v1, v2 = _numeric(e1, subs), _numeric(e2, subs)
    if v1 is None or v2 is None or v2 == 0:
      continue
    ratios.append(v1 / v2)
  if len(ratios) < 3 or ratios[0] == 0:
    return None
  if all(_close(r, ratios[0], tol.probe_rel_tol) for r in ratios):
    return ratios[0]
  return None


def _rel_equal(a: Answer, b: Answer, tol: Tolerance) -> bool:
  (ops_a, xs_a), (ops_b, xs_b) = a.value, b.value
  if len(ops_a) != 1 or len(ops_b) != 1:
    return (ops_a == ops_b and len(xs_a) == len(xs_b) and all(
        expr_equal(x, y, tol) for x, y in zip(xs_a, xs_b)))
  flip = {">": "<", ">=": "<="}
  def canon(ops, xs):
    op, e = ops[0], xs[0] - xs[1]
    return (flip[op], -e) if op in flip else (op, e)
  (op_a, e_a), (op_b, e_b) = canon(ops_a, xs_a), canon(ops_b, xs_b)
  if op_a != op_b:
    return False
  if expr_equal(e_a, e_b, tol):
    return True
  c = _ratio_constant(e_a, e_b, tol)
  if c is None or abs(c.imag) > 1e-12:
    return False
  return op_a in ("==", "!=") or c.real > 0


def _as_interval(a: Answer) -> Answer | None:
  if a.kind == "interval":
    return a
  if a.kind == "tuple" and len(a.items) == 2 and all(
      i.kind == "expr" for i in a.items):
    return Answer("interval", (a.items[0].value, a.items[1].value,
                               a.value[0] == "[", a.value[1] == "]"))
  return None


def _unordered_equal(xs, ys, tol: Tolerance) -> bool:
  if len(xs) != len(ys):
    return False
  left = list(ys)
  for x in xs:
    for j, y in enumerate(left):
      if equivalent(x, y, tol):
        del left[j]
        break
    else:
      return False
  return True


def equivalent(a: Answer, b: Answer, tol: Tolerance = Tolerance()) -> bool:
  """Whether answer `a` (the response's) denotes reference answer `b`."""
  if a.kind == "set" and len(a.items) == 1:
    return equivalent(a.items[0], b, tol)
  if b.kind == "set" and len(b.items) == 1:
    return equivalent(a, b.items[0], tol)
  if a.kind == "expr" and b.kind == "expr":
    return expr_equal(a.value, b.value, tol, a.approx or b.approx)
  for x, y in ((a, b), (b, a)):
    if x.kind == "rel" and y.kind == "expr" and x.value[0] == ("==",):
      lhs, rhs = x.value[1]
      # `x = 5` names the answer 5 on either side; a response `m + n = 17`
      # answers a reference `17` (AIME style), but not the other way round.
      if isinstance(lhs, sympy.Symbol) or (
          x is a and rhs.is_number and y.value.is_number):
        return expr_equal(rhs, y.value, tol, x.approx or y.approx)
  if a.kind == "text" or b.kind == "text":
    return a.kind == b.kind and a.value == b.value
  if a.kind in ("set", "union") and b.kind in ("set", "union"):
    return _unordered_equal(a.items, b.items, tol)
  if a.kind == "rel" and b.kind == "rel":
    return _rel_equal(a, b, tol)
  if a.kind == "tuple" and b.kind == "tuple":
    return (a.value == b.value and len(a.items) == len(b.items) and all(
        equivalent(x, y, tol) for x, y in zip(a.items, b.items)))
  ia, ib = _as_interval(a), _as_interval(b)
  if ia is not None and ib is not None:
    lo_a, hi_a, lc_a, rc_a = ia.value
    lo_b, hi_b, lc_b, rc_b = ib.value
    return (lc_a == lc_b and rc_a == rc_b and expr_equal(lo_a, lo_b, tol)
            and expr_equal(hi_a, hi_b, tol))
  return False
