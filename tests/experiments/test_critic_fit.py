"""experiments.real_model.critic_fit: the registered lever rule (docs/real_model.md, "The
third run") on hand-built figures, and the command run as a user runs it on the tiny config."""

import json
import os
import subprocess
import sys

import pytest

import config_files
from experiments.real_model import critic_fit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lever(ev, settings, fixed_last=0.5):
  return {"overrides": {f"s{i}": i for i in range(settings)},
          "fixed": {"loss_over_constant_by_step": [1.2, fixed_last]},
          "fresh": {"fresh_ev": ev}}


def test_the_highest_held_out_ev_wins_when_nothing_is_near_it():
  r = {"_rollouts": {}, "baseline": _lever(-0.05, 0), "a": _lever(0.30, 2),
       "b": _lever(0.10, 1)}
  assert critic_fit.choose(r)[0] == "a"


def test_a_lever_within_the_margin_with_fewer_settings_is_preferred():
  r = {"baseline": _lever(-0.05, 0), "all": _lever(0.30, 5), "reuse": _lever(0.285, 2),
       "bias": _lever(0.27, 2), "norm": _lever(0.281, 1)}
  pick, why = critic_fit.choose(r)
  assert pick == "norm"             # fewest settings within 0.02 of 0.30
  assert "all (+0.3000, 5 settings)" in why and "bias" not in why   # 0.27 is not near


def test_equal_settings_within_the_margin_go_to_the_higher_ev():
  r = {"baseline": _lever(-0.05, 0), "x": _lever(-0.004, 2), "y": _lever(0.0001, 2)}
  assert critic_fit.choose(r)[0] == "y"


def test_the_baseline_counts_as_the_lever_with_no_settings():
  r = {"baseline": _lever(0.29, 0), "a": _lever(0.30, 2)}
  assert critic_fit.choose(r)[0] == "baseline"


def test_the_baseline_is_kept_when_no_lever_beats_a_constant_on_the_fixed_batch():
  r = {"baseline": _lever(-0.05, 0, 1.1), "a": _lever(0.30, 2, 1.0), "b": _lever(0.1, 1, 3.0)}
  pick, why = critic_fit.choose(r)
  assert pick == "baseline" and "constant" in why
  r["b"]["fixed"]["loss_over_constant_by_step"][-1] = 0.99
  assert critic_fit.choose(r)[0] == "a"


def test_no_lever_is_an_error():
  with pytest.raises(ValueError):
    critic_fit.choose({"_rollouts": {}})


def test_the_committed_figures_give_the_committed_choice():
  """The JSON in the tree and the config's choice (configs/smollm2_135m.py) agree: once every
  lever is measured, the config carries the picked lever's settings and α sized to lengths."""
  path = os.path.join(ROOT, "experiments", "real_model", "results", "critic-levers-2026-12-05",
                      "critic_levers.json")
  with open(path, encoding="utf-8") as f:
    results = json.load(f)
  names = [k for k in results if not k.startswith("_")]
  assert "baseline" in names and len(names) >= 5
  pick, _ = critic_fit.choose(results)
  assert pick in names
  cfg = config_files.load_config_file("smollm2_135m.py")
  if set(critic_fit.levers(cfg)) <= set(names):
    for dotted, value in results[pick]["overrides"].items():
      node = cfg
      for part in dotted.split("."):
        node = node[part]
      assert node == pytest.approx(value) if isinstance(value, float) else node == value, dotted
    assert cfg.rl.alpha == 0


def test_the_command_measures_levers_and_resumes_on_the_tiny_config(tmp_path):
  """Two levers on the tiny config (1 layer, a parity reward), then a rerun that skips both."""
  out = str(tmp_path / "levers.json")
  cmd = [sys.executable, "-m", "experiments.real_model.critic_fit",
         f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}", "--config.sft.enabled=False",
         "--config.rl.prompts_per_step=4", "--config.rl.responses_per_prompt=4",
         "--config.sampling.max_new_tokens=16", "--config.data.num_train=64",
         "--config.data.num_eval=16", "--config.model.num_layers=1",
         "--config.reward.fn=trainer_plugins:even_digits", "--train_batches=2",
         "--fresh_batches=1", "--fixed_steps=2", "--levers=baseline,rewards_pm1", f"--out={out}"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
         "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out, encoding="utf-8") as f:
    results = json.load(f)
  assert set(results) == {"_rollouts", "baseline", "rewards_pm1"}
  for name in ("baseline", "rewards_pm1"):
    fixed, fresh = results[name]["fixed"], results[name]["fresh"]
    assert len(fixed["loss_over_constant_by_step"]) == 2
    assert len(fresh["heldout_ev_by_step"]) == 2
    assert all(abs(v) < 1e3 for v in fixed["loss_over_constant_by_step"])
  assert results["rewards_pm1"]["overrides"] == {"rl.reward_scale": 2.0, "rl.reward_shift": -1.0}
  assert os.path.exists(os.path.splitext(out)[0] + ".md")
  again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "baseline: done before, skipped" in again.stdout
  assert "rewards_pm1: done before, skipped" in again.stdout
