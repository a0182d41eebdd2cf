"""The differential corpus: golds in the styles of real answer keys, with
equivalent rewritings and near-miss non-equivalents, for comparing the math
checker with math-verify (see `test_rewards_differential.py`).

Every gold below was written for this file in the style of one answer key
(MATH, NuminaMath, AIME, GSM8K, olympiad). `GOLDS` rows are
`(style, family, gold, equivalents, near_misses)`; `corpus()` turns each
rewriting into a `reward_cases.Case` by wrapping it in one of the response
formats models produce (chosen by a fixed rotation, so the corpus is
deterministic). Labels are by construction: a rewriting is equal, a near
miss is not.

`POLICY` names the cases where math-verify's verdict differs from the label
on purpose (the README lists each class with its reason): the differential
test requires that every disagreement is one of them.
"""

import re

from reward_case import Case

# (style, family, gold, equivalent rewritings, near misses)
GOLDS = [
    # -- MATH ----------------------------------------------------------------
    ("math", "fraction", r"\frac{3}{4}",
     ["0.75", r"\dfrac34", "3/4", r"\frac{6}{8}", r"\tfrac{3}{4}"],
     [r"\frac{4}{3}", "0.74", r"\frac{3}{5}", "34"]),
    ("math", "fraction", r"-\frac{7}{2}",
     ["-3.5", r"\frac{-7}{2}", r"-3\frac{1}{2}", "-7/2"],
     [r"\frac{7}{2}", r"-\frac{2}{7}", "-3.2"]),
    ("math", "radical", r"2\sqrt{5}",
     [r"\sqrt{20}", r"2 \sqrt 5", r"\sqrt{5}\cdot 2", r"\frac{10}{\sqrt5}"],
     [r"\sqrt{10}", r"2\sqrt{3}", r"5\sqrt{2}", "2"]),
    ("math", "radical", r"\frac{\sqrt{3}}{2}",
     [r"\frac{1}{2}\sqrt3", r"\frac{3}{2\sqrt{3}}", r"\sqrt{\frac{3}{4}}"],
     [r"\frac{\sqrt{2}}{2}", r"\sqrt{3}", r"\frac{3}{2}"]),
    ("math", "radical", r"3+2\sqrt{2}",
     [r"2\sqrt2+3", r"(1+\sqrt{2})^2", r"\sqrt{8}+3"],
     [r"3-2\sqrt{2}", r"3+\sqrt{2}", r"5\sqrt{2}"]),
    ("math", "pi", r"12\pi",
     [r"12 \pi", r"\pi \cdot 12", r"\frac{24\pi}{2}", r"12\pi\text{ cm}^2"],
     ["12", r"6\pi", r"12\pi^2", r"\frac{\pi}{12}"]),
    ("math", "pi", r"\frac{5\pi}{6}",
     [r"\frac56\pi", r"\frac{5}{6}\pi", r"5\pi/6"],
     [r"\frac{\pi}{6}", r"\frac{6\pi}{5}", r"\frac{5}{6}"]),
    ("math", "interval", r"(-\infty, 2) \cup (5, \infty)",
     [r"(5,\infty)\cup(-\infty,2)", r"x<2 \text{ or } x>5",
      r"(-\infty,2)\cup(5,+\infty)"],
     [r"(-\infty, 2] \cup (5, \infty)", "(2,5)", r"(-\infty,5)\cup(2,\infty)"]),
    ("math", "interval", r"[-3, 4)",
     [r"-3 \le x < 4", r"\left[-3,4\right)", r"x \in [-3, 4)"],
     ["(-3,4)", "[-3,4]", "[-4,3)"]),
    ("math", "interval", r"(-\infty, 1]",
     [r"x \le 1", r"-x \ge -1", r"1 \geq x", r"2x \le 2"],
     [r"(-\infty, 1)", r"x \ge 1", r"[1, \infty)"]),
    ("math", "set", r"\{1, 3, 5\}",
     [r"\{5,3,1\}", "1, 3, 5", r"\left\{1,3,5\right\}"],
     [r"\{1,3\}", r"\{1,3,6\}", "1, 3, 5, 7"]),
    ("math", "tuple", "(2, -1)",
     [r"\left(2,-1\right)", "(2; -1)", "(x,y)=(2,-1)", "(2,-1.0)"],
     ["(-1,2)", "(2,1)", "[2,-1]"]),
    ("math", "tuple", r"\left( 3, \frac{\pi}{2} \right)",
     [r"(3, \frac{\pi}{2})", r"(3,\pi/2)", r"\left(3; \frac12\pi\right)"],
     [r"(3, \pi)", r"(\frac{\pi}{2}, 3)"]),
    ("math", "matrix", r"\begin{pmatrix} 3 \\ -1 \end{pmatrix}",
     [r"\begin{bmatrix}3\\-1\end{bmatrix}",
      r"\left[\begin{array}{c}3\\-1\end{array}\right]",
      r"\begin{pmatrix}1\\0\end{pmatrix}+\begin{pmatrix}2\\-1\end{pmatrix}"],
     [r"\begin{pmatrix}-1\\3\end{pmatrix}", r"\begin{pmatrix}3\\1\end{pmatrix}"]),
    ("math", "matrix", r"\begin{pmatrix} 1 & 2 \\ 0 & 1 \end{pmatrix}",
     [r"\left[\begin{array}{cc}1&2\\0&1\end{array}\right]",
      r"\begin{pmatrix}1&0\\0&1\end{pmatrix}+\begin{pmatrix}0&2\\0&0\end{pmatrix}",
      r"\begin{pmatrix}1&1\\0&1\end{pmatrix}\begin{pmatrix}1&1\\0&1\end{pmatrix}"],
     [r"\begin{pmatrix}1&0\\2&1\end{pmatrix}", r"\begin{pmatrix}1&2\\0&-1\end{pmatrix}"]),
    ("math", "separator", r"10,\!000",
     ["10000", r"10{,}000", "10,000", r"10\,000"],
     ["1000", "100000", "10001"]),
    ("math", "separator", r"32,\! 349",
     ["32349", "32,349", r"32{,}349"],
     ["32348", "3249"]),
    ("math", "equation", "y = -2x + 3",
     ["y=3-2x", "2x + y = 3", "y = -2x+3"],
     ["y = 2x+3", "y = -3x + 2", "x = -2y + 3"]),
    ("math", "equation", r"x^2 + y^2 = 25",
     ["y^2+x^2=25", "x^2+y^2-25=0", "2x^2+2y^2=50"],
     ["x^2+y^2=5", "x^2-y^2=25"]),
    ("math", "degree", r"30^\circ",
     ["30", "30°", r"30^{\circ}", r"30\text{ degrees}"],
     [r"60^\circ", "3", r"150^\circ"]),
    ("math", "unit", r"\$12.50",
     ["12.5", "12.50", r"12.50\text{ dollars}", r"\$12.5"],
     ["12.05", "1250", "125"]),
    ("math", "percent", r"25\%",
     ["25", "25 percent", r"25\text{ percent}", "25 pct"],
     ["2.5", "250", "24"]),
    ("math", "expression", r"x^2 + 2x + 1",
     ["(x+1)^2", "1+2x+x^2", r"(x+1)(1+x)"],
     ["(x-1)^2", "x^2+2x", "x^2+1"]),
    ("math", "text", r"\text{(C)}",
     ["C", "(C)", r"\textbf{(C)}"],
     ["D", "(B)"]),
    ("math", "solutions", r"\frac{1}{2}, 3",
     [r"3, \frac12", r"x = \frac12 \text{ or } x = 3", r"x=3or x=\frac12",
      r"\frac12, 3, 3"],
     [r"-\frac12, 3", r"\frac12, -3", r"\frac12, 3, 4"]),
    ("math", "radical", r"\sqrt[3]{2}",
     ["2^{1/3}", r"2^{\frac13}", r"\sqrt[3]{16}/2"],
     [r"\sqrt{2}", r"\sqrt[3]{3}", "2^3"]),
    # -- NuminaMath ------------------------------------------------------------
    ("numina", "radical", r"\dfrac{\sqrt{2}}{2}",
     [r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt2}{2}", r"\sin\frac{\pi}{4}"],
     [r"\frac{\sqrt{3}}{2}", r"\sqrt{2}", r"\frac{1}{2}"]),
    ("numina", "named", "a = 2, b = -1",
     ["b=-1, a=2", "a=2,b=-1", "2, -1"],
     ["a=-1, b=2", "a = 2, b = 1", "-1, 2"]),
    ("numina", "named", "AB=4, CD=5",
     ["4, 5", "CD=5, AB=4", "AB = 4, CD = 5"],
     ["AB=5, CD=4", "4, 6"]),
    ("numina", "named", r"|AB| = 2\sqrt{2}",
     [r"2\sqrt2", r"\sqrt{8}", r"|AB|=\sqrt8"],
     ["2", r"4\sqrt{2}", r"\sqrt2"]),
    ("numina", "named", r"\frac{NO}{BO}=\frac{1}{\sqrt6}",
     [r"\frac{1}{\sqrt6}", r"\frac{\sqrt6}{6}", r"\frac{NO}{BO} = \frac{\sqrt{6}}{6}"],
     [r"\sqrt6", r"\frac{1}{6}"]),
    ("numina", "ratio", "V_1:V_2 = 11:21",
     ["11:21", "V_1 : V_2 = 11 : 21"],
     ["21:11", "11:12"]),
    ("numina", "interval", r"m \in (-1, 2]",
     [r"(-1,2]", r"-1 < m \le 2", r"2 \ge m > -1"],
     [r"[-1,2]", r"(-1,2)", r"-1 < m < 2"]),
    ("numina", "approx", r"\frac{\sqrt{3}}{3}",
     [r"\frac{\sqrt3}{3} \approx 0.577", r"\frac{1}{\sqrt{3}}", r"\frac{\sqrt{3}}{3}"],
     ["0.577", r"\sqrt{3}", r"\frac{\sqrt3}{2}"]),
    ("numina", "approx", "11",
     [r"x \approx 11", "11.0", r"x=11"],
     ["12", r"x \approx 12", "1.1"]),
    ("numina", "equation", r"\frac{x^2}{4} + \frac{y^2}{3} = 1",
     ["3x^2+4y^2=12", r"\frac{y^2}{3}+\frac{x^2}{4}=1"],
     [r"\frac{x^2}{3}+\frac{y^2}{4}=1", "3x^2+4y^2=1"]),
    ("numina", "sequence", "a_n = 2n - 1",
     ["a_n=2n-1", "a_n = -1 + 2n"],
     ["a_n = 2n+1", "a_n = n - 1"]),
    ("numina", "sum", r"\sum_{k=1}^{10} k^2",
     ["385", r"\sum_{j=1}^{10} j^2", r"\frac{10\cdot 11\cdot 21}{6}"],
     ["384", r"\sum_{k=1}^{9} k^2", "55"]),
    ("numina", "percent", r"28\%",
     ["28", "28 percent", r"28\text{ percent}", "28 pct"],
     ["29", "2.8"]),
    ("numina", "inequality", r"0 < f(x) < 1",
     ["(0, 1)", r"0<f(x)<1"],
     ["[0, 1]", "(0, 2)"]),
    # -- AIME ------------------------------------------------------------------
    ("aime", "integer", "73", ["073", "73.0", "m+n=73", r"\text{73}"],
     ["72", "37", "730"]),
    ("aime", "integer", "204", ["204", "0204", r"204."], ["240", "205"]),
    ("aime", "integer", "809", [r"809", r"\mathbf{809}", "n = 809"],
     ["908", "808"]),
    ("aime", "integer", "25", ["025", "5^2", r"\frac{50}{2}"], ["52", "24"]),
    ("aime", "integer", "0", ["000", "0"], ["1", "10"]),
    # -- GSM8K -----------------------------------------------------------------
    ("gsm8k", "separator", "1080",
     ["1,080", r"\$1,080", "1080 dollars", r"1{,}080"],
     ["108", "1008", "1,800"]),
    ("gsm8k", "unit", "2500",
     ["2,500 square feet", "2500", r"2{,}500\text{ square feet}"],
     ["250", "25,000"]),
    ("gsm8k", "unit", "18", ["18.00", "18 apples", r"\$18", "18 dollars"],
     ["17", "180", "1.8"]),
    ("gsm8k", "percent", "40", [r"40\%", "40 percent", "40.0"],
     ["4", "400", "0.4"]),
    ("gsm8k", "separator", "1250000",
     ["1,250,000", r"1{,}250{,}000", r"1,\!250,\!000"],
     ["125000", "1,250"]),
    ("gsm8k", "unit", "5", ["5 hours", r"5\text{ hours}", "5.0"],
     ["6", "50", "0.5"]),
    # -- olympiad --------------------------------------------------------------
    ("olympiad", "integer", "34",
     ["n=34", r"34", r"\text{34}"], ["43", "33", "n = 35"]),
    ("olympiad", "expression", r"\frac{2^{2018}-2}{3}",
     [r"\frac{2(2^{2017}-1)}{3}", r"\frac{2^{2018}}{3}-\frac{2}{3}"],
     [r"\frac{2^{2018}+2}{3}", r"\frac{2^{2017}-2}{3}"]),
    ("olympiad", "expression", r"\binom{10}{3}", ["120", r"\frac{10!}{3!7!}"],
     ["720", r"\binom{10}{4}"]),
    ("olympiad", "named", "p = 2, q = 3", ["q=3, p=2", "2, 3"],
     ["p=3, q=2", "2, 5"]),
    ("olympiad", "function", "f(x) = x", ["f(x)=x", "x"],
     ["f(x)=-x", "f(x) = x + 1"]),
    ("olympiad", "inequality", r"k \ge 2", [r"[2, \infty)", r"k\geq 2", r"2 \le k"],
     [r"k > 2", r"(2,\infty)", r"k \le 2"]),
    ("olympiad", "inequality", r"[-\frac{3}{2}, -1] \cup [1, \frac{3}{2}]",
     [r"1 \le |z| \le \frac{3}{2}", r"1 \le |z| \le 3/2",
      r"[1, 1.5] \cup [-1.5, -1]"],
     [r"[1, \frac32]", r"(-\frac32,-1)\cup(1,\frac32)"]),
    ("olympiad", "expression", r"2^{n}-1", ["2^n - 1", "-1+2^n"],
     ["2^n+1", "2^{n-1}"]),
    ("olympiad", "text", r"\text{no solution}", ["No solution", r"\text{No solution}"],
     [r"\text{one solution}"]),
    ("olympiad", "degree", r"60^\circ", [r"60", r"60^{\circ}", "60 degrees"],
     [r"30^\circ", "120"]),
    ("olympiad", "separator", r"14{,}916", ["14916", r"14,\!916", "14,916"],
     ["14196", "1491"]),
    ("olympiad", "solutions", r"\pm\sqrt{3}",
     [r"\sqrt3, -\sqrt3", r"x=\pm\sqrt{3}", r"-\sqrt{3}, \sqrt{3}"],
     [r"\sqrt{3}", r"\pm 3", r"\pm\sqrt{2}"]),
    ("olympiad", "set", r"\{(1,2),(3,4)\}",
     ["(3,4),(1,2)", r"\{(3,4),(1,2)\}", "(1,2),(3,4)"],
     ["(1,2),(4,3)", "(1,2)"]),
    ("math", "complex", "3+4i", ["4i+3", "3 + 4 i", "(3+4i)"],
     ["3-4i", "4+3i", "5"]),
    ("math", "log", r"\log_2 8", ["3", r"\frac{\ln 8}{\ln 2}", r"\log_{2}{8}"],
     ["8", "2", r"\log_8 2"]),
    ("math", "scientific", "1200", [r"1.2\times10^{3}", r"1.2 \cdot 10^3", "1200.0"],
     [r"1.2\times10^{2}", "120"]),
    ("math", "repeating", r"0.\overline{3}", [r"\frac{1}{3}", "1/3"],
     ["0.3", "0.33"]),
    ("math", "interval", r"[2, 5]", [r"2 \le x \le 5", r"x \in [2,5]", r"5 \ge x \ge 2"],
     [r"2 < x \le 5", "(2,5)", "[2,6]"]),
    ("math", "equation", "y = 2x", ["2x - y = 0", "y=2x", r"x = \frac{y}{2}"],
     ["y = x/2", "y = -2x"]),
    ("math", "expression", r"\frac{a+b}{2}", [r"\frac{a}{2}+\frac{b}{2}", r"(a+b)/2",
                                               r"0.5(a+b)"],
     [r"\frac{a-b}{2}", r"a+b"]),
    ("math", "fraction", r"\frac{1}{2}", ["0.5", ".5", "1/2", r"\frac{2}{4}"],
     ["2", "0.25", r"\frac{1}{3}"]),
    ("math", "text", r"\text{Monday}", ["Monday", r"\text{monday}", r"\textbf{Monday}"],
     ["Tuesday", r"\text{Sunday}"]),
    ("math", "infinity", r"\infty", [r"+\infty", r"\infty"], [r"-\infty", "0"]),
    ("numina", "expression", r"\frac{\pi}{3}", [r"\pi/3", r"\frac{1}{3}\pi", r"60^\circ"],
     [r"\frac{\pi}{6}", "60", r"\frac{\pi}{3}+1"]),
    ("numina", "interval", r"(1, +\infty)",
     [r"\{x \mid x > 1\}", r"x>1", r"(1,\infty)"],
     [r"[1,+\infty)", r"\{x \mid x < 1\}"]),
    ("numina", "interval", r"[-1, 0) \cup (0, +\infty)",
     [r"k \ge -1 \text{ and } k \ne 0", r"(0,\infty)\cup[-1,0)"],
     [r"[-1, +\infty)", r"k \ge -1 \text{ or } k \ne 0"]),
    ("math", "interval", r"(-\infty, \infty)", [r"\mathbb{R}", r"x \in \mathbb{R}"],
     [r"(0, \infty)", r"\mathbb{Z}"]),
    ("math", "percent", "0.35", [r"35\%", "35 percent", r"\frac{7}{20}"],
     [r"3.5\%", "0.53"]),
    ("math", "ratio", r"\frac{3}{2}", ["3:2", "1.5", "6:4"], ["2:3", "3:1"]),
    ("math", "choice", "B", [r"(B) 12", r"\text{(B)}", r"B: 12"],
     [r"(C) 12", r"A: 1, B: 2"]),
    ("olympiad", "general_solution", r"\frac{\pi}{6}+2k\pi",
     [r"x=\frac{\pi}{6}+2k\pi, k\in\mathbb{Z}", r"2k\pi+\frac{\pi}{6}"],
     [r"\frac{\pi}{6}+k\pi", r"\frac{\pi}{3}+2k\pi"]),
    ("numina", "radical", r"4\sqrt{3}", [r"4\sqrt3\text{ cm}", r"\sqrt{48}",
                                         r"4 \sqrt{3} \text{ units}"],
     [r"3\sqrt{4}", r"4\sqrt{2}"]),
]

# Response formats: (name, template). `X` is replaced by the answer.
FORMATS = [
    ("boxed", "We simplify step by step.\nThe answer is $\\boxed{X}$."),
    ("minerva", "So we are done.\nFinal Answer: The final answer is $X$. "
                "I hope it is correct."),
    ("display", "Putting it together,\n\\[\n\\boxed{X}\n\\]"),
    ("markdown", "**Answer:** $X$"),
    ("box_then_minerva", "At first \\boxed{0} seems right, but it is not.\n"
                         "Final Answer: The final answer is $X$. I hope it is correct."),
    ("answer_display", "Collecting the terms.\n\nAnswer:\n$$\nX\n$$"),
]

# Lenient-only formats: no marker (strict finds no answer), and one box per
# part of a multi-part gold.
UNMARKED = "Counting all of them, we get $X$."


# Disagreements with math-verify that are deliberate or known, by class;
# each is (reason, predicate on a case). The README lists them.
def _answer_has_relation(c):
  return bool(re.search(r"<|>|\\le|\\ge", c.answer)) and not re.search(
      r"<|>|\\le|\\ge", c.reference)


POLICY = {
    "solves_inequalities": (
        "we solve inequalities in one variable (`-x \\ge -1`, `2x \\le 2`, "
        "`1 \\le |z| \\le 3/2`, `x<2 or x>5`) and compare the solution set "
        "with an interval gold; math-verify compares the relation as written",
        _answer_has_relation),
    "brackets_are_shape": (
        "a point `(2, -1)` is not the closed interval `[2, -1]`: we compare "
        "tuples and intervals with their brackets; math-verify ignores them",
        lambda c: not c.equal and c.answer[:1] == "[" and c.reference[:1] == "("),
    "named_values_in_order": (
        "a gold `a = 2, b = -1` answered by bare values is read in the "
        "gold's order (`-1, 2` names a = -1); math-verify compares the values "
        "as a set",
        lambda c: not c.equal and "=" in c.reference and "=" not in c.answer),
    "unit_words": (
        "a unit word after a number (`18 dollars`, `12\\pi\\text{ cm}^2`, "
        "`28\\text{ percent}`) is dropped; math-verify keeps some of them and "
        "the number no longer matches",
        lambda c: c.equal and bool(re.search(
            r"\d\s+[a-z]{3,}|\\text\{\s*[a-z]{2,}", c.answer))),
    "degrees_as_radians": (
        "`60^\\circ` against a gold in radians (`\\frac{\\pi}{3}`) is "
        "converted; math-verify compares 60 with pi/3",
        lambda c: c.equal and "circ" in c.answer and "pi" in c.reference),
    "repeating_decimal": (
        "`0.\\overline{3}` is 1/3; math-verify does not read the overline",
        lambda c: c.equal and "overline" in c.reference + c.answer),
    "spaced_imaginary_unit": (
        "`3 + 4 i` with a space before `i` is 3+4i; math-verify misreads it",
        lambda c: c.equal and bool(re.search(r"\d\s+i\b", c.answer))),
    "choice_with_value": (
        "a choice letter followed by its value (`(B) 12`, `B: 12`) matches "
        "the letter or the value; math-verify reads only the value",
        lambda c: c.equal and bool(re.match(r"\(?[A-E][):]", c.answer))),
    "parameter_range_remark": (
        "`, k \\in \\mathbb{Z}` after a general solution names the "
        "parameter's range and is dropped",
        lambda c: c.equal and "mathbb{Z}" in c.answer),
    "several_boxes": (
        "lenient mode joins one box per part of a multi-part gold "
        "(`\\boxed{1/2}` ... `\\boxed{3}` for `1/2, 3`); math-verify reads "
        "the boxes separately",
        lambda c: c.category.endswith(":boxes") and c.lenient_equal),
    "thin_space_separator": (
        "`10\\,000` groups digits with a thin space, as in MATH's answer "
        "keys; math-verify reads a product or a list",
        lambda c: c.equal and bool(re.search(r"\d\\,\d{3}", c.answer))),
    "trailing_period_in_box": (
        "`\\boxed{204.}` ends a sentence inside the box; math-verify does "
        "not parse it",
        lambda c: c.equal and c.answer.endswith(".")),
}


def policy_of(case) -> str | None:
  """The policy class that explains a disagreement on `case`, if any."""
  for name, (_, predicate) in POLICY.items():
    if predicate(case):
      return name
  return None


def _fmt(k: int, answer: str) -> tuple[str, str]:
  name, template = FORMATS[k % len(FORMATS)]
  return name, template.replace("X", answer)


def _lenient_cases() -> list[Case]:
  """Unmarked final answers and one box per part (lenient mode only)."""
  out = []
  for style, family, gold, equal, near in GOLDS:
    parts = [p.strip() for p in gold.split(",")]
    if family in ("integer", "fraction", "radical", "pi", "separator"):
      for answer, label in ((equal[0], True), (near[0], False)):
        out.append(Case(f"corpus:{style}:{family}:unmarked",
                        UNMARKED.replace("X", answer), gold, False,
                        lenient=label, answer=answer))
    if family == "solutions" and len(parts) == 2:
      boxes = rf"First $\boxed{{{parts[0]}}}$, and second $\boxed{{{parts[1]}}}$."
      out.append(Case(f"corpus:{style}:{family}:boxes", boxes, gold, False,
                      lenient=True, answer=gold))
      wrong = rf"First $\boxed{{{parts[0]}}}$, and second $\boxed{{{near[0]}}}$."
      out.append(Case(f"corpus:{style}:{family}:boxes", wrong, gold, False,
                      answer=near[0]))
  return out


def corpus() -> list[Case]:
  """All corpus cases, in a fixed order."""
  cases, k = [], 0
  for style, family, gold, equal, near in GOLDS:
    for answers, label in ((equal, True), (near, False)):
      for answer in answers:
        for shift in (0, 2):  # Each rewriting in two response formats.
          fmt, response = _fmt(k + shift, answer)
          cases.append(Case(f"corpus:{style}:{family}:{fmt}", response, gold,
                            label, answer=answer))
        k += 1
  return cases + _lenient_cases()


CASES = corpus()
