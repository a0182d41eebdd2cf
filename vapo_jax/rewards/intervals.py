"""Inequalities in one variable as unions of intervals, and their comparison.

An interval is a tuple `(lo, hi, left_closed, right_closed)` of sympy
numbers (`-oo`/`oo` allowed). Rules:

* `x > 3`, `3 < x`, `-x > -1`, `2x + 1 <= 5`: a relation linear in its one
  variable is solved (dividing by a negative coefficient flips it).
* `|x - 1| < 2`, `|z| >= 1`: the absolute value of a linear term against a
  number becomes one interval or the union of two.
* `a <= M <= b` with numbers `a`, `b`: each side is solved as above and the
  results intersected when the middle is linear or `|linear|` in one
  variable; otherwise (`0 < f(x) < 1`, several symbols) the middle names a
  quantity and the chain states its range `[a, b]`.
* `x \\ne c` is the union `(-oo, c) \\cup (c, oo)`.
* Unions are compared after sorting and merging touching pieces, so
  `(1, 2] \\cup (2, 3)` equals `(1, 3)` and the order of the pieces does not
  matter.

Everything is done by hand on sympy expressions of degree <= 1 (no
`solveset`), so the work is bounded by the size of the expression.
"""

import math

import sympy

Interval = tuple

_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _ray(op: str, c) -> list[Interval]:
  """The solutions of `s op c`."""
  if op in (">", ">="):
    return [(c, sympy.oo, op == ">=", False)]
  return [(-sympy.oo, c, False, op == "<=")]


def _linear(e):
  """(symbol, a, b) with e == a*s + b, a a nonzero number; else None."""
  syms = e.free_symbols
  if len(syms) != 1:
    return None
  (s,) = syms
  if e.has(sympy.Abs):
    return None
  try:
    poly = sympy.Poly(e, s)
  except (sympy.PolynomialError, sympy.GeneratorsNeeded):
    return None
  if poly.degree() != 1 or any(not c.is_number for c in poly.all_coeffs()):
    return None
  a, b = poly.all_coeffs()
  if not a.is_real or a == 0:
    return None
  return s, a, b


def _abs_linear(e):
  """(symbol, a, b, k) with e == k*|a*s + b| (k > 0 a number); else None."""
  coeff, rest = e.as_coeff_Mul()
  if not (isinstance(rest, sympy.Abs) and coeff.is_number and coeff > 0):
    return None
  lin = _linear(rest.args[0])
  if lin is None:
    return None
  s, a, b = lin
  return s, a, b, coeff


def solve(lhs, op: str, rhs) -> tuple[object, list[Interval]] | None:
  """Solves `lhs op rhs` for its one variable; (symbol, intervals) or None."""
  if op not in _FLIP:
    return None
  if not (rhs.is_number or lhs.is_number):
    lin = _linear(lhs - rhs)
    if lin is None:
      return None
    s, a, b = lin
    return s, _ray(op if a > 0 else _FLIP[op], -b / a)
  if lhs.is_number:
    lhs, rhs, op = rhs, lhs, _FLIP[op]
  if not rhs.is_real:
    return None
  lin = _linear(lhs)
  if lin is not None:
    s, a, b = lin
    return s, _ray(op if a > 0 else _FLIP[op], (rhs - b) / a)
  ab = _abs_linear(lhs)
  if ab is None:
    return None
  s, a, b, k = ab
  c = rhs / k  # |a s + b| op c  <=>  |s + b/a| op c/|a|
  centre, radius = -b / a, c / abs(a)
  closed = op in ("<=", ">=")
  if op in ("<", "<="):
    if radius < 0 or (radius == 0 and not closed):
      return s, []
    return s, [(centre - radius, centre + radius, closed, closed)]
  if radius < 0 or (radius == 0 and not closed):
    return s, [(-sympy.oo, sympy.oo, False, False)]
  return s, [(-sympy.oo, centre - radius, False, closed),
             (centre + radius, sympy.oo, closed, False)]


def from_relation(ops, operands) -> list[Interval] | None:
  """The solution set of a relation or chain as intervals, or None."""
  ops, operands = list(ops), list(operands)
  if ops == ["!="]:  # `x \ne c`: everything but one point.
    lhs, rhs = operands
    if lhs.is_number:
      lhs, rhs = rhs, lhs
    lin = _linear(lhs) if rhs.is_number and rhs.is_real else None
    if lin is None:
      return None
    _, a, b = lin
    c = (rhs - b) / a
    return [(-sympy.oo, c, False, False), (c, sympy.oo, False, False)]
  if not ops or any(op not in _FLIP for op in ops):
    return None
  if len(ops) == 1:
    out = solve(operands[0], ops[0], operands[1])
    return None if out is None else out[1]
  if len(ops) != 2:
    return None
  lo, mid, hi = operands
  if not (lo.is_number and hi.is_number and lo.is_real and hi.is_real):
    return None
  if (ops[0] in ("<", "<=")) != (ops[1] in ("<", "<=")):
    return None
  first = solve(lo, ops[0], mid)
  second = solve(mid, ops[1], hi)
  if first is not None and second is not None:
    return intersect(first[1], second[1])
  if mid.is_number:
    return None
  if ops[0] in (">", ">="):  # b > M > a
    lo, hi, ops = hi, lo, [_FLIP[ops[1]], _FLIP[ops[0]]]
  return [(lo, hi, ops[0] == "<=", ops[1] == "<=")]


def _value(x) -> float | None:
  if x == sympy.oo:
    return math.inf
  if x == -sympy.oo:
    return -math.inf
  try:
    v = complex(sympy.N(x, 30))
  except (TypeError, ValueError, OverflowError):
    return None
  if abs(v.imag) > 1e-12 * max(1.0, abs(v.real)):
    return None
  return v.real


def intersect(xs: list[Interval], ys: list[Interval]) -> list[Interval] | None:
  """Intersection of two unions of intervals (None if not comparable)."""
  out = []
  for lo1, hi1, lc1, rc1 in xs:
    for lo2, hi2, lc2, rc2 in ys:
      v = [_value(t) for t in (lo1, hi1, lo2, hi2)]
      if None in v:
        return None
      lo, lc = (lo1, lc1) if v[0] > v[2] else (lo2, lc2) if v[2] > v[0] else (
          lo1, lc1 and lc2)
      hi, rc = (hi1, rc1) if v[1] < v[3] else (hi2, rc2) if v[3] < v[1] else (
          hi1, rc1 and rc2)
      lv, hv = max(v[0], v[2]), min(v[1], v[3])
      if lv < hv or (lv == hv and lc and rc):
        out.append((lo, hi, lc, rc))
  return out


def canonical(xs: list[Interval]) -> list[tuple] | None:
  """Sorted, merged pieces with their numeric endpoints, or None when an
  endpoint is not a real number."""
  pieces = []
  for lo, hi, lc, rc in xs:
    lv, hv = _value(lo), _value(hi)
    if lv is None or hv is None:
      return None
    pieces.append([lv, hv, bool(lc) and lv != -math.inf,
                   bool(rc) and hv != math.inf, lo, hi])
  pieces.sort(key=lambda p: (p[0], not p[2]))
  merged = []
  for p in pieces:
    if merged:
      q = merged[-1]
      touch = p[0] < q[1] or (p[0] == q[1] and (p[2] or q[3]))
      if touch:
        if p[1] > q[1] or (p[1] == q[1] and p[3]):
          q[1], q[3], q[5] = p[1], p[3], p[5]
        continue
    merged.append(p)
  return merged


def same_union(xs: list[Interval], ys: list[Interval], close) -> bool:
  """Whether two unions of intervals are the same set; `close(a, b)` says
  whether two endpoint expressions are equal."""
  a, b = canonical(xs), canonical(ys)
  if a is None or b is None or len(a) != len(b):
    return False
  for p, q in zip(a, b):
    if p[2] != q[2] or p[3] != q[3]:
      return False
    for i, j in ((0, 4), (1, 5)):
      if math.isinf(p[i]) or math.isinf(q[i]):
        if p[i] != q[i]:
          return False
      elif not close(p[j], q[j]):
        return False
  return True
