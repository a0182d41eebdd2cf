"""data.word_problems: exact answers, disjoint splits, several phrasings, the config path."""

import random
import re

import pytest

from vapo_jax.data import word_problems as wp
from vapo_jax.rewards import math as rmath


def _replay(solution: str) -> int:
  """Recomputes the answer from the worked solution's lines `a op b = c`, checking each."""
  value = None
  for line in solution.splitlines()[:-1]:
    a, op, b, c = re.fullmatch(r"(\d+) ([+*-]) (\d+) = (\d+)", line).groups()
    a, b, c = int(a), int(b), int(c)
    assert value is None or a == value, solution
    assert {"+": a + b, "-": a - b, "*": a * b}[op] == c, line
    value = c
  return value


@pytest.mark.parametrize("seed", [0, 7])
def test_answers_follow_from_the_story(seed):
  spec = wp.WordSpec(min_ops=1, max_ops=3, max_operand=12)
  exs = wp.word_problems(400, "train", seed, spec)
  for ex in exs:
    assert int(ex.answer) == _replay(ex.solution) >= 0
    assert rmath.check_answer(ex.solution, ex.answer).correct  # the boxed form scores 1
    numbers = [int(x) for x in re.findall(r"\d+", ex.problem)]
    assert all(1 <= x <= 12 for x in numbers), ex.problem
    n_ops = len(ex.solution.splitlines()) - 1
    assert 1 <= n_ops <= 3
    # Each operation is one sentence (a multiplying start holds two numbers), then the question.
    assert ex.problem.rstrip().endswith("?")


def test_splits_are_disjoint_and_deterministic():
  spec = wp.WordSpec(min_ops=1, max_ops=2)
  train = wp.word_problems(2000, "train", 0, spec)
  test = wp.word_problems(150, "test", 0, spec)
  assert not {e.problem for e in train} & {e.problem for e in test}
  assert len({e.problem for e in train}) == 2000
  assert wp.word_problems(150, "test", 0, spec) == test
  assert wp.word_problems(150, "test", 1, spec) != test


def test_every_operation_comes_in_several_phrasings():
  rng = random.Random(0)
  exs = [wp.make_problem(rng, wp.WordSpec(min_ops=1, max_ops=1)) for _ in range(600)]
  verbs = {re.sub(r"\d+|" + "|".join(wp.THINGS), "#", ex.problem.split(". ")[1])
           for ex in exs if ex.problem.count(". ") >= 1}
  assert len(verbs) > 8
  for op in "+-*":
    assert any(f" {op} " in ex.solution for ex in exs)


def test_one_operation_kind_and_bad_specs():
  for ex in wp.word_problems(100, "train", 0, wp.WordSpec(ops="-", max_ops=3)):
    assert " + " not in ex.solution and " * " not in ex.solution and int(ex.answer) >= 1
  with pytest.raises(ValueError, match="min_ops"):
    wp.WordSpec(min_ops=3, max_ops=2)
  with pytest.raises(ValueError, match="ops"):
    wp.WordSpec(ops="/")
  with pytest.raises(ValueError, match="split"):
    wp.word_problems(3, "dev")


def test_the_config_builds_word_problems():
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import inputs  # pylint: disable=import-outside-toplevel
  c = config_lib.default_config_dict()
  c.data.synthetic_task = "word"
  c.data.synthetic_min_steps, c.data.synthetic_max_steps = 1, 2
  c.data.num_train, c.data.num_eval = 64, 16
  c.data.max_prompt_tokens = 400
  cfg = config_lib.from_config_dict(c)
  text = inputs.build_text(cfg)
  train, test, _ = inputs.build_examples(cfg, text)
  assert len(train) == 64 and len(test) == 16
  assert test == wp.word_problems(16, "test", cfg.data_seed, wp.WordSpec(max_ops=2, max_operand=9))
  c.data.synthetic_task = "words"
  with pytest.raises(config_lib.ConfigError, match="synthetic_task"):
    config_lib.from_config_dict(c)
