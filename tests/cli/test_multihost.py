"""The pod path end to end, as users run it: `launch/local_multiprocess.sh` → `vapo_jax.main`.

Two JAX processes with two CPU devices each (gloo collectives) are the multi-host code path on
one machine. The runs go through every stage with periodic and stage-end saves:

1. 2 processes: SIGTERM (to the launcher, which passes it to every process) in the middle of
   RL; they must agree on one step, save it, and exit 0.
2. The same command again resumes and finishes (with synchronous saves).
3. A copy of the stopped run resumes on 1 process with 4 devices (a different process count).
4. 1 process with 4 devices runs uninterrupted: the reference.

The exported final policies and critics (`python -m vapo_jax.tools.export`, HF safetensors)
of 2 and 3 must equal 4's. Also: a host that never reaches a collective ends every process
with a message within the deadline.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "launch", "local_multiprocess.sh")
TIMEOUT = 600

# The tiny default, shrunk: global steps are sft 1-4, value pretraining 5-6, rl 7-12.
FLAGS = ["--config.sft.steps=4", "--config.sft.batch_size=16",
         "--config.value_pretrain.max_steps=2", "--config.value_pretrain.min_steps=2",
         "--config.rl.steps=6", "--config.rl.prompts_per_step=8",
         "--config.rl.responses_per_prompt=4", "--config.eval.num_examples=8",
         "--config.eval.batch_prompts=8", "--config.data.num_train=256",
         "--config.data.num_eval=8", "--config.checkpoint.every=3",
         "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
         "--config.metrics.tensorboard=False", "--config.metrics.plot=False",
         "--config.faults.collective_timeout_s=300"]


def _env(nproc: int, devices: int, workdir, **extra) -> dict:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROC", "JAX_PROCESS", "XLA_FLAGS"))}
  return {**env, "NPROC": str(nproc), "DEVICES": str(devices), "WORKDIR": str(workdir),
          **extra}


def _launch(nproc: int, devices: int, workdir, *flags, **extra) -> subprocess.Popen:
  return subprocess.Popen(["bash", LAUNCH, *FLAGS, *flags],
                          env=_env(nproc, devices, workdir, **extra), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, workdir, timeout: float = TIMEOUT) -> str:
  try:
    out = proc.communicate(timeout=timeout)[0]
  except subprocess.TimeoutExpired:
    proc.kill()
    raise AssertionError(f"no exit within {timeout} s:\n{_logs(workdir)}") from None
  assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-3000:]}\n{_logs(workdir)}"
  return _logs(workdir)


def _logs(workdir, tail: int | None = 4000) -> str:
  """Each process's log (the last `tail` characters; None: all of it), Gloo lines dropped."""
  out = []
  for name in sorted(os.listdir(workdir)):
    if name.startswith("process_"):
      with open(os.path.join(workdir, name), encoding="utf-8", errors="replace") as f:
        text = "".join(l for l in f if not l.startswith("[Gloo]"))
      out.append(f"--- {name}\n{text if tail is None else text[-tail:]}")
  return "\n".join(out)


def _summary(workdir) -> dict:
  """The JSON summary process 0 prints at the end."""
  with open(os.path.join(workdir, "process_0.log"), encoding="utf-8") as f:
    text = f.read()
  return json.loads(text[[m.start() for m in re.finditer(r"^\{$", text, re.M)][-1]:])


def _checkpoints(workdir) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(s) for s in os.listdir(d) if s.isdigit())


def _records(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _wait_for_rl_step(workdir, step: int, proc: subprocess.Popen) -> None:
  path = os.path.join(workdir, "metrics.jsonl")
  # Longer than one process's TIMEOUT: the first RL step compiles the rollout, evaluation
  # and greedy engines' programs and the packed steps, beside the 1-process reference.
  deadline = time.monotonic() + 1.5 * TIMEOUT
  while time.monotonic() < deadline:
    if os.path.exists(path) and any(r["stage"] == "rl" and r["step"] >= step
                                    for r in _records(workdir)):
      return
    assert proc.poll() is None, f"exited early:\n{_logs(workdir)}"
    time.sleep(0.5)
  raise AssertionError(f"rl step {step} never logged:\n{_logs(workdir)}")


def _export(workdir, what: str):
  out = os.path.join(workdir, f"hf_{what}")
  return subprocess.Popen([sys.executable, "-m", "vapo_jax.tools.export",
                           "--config=configs/tiny.py", *FLAGS, f"--workdir={workdir}",
                           f"--out={out}", f"--what={what}"], cwd=ROOT,
                          env={**_env(1, 4, workdir), "JAX_PLATFORMS": "cpu",
                               "XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _tensors(workdir, what: str) -> dict:
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  path = os.path.join(workdir, f"hf_{what}")
  out = {}
  for name in sorted(os.listdir(path)):
    if name.endswith(".safetensors"):
      out.update(load_file(os.path.join(path, name)))
  return out


def test_sigterm_resume_and_process_counts_equal_one_process(tmp_path):
  two, moved, one = tmp_path / "two", tmp_path / "moved", tmp_path / "one"

  # 1. Two processes, SIGTERM after the first RL step has been logged.
  proc = _launch(2, 2, two)
  reference = _launch(1, 4, one)  # 4. meanwhile, the uninterrupted reference
  _wait_for_rl_step(two, 1, proc)
  proc.send_signal(signal.SIGTERM)
  _finish(proc, two)
  stopped = _summary(two)
  assert "stopped by SIGTERM after rl step" in stopped["preempted"], stopped
  rl_step = int(stopped["preempted"].split("after rl step ")[1].split()[0])
  global_step = 6 + rl_step
  assert 1 <= rl_step < 6
  # The newest checkpoint is the agreed stop (nothing after it was written).
  assert _checkpoints(two)[-1] == global_step, (_checkpoints(two), stopped)
  shutil.copytree(two, moved)

  # 2. The same command resumes and finishes, with synchronous saves (every one must
  # complete: each periodic one after the stop and the final one are there);
  # 3. the copy resumes on one process.
  _finish(_launch(2, 2, two, "--config.checkpoint.async_save=False"), two)
  assert set(range(global_step + 1, 13)) & {9, 12} <= set(_checkpoints(two)), (
      _checkpoints(two), global_step)
  _finish(_launch(1, 4, moved), moved)
  _finish(reference, one)
  for w in (two, moved, one):
    summary = _summary(w)
    assert "preempted" not in summary and "eval_after_rl" in summary, summary
    assert _checkpoints(w)[-1] == 12, _checkpoints(w)
  # Printed at the start of the resumed run: search the whole log, not its tail (warnings
  # that jax prints later, e.g. jax 0.12's Shardy notice, can push it out of the tail).
  assert "Restored checkpoint" in _logs(two, None), _logs(two)
  assert "Restored checkpoint" in _logs(moved, None), _logs(moved)

  # Process 0 alone writes metrics, once per record, resumed or not.
  def stages(w):
    return [(r["stage"], r["step"]) for r in _records(w)]
  assert stages(two) == stages(moved) == stages(one)
  last = {w: [r for r in _records(w) if r["stage"] == "rl"][-1] for w in (two, moved, one)}
  for w in (two, moved):
    for k in ("reward/mean", "response/length_mean", "policy_loss", "value_loss"):
      np.testing.assert_allclose(last[w][k], last[one][k], rtol=1e-4, atol=1e-6, err_msg=k)

  exports = [(w, what, _export(w, what)) for w in (two, moved, one)
             for what in ("policy", "critic")]
  for w, what, p in exports:
    out = p.communicate(timeout=TIMEOUT)[0]
    assert p.returncode == 0, f"export {what} of {w}:\n{out[-3000:]}"
  for what in ("policy", "critic"):
    ref = _tensors(one, what)
    for w in (two, moved):
      got = _tensors(w, what)
      assert got.keys() == ref.keys()
      for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=2e-5, err_msg=f"{w} {k}")


@pytest.mark.parametrize("operation", ["SIGTERM agreement"])
def test_a_host_that_never_arrives_ends_every_process_within_the_deadline(tmp_path,
                                                                          operation):
  w = tmp_path / "stuck"
  deadline = 20
  t0 = time.monotonic()
  proc = _launch(2, 2, w, f"--config.faults.collective_timeout_s={deadline}",
                 VAPO_TEST_STALL=f"{operation}:1")
  try:
    proc.communicate(timeout=TIMEOUT)
  except subprocess.TimeoutExpired:
    proc.kill()
    raise AssertionError(f"still running:\n{_logs(w)}") from None
  assert proc.returncode != 0
  logs = _logs(w)
  # Both hosts stop at the first step boundary: process 1 never arrives at the agreement,
  # process 0 waits in it. Each deadline ends its process with the line naming the stage,
  # the step and the operation; a process whose peer exited a moment earlier may instead be
  # ended by JAX's coordination service, which says so. At least one names the operation.
  named = 0
  for i in (0, 1):
    with open(os.path.join(w, f"process_{i}.log"), encoding="utf-8") as f:
      text = f.read()
    ours = (f"process {i} of 2: {operation} (stage sft, step 1) did not finish within "
            f"{deadline} s (faults.collective_timeout_s)") in text
    named += ours
    assert ours or "distributed service detected fatal errors" in text, logs
  assert named >= 1, logs
  assert time.monotonic() - t0 < TIMEOUT


_BURST = """
import os, sys
pid, port = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, {root!r})
from vapo_jax import distributed as dist
dist.initialize("explicit", coordinator=f"127.0.0.1:{{port}}", num_processes=2, process_id=pid)
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from vapo_jax.run import checkpoint_store
mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
tree = [jax.device_put(jnp.arange(64.0) + i, NamedSharding(mesh, P("d"))) for i in range(120)]
sums = checkpoint_store.checksums(tree)                     # one program, not 120
total = jax.jit(lambda x: jnp.sum(x))
paced = [dist.pace(total(x)) for x in tree]             # 120 collective programs, paced
print("ok", len(set(sums)), float(sum(jax.device_get(paced))), flush=True)
"""


def test_many_collectives_in_a_row_do_not_deadlock(tmp_path):
  # Unpaced, XLA's CPU client hangs after ~40 such programs in flight (the cause of the
  # multi-process checkpoint hang); checksums and the paced loops must not.
  import socket  # pylint: disable=import-outside-toplevel
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  code = _BURST.format(root=ROOT)
  env = {**_env(2, 2, tmp_path), "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=120)[0])
  finally:
    for p in procs:
      p.kill()
  want = f"ok 120 {sum(64 * 63 / 2 + 64 * i for i in range(120))}"
  for p, out in zip(procs, outs):
    assert p.returncode == 0 and want in out, out[-2000:]
