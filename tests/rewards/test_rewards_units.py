"""Unit tests of extraction, normalisation, the parser and its bounds."""

import builtins
import os
import random
import time

import pytest
import sympy

import reward_cases
from vapo_jax.rewards import answers
from vapo_jax.rewards import extract
from vapo_jax.rewards import latex
from vapo_jax.rewards import normalize
from vapo_jax import rewards


@pytest.mark.parametrize("text,answer,reason", [
    (r"a \boxed{\frac{1}{\{2\}}} b", r"\frac{1}{\{2\}}", "boxed"),
    (r"\boxed{1} then \fbox{2}", "2", "boxed"),
    (r"\boxed{1} then \boxed{2", None, "malformed_box"),
    (r"\boxed{}", None, "empty_box"),
    ("work\n#### 1,234", "1,234", "gsm8k"),
    ("So the final answer is $x=3$.", "x=3", "phrase"),
    ("no answer here", None, "no_answer"),
    ("y" * 2_000_000, None, "no_answer"),
    (r"\boxed{%s}" % ("1" * 1500), None, "answer_too_long"),
])
def test_extract(text, answer, reason):
  out = extract.extract_answer(text)
  assert (out.answer, out.reason) == (answer, reason)


@pytest.mark.parametrize("text,plain,stray", [
    (r"{a{b}c}", 7, 7),   # nested braces
    (r"{a\}b}", 6, 4),    # an escaped brace: skipped, or the stray close
    (r"{\{a\}}", 7, 7),   # escaped pairs do not count
    (r"{a{\}b", -1, -1),  # a stray close below the group's level closes nothing
    (r"{5\}", -1, 4),     # `\boxed{5\}`
    (r"x{a}", -1, -1),    # no group opens at `start`
])
def test_find_group_plain_and_stray_close(text, plain, stray):
  assert normalize.find_group(text, 0) == plain
  assert normalize.find_group(text, 0, stray_close=True) == stray


def test_find_group_limit_bounds_the_search():
  text = "{" + "a" * 20 + "}"
  assert normalize.find_group(text, 0) == 22
  assert normalize.find_group(text, 0, limit=22) == 22
  assert normalize.find_group(text, 0, limit=21) == -1
  # An escape that starts inside the bound is read whole.
  stray = "{" + "a" * 20 + "\\}"
  assert normalize.find_group(stray, 0, stray_close=True, limit=22) == 23
  assert normalize.find_group(stray, 0, stray_close=True, limit=21) == -1


def test_extract_reference_forms():
  assert extract.extract_reference("  7 ") == "7"
  assert extract.extract_reference(r"so $\boxed{7}$") == "7"
  assert extract.extract_reference("a\n#### 7") == "7"


@pytest.mark.parametrize("raw,norm", [
    (r"\left( \dfrac{1}{2} \right)", r"( \frac{1}{2} )"),
    (r"\text{5 }\text{ cm}", "5"),
    (r"45^{\circ}", "45"),
    (r"\$1{,}000.", "1000"),
    ("1,234,567", "1234567"),
    ("x = 7", "7"),
    ("y = 2x", "y = 2x"),
    (r"\text{(d)}", "D"),
    ("2 and 3", "2, 3"),
    (r"5\frac{3}{4}", "(5+3/4)"),
    (r"f(x) = x^2", "x^2"),
])
def test_normalize(raw, norm):
  assert normalize.normalize_answer(raw) == norm


@pytest.mark.parametrize("text,value", [
    (r"\frac{1}{2}+\frac13", sympy.Rational(5, 6)),
    (r"2^{10}", sympy.Integer(1024)),
    ("2^10", sympy.Integer(1024)),
    (r"\sqrt[3]{8}", sympy.Integer(2)),
    ("3!", sympy.Integer(6)),
    ("5!!", sympy.Integer(15)),
    (r"\binom{6}{3}", sympy.Integer(20)),
    ("-2^2", sympy.Integer(-4)),
    ("2^-1", sympy.Rational(1, 2)),
    ("0.125", sympy.Rational(1, 8)),
    (r"|3-5|", sympy.Integer(2)),
    (r"\lfloor 2.5 \rfloor", sympy.Integer(2)),
    ("12.5%", sympy.Rational(1, 8)),
    (r"\log_{2}{32}", sympy.Integer(5)),
])
def test_parse_values(text, value):
  assert sympy.simplify(latex.parse_latex(text) - value) == 0


def test_parse_builds_symbols_and_relations():
  x, y = sympy.symbols("x y")
  assert latex.parse_latex("2xy") == 2 * x * y
  assert latex.parse_latex(r"x_{1}+x_2") == sympy.Symbol("x_1") + sympy.Symbol("x_2")
  assert latex.parse_latex(r"\sin^2 x") == sympy.sin(x) ** 2
  assert latex.parse_latex("1 < x <= 2") == ("rel", ("<", "<="), (1, x, 2))


@pytest.mark.parametrize("text", [
    "10^{10^{10}}", "9!!!!!!", "100000!", "x^{10^{9}}", "(x+1)^{10^6}",
    r"\binom{10^9}{10}", "(" * 500 + "1" + ")" * 500, "9" * 1500,
    "2^{2^{2^{2^{2^{2}}}}}", r"\sqrt[10^9]{2}", r"2^{\frac{10^{9}}{3}}",
    "2^{10^{9.5}}",
])
def test_bounds_raise_too_large_fast(text):
  start = time.perf_counter()
  with pytest.raises(latex.TooLarge):
    latex.parse_latex(text)
  assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("text", [
    "__import__('os')", "a.b", "f'x'", "x @ y", "\\undefined{1}", "1 +", "",
    "\\frac{1}{0}", "hello world",
])
def test_parse_rejects_non_math(text):
  with pytest.raises((latex.ParseError, latex.TooLarge)):
    latex.parse_latex(text)


def test_structures():
  a = answers.parse_answer(r"(-\infty, 1] \cup (2, 3)")
  assert a.kind == "union" and [i.kind for i in a.items] == ["tuple", "tuple"]
  assert answers.parse_answer(r"\{1, 2\}").kind == "set"
  assert answers.parse_answer("x > 2").kind == "interval"
  assert answers.parse_answer("x + y = 2").kind == "rel"
  assert answers.parse_answer("word").kind == "text"


def test_no_eval_or_exec_during_the_suite(monkeypatch, tmp_path):
  calls = []
  real_eval, real_exec = builtins.eval, builtins.exec
  def spy_eval(*args, **kwargs):
    calls.append(("eval", args[:1]))
    return real_eval(*args, **kwargs)
  def spy_exec(*args, **kwargs):
    calls.append(("exec", args[:1]))
    return real_exec(*args, **kwargs)
  monkeypatch.setattr(builtins, "eval", spy_eval)
  monkeypatch.setattr(builtins, "exec", spy_exec)
  sentinel = tmp_path / "pwned"
  payloads = [
      rf"\boxed{{__import__('os').system('touch {sentinel}')}}",
      rf"\boxed{{open('{sentinel}', 'w')}}",
      rf"The answer is __import__('pathlib').Path('{sentinel}').touch()",
  ]
  for case in reward_cases.ALL_CASES:
    rewards.check_answer(case.response, case.reference)
  for p in payloads:
    assert not rewards.check_answer(p, "0").correct
  assert calls == []
  assert not sentinel.exists()
  assert not os.path.exists(reward_cases.SENTINEL)


def test_megabyte_responses_are_fast():
  big = "Let me think. " * 80_000 + r"\boxed{42}"
  assert len(big) > 1_000_000
  start = time.perf_counter()
  assert rewards.check_answer(big, "42").correct
  assert not rewards.check_answer("{" * 1_000_000, "42").correct
  assert not rewards.check_answer(r"\boxed{" * 200_000, "42").correct
  assert time.perf_counter() - start < 1.0


def test_options_are_frozen_and_tolerance_configurable():
  loose = rewards.CheckOptions(tolerance=answers.Tolerance(rel_tol=1e-2))
  assert rewards.check_answer(r"\boxed{3.14}", r"\pi", loose).correct
  assert not rewards.check_answer(r"\boxed{3.14}", r"\pi").correct
  with pytest.raises(Exception):
    loose.limits = None  # frozen


_FUZZ_TOKENS = (
    "1 2 0 9 10 x y e i \\pi + - * / ^ ! ( ) [ ] { } \\{ \\} \\frac \\sqrt \\sin "
    "\\log _ , = < \\le \\infty | . \\cdot \\pm \\cup \\text{ cm \\left( \\right) % "
    "^\\circ \\binom \\overline{3} \\begin{pmatrix} \\end{pmatrix} \\\\ & "
    "\\lfloor \\rfloor 0.5 3. !! \\$ or and \\in").split()


def test_fuzz_never_raises_and_is_self_consistent():
  rng = random.Random(0)
  for _ in range(400):
    a = "".join(rng.choice(_FUZZ_TOKENS) for _ in range(rng.randint(1, 12)))
    b = "".join(rng.choice(_FUZZ_TOKENS) for _ in range(rng.randint(1, 6)))
    start = time.perf_counter()
    rewards.check_answer("\\boxed{" + a + "}", b)
    same = rewards.check_answer("\\boxed{" + a + "}", a)
    assert time.perf_counter() - start < 1.0, a
    balanced = normalize.find_group("{" + a + "}", 0) == len(a) + 2
    if balanced and same.reason in ("mismatch",):
      pytest.fail(f"{a!r} is not equal to itself")


@pytest.mark.parametrize("reference", [
    "1" * 50_000, "(" * 100_000, "1" * 5000 + r".\overline{3}", r"\boxed{",
    "", "   ", "#### ", r"\frac{1}{0}", "x" * 10_000,
], ids=lambda r: f"{r[:10]!r}x{len(r)}")
def test_odd_references_never_raise(reference):
  start = time.perf_counter()
  verdict = rewards.check_answer(r"\boxed{1}", reference)
  assert not verdict.correct
  assert time.perf_counter() - start < 1.0
