"""run.host_memory: glibc malloc keeps large freed buffers mapped, so repeated programs stop
faulting in fresh pages.

The oracle is the kernel's own count of minor page faults (`getrusage`) of a subprocess that
allocates, touches and frees the same large buffer again and again, with and without the
settings; mallopt is process-wide and cannot be undone, so every case runs in its own
process.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from vapo_jax.run import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLIBC = host_memory.glibc() is not None
needs_glibc = pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's (Linux) only")


def _run(code: str, malloc: str) -> dict:
  env = dict(os.environ, VAPO_HOST_MALLOC=malloc, PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, check=True,
                       capture_output=True, text=True, timeout=120)
  return json.loads(out.stdout.strip().splitlines()[-1])


# 64 MiB, above glibc's largest mmap threshold (32 MiB): freed with munmap by default.
_MALLOC = """
import ctypes, json, resource
from vapo_jax.run import host_memory
applied = host_memory.configure("cpu")
libc = ctypes.CDLL(None)
libc.posix_memalign.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                ctypes.c_size_t)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
libc.free.argtypes = (ctypes.c_void_p,)
n = 64 << 20

def once():
  p = ctypes.c_void_p()
  assert libc.posix_memalign(ctypes.byref(p), 64, n) == 0
  libc.memset(p, 1, n)
  libc.free(p)

for _ in range(10):  # glibc's memalign leaves holes a same-size request does not fit at
  once()        # first; the heap settles after a few
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  once()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"applied": applied, "faults": f1 - f0}))
"""

# The same through XLA:CPU: a jitted op on a 64 MiB array, its output freed each time.
_XLA = """
CALLS = 48
import json, resource
from vapo_jax.run import host_memory
applied = host_memory.configure("cpu")  # before jax starts its CPU client and its threads
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), jnp.float32)
f = jax.jit(lambda x: x * 2.0 + 1.0)
for _ in range(16):  # the heap settles (XLA's threads interleave: a few more than plain malloc)
  f(x).block_until_ready()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(CALLS):
  f(x).block_until_ready()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"applied": applied, "faults": f1 - f0}))
"""

PAGES = (64 << 20) // 4096  # one fresh 64 MiB buffer = 16,384 faults of 4 KiB pages


@needs_glibc
def test_large_buffer_is_reused_instead_of_remapped():
  default, tuned = _run(_MALLOC, "0"), _run(_MALLOC, "1")
  assert default["applied"] == {}
  assert set(tuned["applied"]) == set(host_memory.SETTINGS)
  # Default glibc maps every allocation afresh: 10 × 16,384 faults; tuned, the heap has
  # settled in the warm-up and the buffer is reused.
  assert default["faults"] > 8 * PAGES, default
  assert tuned["faults"] < PAGES, tuned


@needs_glibc
def test_xla_cpu_buffers_stop_faulting():
  """Tuned, most settled calls reuse the heap. Not all: XLA's threads interleave their
  allocations, and in 30 runs here up to 6 of 48 calls (one 16-call window: 6) still mapped
  fresh pages, so the bound is a quarter of the calls (a 16-call window with at most 3 failed
  ~7% of runs)."""
  default, tuned = _run(_XLA, "0"), _run(_XLA, "1")
  assert default["faults"] > 44 * PAGES, default  # every call: a fresh 64 MiB output
  assert tuned["faults"] < 12 * PAGES, tuned      # at most 11 of the 48


def test_off_switch_and_other_platforms_leave_malloc_alone():
  assert host_memory.configure("tpu") == {}
  assert host_memory.configure("gpu") == {}
  assert host_memory.configure("cpu", env={host_memory.ENV: "0"}) == {}
  assert host_memory.configure("cpu", env={host_memory.ENV: "Off"}) == {}
  assert host_memory.configure(None) == {}
  assert host_memory.enabled({}) and host_memory.enabled({host_memory.ENV: "1"})


def test_expected_platform_reads_jax_platforms_without_starting_jax():
  assert host_memory.expected_platform({"JAX_PLATFORMS": "cpu"}) == "cpu"
  assert host_memory.expected_platform({"JAX_PLATFORMS": "cuda,cpu"}) == "cuda"
  assert host_memory.expected_platform({"JAX_PLATFORMS": "tpu"}) == "tpu"


# main's startup hook, in its own process (absl flags: vapo_jax.main and the tools define
# --config each, so they cannot be imported into one test process).
_MAIN = """
import json, os
from absl import flags
from jax._src import xla_bridge
from vapo_jax.run import host_memory
from vapo_jax.run import trainer as trainer_lib
from vapo_jax import main as main_lib
seen = []
configure = host_memory.configure

def spy(platform):
  seen.append({"platform": platform, "backend_started": bool(xla_bridge._backends)})
  return configure(platform)

class Stop(Exception):
  pass

def trainer(*args, **kwargs):
  raise Stop

host_memory.configure, trainer_lib.Trainer = spy, trainer
flags.FLAGS(["main", "--config=" + os.path.join(os.environ["PYTHONPATH"], "configs", "tiny.py")])
try:
  main_lib.main([])
except Stop:
  pass
print(json.dumps({"seen": seen, "applied": host_memory.applied()}))
"""


@needs_glibc
def test_main_applies_it_before_jax_starts():
  """main's first act: configure(expected_platform()), before any backend exists (threads
  that allocated before M_ARENA_MAX keep arenas of their own), and the trainer after it."""
  got = _run(_MAIN, "1")
  assert got["seen"] == [{"platform": "cpu", "backend_started": False}], got
  assert set(got["applied"]) == set(host_memory.SETTINGS)
  assert _run(_MAIN, "0")["applied"] == {}


# A hole in the middle of the heap: a buffer freed below a small live one, so the top of the
# heap cannot shrink; trim() hands its pages back (RSS from /proc/self/statm), and leaves a
# hole smaller than TRIM_MIN_FREE alone.
_TRIM = """
import ctypes, json, os, sys
from vapo_jax.run import host_memory
applied = host_memory.configure("cpu")
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
libc.free.argtypes = (ctypes.c_void_p,)
page = os.sysconf("SC_PAGE_SIZE")
def rss():
  return int(open("/proc/self/statm").read().split()[1]) * page
out = {"applied": applied}
for name, size in (("small", 16 << 20), ("big", 512 << 20)):
  hole = libc.malloc(size)
  libc.memset(hole, 1, size)
  keep = libc.malloc(1 << 20)  # above the hole: the heap's top stays
  libc.memset(keep, 1, 1 << 20)
  libc.free(hole)
  r0 = rss()
  ran = host_memory.trim()
  out[name] = {"ran": ran, "freed": r0 - rss(), "free": host_memory.free_bytes()}
print(json.dumps(out))
"""


@needs_glibc
def test_trim_returns_a_freed_hole_in_the_heap():
  on = _run(_TRIM, "1")
  assert on["applied"] and on["big"]["ran"]
  assert on["big"]["freed"] > 400 << 20  # the hole's 512 MiB, less what malloc keeps
  if on["small"]["free"] is not None:  # glibc >= 2.33 says how much is free: a small hole
    assert not on["small"]["ran"] and on["small"]["freed"] < 8 << 20   # is left alone
  off = _run(_TRIM, "0")  # the settings off: nothing applied, trim does nothing
  assert not off["applied"] and not off["big"]["ran"]
