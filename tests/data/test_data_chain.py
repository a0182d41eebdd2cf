"""The long chain-of-thought task (data.chain) and its config (configs/longcot.py)."""

import importlib.util
import os
import re
import statistics

import pytest

from vapo_jax import config as config_lib
from vapo_jax.data import chain
from vapo_jax.data import CharTokenizer
from vapo_jax.data import sources
from vapo_jax.data import synthetic
from vapo_jax.rewards import math as math_reward
from vapo_jax.run import inputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _longcot(preset="vapo"):
  spec = importlib.util.spec_from_file_location("longcot", os.path.join(ROOT, "configs",
                                                                         "longcot.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)


def _evaluate(problem: str) -> tuple[int, list[tuple[str, str, int]]]:
  """Reads the problem text independently: (answer, [(label, op, operand)])."""
  m = re.fullmatch(r"start (\d+): (.*)", problem)
  assert m, problem
  value, steps = int(m.group(1)), []
  for token in m.group(2).split(" "):
    label, op, operand = token[0], token[1], int(token[2:])
    value = {"+": value + operand, "-": value - operand, "*": value * operand}[op]
    steps.append((label, op, operand))
  return value, steps


def test_solutions_are_right_step_by_step_and_stay_in_range():
  spec = chain.ChainSpec()
  for ex in chain.chains(300, "train", seed=3, spec=spec):
    answer, steps = _evaluate(ex.problem)
    assert ex.answer == str(answer)
    lines = ex.solution.split("\n")
    assert lines[-1] == f"\\boxed{{{answer}}}"
    assert spec.min_steps <= len(steps) == len(lines) - 1 <= spec.max_steps
    value = int(ex.problem.split(" ")[1][:-1])
    for k, (line, (label, op, operand)) in enumerate(zip(lines, steps)):
      assert label == "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[k]
      new = {"+": value + operand, "-": value - operand, "*": value * operand}[op]
      assert line == f"{label}:{value}{op}{operand}={new}"
      value = new
      assert 0 <= value <= spec.max_value
      if op in "+-":
        assert 1 <= operand <= spec.max_operand
      else:
        assert 2 <= operand <= spec.max_factor
    # The reward the runs use: the reference solution scores 1, a wrong final answer 0.
    assert math_reward.score(ex.problem, ex.solution, ex.answer)[0] == 1.0
    wrong = ex.solution.rsplit("\\boxed", 1)[0] + f"\\boxed{{{answer + 1}}}"
    assert math_reward.score(ex.problem, wrong, ex.answer)[0] == 0.0


def test_splits_are_deterministic_and_disjoint():
  train = chain.chains(400, "train", seed=0)
  assert train == chain.chains(400, "train", seed=0)
  assert train != chain.chains(400, "train", seed=1)
  test = chain.chains(100, "test", seed=0)
  assert not {e.problem for e in train} & {e.problem for e in test}
  assert len({e.problem for e in train}) == 400
  ops = {op for e in train for _, op, _ in _evaluate(e.problem)[1]}
  assert ops == {"+", "-", "*"}
  assert {op for e in chain.chains(50, spec=chain.ChainSpec(ops="+-"))
          for _, op, _ in _evaluate(e.problem)[1]} == {"+", "-"}


def test_distinct_keeps_new_problems_of_the_split_in_draw_order():
  texts = [f"p{k}" for k in range(400)]
  split = {t: synthetic.split_of(t, 0.5) for t in texts}
  test = [t for t in texts if split[t] == "test"][:5]
  stream = iter([test[0], test[0], *[t for t in texts if split[t] == "train"][:3], *test[1:]])
  got = list(chain.distinct(lambda: sources.Example(next(stream), "0"), 4, "test", 0.5, "p"))
  assert got == [(i, sources.Example(t, "0")) for i, t in enumerate(test[:4])]
  with pytest.raises(ValueError, match="split must be"):
    list(chain.distinct(lambda: None, 1, "dev", 0.5, "p"))
  with pytest.raises(ValueError, match=r"only 1 distinct test problems found for p\b"):
    list(chain.distinct(lambda: sources.Example(test[0], "0"), 2, "test", 0.5, "p"))


@pytest.mark.parametrize("bad", [dict(ops="*"), dict(ops="+*"), dict(min_steps=0),
                                 dict(max_steps=27), dict(min_steps=5, max_steps=4),
                                 dict(max_factor=1), dict(heldout_fraction=0)])
def test_bad_specs_are_refused(bad):
  with pytest.raises(ValueError):
    chain.ChainSpec(**bad)


def test_longcot_config_gives_long_responses_that_fit_and_sft_keeps_whole():
  """The responses are long (a 100–300 token CoT), prompts and solutions fit the budgets,
  and the SFT batch holds each whole solution and its EOS."""
  cfg = config_lib.from_config_dict(_longcot())
  assert cfg.data.synthetic_task == "chain"
  text = inputs.build_text(cfg)
  train, test, stats = inputs.build_examples(cfg, text)
  assert stats == {"data/train_dropped_too_long": 0, "data/eval_dropped_too_long": 0}
  assert len(train) == cfg.data.num_train and len(test) == cfg.data.num_eval
  lengths = [len(text.encode(e.solution)) + 1 for e in train]
  assert 100 <= statistics.mean(lengths) <= 300 and min(lengths) >= 85
  assert max(lengths) <= cfg.sampling.max_new_tokens
  batch = inputs.sft_batch(train[:32], text, cfg.data.max_prompt_tokens,
                           cfg.sampling.max_new_tokens)
  resp = batch["tokens_BxL"][:, cfg.data.max_prompt_tokens:]
  tok = CharTokenizer()
  for i, ex in enumerate(train[:32]):
    n = int(batch["response_mask_BxR"][i].sum())
    assert tok.decode(resp[i, :n]) == ex.solution and resp[i, n - 1] == tok.eos_id
  for preset in config_lib.PRESETS:
    config_lib.from_config_dict(_longcot(preset))


def test_synthetic_task_is_checked():
  c = _longcot()
  c.data.synthetic_task = "sudoku"
  with pytest.raises(config_lib.ConfigError, match="data.synthetic_task"):
    config_lib.from_config_dict(c)
