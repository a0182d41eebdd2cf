"""Deadlines end a stuck process with a message; SIGTERM ends one whose main thread is blocked.

Each case runs in a child process, because the watchdog ends its process with os._exit.
The children block the main thread the way a hung collective does (inside a lock wait
with no timeout), so no Python-level handler gets to end them.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vapo_jax.run import watchdog

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PRELUDE = """
import sys, threading, time
sys.path.insert(0, {root!r})
from vapo_jax.run import control as run_control, watchdog
def block_forever():
  print("blocking", flush=True)
  lock = threading.Lock()
  lock.acquire()
  lock.acquire()  # never returns
"""


def _child(body: str, **env) -> subprocess.Popen:
  code = _PRELUDE.format(root=ROOT) + textwrap.dedent(body)
  return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env})


def _wait_for(proc: subprocess.Popen, line: str, timeout: float = 30) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    out = proc.stdout.readline()
    if line in out:
      return
    if proc.poll() is not None:
      break
  raise AssertionError(f"child never printed {line!r}: {proc.communicate()}")


def test_guard_deadline_exits_naming_stage_step_and_operation():
  t0 = time.monotonic()
  p = _child("""
    wd = watchdog.Watchdog(poll_s=0.05)
    with wd.guard("checkpoint save 12", "value_pretrain", 2, timeout_s=1.0,
                  setting="faults.collective_timeout_s"):
      block_forever()
  """)
  _, err = p.communicate(timeout=60)
  assert p.returncode == watchdog.EXIT_STUCK, err
  assert time.monotonic() - t0 < 30
  first = err.splitlines()[0]
  assert "checkpoint save 12 (stage value_pretrain, step 2)" in first
  assert "within 1 s (faults.collective_timeout_s)" in first and "process 0 of 1" in first
  assert "block_forever" in err  # the stuck stack is printed


def test_finished_guard_and_rearmed_heartbeat_do_not_fire():
  p = _child("""
    wd = watchdog.Watchdog(poll_s=0.05)
    with wd.guard("quick", "rl", 1, timeout_s=0.5):
      pass
    for i in range(8):                       # 1.6 s in all, each beat inside 0.5 s
      wd.arm("step", "rl step", "rl", i, timeout_s=0.5)
      time.sleep(0.2)
    wd.close()
    time.sleep(1.0)
    print("survived", flush=True)
  """)
  out, err = p.communicate(timeout=60)
  assert p.returncode == 0 and "survived" in out, err


def test_step_heartbeat_of_run_control_fires_when_a_step_never_ends():
  p = _child("""
    ctl = run_control.RunControl(stage="rl", step_timeout_s=1.0)
    ctl.enter("rl")
    ctl.advance("rl", 1)
    block_forever()
  """)
  _, err = p.communicate(timeout=60)
  assert p.returncode == watchdog.EXIT_STUCK, err
  assert "rl step 2" in err.splitlines()[0] and "faults.step_timeout_s" in err


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_while_the_main_thread_is_blocked(signals):
  # One SIGTERM: the grace deadline ends it; two: the second ends it at once.
  grace = 2.0 if signals == 1 else 600.0
  p = _child(f"""
    ctl = run_control.RunControl(stage="rl", sigterm_grace_s={grace})
    ctl.install_sigterm()
    block_forever()
  """)
  _wait_for(p, "blocking")
  t0 = time.monotonic()
  for _ in range(signals):
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
  _, err = p.communicate(timeout=60)
  assert p.returncode == watchdog.EXIT_SIGTERM, err
  assert time.monotonic() - t0 < 20
  assert ("second SIGTERM" if signals == 2 else "faults.sigterm_grace_s") in err


def test_stall_hook_sleeps_inside_the_named_operation_only():
  p = _child("""
    wd = watchdog.Watchdog(poll_s=0.05)
    with wd.guard("checkpoint write", "rl", 3, timeout_s=30):
      print("other operations run", flush=True)
    with wd.guard("SIGTERM agreement", "rl", 3, timeout_s=1.0):
      print("not reached", flush=True)
  """, **{watchdog.STALL_ENV: "SIGTERM agreement:0"})
  out, err = p.communicate(timeout=60)
  assert p.returncode == watchdog.EXIT_STUCK, err
  assert "other operations run" in out and "not reached" not in out
  assert "SIGTERM agreement (stage rl, step 3)" in err
