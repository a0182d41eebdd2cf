"""Bounds on the work of building sympy objects from untrusted answers.

Every operation whose cost grows with the size of its operands -- integer
powers, factorials, binomials, long literals, deep nesting -- is checked
against `Limits` before sympy is asked to do it, so that a `10^{10^{10}}` or a
`9!!!!!!` in a box costs microseconds instead of freezing a worker.
"""

import dataclasses
import math

import sympy


class TooLarge(ValueError):
  """The expression would take unbounded work to build or compare."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Bounds on the work that building one expression may take.

  Attributes:
    max_chars: longest answer string that is parsed at all.
    max_depth: deepest nesting of groups / operators.
    max_digits: longest integer literal.
    max_bits: largest |exponent * log2(base)| for numeric powers (the size of
      the integer result in bits).
    max_symbolic_exponent: largest |integer exponent| on a non-numeric base.
    max_factorial: largest integer whose factorial is computed.
    max_matrix_cells: most cells of one matrix.
    max_terms: most terms of a `\\sum` / `\\prod` that is added up.
  """
  max_chars: int = 1000
  max_depth: int = 150
  max_digits: int = 1000
  max_bits: int = 20000
  max_symbolic_exponent: int = 200
  max_factorial: int = 5000
  max_matrix_cells: int = 100
  max_terms: int = 1000


DEFAULT_LIMITS = Limits()


def is_number(e) -> bool:
  return isinstance(e, sympy.Basic) and e.is_number


def check_pow(base, exponent, limits: Limits = DEFAULT_LIMITS):
  """Raises TooLarge when `base ** exponent` could take unbounded work."""
  if not is_number(exponent):
    return
  if exponent.is_Rational:
    mag = abs(exponent)
    if exponent.q > 1000 or abs(exponent.p) > 10**9:
      raise TooLarge("exponent")
  else:
    try:
      mag = abs(complex(sympy.N(exponent, 15)))
    except (TypeError, ValueError) as e:
      raise TooLarge("exponent") from e
    if not math.isfinite(mag):
      raise TooLarge("exponent")
  if is_number(base):
    if base.is_zero:
      return
    if base.is_Rational:
      size = max(abs(base.p), abs(base.q))
      bits = size.bit_length() if size > 1 else 0
      if base in (1, -1):
        return
    else:
      try:
        b = abs(complex(sympy.N(base, 15)))
      except (TypeError, ValueError) as e:
        raise TooLarge("base") from e
      bits = abs(math.log2(b)) if b > 0 else 0
    if float(mag) * max(bits, 1) > limits.max_bits:
      raise TooLarge("power")
  elif float(mag) > limits.max_symbolic_exponent:
    raise TooLarge("power")


def safe_pow(base, exponent, limits: Limits = DEFAULT_LIMITS):
  """`base ** exponent` after `check_pow`."""
  check_pow(base, exponent, limits)
  return sympy.Pow(base, exponent)


def safe_factorial(x, double: bool = False, limits: Limits = DEFAULT_LIMITS):
  """`x!` (or `x!!`), refusing integers above `limits.max_factorial`."""
  if is_number(x):
    if not (x.is_Integer and 0 <= x <= limits.max_factorial):
      raise TooLarge("factorial")
  return sympy.factorial2(x) if double else sympy.factorial(x)
