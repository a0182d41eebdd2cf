"""data.word_problems: exact answers, disjoint splits, several phrasings, the config path, a
held-out split balanced over operation orders that shortcuts do not solve."""

import random
import re

import pytest

from vapo_jax.data import shortcuts
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


def _structure(ex) -> tuple[str, ...]:
  """The operations of a problem as `wp.structures` names them ("x": a multiplying start)."""
  ops = tuple(shortcuts.operations(ex.solution))
  return ("x",) + ops[1:] if " in each." in ex.problem or "each one holds" in ex.problem else ops


def test_heldout_cycles_through_mixed_structures():
  spec = wp.WordSpec(min_ops=1, max_ops=2, max_operand=12)
  shapes = wp.structures(spec)
  assert sorted(shapes) == sorted([("x", "+"), ("x", "-"), ("+", "-"), ("+", "*"),
                                   ("-", "+"), ("-", "*"), ("*", "+"), ("*", "-")])
  test = wp.word_problems(4 * len(shapes), "test", 0, spec)
  assert [_structure(e) for e in test] == shapes * 4
  for e in test:
    assert int(e.answer) == _replay(e.solution) >= 1
    assert int(e.answer) not in shortcuts.numbers(e.problem)
  # One kind of operation, or one operation: nothing to mix, every structure is used.
  assert wp.structures(wp.WordSpec(ops="+", max_ops=2)) == [("+",), ("+", "+")]
  assert sorted(wp.structures(wp.WordSpec(max_ops=1))) == [("*",), ("+",), ("-",), ("x",)]


def _config_heldout(n: int):
  """The held-out problems of configs/smollm2_135m.py, built as `run.inputs` builds them."""
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  import configs.smollm2_135m as smollm2  # pylint: disable=import-outside-toplevel
  cfg = config_lib.from_config_dict(smollm2.get_config())
  d = cfg.data
  assert d.source == "synthetic" and d.synthetic_task == "word"
  spec = wp.WordSpec(min_ops=d.synthetic_min_steps, max_ops=d.synthetic_max_steps,
                     max_operand=d.synthetic_max_operand, ops=d.synthetic_ops)
  return cfg, wp.word_problems(n, "test", cfg.data_seed, spec)


def test_real_model_heldout_defeats_shortcuts():
  """configs/smollm2_135m.py: >= 256 held-out problems exist, and on the ones it evaluates
  (and on the first 256) no shortcut of data.shortcuts is right on more than 5%."""
  cfg, test = _config_heldout(256)
  evaluated = test[:min(cfg.data.num_eval, cfg.eval.num_examples)]
  assert len(test) >= 256 and len(evaluated) >= 48
  for problems in (evaluated, test):
    out = shortcuts.scores(problems)
    assert out["best"] <= 0.05, out
