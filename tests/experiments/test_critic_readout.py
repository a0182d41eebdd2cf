"""experiments.real_model.critic_readout: a finished run's critic read out after the fact, as a
user runs it, on a short VAPO run of the tiny config; and the logged figures on hand-built
records."""

import hashlib
import json
import math
import os
import subprocess
import sys

import pytest

from experiments.real_model import critic_readout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = [f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}", "--config.sft.enabled=False",
         "--config.rl.prompts_per_step=4", "--config.rl.responses_per_prompt=4",
         "--config.sampling.max_new_tokens=16", "--config.data.num_train=64",
         "--config.data.num_eval=16", "--config.model.num_layers=1",
         "--config.reward.fn=trainer_plugins:even_digits",
         "--config.value_pretrain.min_steps=2", "--config.value_pretrain.max_steps=2",
         "--config.rl.steps=2", "--config.eval.every=0", "--config.eval.num_examples=8",
         "--config.checkpoint.every=1"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
       "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}


def _run(args, timeout=900):
  done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=timeout)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def _digest(folder):
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(folder)):
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(path.encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def test_logged_figures_take_each_step_once_the_last_record_written(tmp_path):
  path = tmp_path / "metrics.jsonl"
  rows = [{"stage": "value_pretrain", "step": s, "value/explained_variance": v}
          for s, v in ((1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5))]
  rows += [{"stage": "rl", "step": 1, "value/explained_variance": -1.0},   # before a resume
           {"stage": "eval", "step": 0, "eval/avg@4": 3.0},
           {"stage": "rl", "step": 1, "value/explained_variance": 0.25},   # the resumed step
           {"stage": "rl", "step": 2, "value/explained_variance": 0.75}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  got = critic_readout.logged(str(path))
  assert got["value_pretrain_last"] == 0.5
  assert got["value_pretrain_mean_last4"] == pytest.approx((0.2 + 0.3 + 0.4 + 0.5) / 4)
  assert got["rl"] == {"1": 0.25, "2": 0.75}
  assert got["rl_mean"] == pytest.approx(0.5) and got["rl_mean_last5"] == pytest.approx(0.5)


def test_the_command_reads_a_finished_runs_critic_at_two_checkpoints(tmp_path):
  run = str(tmp_path / "run")
  _run(["vapo_jax.main", *SMALL, f"--workdir={run}", "--noprogress"])
  before = _digest(run)
  out = str(tmp_path / "critic.json")
  args = ["experiments.real_model.critic_readout", *SMALL, f"--run={run}", "--steps=2,latest",
          "--fresh_batches=2", f"--out={out}"]
  printed = _run(args)
  assert _digest(run) == before                     # read-only: the run's folder untouched
  with open(out, encoding="utf-8") as f:
    got = json.load(f)
  vp_end, last = got["checkpoints"]
  assert (vp_end["step"], last["step"]) == (2, 4)   # 2 value-pretraining + 2 RL steps
  for r in (vp_end, last):
    assert r["responses"] == 2 * 4 * 4
    assert math.isfinite(r["fresh_ev"]) and r["fresh_ev"] <= 1.0
    assert {"critic/ev_first_half", "critic/ev_second_half", "critic/ev_last_token"} <= set(r)
  # The policy and critic of each checkpoint: RL moved them, so the readouts differ; the same
  # checkpoint read again gives the same figures (fresh keys do not depend on the run).
  assert vp_end["fresh_ev"] != last["fresh_ev"] or vp_end["reward_mean"] != last["reward_mean"]
  assert set(got["logged"]["value_pretrain"]) == {"1", "2"}
  assert set(got["logged"]["rl"]) == {"1", "2"}
  assert "| 4 |" in printed and os.path.exists(str(tmp_path / "critic.md"))
  _run(args[:-1] + [f"--out={tmp_path / 'again.json'}"])
  with open(tmp_path / "again.json", encoding="utf-8") as f:
    assert json.load(f)["checkpoints"] == got["checkpoints"]
