"""Host memory: glibc malloc settings that let XLA:CPU reuse its buffers from step to step.

    host_memory.configure(host_memory.expected_platform())   # before jax starts its backend

**Why.** XLA's CPU client takes every buffer (a program's outputs, and the temporary buffer
of all its intermediates, fresh at each call) from `posix_memalign`, mostly in its own
threads. With glibc's defaults such a buffer above the mmap threshold (dynamic, at most
32 MiB on 64-bit Linux) is a private `mmap`, returned with `munmap` when it is freed; in a
thread's arena (heaps of at most 64 MiB) a larger one is always mmap'ed, and freed heap
above the trim threshold goes back to the kernel (`MADV_DONTNEED`). So each call of a
train step or a sampler maps its large buffers afresh, and the kernel zero-fills every
4 KiB page at its first touch: one minor page fault each, system CPU time that grows with
the bytes a program touches, not with its FLOPs. The tiny default (configs/tiny.py) took
75M faults and 24% of its CPU time in the kernel this way (docs/speed.md).

**What `configure` sets** (`mallopt`; process-wide, for the allocations that follow):

    M_ARENA_MAX       1         every thread allocates from the main arena, whose heap has no
                                64 MiB limit (threads started before this keep their arenas:
                                call it before jax creates its CPU client)
    M_MMAP_MAX        0         no request is served by its own mmap: a freed buffer stays in
                                the heap for the next call
    M_TRIM_THRESHOLD  2 GiB     freed heap is not handed back to the kernel (2 GiB is the
                                largest value mallopt takes)
    M_TOP_PAD         64 MiB    each heap extension takes 64 MiB more than asked

The resident size then stays near its high-water mark instead of breathing with each call,
which is what a training process wants. What it costs is memory held free: a step's phases
(the rollout's KV pool and decode copy, the updates' activations, an evaluation's engine)
leave holes in the one heap that the next phase does not always fill, and nothing went back
to the kernel. On the real model's VAPO config the peak RSS after 3 RL steps was 14.4 GB, 11.3
with glibc's defaults and 10.4 with `trim` (docs/speed.md, 2026-12-06). So `trim()` hands the
heap's free pages back (`malloc_trim(0)`: `MADV_DONTNEED` on every free page, the middle of
the heap included) at the trainer's phase boundaries: after a step's experience and at the
end of every step. The pages a later call touches again fault once per step, not per call.

Only the CPU backend's buffers live in malloc'ed host memory: on TPU and GPU the device
allocators hold them, and `configure` leaves glibc alone. It is a no-op off Linux glibc
(macOS, musl), and VAPO_HOST_MALLOC=0 (or "off", "false", "no") turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Mapping

ENV = "VAPO_HOST_MALLOC"
_OFF = ("0", "off", "false", "no")

# mallopt parameters (glibc malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8

SETTINGS: dict[str, tuple[int, int]] = {
    "M_ARENA_MAX": (M_ARENA_MAX, 1),
    "M_MMAP_MAX": (M_MMAP_MAX, 0),
    "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2**31 - 1),
    "M_TOP_PAD": (M_TOP_PAD, 64 << 20),
}

_applied: dict[str, int] | None = None


def glibc() -> ctypes.CDLL | None:
  """This process's C library if it is glibc (it exports `gnu_get_libc_version`), else None."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(None)
    libc.gnu_get_libc_version  # pylint: disable=pointless-statement
    libc.mallopt  # pylint: disable=pointless-statement
  except (OSError, AttributeError):
    return None
  return libc


def enabled(env: Mapping[str, str] | None = None) -> bool:
  """False when the user turned the settings off (VAPO_HOST_MALLOC=0/off/false/no)."""
  env = os.environ if env is None else env
  return env.get(ENV, "1").strip().lower() not in _OFF


def expected_platform(env: Mapping[str, str] | None = None) -> str | None:
  """The backend jax will compute on, read without starting it: the first entry of
  JAX_PLATFORMS (or of `jax.config.jax_platforms` once jax is imported), else "cpu" on a
  host with no accelerator (`cli.has_accelerator`), else None (jax will pick a TPU or GPU).
  """
  env = os.environ if env is None else env
  platforms = env.get("JAX_PLATFORMS", "")
  if not platforms and "jax" in sys.modules:
    platforms = str(sys.modules["jax"].config.jax_platforms or "")
  if platforms:
    return platforms.split(",")[0].strip().lower() or None
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel
  return None if cli.has_accelerator() else "cpu"


def configure(platform: str | None, *, env: Mapping[str, str] | None = None) -> dict[str, int]:
  """Applies `SETTINGS` with mallopt where they help; returns what was set ({} if nothing).

  Args:
    platform: the jax backend the run computes on (`expected_platform()`, or
      `jax.default_backend()` where the backend has started, though then jax's threads keep
      their own arenas); anything but "cpu" leaves malloc alone.
    env: the environment to read VAPO_HOST_MALLOC from (tests); os.environ by default.

  Idempotent: a later call returns the first call's settings.
  """
  global _applied
  if platform != "cpu" or not enabled(env):
    return {}
  if _applied is not None:
    return dict(_applied)
  libc = glibc()
  if libc is None:
    return {}
  libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  libc.mallopt.restype = ctypes.c_int
  done = {}
  for name, (param, value) in SETTINGS.items():
    if libc.mallopt(param, value) == 1:
      done[name] = value
  _applied = done
  return dict(done)


def applied() -> dict[str, int]:
  """The settings this process's `configure` applied ({} if none)."""
  return dict(_applied or {})


class _Mallinfo2(ctypes.Structure):
  """glibc's `struct mallinfo2` (2.33+): size_t fields; fordblks = free bytes in the heap."""
  _fields_ = [(name, ctypes.c_size_t) for name in (
      "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
      "fordblks", "keepcost")]


def free_bytes() -> int | None:
  """Bytes free in malloc's main heap (`mallinfo2().fordblks`), or None where glibc has no
  mallinfo2 (before 2.33) or this is not glibc."""
  libc = glibc()
  if libc is None or not hasattr(libc, "mallinfo2"):
    return None
  libc.mallinfo2.restype = _Mallinfo2
  return int(libc.mallinfo2().fordblks)


# Below this much free heap trim() does nothing: the pages it would free fault again at the
# next step, which costs more than they hold (the tiny default's whole heap is ~1 GB).
TRIM_MIN_FREE = 256 << 20


def trim(min_free: int = TRIM_MIN_FREE) -> bool:
  """Returns the heap's free pages to the kernel (glibc `malloc_trim(0)`) where `configure`
  applied its settings and at least `min_free` bytes are free (where glibc can say); True if
  it ran. Call it between phases, not inside them: each page it frees faults again at its
  next use."""
  if not _applied:
    return False
  libc = glibc()
  if libc is None:
    return False
  free = free_bytes()
  if free is not None and free < min_free:
    return False
  libc.malloc_trim.argtypes = (ctypes.c_size_t,)
  libc.malloc_trim.restype = ctypes.c_int
  libc.malloc_trim(0)
  return True
