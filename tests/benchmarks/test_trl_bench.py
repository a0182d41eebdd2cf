"""benchmarks/trl_bench.py: its arithmetic and TRL phase bookkeeping (runs no benchmark, loads
no model). Skipped without trl, which the script needs."""

import importlib.util
import os
import sys
import time

import numpy as np
import pytest

pytest.importorskip("trl")

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
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
    import torch  # pylint: disable=import-outside-toplevel
    self._generate()
    self._get_per_token_logps_and_entropies()   # the reference's forward
    self._calculate_rewards()
    self.clock[0] += 0.125                       # tokenizing, advantages
    # Two completions of 3 and 1 tokens, padded to 4; prompts padded to 6.
    return {"prompt_ids": torch.zeros(2, 6, dtype=torch.long),
            "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])}


def test_trl_timer_splits_a_step(bench, monkeypatch):
  clock = [0.0]
  monkeypatch.setattr(time, "perf_counter", lambda: clock[0])  # trl_side's clock
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
  # What TRL generated: each completion's length and the padded widths it computed on.
  assert run["generated_lengths"] == [3, 1]
  assert run["padded"] == {"rows": 2, "completion_len": 4, "prompt_len": 6}


def test_trl_stops_adding_rounds_before_the_deadline(bench):
  trl_side = sys.modules[bench.TRLTimer.__module__]
  # Rounds so far: warm-up 100 s (compiles), then 10 and 20 s: the next is taken as 20 s.
  assert not trl_side.should_stop(1000.0, None, [100.0, 10.0, 20.0], 60.0)
  assert not trl_side.should_stop(1000.0, 1080.5, [100.0, 10.0, 20.0], 60.0)
  assert trl_side.should_stop(1000.0, 1079.5, [100.0, 10.0, 20.0], 60.0)
  assert trl_side.should_stop(1000.0, 1150.0, [100.0], 60.0)   # only the warm-up: its time
  assert not trl_side.should_stop(1000.0, 1000.0, [], 60.0)


def test_the_malloc_switch_is_named_as_host_memory_names_it(bench):
  from vapo_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  assert bench.HOST_MALLOC_ENV == host_memory.ENV


def test_our_config_takes_trl_settings_and_packing_overrides(bench):
  """our_config: the bench's settings on our side (full fine-tuning, one update per batch,
  TRL's lengths and group), and --row-tokens / --row-steps reach rl.packing_* and are
  validated like any config (a row shorter than prompt + response is refused)."""
  import types  # pylint: disable=import-outside-toplevel
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  args = types.SimpleNamespace(max_prompt=96, max_new=32, prompts=3, group=4, lr=2e-6,
                               old_logprobs="exact", row_tokens=None, row_steps=None,
                               micro_batch=None, device="cpu")
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
  # Micro-batches: the config's 8 where it divides P·G (4 x 4 = 16 rows) on a CPU; on CUDA
  # one pass (0), as TRL's; --micro-batch wins everywhere.
  def mb(**kw):
    return bench.our_config(path, "grpo", "/nowhere", types.SimpleNamespace(
        **{**vars(args), "prompts": 4, **kw})).rl.micro_batch_size
  assert mb() == 8 and mb(device="cuda") == 0
  assert mb(micro_batch=4) == 4 and mb(device="cuda", micro_batch=16) == 16
  with pytest.raises(config_lib.ConfigError, match="rl.packing_row_tokens"):
    bench.our_config(path, "grpo", "/nowhere",
                     types.SimpleNamespace(**{**vars(args), "row_tokens": 100}))


def test_smoke_run_writes_the_new_fields(tmp_path):
  """The whole bench on a tiny random model (2 prompts x 2, 8 new tokens, 2 timed rounds):
  it runs and its JSON holds what issue 52 asks to record (not its figures)."""
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import tiny_hf  # pylint: disable=import-outside-toplevel
  model = tiny_hf.save_base(tmp_path / "hf", "llama3")
  out = tmp_path / "trl.json"
  repo = os.path.dirname(os.path.dirname(_PATH))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0",
         "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
  subprocess.run([sys.executable, _PATH, f"--model={model}", "--prompts=2", "--group=2",
                  "--max-prompt=512", "--max-new=8", "--steps=2", "--rollout-rounds=1",
                  "--old-logprobs=exact", f"--json={out}",
                  f"--trl-dir={tmp_path / 'trl'}"], env=env, check=True, timeout=600,
                 capture_output=True, text=True)
  got = json.loads(out.read_text())
  assert got["machine"]["cpu"] and isinstance(got["machine"]["cpu_flags"], list)
  res = got["results"]
  assert res["stage"] == "done"
  assert res["settings"]["torch_threads"] >= 1 and res["settings"]["micro_batch_size"] == 0
  procs = res["settings"]["processes"]  # each side in its own process (trl_ours.py)
  assert procs["ours"] and procs["trl"] and procs["ours"] != procs["trl"]
  from vapo_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  # ours with the settings of python -m vapo_jax.main
  if host_memory.glibc() is not None and host_memory.enabled():
    assert res["settings"]["malloc"]["ours"] == {k: v for k, (_, v) in
                                                 host_memory.SETTINGS.items()}
  rl = res["rl_step"]
  assert rl["rounds_timed"] == 2 and len(rl["ours"]["per_round"]) == 2
  assert rl["comparison"]["ratio_of_means"] > 0
  for side in ("ours", "trl"):
    assert set(rl[side]["summary"]["step"]) >= {"mean", "median"}
    for r in [rl[side]["warmup"], *rl[side]["per_round"]]:
      assert len(r["generated_lengths"]) == 4
  assert rl["ours"]["warmup"]["jax_compile"]["backend_compiles"] > 0
  r1 = rl["ours"]["per_round"][0]
  assert {"backend_compiles", "compile_s", "cache_hits"} <= set(r1["jax_compile"])
  assert {c["phase"] for c in r1["packed"]} == {"experience", "update", "timed again alone"}
  assert all(len(c["shape"]) == 3 for c in r1["packed"])
  assert "completions/mean_length" in rl["trl"]["per_round"][0]["logged"]
  assert res["rollout"]["tokens_per_s"]["engine"] > 0
  floor = res["rollout"]["floor"]  # the engine's rounds against their floor (rollout_floor)
  assert len(floor["seconds"]) == len(floor["share"]) == 1 and 0 < floor["share"][0] < 1
  assert "of the floor" in floor["line"]
