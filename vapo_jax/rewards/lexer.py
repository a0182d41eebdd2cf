"""Tokens of the LaTeX math grammar of `latex` (no `eval`, nothing executed).

`tokenize` maps a few Unicode symbols to LaTeX, turns every matrix
environment into one `\\matrix` ... `\\endmatrix` pair, and splits the text
into numbers, commands, words and operators; a word of three or more letters
that is not a function name is prose and raises `ParseError`. The tables
here (Greek letters, functions, relations) are shared with the parser.
"""

import re

import sympy


class ParseError(ValueError):
  """The text is not math that this parser understands."""


_TOKEN_RE = re.compile(
    r"\s+"
    r"|(?P<num>\d+\.\d*|\.\d+|\d+)"
    r"|(?P<cmd>\\[A-Za-z]+|\\[{}|,;:!%$#&_ ])"
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<op><=|>=|!=|\*\*|\\\\|[-+*/^_()\[\]{}|!,=<>'%:&])")

_UNICODE = {
    "≤": "<=", "≥": ">=", "≠": "!=", "π": r"\pi", "∞": r"\infty",
    "·": "*", "×": "*", "÷": "/", "−": "-", "√": r"\sqrt", "±": r"\pm",
    "½": "(1/2)", "⅓": "(1/3)", "⅔": "(2/3)", "¼": "(1/4)", "¾": "(3/4)",
    "⅕": "(1/5)", "⅙": "(1/6)", "⅛": "(1/8)",
}

_GREEK = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota "
    "kappa lambda mu nu xi rho sigma tau upsilon phi varphi chi psi omega "
    "Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega").split()

_FUNCS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot,
    "sec": sympy.sec, "csc": sympy.csc, "arcsin": sympy.asin,
    "arccos": sympy.acos, "arctan": sympy.atan, "sinh": sympy.sinh,
    "cosh": sympy.cosh, "tanh": sympy.tanh, "exp": sympy.exp,
    "ln": sympy.log, "log": lambda x: sympy.log(x, 10), "lg": lambda x: sympy.log(x, 10),
}

_RELOPS = {
    "=": "==", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "!=": "!=",
    r"\le": "<=", r"\leq": "<=", r"\leqslant": "<=", r"\ge": ">=",
    r"\geq": ">=", r"\geqslant": ">=", r"\ne": "!=", r"\neq": "!=",
    r"\lt": "<", r"\gt": ">",
}


def tokenize(text: str) -> list[str]:
  """Splits `text` into tokens; raises ParseError on unknown characters."""
  for u, r in _UNICODE.items():
    text = text.replace(u, " " + r + " ")
  # Every matrix environment is one pair of tokens (see `normalize`).
  text = re.sub(r"\\begin\{(?:array\}\{[^{}]*|[pbBvVs]?matrix)\}", r" \\matrix ",
                text)
  text = re.sub(r"\\end\{(?:array|[pbBvVs]?matrix)\}", r" \\endmatrix ", text)
  tokens = []
  pos = 0
  while pos < len(text):
    m = _TOKEN_RE.match(text, pos)
    if m is None:
      raise ParseError(f"unexpected character {text[pos]!r}")
    pos = m.end()
    if m.lastgroup is None:
      continue
    tok = m.group(m.lastgroup)
    if m.lastgroup == "word" and len(tok) > 1:
      # A run of letters: function names stay whole, a word of 3+ letters
      # is prose (compared as text), two letters are a product like `xy`.
      if tok in _FUNCS or tok in ("sqrt", "pi", "oo"):
        tokens.append(tok)
        continue
      if len(tok) > 2:
        raise ParseError(f"word {tok!r}")
      tokens.extend(tok)
      continue
    tokens.append(tok)
  return tokens
