"""The commands as users run them: `python -m vapo_jax.main` killed and rerun, and the tools.

A run stopped by SIGTERM (it saves at the next step boundary and exits 0) or by SIGKILL (no
warning; the newest complete checkpoint is what is left) and started again with the same
command must end exactly where an uninterrupted run ends: the same final checkpoint, bit for
bit (its per-array checksums), and the same metrics records. Saves are periodic
(`checkpoint.every=2`) as well as at stage ends, and asynchronous, so a kill can land in the
middle of a write.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from vapo_jax.run import checkpoint_store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 600
# Global steps: sft 1-4, value pretraining 5-6, rl 7-11; saves every 2 and at stage ends.
FLAGS = ["--config=configs/tiny.py", "--noprogress", "--config.sft.steps=4",
         "--config.sft.batch_size=16", "--config.value_pretrain.max_steps=2",
         "--config.value_pretrain.min_steps=2", "--config.rl.steps=5",
         "--config.rl.prompts_per_step=8", "--config.rl.responses_per_prompt=4",
         "--config.eval.num_examples=8", "--config.eval.batch_prompts=8",
         "--config.data.num_train=256", "--config.data.num_eval=8",
         "--config.checkpoint.every=2", "--config.metrics.tensorboard=False",
         "--config.metrics.plot=False"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def _start(workdir, *extra) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "vapo_jax.main", *FLAGS, *extra,
                           f"--workdir={workdir}"], cwd=ROOT, env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen) -> dict:
  try:
    out = proc.communicate(timeout=TIMEOUT)[0]
  except subprocess.TimeoutExpired:
    proc.kill()
    raise
  assert proc.returncode == 0, out[-4000:]
  return _last_json(out)


def _last_json(text: str) -> dict:
  """The indented JSON summary that ends a command's output."""
  starts = [m.start() for m in re.finditer(r"^\{$", text, re.M)]
  assert starts, text[-4000:]
  return json.loads(text[starts[-1]:])


def _records(workdir) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    lines = [json.loads(line) for line in f]
  # Everything but wall-clock figures and what this process compiled (a resumed process
  # compiles its programs again, or loads them from the cache), and its peak memory.
  return [{k: v for k, v in r.items()
           if not any(w in k for w in ("time", "seconds", "_per_s", "compile/", "mem/"))}
          for r in lines]


def _eval_files(workdir) -> dict[str, str]:
  """{name: text} of the per-problem evaluation records (run.eval_records) in workdir/eval."""
  folder = os.path.join(workdir, "eval")
  return {n: open(os.path.join(folder, n), encoding="utf-8").read()
          for n in sorted(os.listdir(folder))} if os.path.isdir(folder) else {}


def _wait_for(workdir, stage: str, step: int, proc: subprocess.Popen) -> None:
  deadline = time.monotonic() + TIMEOUT
  while time.monotonic() < deadline:
    if any(r["stage"] == stage and r["step"] >= step for r in _records(workdir)):
      return
    if proc.poll() is not None:
      raise AssertionError(proc.communicate()[0][-4000:])
    time.sleep(0.3)
  raise AssertionError(f"{stage} step {step} never logged")


def _final(workdir) -> tuple[int, dict]:
  store = checkpoint_store.CheckpointStore(os.path.join(workdir, "checkpoints"), read_only=True)
  try:
    step = store.steps()[-1]
    return step, store.read_meta(step)["groups"]
  finally:
    store.close()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  summary = _finish(_start(workdir))
  return workdir, summary


def test_killed_stopped_and_rerun_ends_as_an_uninterrupted_run(uninterrupted, tmp_path):
  """SIGKILL in value pretraining right after a (periodic) save began, the same command
  again, SIGTERM mid-RL, the same command again: the run ends as the uninterrupted one."""
  ref_dir, ref_summary = uninterrupted
  proc = _start(tmp_path)
  _wait_for(tmp_path, "value_pretrain", 2, proc)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)
  proc = _start(tmp_path)
  _wait_for(tmp_path, "rl", 1, proc)
  proc.send_signal(signal.SIGTERM)
  stopped = _finish(proc)
  assert "stopped by SIGTERM after rl step" in stopped["preempted"]
  summary = _finish(_start(tmp_path))
  assert "preempted" not in summary
  for key in ("eval_before_rl", "eval_after_rl"):
    assert summary[key] == ref_summary[key], key
  assert _final(tmp_path) == _final(ref_dir)  # same step, same bits of every array
  assert _records(tmp_path) == _records(ref_dir)  # each record once, equal values
  # Per-problem records: one file per evaluation, each problem once, the same verdicts.
  assert _eval_files(tmp_path) == _eval_files(ref_dir) and "rl_step_5.jsonl" in _eval_files(ref_dir)
  # The rollout engine sampled them (the default sampling.engine), with its own metrics.
  assert all(r["rollout/decode_steps"] > 0 for r in _records(ref_dir) if r["stage"] == "rl")


def test_evaluate_and_export_run_as_commands(uninterrupted, tmp_path):
  workdir, summary = uninterrupted
  common = [f"--workdir={workdir}"] + [f for f in FLAGS if f != "--noprogress"]
  out = subprocess.run([sys.executable, "-m", "vapo_jax.tools.evaluate", *common,
                        "--step=latest"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=TIMEOUT)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout[out.stdout.index("{"):])
  assert result["avg@4"] == summary["eval_after_rl"]["avg@4"]
  for dtype in ("float32", "bfloat16"):
    dest = tmp_path / dtype
    out = subprocess.run([sys.executable, "-m", "vapo_jax.tools.export", *common,
                          f"--out={dest}", f"--dtype={dtype}"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(dest / "config.json", encoding="utf-8") as f:
      config = json.load(f)
    from safetensors import safe_open  # pylint: disable=import-outside-toplevel
    with safe_open(str(dest / "model.safetensors"), "np") as f:
      dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
    want = {"float32": "F32", "bfloat16": "BF16"}[dtype]
    assert dtypes == {want}, dtypes
    assert config["model_type"] in ("qwen2", "qwen3", "llama")


def test_resume_with_another_optimizer_chain_stops_with_one_line(uninterrupted, tmp_path):
  """A config change that the checkpoint's arrays do not fit is not damage: the command
  exits with one line saying what differs and what to do, and moves no checkpoint."""
  workdir = tmp_path / "run"
  shutil.copytree(uninterrupted[0], workdir)
  ckdir = workdir / "checkpoints"
  before = sorted(os.listdir(ckdir))
  proc = _start(workdir, "--config.optim.grad_clip=0")
  out = proc.communicate(timeout=TIMEOUT)[0]
  assert proc.returncode == 1, out[-4000:]
  last = out.strip().splitlines()[-1]
  assert last.startswith("Cannot resume: checkpoint "), out[-4000:]
  assert "optim.grad_clip=0.0 (was 1.0)" in last and "checkpoint.restore=weights" in last
  assert sorted(os.listdir(ckdir)) == before
  assert not os.path.exists(workdir / "checkpoints_corrupt")
