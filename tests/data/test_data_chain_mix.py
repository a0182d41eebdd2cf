"""The "chain or guess" task (data.chain_mix) and its config (configs/chain_or_guess.py)."""

import collections
import importlib.util
import os
import statistics

import pytest

from vapo_jax import config as config_lib
from vapo_jax.data import chain
from vapo_jax.data import chain_mix
from vapo_jax.rewards import math as math_reward
from vapo_jax.run import inputs
from test_data_chain import _evaluate  # the same folder: on sys.path under pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
  spec = importlib.util.spec_from_file_location(
      "chain_or_guess", os.path.join(ROOT, "configs", "chain_or_guess.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def train():
  return chain_mix.chain_or_guess(4096, "train", 0)


def test_mixture_lengths_guesses_and_their_accuracy(train):
  """~15% guesses (right ~10% of the time: a uniform digit), short and long chains, and
  response lengths that vary ~10x between a guess and a long chain."""
  kinds = collections.Counter(chain_mix.kind_of(e) for e in train)
  assert set(kinds) == {"short", "long", "guess"}
  assert abs(kinds["guess"] / len(train) - 0.15) < 0.02, kinds
  # Short chains are drawn half the time; some 3-step ones repeat and are redrawn.
  assert 0.38 < (kinds["short"] / (kinds["short"] + kinds["long"])) < 0.52, kinds
  lengths = collections.defaultdict(list)
  for e in train:
    lengths[chain_mix.kind_of(e)].append(len(e.solution) + 1)  # + EOS, one char a token
  assert set(lengths["guess"]) == {10}
  assert 25 <= min(lengths["short"]) and max(lengths["short"]) <= 58
  assert 113 <= min(lengths["long"]) and max(lengths["long"]) <= 170
  assert statistics.mean(lengths["long"]) / statistics.mean(lengths["guess"]) >= 10
  guesses = [e for e in train if chain_mix.kind_of(e) == "guess"]
  right = sum(math_reward.score(e.problem, e.solution, e.answer)[0] for e in guesses) / len(guesses)
  assert 0.07 < right < 0.14, right  # ~600 guesses: SE 0.012 around 0.10
  # Worked solutions are right, step by step, and every value is one digit.
  for e in train:
    answer, steps = _evaluate(e.problem)
    assert e.answer == str(answer)
    if chain_mix.kind_of(e) != "guess":
      assert math_reward.score(e.problem, e.solution, e.answer)[0] == 1.0
      lines = e.solution.split("\n")[:-1]
      assert len(lines) == len(steps) and all(0 <= int(x.split("=")[1]) <= 9 for x in lines)
      assert (3 <= len(steps) <= 6) == (chain_mix.kind_of(e) == "short")


def test_determinism_by_seed_and_disjoint_splits(train):
  again = chain_mix.chain_or_guess(4096, "train", 0)
  assert again == train
  other = chain_mix.chain_or_guess(512, "train", 1)
  assert [e.problem for e in other] != [e.problem for e in train[:512]]
  test = chain_mix.chain_or_guess(256, "test", 0)
  assert not {e.problem for e in test} & {e.problem for e in train}
  assert {chain_mix.kind_of(e) for e in test} == {"short", "long"}  # no guesses held out
  dev = chain_mix.dev_set(128, 256, 0)
  assert not {e.problem for e in dev} & ({e.problem for e in test} | {e.problem for e in train})
  # The guesses come from a stream of their own: the problems do not depend on them.
  none = chain_mix.chain_or_guess(4096, "train", 0, chain_mix.MixSpec(guess_fraction=0.0))
  assert [e.problem for e in none] == [e.problem for e in train]
  assert {chain_mix.kind_of(e) for e in none} == {"short", "long"}


@pytest.mark.parametrize("bad", [
    {"short_fraction": 1.5}, {"guess_fraction": 1.0},
    {"long": chain.ChainSpec(min_steps=5, max_steps=9, max_value=9, ops="+-")},
    {"short": chain.ChainSpec(min_steps=3, max_steps=6, max_value=19, ops="+-")}])
def test_bad_mixtures_are_refused(bad):
  with pytest.raises(ValueError):
    chain_mix.MixSpec(**bad)


def test_config_builds_every_row_with_the_papers_dimensionless_settings():
  module = _module()
  cfg = config_lib.from_config_dict(module.get_config())
  assert (cfg.rl.alpha, cfg.rl.nll_coef, cfg.rl.num_minibatches) == (0.05, 0.1, 4)
  assert cfg.optim.critic_lr == 2 * cfg.optim.policy_lr and cfg.rl.whiten_advantages
  # A fixed value-pretraining budget (the precondition log's session-14 entry).
  assert cfg.value_pretrain.min_steps == cfg.value_pretrain.max_steps == 128
  assert cfg.eval.correct_threshold == 1.0 and cfg.eval.short_response_tokens == 15
  for preset in config_lib.PRESETS:
    config_lib.from_config_dict(module.get_config(preset))
  for preset in ("ppo", "no_length_adaptive"):
    assert module.get_config(preset).rl.lam_policy == module.FIXED_LAMBDA == 0.8
  vp = module.get_config("no_decoupled_gae_vp")
  assert vp.value_pretrain.coupled_gae and not vp.rl.decoupled_gae
  assert module.get_config("vapo").rl.lam_policy == 0.8  # (unused with length-adaptive λ)
  assert "Run status" in module.__doc__ and "Pre-registered criteria" in module.__doc__
  names = module.ABLATION_ROWS.split(",")
  assert {"vapo", "ppo", "no_value_pretrain", "no_decoupled_gae",
          "no_decoupled_gae_vp"} <= set(names)
  assert set(module.SFT_BAND["bounds"]) == {"accuracy/long", "accuracy/short", "guess_rate"}
  # The start is selected among the SFT run's checkpoints 1000..SFT_STEPS.
  assert module.SFT_BAND["select"] == {"first": 1000, "every": 20}
  assert cfg.sft.steps == module.SFT_STEPS == 1600


def test_the_data_seed_fixes_the_problems_whatever_the_run_seed():
  module = _module()
  c = module.get_config()
  c.data.num_train, c.data.num_eval = 512, 64
  cfg0 = config_lib.from_config_dict(c)
  c.seed = 5
  cfg5 = config_lib.from_config_dict(c)
  assert (cfg5.data_seed, cfg5.init_seed) == (0, 0)
  text = inputs.build_text(cfg0)
  a, b = inputs.build_examples(cfg0, text), inputs.build_examples(cfg5, text)
  assert a == b and a[2] == {"data/train_dropped_too_long": 0, "data/eval_dropped_too_long": 0}
  assert max(len(e.solution) + 1 for e in a[0]) <= cfg0.sampling.max_new_tokens
  c.data.seed = c.model.init_seed = -1  # the old protocol: the run seed is every seed
  cfg5 = config_lib.from_config_dict(c)
  assert (cfg5.data_seed, cfg5.init_seed) == (5, 5)
  assert inputs.build_examples(cfg5, text)[0] != a[0]
