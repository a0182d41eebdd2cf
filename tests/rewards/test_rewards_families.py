"""One test per answer family of issue #14, in the modes where it applies.

Each row is (response, reference, strict verdict, lenient verdict). Responses
are bare answers wrapped as `The answer is $\\boxed{...}$.` unless they spell
out a whole response.
"""

import pytest

from vapo_jax import rewards

STRICT = rewards.CheckOptions(mode="strict")
LENIENT = rewards.CheckOptions(mode="lenient")


def box(answer: str) -> str:
  return f"The answer is $\\boxed{{{answer}}}$."


FAMILIES = {
    "thousands_separators": [
        (box(r"10,\!000"), "10000", True, True),
        (box(r"32,\! 349"), "32349", True, True),
        (box(r"14{,}916"), "14916", True, True),
        (box("2,500 square feet"), "2500", True, True),
        (box(r"1,\!250,\!000"), "1250000", True, True),
        (box(r"10,\!000"), "1000", False, False),
        (box("1,234"), "(1,234)", False, False),
    ],
    "minerva_beats_earlier_box": [
        ("We try \\boxed{4}.\nFinal Answer: The final answer is $7$. I hope it "
         "is correct.", "7", True, True),
        ("We try \\boxed{4}.\nFinal Answer: The final answer is $7$. I hope it "
         "is correct.", "4", False, False),
        ("The answer is 5.\n\nSo in the end \\boxed{6}.", "6", True, True),
    ],
    "final_answer_description": [
        ("Final Answer: The largest $n$ is 34.", "34", True, True),
        ("Final Answer: The number of ways is $\\binom{5}{2}$.", "10", True, True),
        ("Final Answer: The largest $n$ is 34.", "35", False, False),
    ],
    "phrase_then_display_math": [
        ("Answer \\[\n x = \\frac{1}{2}\n\\]", r"\frac12", True, True),
        ("The answer is:\n$$\nx=5\n$$\nDone.", "5", True, True),
        ("Answer:\n$$\n(1,\n 2)\n$$", "(1,2)", True, True),
        ("The answer is:\n$$\nx=5\n$$", "6", False, False),
    ],
    "approx": [
        (box(r"\frac{\sqrt3}{3} \approx 0.577"), r"\frac{\sqrt{3}}{3}", True, True),
        (box(r"x \approx 11"), "11", True, True),
        (box(r"\frac{\sqrt3}{3} \approx 0.577"), "0.577", False, False),
    ],
    "percent_as_word": [
        (box("28 percent"), "28", True, True),
        (box("28 pct"), r"28\%", True, True),
        (box(r"28\text{ percent}"), r"28\%", True, True),
        (box("28 percent"), "0.28", True, True),  # Also its fraction.
        (box("28 percent"), "2.8", False, False),
    ],
    "named_golds": [
        (box("4, 5"), "AB=4, CD=5", True, True),
        (box("CD=5, AB=4"), "AB=4, CD=5", True, True),
        (box("5, 4"), "AB=4, CD=5", False, False),
        (box("AB=5, CD=4"), "AB=4, CD=5", False, False),
        (box("1"), "|AB| = 1", True, True),
        (box(r"\frac{1}{\sqrt6}"), r"\frac{NO}{BO}=\frac{1}{\sqrt6}", True, True),
        (box("11:21"), "V_1:V_2 = 11:21", True, True),
        (box("21:11"), "V_1:V_2 = 11:21", False, False),
    ],
    "matrices": [
        (box(r"\left[\begin{array}{cc}1&2\\3&4\end{array}\right]"),
         r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True, True),
        (box(r"\begin{pmatrix}1\\2\end{pmatrix}+\begin{pmatrix}3\\4\end{pmatrix}"),
         r"\begin{pmatrix}4\\6\end{pmatrix}", True, True),
        (box(r"\begin{pmatrix}1&1\\0&1\end{pmatrix}\begin{pmatrix}1&1\\0&1\end{pmatrix}"),
         r"\begin{pmatrix}1&2\\0&1\end{pmatrix}", True, True),
        (box(r"2\begin{pmatrix}1&0\\0&1\end{pmatrix}"),
         r"\begin{pmatrix}2&0\\0&2\end{pmatrix}", True, True),
        (box(r"\left[\begin{array}{cc}1&2\\3&4\end{array}\right]"),
         r"\begin{pmatrix}1&3\\2&4\end{pmatrix}", False, False),
    ],
    "inequalities": [
        (box("-x > -1"), "x<1", True, True),
        (box("-x > -1"), "x>1", False, False),
        (box(r"0 < f(x) < 1"), "(0,1)", True, True),
        (box(r"1 \le |z| \le 3/2"), r"[-\frac32,-1]\cup[1,\frac32]", True, True),
        (box(r"1 \le |z| \le 3/2"), r"[1,\frac32]", False, False),
        (box(r"|x-1| < 2"), "(-1, 3)", True, True),
        (box(r"(1, 2] \cup (2, 3)"), "(1, 3)", True, True),
    ],
    "tuples_with_semicolons": [
        (box("(1; 2)"), "(1,2)", True, True),
        (box("(1; 2)"), "(2,1)", False, False),
    ],
    "repeated_solution": [
        (box("2, 2, 3"), "2, 3", True, True),
        (box("2, 2"), "2", True, True),
        (box(r"\{1, 2, 2\}"), r"\{1, 2\}", False, False),
    ],
    "or_without_spaces": [
        (box("x=2or x=3"), "2, 3", True, True),
        (box(r"2\text{or}3"), "3, 2", True, True),
    ],
    "stray_trailing_backslash": [
        (box("5\\"), "5", True, True),
        (box(r"\frac{1}{2}\\"), "0.5", True, True),
        (box("5\\"), "6", False, False),
    ],
    "sums": [
        (box(r"\sum_{k=1}^{10} k^2"), "385", True, True),
        (box(r"\sum_{k=1}^{n} k"), r"\sum_{i=1}^{n} i", True, True),
        (box(r"\sum_{k=1}^{n} k"), r"\sum_{i=1}^{n} i^2", False, False),
        (box(r"\prod_{i=1}^{5} i"), "120", True, True),
    ],
    "several_boxes": [
        (r"So $\boxed{2}$ and $\boxed{3}$.", "2, 3", False, True),
        (r"So $\boxed{3}$ and $\boxed{2}$.", "2, 3", False, True),
        (r"So $\boxed{2}$ and $\boxed{4}$.", "2, 3", False, False),
        (r"$\boxed{1}$ $\boxed{2}$ $\boxed{3}$", "2, 3", False, False),
    ],
    "unmarked_final_answer": [
        ("Adding, 5 + 7 = 12.", "12", False, True),
        ("So she has $12$ apples left.", "12", False, True),
        ("So she has $13$ apples left.", "12", False, False),
        ("Hence $x = \\frac{1}{2}$", "0.5", False, True),
    ],
    "multiple_choice_with_value": [
        (box("(C) 3"), "C", True, True),
        (box("(C) 3"), "3", True, True),
        (box("(C) 3"), "4", False, False),
        (box("(A) (B) (C) (D) (E)"), "C", False, False),
    ],
    "unicode_and_ordinals": [
        ("the answer is ¼", r"\frac{1}{4}", True, True),
        (box(r"7\text{th}"), "7", True, True),
        (box(r"2\tfrac14"), "9/4", True, True),
    ],
    "real_line_ratio_log": [
        (box(r"\mathbb{R}"), r"(-\infty, \infty)", True, True),
        (box("3:2"), r"\frac{3}{2}", True, True),
        (box(r"\log 100"), "2", True, True),
        (box("x=2, y=3"), "(2, 3)", True, True),
        (box("x=3, y=2"), "(2, 3)", False, False),
    ],
    "remarks_vectors_temperatures": [
        (box(r"\frac{2}{3}\text{ of the pie}"), r"\frac23", True, True),
        (box(r"1 \text{ (one)}"), "1", True, True),
        (box(r"\langle 1, 2 \rangle"), "(1,2)", True, True),
        (box(r"5^{\circ}\text{C}"), "5", True, True),
        (box(r"x \neq 0"), r"(-\infty,0)\cup(0,\infty)", True, True),
        (box(r"x \neq 1"), r"(-\infty,0)\cup(0,\infty)", False, False),
        (box(r"\textbf{(B) }12"), "B", True, True),
        (box(r"x = 4 \text{ and } y = 4"), "4", False, False),
    ],
    "box_holding_a_response": [
        (box("Final Answer: The largest $n$ is 34."), "34", True, True),
        (box("The answer is:\n$$\nx=5\n$$"), "5", True, True),
        (box(r"So $\boxed{2}$ and $\boxed{3}$."), "2, 3", False, True),
        (box("Adding, 5 + 7 = 12."), "12", False, True),
        (box("Adding, 5 + 7 = 12."), "7", False, False),
    ],
    "set_builder_and_conjunctions": [
        (box(r"\{x \mid x > 1\}"), r"(1, \infty)", True, True),
        (box(r"\{x|x>1\}"), r"(1, \infty)", True, True),
        (box(r"k\ge -1 \text{ and } k\ne 0"), r"[-1,0)\cup(0,+\infty)", True, True),
        (box(r"k\ge -1 \text{ or } k\ne 0"), r"[-1,0)\cup(0,+\infty)", False, False),
        (box(r"x=\frac{\pi}{6}+2k\pi, k\in\mathbb{Z}"), r"\frac{\pi}{6}+2k\pi",
         True, True),
    ],
    "counts_and_descriptions": [
        (box(r"\text{3 solutions}"), "3", True, True),
        (box("24种"), "24", True, True),
        (box(r"\text{the maximum is } 3"), "3", True, True),
        (box(r"\max f(x)=3"), "3", True, True),
        (box(r"f(x)_{\max}=3"), "3", True, True),
        (box(r"\text{D}. 12"), "D", True, True),
        (box("B: 4"), "4", True, True),
    ],
    "unmarked_parts": [
        ("The roots are $x = -2$ and $x = 3$.", "-2, 3", False, True),
        ("The roots are $x = -2$ and $x = 4$.", "-2, 3", False, False),
    ],
    "degrees_against_radians": [
        (box(r"60^\circ"), r"\frac{\pi}{3}", True, True),
        (box(r"\frac{\pi}{3}"), r"60^\circ", True, True),
        (box(r"30^\circ"), r"\frac{\pi}{3}", False, False),
    ],
}


@pytest.mark.parametrize("family,row", [
    (f, r) for f, rows in FAMILIES.items() for r in rows],
    ids=[f"{f}-{i}" for f, rows in FAMILIES.items() for i in range(len(rows))])
def test_family(family, row):
  response, reference, strict, lenient = row
  got_strict = rewards.check_answer(response, reference, STRICT)
  got_lenient = rewards.check_answer(response, reference, LENIENT)
  assert got_strict.correct == strict, (family, "strict", got_strict)
  assert got_lenient.correct == lenient, (family, "lenient", got_lenient)


def test_modes_are_validated():
  with pytest.raises(ValueError, match="mode"):
    rewards.CheckOptions(mode="loose")


def test_lenient_plugin_scores_unmarked_answers():
  assert rewards.score_lenient("", "It is 4.", "4") == (1.0, "match:string")
  assert rewards.score("", "It is 4.", "4") == (0.0, "no_answer")
