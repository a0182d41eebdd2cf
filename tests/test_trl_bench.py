"""benchmarks/trl_bench.py: its arithmetic and TRL phase bookkeeping (runs no benchmark, loads
no model). Skipped without trl, which the script needs."""

import importlib.util
import os

import numpy as np
import pytest

pytest.importorskip("trl")

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "benchmarks", "trl_bench.py")


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("trl_bench", _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_response_tokens_count_up_to_and_including_the_first_eos(bench):
  ids = np.array([[5, 6, 2, 2, 2],     # EOS (2) at 2: 3 tokens
                  [5, 6, 7, 8, 9],     # no EOS: all 5
                  [2, 0, 0, 0, 0],     # EOS first: 1
                  [5, 9, 6, 7, 9]])    # the second EOS id (9) counts too: 2
  assert bench.response_tokens(ids, (2, 9)).tolist() == [3, 5, 1, 2]


def test_rollout_ratio_is_a_tokens_per_second_ratio(bench):
  # engine: 100 tokens in 1 s and 300 in 2 s; generate: 100 in 4 s and 100 in 1 s.
  rounds = bench.rollout_rounds({"engine": [1.0, 2.0], "generate": [4.0, 1.0]},
                                {"engine": [100.0, 300.0], "generate": [100.0, 100.0]})
  # s per 1k tokens: engine 10, 6.67; generate 40, 10 -> ratios 4.0, 1.5, median 2.75
  assert rounds.ratios("engine", "generate") == pytest.approx([4.0, 1.5])
  assert rounds.ratio("engine", "generate") == pytest.approx(2.75)


def test_medians_and_split_lines(bench):
  runs = [{"rollout": 1.0, "forward": 0.5, "reward": 0.1, "updates": 2.0, "step": 4.0},
          {"rollout": 3.0, "forward": 0.7, "reward": 0.1, "updates": 2.0, "step": 6.0},
          {"rollout": 2.0, "forward": 0.6, "reward": 0.1, "updates": 2.0, "step": 5.0}]
  med = bench.medians(runs, bench.OUR_PHASES)
  assert med == pytest.approx({"rollout": 2.0, "forward": 0.6, "reward": 0.1, "updates": 2.0,
                               "step": 5.0})
  lines = bench.split_lines("x", med)
  assert lines[0] == "x: step 5.000 s"
  assert "40.0%" in lines[1]          # rollout 2 of 5 s
  assert "0.300 s" in lines[-1]       # other = 5 - (2 + 0.6 + 0.1 + 2)


class _FakeTrainer:
  """The four methods TRLTimer wraps; the clock moves by fixed amounts in each."""

  def __init__(self, clock):
    self.clock = clock

  def _generate(self):
    self.clock[0] += 2.0

  def _calculate_rewards(self):
    self.clock[0] += 0.25

  def _get_per_token_logps_and_entropies(self):
    self.clock[0] += 0.5

  def _generate_and_score_completions(self):
    self._generate()
    self._get_per_token_logps_and_entropies()   # the reference's forward
    self._calculate_rewards()
    self.clock[0] += 0.125                       # tokenizing, advantages


def test_trl_timer_splits_a_step(bench, monkeypatch):
  clock = [0.0]
  monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
  trainer = _FakeTrainer(clock)
  timer = bench.TRLTimer(trainer)
  timer.begin()
  trainer._generate_and_score_completions()
  trainer._get_per_token_logps_and_entropies()  # the loss's forward: part of the update
  clock[0] += 1.0                               # backward + optimizer
  timer.end()
  (run,) = timer.runs
  assert run["rollout"] == pytest.approx(2.0)
  assert run["forward"] == pytest.approx(0.5)
  assert run["reward"] == pytest.approx(0.25)
  assert run["experience"] == pytest.approx(2.875)
  assert run["step"] == pytest.approx(4.375)
  assert run["updates"] == pytest.approx(1.5)


def test_our_config_takes_trl_settings_and_packing_overrides(bench):
  """our_config: the bench's settings on our side (full fine-tuning, one update per batch,
  TRL's lengths and group), and --row-tokens / --row-steps reach rl.packing_* and are
  validated like any config (a row shorter than prompt + response is refused)."""
  import types  # pylint: disable=import-outside-toplevel
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  args = types.SimpleNamespace(max_prompt=96, max_new=32, prompts=3, group=4, lr=2e-6,
                               old_logprobs="exact", row_tokens=None, row_steps=None)
  path = os.path.join(os.path.dirname(_PATH), "..", "configs", "smollm2_135m.py")
  cfg = bench.our_config(path, "grpo", "/nowhere", args)
  assert (cfg.model.lora.rank, cfg.rl.prompts_per_step, cfg.rl.responses_per_prompt) == (0, 3, 4)
  assert (cfg.rl.num_minibatches, cfg.rl.ppo_epochs, cfg.old_logprobs) == (1, 1, "exact")
  assert (cfg.sampling.max_new_tokens, cfg.data.max_prompt_tokens) == (32, 96)
  assert cfg.rl.micro_batch_size == 0          # 12 rows: the config's 8 does not divide them
  assert (cfg.rl.packing_row_tokens, cfg.rl.packing_row_steps) == (0, 1)
  long = bench.our_config(path, "grpo", "/nowhere",
                          types.SimpleNamespace(**{**vars(args), "row_tokens": 512,
                                                   "row_steps": 4}))
  assert (long.rl.packing_row_tokens, long.rl.packing_row_steps) == (512, 4)
  with pytest.raises(config_lib.ConfigError, match="rl.packing_row_tokens"):
    bench.our_config(path, "grpo", "/nowhere",
                     types.SimpleNamespace(**{**vars(args), "row_tokens": 100}))
