"""What a run compiles: JAX's own compile events counted per step, and JAX's persistent
compilation cache on by default.

Counts come from `jax.monitoring` (the events JAX records for every program it builds, jit
and eager alike), summed in one process-wide `Tally`:

  compile/count        programs built: XLA compiles and loads from the persistent cache
                       (JAX's backend-compile event wraps both)
  compile/cache_loads  of those, loaded from the persistent cache
  compile/seconds      tracing + lowering to MLIR + backend compile (or load), summed
  mem/peak_rss_gb      the process's peak resident memory so far (getrusage's ru_maxrss),
                       so that a run's records say when its memory grew

`since(snapshot())` gives the deltas of one step; the trainer logs them with every step's
metrics, so `metrics.jsonl` shows which steps compiled and for how long.

The persistent cache (`enable_cache`) keeps compiled programs on disk between processes, so a
rerun or a resumed run loads its programs instead of compiling them. Its directory must be
the user's own and private: JAX loads what it finds there as trusted executable code, so a
directory that another user can write is refused (with a warning, and the run goes on without
a cache). JAX_COMPILATION_CACHE_DIR, when set, wins over the config.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import threading
import warnings

import jax
from jax import monitoring

BACKEND = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(frozen=True)
class Snapshot:
  count: int = 0
  cache_loads: int = 0
  seconds: float = 0.0


class Tally:
  """Running totals of this process's compile events (listeners registered once)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._count = self._loads = 0
    self._seconds = 0.0

  def on_duration(self, event: str, duration: float, **_):
    if event in (BACKEND, TRACE, LOWER):
      with self._lock:
        self._seconds += float(duration)
        self._count += event == BACKEND

  def on_event(self, event: str, **_):
    if event == CACHE_HIT:
      with self._lock:
        self._loads += 1

  def snapshot(self) -> Snapshot:
    with self._lock:
      return Snapshot(self._count, self._loads, self._seconds)


_TALLY: Tally | None = None


def tally() -> Tally:
  """The process's tally, its listeners registered on first use."""
  global _TALLY  # pylint: disable=global-statement
  if _TALLY is None:
    _TALLY = Tally()
    monitoring.register_event_duration_secs_listener(_TALLY.on_duration)
    monitoring.register_event_listener(_TALLY.on_event)
  return _TALLY


def snapshot() -> Snapshot:
  return tally().snapshot()


def since(start: Snapshot) -> dict[str, float]:
  """compile/count, compile/cache_loads and compile/seconds since `start`, and
  mem/peak_rss_gb."""
  now = snapshot()
  return {"compile/count": float(now.count - start.count),
          "compile/cache_loads": float(now.cache_loads - start.cache_loads),
          "compile/seconds": now.seconds - start.seconds,
          "mem/peak_rss_gb": peak_rss_gb()}


def peak_rss_gb() -> float:
  """This process's peak resident set size, GB (ru_maxrss is KiB on Linux, bytes on macOS;
  0 where the resource module is missing)."""
  try:
    import resource  # pylint: disable=import-outside-toplevel
  except ImportError:
    return 0.0
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (1e9 if sys.platform == "darwin" else 1e9 / 1024)


# ------------------------------------------------------------------- the persistent cache


def default_cache_dir() -> str:
  """$XDG_CACHE_HOME/vapo_jax/jax (~/.cache/vapo_jax/jax): the user's own cache."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "vapo_jax", "jax")


def private_dir(path: str) -> str | None:
  """Creates `path` (mode 0700) if missing; None if it is usable as a trusted cache (a
  directory owned by this user that no one else can write), else why not."""
  try:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
  except OSError as e:
    return f"cannot create it ({e.strerror})"
  if not stat.S_ISDIR(st.st_mode):
    return "it is not a directory"
  if hasattr(os, "getuid") and st.st_uid != os.getuid():
    return "another user owns it"
  if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return "others can write to it (chmod go-w)"
  return None


def enable_cache(enabled: bool, cache_dir: str = "") -> str | None:
  """Turns JAX's persistent compilation cache on (in `cache_dir`, default
  `default_cache_dir()`) and returns its directory; None when off. JAX_COMPILATION_CACHE_DIR,
  when set, is JAX's own setting and is left as it is (returned)."""
  env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if env:
    return env
  if not enabled:
    return None
  path = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
  why = private_dir(path)
  if why is not None:
    warnings.warn(f"compile.cache_dir={path}: not used as a compilation cache, {why}; "
                  "programs will be compiled afresh (compile.cache=False silences this)",
                  stacklevel=2)
    return None
  # JAX opens its cache once, at the first compile after a directory is set, and keeps it:
  # a process that compiled before (a notebook cell, a test, JAX_COMPILATION_CACHE_DIR read
  # at start-up) would go on writing to the old one. Resetting makes the next compile open
  # this one (tests/run/test_compile_once.py).
  if jax.config.jax_compilation_cache_dir != path:
    from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=import-outside-toplevel
    jax.config.update("jax_compilation_cache_dir", path)
    compilation_cache.reset_cache()
  # Every program the run compiles for more than a second is kept (JAX's default); the
  # many small eager ones are not worth a file each.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  return path
