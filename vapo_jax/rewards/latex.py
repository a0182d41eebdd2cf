"""A small LaTeX math parser that builds sympy objects without `eval`.

Model outputs are untrusted text. `sympy.sympify` and `parse_expr` run Python's
`eval` on their input, so this module never calls them: a hand-written
tokenizer and recursive-descent parser build sympy objects directly from the
tokens, and every operation whose cost grows with the size of its operands
(powers, factorials, binomials, long integer literals, nesting depth) is
checked against a bound first. An answer that exceeds a bound raises
`TooLarge`; text that is not math this grammar knows raises `ParseError`.

Grammar (informal, loosest binding first):

  relation := sum (relop sum)*
  sum      := ['+' | '-' | '\\pm'] product (('+' | '-' | '\\pm') product)*
  product  := unary (('*' | '\\cdot' | '\\times' | '/' | '\\div' | ':') unary
              | <implicit multiplication> unary)*
  unary    := ('-' | '+') unary | power
  power    := postfix ['^' exponent]
  postfix  := atom ('!' | '!!' | '%')*
  atom     := number | symbol | group | \\frac | \\sqrt | function | |x| | ...
"""

import sympy

from vapo_jax.rewards import blocks
from vapo_jax.rewards.bounds import DEFAULT_LIMITS
from vapo_jax.rewards.bounds import is_number as _is_number
from vapo_jax.rewards.bounds import Limits
from vapo_jax.rewards.bounds import safe_factorial
from vapo_jax.rewards.bounds import safe_pow
from vapo_jax.rewards.bounds import TooLarge


from vapo_jax.rewards.lexer import _FUNCS
from vapo_jax.rewards.lexer import _GREEK
from vapo_jax.rewards.lexer import _RELOPS
from vapo_jax.rewards.lexer import ParseError
from vapo_jax.rewards.lexer import tokenize

__all__ = ["Limits", "ParseError", "TooLarge", "parse_latex", "tokenize"]


class _Parser:
  """Recursive-descent parser over a token list; see the module docstring."""

  def __init__(self, tokens, limits: Limits, work=None, values=None):
    self.toks = tokens
    self.work = work if work is not None else [limits.max_terms]
    self.values = values or {}  # Sum indices bound to numbers.
    self.i = 0
    self.depth = 0
    self.abs_depth = 0
    self.sum_depth = 0
    self.bound = []  # Index names of enclosing sums: `i`, `e` are symbols there.
    self.limits = limits

  # -- token helpers --------------------------------------------------------
  def peek(self, k: int = 0):
    j = self.i + k
    return self.toks[j] if j < len(self.toks) else None

  def take(self, expected=None):
    tok = self.peek()
    if tok is None or (expected is not None and tok != expected):
      raise ParseError(f"expected {expected!r}, got {tok!r}")
    self.i += 1
    return tok

  def enter(self):
    self.depth += 1
    if self.depth > self.limits.max_depth:
      raise TooLarge("nesting")

  def leave(self):
    self.depth -= 1

  # -- grammar --------------------------------------------------------------
  def parse(self):
    out = self.relation()
    if self.peek() is not None:
      raise ParseError(f"trailing token {self.peek()!r}")
    return out

  def relation(self):
    """Returns an expression, or ('rel', [ops], [operands]) for a chain."""
    first = self.sum()
    ops, operands = [], [first]
    while self.peek() in _RELOPS:
      ops.append(_RELOPS[self.take()])
      operands.append(self.sum())
    if not ops:
      return first
    return ("rel", tuple(ops), tuple(operands))

  def sum(self):
    self.enter()
    sign = 1
    if self.peek() in ("+", "-"):
      sign = -1 if self.take() == "-" else 1
    elif self.peek() == r"\pm":
      raise ParseError("pm")
    total = sign * self.product()
    while self.peek() in ("+", "-", r"\pm", r"\mp"):
      op = self.take()
      if op in (r"\pm", r"\mp"):
        raise ParseError("pm")
      term = self.product()
      total = total + term if op == "+" else total - term
    self.leave()
    return total

  def _starts_atom(self, tok) -> bool:
    if tok is None:
      return False
    if tok == "|":
      return self.abs_depth == 0
    if tok in ("(", "{", r"\{", r"\lfloor", r"\lceil"):
      return True
    if tok[0].isdigit() or tok[0] == "." or tok[0].isalpha():
      return True
    if tok.startswith("\\") and tok not in _RELOPS and tok not in (
        r"\cdot", r"\times", r"\div", r"\pm", r"\mp", r"\}", r"\cup",
        r"\cap", r"\right", r"\rfloor", r"\rceil", r"\in", r"\to", r"\,",
        r"\endmatrix", "\\\\",
        r"\;", r"\:", r"\!", r"\ "):
      return True
    return False

  def product(self):
    self.enter()
    value = self.unary()
    while True:
      tok = self.peek()
      if tok in ("*", r"\cdot", r"\times"):
        self.take()
        value = value * self.unary()
      elif tok in ("/", r"\div", ":"):  # A ratio `3:2` is the number 3/2.
        self.take()
        den = self.unary()
        if den == 0:
          raise ParseError("division by zero")
        value = value / den
      elif self._starts_atom(tok):
        if (tok[0].isdigit() or tok[0] == ".") and self.i > 0 and (
            self.toks[self.i - 1][0].isdigit()):
          raise ParseError("two numbers side by side")
        value = value * self.power()
      else:
        break
    self.leave()
    return value

  def unary(self):
    tok = self.peek()
    if tok in ("-", "+"):
      self.take()
      self.enter()
      v = self.unary()
      self.leave()
      return -v if tok == "-" else v
    return self.power()

  def power(self):
    base = self.postfix()
    if self.peek() in ("^", "**"):
      self.take()
      self.enter()
      if self.peek() in ("-", "+"):
        exponent = self.unary()
      else:
        exponent = self.power_operand()
      self.leave()
      return safe_pow(base, exponent, self.limits)
    return base

  def power_operand(self):
    """The exponent of `^`: a braced group or a single (postfix) atom."""
    if self.peek() == "{":
      return self.postfix()
    tok = self.peek()
    if tok is not None and tok[0].isdigit() and len(tok) > 1 and "." not in tok:
      # `2^10` in LaTeX is 2^1 * 0; models mean 2^{10}. Accept the digits.
      self.take()
      return self.number(tok)
    return self.postfix()

  def postfix(self):
    value = self.atom()
    while self.peek() in ("!", "%"):
      tok = self.take()
      if tok == "%":
        value = value / 100
      elif self.peek() == "!":
        self.take()
        value = safe_factorial(value, double=True, limits=self.limits)
      else:
        value = safe_factorial(value, limits=self.limits)
    return value

  def number(self, tok):
    digits = tok.replace(".", "")
    if len(digits) > self.limits.max_digits:
      raise TooLarge("literal")
    if "." in tok:
      return sympy.Rational(tok if not tok.endswith(".") else tok[:-1])
    return sympy.Integer(int(tok))

  def group(self, open_tok, close_tok):
    self.take(open_tok)
    self.enter()
    inner = self.relation()
    self.leave()
    self.take(close_tok)
    if isinstance(inner, tuple):
      raise ParseError("relation inside group")
    return inner

  def arg(self):
    """A macro argument: `{...}` or a single token (as in `\\frac12`)."""
    tok = self.peek()
    if tok == "{":
      return self.group("{", "}")
    if tok is None:
      raise ParseError("missing argument")
    if tok[0].isdigit():
      self.take()
      if len(tok) > 1 and "." not in tok:  # \frac12 is 1/2: split digits.
        self.toks.insert(self.i, tok[1:])
        tok = tok[0]
      return self.number(tok)
    return self.atom()

  def symbol_name(self, tok):
    name = tok.lstrip("\\")
    if self.peek() == "_":
      self.take()
      if self.peek() == "{":
        self.take()
        parts = []
        while self.peek() not in ("}", None):
          parts.append(self.take().lstrip("\\"))
        self.take("}")
        sub = "".join(parts)
      else:
        sub = self.take().lstrip("\\")
      name = f"{name}_{sub}"
    return name

  def function(self, name):
    fn = _FUNCS[name]
    base = None
    if name == "log" and self.peek() == "_":
      self.take()
      base = self.arg()
    power = None
    if self.peek() == "^":
      self.take()
      power = self.power_operand()
    if self.peek() in ("(", "{"):
      x = self.group(self.peek(), ")" if self.peek() == "(" else "}")
    else:
      # `\sin 2x` is sin(2x): a run of juxtaposed atoms, up to the next
      # operator or function (`\sin x \cos x` is sin(x) cos(x)).
      x = self.postfix()
      while self._starts_atom(self.peek()) and self.peek().lstrip(
          "\\") not in _FUNCS and self.peek() not in ("(", "|"):
        x = x * self.postfix()
    out = sympy.log(x, base) if base is not None else fn(x)
    if power is not None:
      if power == -1 and name in ("sin", "cos", "tan"):
        return {"sin": sympy.asin, "cos": sympy.acos, "tan": sympy.atan}[name](x)
      out = safe_pow(out, power, self.limits)
    return out

  def atom(self):
    tok = self.peek()
    if tok is None:
      raise ParseError("unexpected end")
    self.enter()
    try:
      return self._atom(tok)
    finally:
      self.leave()

  def _atom(self, tok):
    if tok[0].isdigit() or tok[0] == ".":
      self.take()
      return self.number(tok)
    if tok == "(":
      return self.group("(", ")")
    if tok == "{":
      return self.group("{", "}")
    if tok == "[":
      return self.group("[", "]")
    if tok == "|":
      self.take()
      self.abs_depth += 1
      inner = self.sum()
      self.abs_depth -= 1
      self.take("|")
      return sympy.Abs(inner)
    if tok in (r"\lfloor", r"\lceil"):
      close = r"\rfloor" if tok == r"\lfloor" else r"\rceil"
      inner = self.group(tok, close)
      return sympy.floor(inner) if tok == r"\lfloor" else sympy.ceiling(inner)
    if tok in (r"\frac", r"\dfrac", r"\tfrac", r"\cfrac"):
      self.take()
      num, den = self.arg(), self.arg()
      if den == 0:
        raise ParseError("division by zero")
      return num / den
    if tok == r"\binom":
      self.take()
      n, k = self.arg(), self.arg()
      if _is_number(n) and not (n.is_Integer and abs(n) <= self.limits.max_factorial):
        raise TooLarge("binomial")
      return sympy.binomial(n, k)
    if tok in (r"\sqrt", "sqrt"):
      self.take()
      index = 2
      if self.peek() == "[":
        index = self.group("[", "]")
      x = self.arg() if self.peek() != "(" else self.group("(", ")")
      if index == 2:
        return sympy.sqrt(x)
      return safe_pow(x, sympy.Integer(1) / index, self.limits)
    if tok == r"\matrix":
      return blocks.matrix(self)
    if tok in (r"\sum", r"\prod"):
      return blocks.big_operator(self, tok)
    if tok in (r"\pi", "pi"):
      self.take()
      return sympy.pi
    if tok in (r"\infty", r"\infin", "oo"):
      self.take()
      return sympy.oo
    if tok.lstrip("\\") in _FUNCS:
      self.take()
      return self.function(tok.lstrip("\\"))
    if tok.lstrip("\\") in self.values and self.peek(1) != "_":
      self.take()
      return self.values[tok.lstrip("\\")]
    if tok.startswith("\\") and tok[1:] in _GREEK:
      self.take()
      return sympy.Symbol(self.symbol_name(tok))
    if tok.isalpha() and len(tok) == 1:
      self.take()
      if tok == "i" and self.peek() != "_" and tok not in self.bound:
        return sympy.I
      if tok == "e" and self.peek() != "_" and tok not in self.bound:
        return sympy.E
      return sympy.Symbol(self.symbol_name(tok))
    raise ParseError(f"unexpected token {tok!r}")


def parse_latex(text: str, limits: Limits = DEFAULT_LIMITS):
  """Parses one math expression (or a relation chain) without `eval`.

  Args:
    text: normalised answer text such as `\\frac{1}{2}+\\sqrt{3}x`.
    limits: bounds on the work; see `Limits`.

  Returns:
    A sympy expression, or `("rel", ops, operands)` for `a < b <= c` style
    chains and equations, with ops among `== < > <= >= !=`.

  Raises:
    ParseError: the text is not math this grammar knows.
    TooLarge: building the expression would exceed `limits`.
  """
  if len(text) > limits.max_chars:
    raise TooLarge("answer too long")
  tokens = tokenize(text)
  if not tokens:
    raise ParseError("empty")
  try:
    return _Parser(tokens, limits).parse()
  except RecursionError as e:
    raise TooLarge("nesting") from e
  except (ZeroDivisionError, OverflowError) as e:
    raise TooLarge(str(e)) from e
  except (TypeError, AttributeError, ValueError, IndexError) as e:
    if isinstance(e, TooLarge):
      raise
    raise ParseError(str(e)) from e
