"""Deadlines on the host's waits: a stuck collective ends the process with a message.

A multi-host run that loses one host inside a collective, or whose hosts issue collectives
in different orders, waits forever inside XLA: Python never runs again, so no exception,
timeout or signal handler can end it, and the slice stays held. A `Watchdog` runs a daemon
thread that ends the process with `os._exit` when an armed deadline passes:

    wd = Watchdog()
    with wd.guard("checkpoint save 12", "rl", 12, timeout_s=1800):
      ...                              # every host waits here at most 1800 s
    wd.arm("step", "rl", 13, timeout_s=7200)   # a deadline the caller re-arms (heartbeat)

On expiry it prints one line naming the operation, the stage, the step and the process,
then every thread's Python stack, and exits with `EXIT_STUCK`. Every host that is stuck
hits its own deadline; a host whose peer died is ended earlier by JAX's coordination
service.

SIGTERM: `watch_sigterm(grace_s)` makes the thread see each SIGTERM through
`signal.set_wakeup_fd`, which the interpreter's C-level handler writes to even while the
main thread is blocked inside XLA (where the Python-level handler cannot run). The first
SIGTERM arms a grace deadline (the trainer is expected to save at its next step boundary
and exit 0 before it passes); a second SIGTERM exits at once with `EXIT_SIGTERM`.

Test hook: with the environment variable VAPO_TEST_STALL="<operation>:<process index>",
that process sleeps inside `guard(<operation>, ...)` instead of running it, as a host that
never reaches a collective would (the others then wait in it).

Imports only the standard library (floor 1).
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import os
import signal
import sys
import threading
import time
from typing import Iterator

EXIT_STUCK = 3        # a deadline passed
EXIT_SIGTERM = 143    # a second SIGTERM, or the grace after the first ran out (128 + 15)
STALL_ENV = "VAPO_TEST_STALL"


def _process() -> tuple[int, int]:
  try:
    import jax  # pylint: disable=import-outside-toplevel
    return jax.process_index(), jax.process_count()
  except Exception:  # pylint: disable=broad-except
    return 0, 1


def _exit(code: int, message: str) -> None:
  """Prints `message` and all threads' stacks to stderr, then ends the process now."""
  try:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
  finally:
    os._exit(code)  # pylint: disable=protected-access


class Watchdog:
  """Deadlines checked by one daemon thread; see the module docstring.

  Args:
    clock: seconds, monotonic (tests pass a fake).
    poll_s: how often the thread checks the deadlines.
  """

  def __init__(self, *, clock=time.monotonic, poll_s: float = 0.2):
    self._clock = clock
    self._poll_s = poll_s
    self._lock = threading.Lock()
    self._deadlines: dict[str, tuple[float, str, int]] = {}
    self._guards = itertools.count()  # a slot of its own for each guard, nested or not
    self._grace_s = 0.0
    self._thread: threading.Thread | None = None
    self._stop = threading.Event()
    self._sigterms = 0
    self._wakeup: tuple[int, int] | None = None
    self._previous_wakeup_fd = -1

  # ---------------------------------------------------------------------------- deadlines
  def arm(self, slot: str, what: str, stage: str, step: int, timeout_s: float,
          setting: str = "") -> None:
    """Sets deadline `slot` to now + timeout_s (replacing the slot's old one); 0 = off.

    `setting` names the config field that sets timeout_s, for the message.
    """
    i, n = _process()
    message = (f"vapo_jax: process {i} of {n}: {what} (stage {stage}, step {step}) did not "
               f"finish within {timeout_s:g} s"
               + (f" ({setting})" if setting else "")
               + "; a collective or barrier is stuck on some host. Exiting with code "
               f"{EXIT_STUCK}; the newest complete checkpoint is kept, so rerunning the same "
               "command resumes from it.")
    self._set(slot, timeout_s, message, EXIT_STUCK)

  def _set(self, slot: str, timeout_s: float, message: str, code: int) -> None:
    if timeout_s <= 0:
      self.disarm(slot)
      return
    with self._lock:
      self._deadlines[slot] = (self._clock() + timeout_s, message, code)
    self._start()

  def disarm(self, slot: str) -> None:
    with self._lock:
      self._deadlines.pop(slot, None)

  @contextlib.contextmanager
  def guard(self, what: str, stage: str, step: int, timeout_s: float,
            setting: str = "") -> Iterator[None]:
    """Runs the body under a deadline of its own (nested guards each have theirs)."""
    slot = f"guard:{what}:{next(self._guards)}"
    self.arm(slot, what, stage, step, timeout_s, setting)
    try:
      _maybe_stall(what)
      yield
    finally:
      self.disarm(slot)

  # ------------------------------------------------------------------------------ SIGTERM
  def watch_sigterm(self, grace_s: float) -> None:
    """Sees SIGTERMs even while the main thread is blocked (call from the main thread,
    after the Python-level SIGTERM handler is installed)."""
    self._grace_s = grace_s
    if self._wakeup is not None:
      return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
      self._previous_wakeup_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
      os.close(r)
      os.close(w)
      return
    self._wakeup = (r, w)
    self._start()

  def unwatch_sigterm(self) -> None:
    if self._wakeup is None:
      return
    signal.set_wakeup_fd(self._previous_wakeup_fd)
    r, w = self._wakeup
    self._wakeup = None
    os.close(w)
    os.close(r)

  def _on_signals(self, data: bytes) -> None:
    for signum in data:
      if signum != signal.SIGTERM:
        continue
      self._sigterms += 1
      i, n = _process()
      if self._sigterms >= 2:
        _exit(EXIT_SIGTERM, f"vapo_jax: process {i} of {n}: second SIGTERM; exiting now "
              "without a checkpoint (the newest complete one is kept).")
      self._set("sigterm", self._grace_s,
                f"vapo_jax: process {i} of {n}: no step boundary within {self._grace_s:g} s "
                "of SIGTERM (faults.sigterm_grace_s); exiting without a new checkpoint (the "
                "newest complete one is kept).", EXIT_SIGTERM)

  # ------------------------------------------------------------------------------- thread
  def _start(self) -> None:
    if self._thread is None:
      self._thread = threading.Thread(target=self._loop, name="vapo-watchdog", daemon=True)
      self._thread.start()

  def _loop(self) -> None:
    import select  # pylint: disable=import-outside-toplevel
    while not self._stop.is_set():
      wakeup = self._wakeup
      if wakeup is not None:
        try:
          ready, _, _ = select.select([wakeup[0]], [], [], self._poll_s)
          if ready:
            self._on_signals(os.read(wakeup[0], 64))
        except (OSError, ValueError):  # closed by unwatch_sigterm meanwhile
          pass
      else:
        time.sleep(self._poll_s)
      now = self._clock()
      with self._lock:
        expired = [(code, m) for d, m, code in self._deadlines.values() if now >= d]
      if expired:
        _exit(*expired[0])

  def close(self) -> None:
    """Disarms everything and stops the thread."""
    with self._lock:
      self._deadlines.clear()
    self.unwatch_sigterm()
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=2 * self._poll_s + 1)
      self._thread = None
    self._stop = threading.Event()


def _maybe_stall(what: str) -> None:
  """The VAPO_TEST_STALL hook: sleep forever inside `what` on the named process."""
  spec = os.environ.get(STALL_ENV, "")
  if not spec:
    return
  op, _, proc = spec.rpartition(":")
  if op and what.startswith(op) and str(_process()[0]) == proc:
    print(f"vapo_jax: {STALL_ENV}: process {proc} stalls in {what!r}", file=sys.stderr,
          flush=True)
    while True:
      time.sleep(3600)
