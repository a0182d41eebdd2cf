"""Block constructs of the LaTeX grammar: matrices and big operators.

Both are functions of a `latex._Parser` (`parser`) positioned on the
construct's first token; they use its token helpers and bounds, so every
limit of `bounds.Limits` applies inside them too.
"""

import sympy

from vapo_jax.rewards.bounds import is_number as _is_number
from vapo_jax.rewards.bounds import TooLarge
from vapo_jax.rewards.lexer import _GREEK
from vapo_jax.rewards.lexer import ParseError

# pylint: disable=protected-access


def matrix(parser) -> sympy.ImmutableMatrix:
  """`\\matrix a & b \\\\ c & d \\endmatrix` -> an immutable sympy matrix."""
  parser.take(r"\matrix")
  rows, row = [], []
  while True:
    if parser.peek() == r"\endmatrix":
      parser.take()
      break
    row.append(parser.sum())
    if len(row) * (len(rows) + 1) > parser.limits.max_matrix_cells:
      raise TooLarge("matrix")
    sep = parser.take()
    if sep == "&":
      continue
    if sep == "\\\\" or sep == r"\endmatrix":
      rows.append(row)
      row = []
      if sep == r"\endmatrix":
        break
      continue
    raise ParseError(f"unexpected {sep!r} in a matrix")
  if row:
    rows.append(row)
  if not rows or len({len(r) for r in rows}) != 1:
    raise ParseError("ragged matrix")
  return sympy.ImmutableMatrix(rows)

def big_operator(parser, tok: str):
  """`\\sum_{k=a}^{b} body` (and `\\prod`): added up when the bounds are
  integers at most `limits.max_terms` apart, else a sympy `Sum`/`Product`
  over a canonically named index so that renamed indices compare equal.
  The body is one product (`\\sum_k k^2 + 1` is (sum k^2) + 1). Each term
  is parsed again with the index bound to its value, so every bound on
  powers and factorials applies to it; all the terms of one answer share
  one budget of `limits.max_terms` parses."""
  parser.take()
  parser.take("_")
  parser.take("{")
  var = parser.take()
  if not (var.isalpha() or var.lstrip("\\") in _GREEK):
    raise ParseError("sum index")
  name = var.lstrip("\\")
  parser.take("=")
  lo = parser.sum()
  parser.take("}")
  parser.take("^")
  hi = parser.power_operand()
  parser.sum_depth += 1
  index = sympy.Symbol(f"_k{parser.sum_depth}")
  parser.bound.append(name)
  start = parser.i
  body = parser.product().subs(sympy.Symbol(name), index)
  end = parser.i
  parser.bound.pop()
  parser.sum_depth -= 1
  if not (_is_number(lo) and _is_number(hi) and lo.is_Integer
          and hi.is_Integer and 0 <= hi - lo < parser.limits.max_terms):
    cls = sympy.Sum if tok == r"\sum" else sympy.Product
    return cls(body, (index, lo, hi))
  out = sympy.Integer(0 if tok == r"\sum" else 1)
  for j in range(int(lo), int(hi) + 1):
    parser.work[0] -= 1
    if parser.work[0] < 0:
      raise TooLarge("terms")
    term = type(parser)(parser.toks[start:end], parser.limits, parser.work,
                   {**parser.values, name: sympy.Integer(j)}).product()
    out = out + term if tok == r"\sum" else out * term
    if out.is_Rational and max(abs(out.p), out.q).bit_length() > (
        parser.limits.max_bits):
      raise TooLarge("sum")
  return out
