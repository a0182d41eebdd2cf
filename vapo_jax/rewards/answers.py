"""Equivalence of structured answers (see `parse` for how they are built).

`parse_answer` (from `parse`) turns a normalised answer string into an
`Answer` tree whose leaves are sympy expressions built by
`latex.parse_latex` (never `eval`). `equivalent` compares two trees: numbers
exactly when both are rational, otherwise to a relative tolerance; expressions
with free symbols by exact cancellation or by evaluating both at fixed sample
points; solution lists and sets as unordered collections; tuples and intervals
in order with their brackets; equations up to a nonzero constant factor;
inequalities in one variable and intervals as unions of intervals (see
`intervals`).

Labels: a list item `NAME = value` (`AB = 4`, `x_1 = 2`) keeps its name. Two
lists whose items all carry distinct names match by name; a named list and
a bare list of values, or a point, match in order (`AB=4, CD=5` vs `4, 5`;
`x=2, y=3` vs `(2, 3)`). Solution
lists without braces ignore a repeated member (`2, 2, 3` is `2, 3`); a set
written with braces is compared as written.
"""

import dataclasses

import sympy

from vapo_jax.rewards import intervals
from vapo_jax.rewards.parse import Answer
from vapo_jax.rewards.parse import count_parts
from vapo_jax.rewards.parse import parse_answer

__all__ = ["Answer", "Tolerance", "count_parts", "equivalent", "expr_equal",
           "parse_answer"]

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
  if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)):
    return False
  if a.has(sympy.Sum, sympy.Product) or b.has(sympy.Sum, sympy.Product):
    return False  # Unevaluated sums with symbolic bounds: only as written.
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


def _pieces(a: Answer, top: bool = True) -> list | None:
  """An answer as a union of intervals: an interval, a union, a 2-tuple of
  values, or (at the top) a list of such (`x<2 or x>3`); else None."""
  if a.kind == "interval":
    return [a.value]
  if a.kind == "tuple" and a.value != "M" and len(a.items) == 2 and all(
      i.kind == "expr" for i in a.items):
    return [(a.items[0].value, a.items[1].value, a.value[0] == "[",
             a.value[1] == "]")]
  if a.kind == "union" or (top and a.kind == "set" and a.value == "list"):
    out = []
    for item in a.items:
      sub = _pieces(item, top=False)
      if sub is None:
        return None
      out += sub
    return out
  return None


def _is_interval_like(a: Answer) -> bool:
  """Whether `a` can only mean a set of reals (not a point or a list)."""
  return a.kind in ("interval", "union") or (
      a.kind == "set" and any(i.kind in ("interval", "union") for i in a.items))


def _dedupe(xs, tol: Tolerance):
  """Drops list members equal to an earlier member (bounded: short lists)."""
  if len(xs) > 30:
    return xs
  out = []
  for x in xs:
    if not any(x.label == y.label and equivalent(x, y, tol) for y in out):
      out.append(x)
  return out


def _unordered_equal(xs, ys, tol: Tolerance, by_label: bool = False) -> bool:
  if len(xs) != len(ys):
    return False
  left = list(ys)
  for x in xs:
    for j, y in enumerate(left):
      if (not by_label or x.label == y.label) and equivalent(x, y, tol):
        del left[j]
        break
    else:
      return False
  return True


def _named(xs) -> bool:
  labels = [x.label for x in xs]
  return all(labels) and len(set(labels)) == len(labels)


def _collections_equal(a: Answer, b: Answer, tol: Tolerance) -> bool:
  """Sets, solution lists and unions (see the module docstring)."""
  xs, ys = list(a.items), list(b.items)
  if len(xs) == 1 and len(ys) == 1:
    return equivalent(xs[0], ys[0], tol)
  named_x, named_y = _named(xs), _named(ys)
  if named_x and named_y:
    return _unordered_equal(xs, ys, tol, by_label=True)
  if (named_x or named_y) and not any(
      i.label for i in (ys if named_x else xs)):
    return len(xs) == len(ys) and all(
        equivalent(x, y, tol) for x, y in zip(xs, ys))
  return _unordered_equal(xs, ys, tol)


def equivalent(a: Answer, b: Answer, tol: Tolerance = Tolerance()) -> bool:
  """Whether answer `a` (the response's) denotes reference answer `b`."""
  if a.kind == "set" and a.value == "list" and len(a.items) > 1:
    a = dataclasses.replace(a, items=tuple(_dedupe(a.items, tol)))
  if b.kind == "set" and b.value == "list" and len(b.items) > 1:
    b = dataclasses.replace(b, items=tuple(_dedupe(b.items, tol)))
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
  if _is_interval_like(a) or _is_interval_like(b):
    pa, pb = _pieces(a), _pieces(b)
    if pa is not None and pb is not None:
      return intervals.same_union(
          pa, pb, lambda x, y: expr_equal(x, y, tol, a.approx or b.approx))
  if a.kind in ("set", "union") and b.kind in ("set", "union"):
    return _collections_equal(a, b, tol)
  for x, y in ((a, b), (b, a)):
    # `x=2, y=3` states the point `(2, 3)`: named values in order.
    if x.kind == "set" and _named(x.items) and y.kind == "tuple" and (
        y.value == "()"):
      return len(x.items) == len(y.items) and all(
          equivalent(i, j, tol) for i, j in zip(x.items, y.items))
  if a.kind == "rel" and b.kind == "rel":
    return _rel_equal(a, b, tol)
  if a.kind == "tuple" and b.kind == "tuple":
    return (a.value == b.value and len(a.items) == len(b.items) and all(
        equivalent(x, y, tol) for x, y in zip(a.items, b.items)))
  return False
