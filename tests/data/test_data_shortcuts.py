"""data.shortcuts: each shortcut by hand, the operator-pattern floor, operations from solutions."""

import pytest

from vapo_jax.data import shortcuts as sc
from vapo_jax.data import sources


def ex(problem, answer, solution=None):
  return sources.Example(problem=problem, answer=str(answer), solution=solution)


STORY = "Maya has 7 pencils. She buys 4 more pencils. Then she gives 3 pencils to her friend."


def test_numbers_in_order_with_multiplier_words():
  assert sc.numbers(STORY) == [7, 4, 3]
  assert sc.numbers("Tom has 5 cards. Then the number of cards he has doubles.") == [5, 2]
  assert sc.numbers("He ends up with three times as many. Twice 6.") == [3, 2, 6]
  assert sc.numbers("Compute ((3+4)*2)-5.") == [3, 4, 2, 5]
  assert sc.numbers("no numbers here") == []


@pytest.mark.parametrize("answer,right", [
    (14, {"sum"}), (84, {"product"}), (7, {"first", "max"}), (3, {"last", "min"}),
    (0, {"first_minus_rest"}), (4, {"range"}), (8, set())])
def test_each_shortcut_by_hand(answer, right):
  # 7, 4, 3: sum 14, product 84, first 7, last 3, max 7, min 3, 7 - 4 - 3 = 0, 7 - 3 = 4.
  got = sc.verdicts(ex(STORY, answer))
  assert set(got) == set(sc.SHORTCUTS)
  assert {k for k, v in got.items() if v} == right


def test_non_numeric_answers_and_empty_problems_are_never_right():
  assert not any(sc.verdicts(ex(STORY, "\\frac{1}{2}")).values())
  assert not any(sc.verdicts(ex("What is x?", "3")).values())
  assert sc.verdicts(ex("1,000 and 2", "1,000"))["first"] is False  # "1", "000": no comma
  assert sc.verdicts(ex("3 and 4", "7.0"))["sum"]


def test_scores_best_and_template():
  exs = [ex("2 and 3", 5), ex("2 and 3", 6), ex("4 and 3", 1), ex("4 and 3 and 2", 14)]
  out = sc.scores(exs)
  assert out["sum"] == 0.25 and out["product"] == 0.25 and out["first_minus_rest"] == 0.25
  assert out["range"] == 0.25  # 4 - 3 = 1
  assert out["best"] == max(out[k] for k in sc.SHORTCUTS)
  # Best pattern over 2 numbers: "+", "*" and "-" each right once -> 1 of 3; over 3 numbers
  # (4 + 3) * 2 = 14 -> 1 of 1. Total 2 of 4.
  assert out["template"] == 0.5
  assert sc.scores([]) == {}


def test_operations_from_worked_solutions():
  assert sc.operations("7 + 4 = 11\n11 - 3 = 8\nThe answer is \\boxed{8}.") == ["+", "-"]
  assert sc.operations("9-6=3\n3*5=15\n\\boxed{15}") == ["-", "*"]
  assert sc.operations("A:23+4=27\nB:27-5=22\n\\boxed{22}") == ["+", "-"]
  assert sc.operations("She sold 48/2 = <<48/2=24>>24 clips.\n#### 24") is None
  assert sc.operations(None) is None and sc.operations("\\boxed{3}") is None
