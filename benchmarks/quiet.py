"""Benchmark discipline shared by every script in benchmarks/ (issue #17).

A figure is a result only if the machine was quiet while it was measured:

  * the 1-minute load average is at most QUIET_LOAD (1.0) when the benchmark starts;
  * while it runs, other processes use at most FOREIGN_CORES (0.25) cores on average and at
    most twice that in any sampling interval: the machine's busy CPU time from /proc/stat
    minus this process's own (threads and waited-for children). The load average cannot
    judge this part: on a 2-core machine a benchmark's own two threads lift it to ~2;
  * at the end, once the benchmark's own work has stopped, the load average falls back to
    at most QUIET_LOAD within SETTLE_S (90 s) of waiting idle.

Anything else is printed and written as "LOADED — not a result" (`"quiet": false` in JSON),
so that nobody copies it into the README. Without /proc/stat (not Linux) the run-time
check falls back to the load average samples.

  load = quiet.Load()                       # samples in the background
  with load:
    quiet.print_header(quiet.machine_facts(["torch"]), load)
    rounds = quiet.interleave([("ours", f), ("torch", g)], n, load=load)
  print(load.tag(f"ours {rounds.median('ours'):.3f} s"))
  print(load.tag(rounds.describe_ratio("ours", "torch")))
  print(load.verdict())
  quiet.write_json(path, load, facts, {...})

The sides of a comparison run round by round (ours, the peer's, then the peer's, ours, ...),
so every side sees the same machine state, and each round gives its own ratio.

`machine_peaks()` measures this machine's float32 matmul FLOP/s and copy bandwidth (the
roofline's peaks in sampler_bench.py), `all_peaks()` adds the bfloat16 matmul's (bf16 inputs,
float32 accumulate); `python benchmarks/quiet.py --peaks` prints them with the load, for
quoting beside a run's time (docs/speed.md). `machine_facts()` records the CPU's model name
and its matmul-relevant flags (avx512_bf16, amx_bf16, ...) from /proc/cpuinfo.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import threading
import time
from importlib import metadata
from typing import Callable, Iterable, Sequence

QUIET_LOAD = 1.0
FOREIGN_CORES = 0.25
# Other processes' cores are judged over intervals of at least this many seconds (shorter ones
# merge into the next): /proc/stat's 10 ms ticks over a 1 ms interval read as ~10 cores.
MIN_INTERVAL_S = 1.0
# BENCH_SETTLE_S=0: no idle wait at the end (the smoke tests in
# tests/benchmarks/test_bench_quiet.py, which check that a script runs, not its figures).
SETTLE_S = float(os.environ.get("BENCH_SETTLE_S", "90"))
LOADED = "LOADED — not a result"


def load1() -> float:
  """The 1-minute load average of this machine."""
  return os.getloadavg()[0]


def cpu_seconds() -> tuple[float, float, float] | None:
  """(busy CPU seconds of the whole machine, this process's CPU seconds, wall clock).

  Busy = user + nice + system + irq + softirq + steal over all cores (/proc/stat); this
  process's = its threads, its live descendants (worker pools: a benchmark's own workers
  are not "other processes") and the children it has waited for. None without /proc/stat.
  """
  try:
    with open("/proc/stat", encoding="ascii") as f:
      fields = f.readline().split()
  except OSError:
    return None
  if not fields or fields[0] != "cpu":
    return None
  ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
  busy = sum(ticks) - ticks[3] - ticks[4]
  t = os.times()
  hz = os.sysconf("SC_CLK_TCK")
  own = t.user + t.system + t.children_user + t.children_system + descendants_ticks() / hz
  return busy / hz, own, time.monotonic()


def descendants_ticks(root: int | None = None) -> int:
  """CPU ticks (user + system, and of their waited-for children) of the live descendants of
  process `root` (this one by default), from /proc/<pid>/stat; 0 where /proc is missing."""
  root = os.getpid() if root is None else root
  parent, ticks = {}, {}
  try:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
  except OSError:
    return 0
  for pid in pids:
    try:
      with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        stat = f.read()
    except OSError:  # gone since the listing
      continue
    rest = stat[stat.rfind(")") + 2:].split()  # fields after "pid (comm) "
    if len(rest) < 15:
      continue
    parent[pid] = int(rest[1])
    ticks[pid] = sum(int(x) for x in rest[11:15])  # utime stime cutime cstime
  total = 0
  for pid in parent:
    p, seen = parent[pid], 0
    while p > 1 and p != root and seen < 64:  # walk up to root (or init)
      p, seen = parent.get(p, 0), seen + 1
    if p == root and pid != root:
      total += ticks[pid]
  return total


class Load:
  """Judges whether the machine was quiet around and during a benchmark (see the module doc).

  Use as a context manager. `interval_s=None` turns the background sampler off (the start,
  the end and explicit `sample()` calls remain); `settle_s=0` takes the end sample at once.
  """

  def __init__(self, load_fn: Callable[[], float] = load1, interval_s: float | None = 5.0,
               limit: float = QUIET_LOAD,
               cpu_fn: Callable[[], tuple[float, float, float] | None] = cpu_seconds,
               foreign_limit: float = FOREIGN_CORES, settle_s: float = SETTLE_S,
               sleep: Callable[[float], None] = time.sleep):
    self.load_fn, self.interval_s, self.limit = load_fn, interval_s, limit
    self.cpu_fn, self.foreign_limit, self.settle_s, self._sleep = (
        cpu_fn, foreign_limit, settle_s, sleep)
    self.samples: list[float] = []
    self.foreign: list[float] = []   # other processes' cores, per sampling interval
    self.foreign_mean: float | None = None
    self.start: float | None = None
    self.end: float | None = None
    self.settled_s = 0.0
    self._cpu0 = self._cpu_last = self._cpu_end = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._lock = threading.Lock()

  @staticmethod
  def _cores(a, b) -> float | None:
    if a is None or b is None or b[2] - a[2] <= 0:
      return None
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / (b[2] - a[2]))

  def sample(self) -> float:
    value = float(self.load_fn())
    cpu = self.cpu_fn()
    with self._lock:
      self.samples.append(value)
      # /proc/stat counts in ticks (10 ms): over a few ms one tick reads as several cores, so
      # an interval shorter than MIN_INTERVAL_S is merged into the next one.
      last = self._cpu_last
      if cpu is not None and last is not None and cpu[2] - last[2] >= MIN_INTERVAL_S:
        cores = self._cores(last, cpu)
        if cores is not None:
          self.foreign.append(cores)
        self._cpu_last = cpu
      elif last is None:
        self._cpu_last = cpu
      if cpu is not None:
        self._cpu_end = cpu
    return value

  def __enter__(self) -> "Load":
    self.start = float(self.load_fn())
    self._cpu0 = self._cpu_last = self._cpu_end = self.cpu_fn()
    self.samples.append(self.start)
    if self.interval_s:
      self._thread = threading.Thread(target=self._run, daemon=True, name="load-sampler")
      self._thread.start()
    return self

  def _run(self):
    while not self._stop.wait(self.interval_s):
      self.sample()

  def __exit__(self, *exc):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    self.sample()
    self.foreign_mean = self._cores(self._cpu0, self._cpu_end)
    # Our own threads lifted the load average; wait idle for it to fall back.
    end, waited = float(self.load_fn()), 0.0
    while end > self.limit and waited < self.settle_s:
      self._sleep(1.0)
      waited += 1.0
      end = float(self.load_fn())
    self.end, self.settled_s = end, waited
    return False

  @property
  def peak(self) -> float:
    with self._lock:
      return max(self.samples) if self.samples else float("nan")

  @property
  def peak_foreign(self) -> float | None:
    with self._lock:
      return max(self.foreign) if self.foreign else None

  @property
  def quiet(self) -> bool:
    if self.start is None or self.start > self.limit:
      return False
    if self.end is not None and self.end > self.limit:
      return False
    if self.foreign_mean is None and not self.foreign:
      # No CPU accounting: only the load average can judge the run.
      return bool(self.samples) and self.peak <= self.limit
    mean = self.foreign_mean if self.foreign_mean is not None else (
        sum(self.foreign) / len(self.foreign))
    peak = self.peak_foreign or 0.0
    return mean <= self.foreign_limit and peak <= 2 * self.foreign_limit

  def tag(self, line: str) -> str:
    """`line`, marked as not a result when the run was loaded."""
    return line if self.quiet else f"{line}   [{LOADED}]"

  def verdict(self) -> str:
    end = "running" if self.end is None else f"{self.end:.2f}"
    if self.settled_s:
      end += f" (after {self.settled_s:.0f} s idle)"
    other = ""
    if self.foreign_mean is not None:
      other = (f"; other processes used {self.foreign_mean:.2f} cores on average, "
               f"{self.peak_foreign or 0.0:.2f} at most")
    state = ("quiet" if self.quiet
             else f"{LOADED}; rerun on a quiet machine")
    return (f"load average (1 min): start {self.start:.2f}, end {end}, max during "
            f"{self.peak:.2f} (this benchmark's own threads included){other} -> {state} "
            f"(limits: load {self.limit:g} at start and end, other processes "
            f"{self.foreign_limit:g} cores)")

  def to_json(self) -> dict:
    return {"quiet": self.quiet, "verdict": "quiet" if self.quiet else LOADED,
            "load_1min": {"start": self.start, "end": self.end, "max": self.peak,
                          "samples": len(self.samples), "limit": self.limit,
                          "settled_s": self.settled_s},
            "other_processes_cores": {"mean": self.foreign_mean, "max": self.peak_foreign,
                                      "limit": self.foreign_limit}}


def versions(packages: Iterable[str]) -> dict[str, str]:
  """Installed versions by distribution name, without importing anything."""
  out = {}
  for name in packages:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = "not installed"
  return out


# The instruction-set flags that decide this machine's matmul peaks (bf16 and AMX among them).
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni",
             "amx_tile", "amx_bf16", "amx_int8")


def parse_cpuinfo(text: str) -> dict:
  """The CPU of a /proc/cpuinfo text: {"model": model name, "flags": those of CPU_FLAGS it
  has, "logical_cpus": processor entries, "sockets": distinct physical ids (or None)}.

  The first processor's model name and flags stand for all (Linux lists one per logical
  CPU); an empty text gives model "" and no flags."""
  model, flags, cpus, sockets = "", set(), 0, set()
  for line in text.splitlines():
    key, sep, value = line.partition(":")
    if not sep:
      continue
    key, value = key.strip(), value.strip()
    if key == "processor":
      cpus += 1
    elif key == "model name" and not model:
      model = value
    elif key == "flags" and not flags:
      flags = set(value.split())
    elif key == "physical id":
      sockets.add(value)
  return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags],
          "logical_cpus": cpus, "sockets": len(sockets) or None}


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
  """`parse_cpuinfo` of this machine ({} without /proc/cpuinfo, e.g. not Linux)."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return parse_cpuinfo(f.read())
  except OSError:
    return {}


def machine_facts(peers: Sequence[str] = (), ours: Sequence[str] = ("jax", "flax")) -> dict:
  """Cores, the CPU's model and flags, platform, and the versions of python, jax and the
  peer libraries. "cpu" is the model name from /proc/cpuinfo (platform.processor() is empty
  on Linux), else what platform knows."""
  info = cpu_info()
  return {"cpu": info.get("model") or platform.processor() or platform.machine(),
          "cpu_flags": info.get("flags", []), "cores": os.cpu_count(),
          "platform": platform.platform(), "python": platform.python_version(),
          "versions": versions([*ours, *peers])}


def print_header(facts: dict, load: Load) -> None:
  v = ", ".join(f"{k} {x}" for k, x in facts["versions"].items())
  flags = " ".join(facts.get("cpu_flags") or []) or "none known"
  print(f"machine: {facts['cpu']} (flags: {flags}), {facts['cores']} cores, "
        f"{facts['platform']}; python {facts['python']}, {v}")
  print(f"load average (1 min) at start: {load.start:.2f}"
        + ("" if load.start <= load.limit else f"  [{LOADED}: above {load.limit:g}]"))


@dataclasses.dataclass
class Rounds:
  """Per-round seconds of each side, in the order the sides ran."""
  times: dict[str, list[float]]
  order: list[str]

  @property
  def n(self) -> int:
    return min((len(t) for t in self.times.values()), default=0)

  def median(self, name: str) -> float:
    return statistics.median(self.times[name])

  def ratios(self, ours: str, peer: str) -> list[float]:
    """Per round, the peer's time over ours: how many times faster we are (> 1: faster)."""
    return [p / o for o, p in zip(self.times[ours], self.times[peer])]

  def ratio(self, ours: str, peer: str) -> float:
    """The median of the per-round ratios."""
    return statistics.median(self.ratios(ours, peer))

  def describe_ratio(self, ours: str, peer: str, label: str | None = None) -> str:
    per = ", ".join(f"{r:.2f}" for r in self.ratios(ours, peer))
    return (f"{label or f'{ours} vs {peer}'}: {self.ratio(ours, peer):.2f}x (peer's time / "
            f"ours, > 1: we are faster), median of {self.n} round(s) (per round: {per})")

  def to_json(self, pairs: Sequence[tuple[str, str]] = ()) -> dict:
    return {"seconds": self.times,
            "median_s": {k: statistics.median(v) for k, v in self.times.items() if v},
            "ratios": {f"{o}/{p}": {"per_round": self.ratios(o, p), "median": self.ratio(o, p)}
                       for o, p in pairs}}


def interleave(sides: Sequence[tuple[str, Callable[[], float | None]]], rounds: int,
               load: Load | None = None, alternate: bool = True,
               each_round: Callable[[int], None] | None = None,
               clock: Callable[[], float] = time.perf_counter) -> Rounds:
  """Runs every side once per round, alternating their order, and times each call.

  A side that returns a number reports its own seconds for the round (for instance the best
  of several steps); otherwise the wall time of the call counts. With `alternate`, odd rounds
  run the sides in reverse order, so no side always runs first. `each_round(i)` runs at the
  start of round i (untimed), and `load` is sampled after every round.
  """
  times: dict[str, list[float]] = {name: [] for name, _ in sides}
  order: list[str] = []
  for i in range(rounds):
    if each_round is not None:
      each_round(i)
    for name, fn in (reversed(sides) if alternate and i % 2 else sides):
      t0 = clock()
      got = fn()
      elapsed = clock() - t0
      times[name].append(float(got) if isinstance(got, (int, float)) else elapsed)
      order.append(name)
    if load is not None:
      load.sample()
  return Rounds(times, order)


def matmul_peak(dtype: str = "float32", n: int = 1024, reps: int = 10) -> float:
  """FLOP/s of jit(x @ x) on [n, n] `dtype` inputs with a float32 accumulator and output
  (`preferred_element_type`, as the model's bf16 matmuls), on JAX's default backend; best
  of `reps` timings."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  a = jnp.ones((n, n), dtype)
  mm = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32))
  mm(a).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    mm(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def copy_peak(reps: int = 5) -> float:
  """Bytes/s (read + written) of np.copyto of 256 MiB; best of `reps`."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  x = np.ones(64 << 20, np.float32)  # 256 MiB
  y = np.empty_like(x)
  np.copyto(y, x)
  best = float("inf")
  for _ in range(max(reps, 1)):
    t = time.perf_counter()
    np.copyto(y, x)
    best = min(best, time.perf_counter() - t)
  return 2 * x.nbytes / best


def machine_peaks(reps: int = 10) -> tuple[float, float]:
  """(float32 matmul FLOP/s, copy bytes/s) of this machine, measured with jax and numpy.

  Matmul: jit(x @ x) on [1024, 1024] float32; copy: np.copyto of 256 MiB (bytes read +
  written). Best of `reps` (of reps // 2 for the copy) timings each: the total over the
  repetitions let one slow repetition lower a run's peak, and with it the bound: one quiet
  run of sampler_bench's `small` preset got 130 GFLOP/s instead of ~209 and read 63% of its
  roofline where the next run read 40%. `all_peaks` adds bfloat16.
  """
  return matmul_peak("float32", reps=reps), copy_peak(max(reps // 2, 1))


def all_peaks(reps: int = 10) -> dict[str, float]:
  """{"flops_peak": float32 matmul FLOP/s, "bf16_flops_peak": bfloat16 inputs with a float32
  accumulator, "bw_peak": copy bytes/s} (keys as `--peaks` writes them)."""
  flops, bw = machine_peaks(reps)
  return {"flops_peak": flops, "bf16_flops_peak": matmul_peak("bfloat16", reps=reps),
          "bw_peak": bw}


def describe_peaks(flops: float, bw: float, bf16: float | None = None) -> str:
  out = f"{flops / 1e9:.0f} GFLOP/s float32 matmul, {bw / 1e9:.1f} GB/s copy"
  if bf16 is not None:
    out += f", {bf16 / 1e9:.0f} GFLOP/s bfloat16 matmul (float32 accumulate)"
  return out


def add_flags(parser) -> None:
  """The flags every benchmark shares."""
  parser.add_argument("--json", default=None, metavar="PATH",
                      help="also write the figures as JSON, with \"quiet\": true/false")


def write_json(path: str | None, load: Load, facts: dict, results: dict,
               announce: bool = True) -> None:
  """Writes the run's JSON (load verdict, machine, results) to `path` (None: nothing), whole
  or not at all (a temporary file renamed over it: a bench that rewrites it after every round
  never leaves half a file); `announce=False` prints nothing."""
  if not path:
    return
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({**load.to_json(), "machine": facts, "results": results}, f, indent=1,
              ensure_ascii=False, default=_json_default)
  os.replace(tmp, path)
  if announce:
    print(f"wrote {path}" + ("" if load.quiet else f" (\"quiet\": false, {LOADED})"))


def _json_default(x):
  """numpy scalars and arrays as plain numbers and lists; anything else as its str."""
  if hasattr(x, "tolist"):
    return x.tolist()
  return str(x)


def main(argv=None) -> None:
  """`python benchmarks/quiet.py --peaks`: this machine's matmul and copy peaks, and whether
  it was quiet while they were measured."""
  import argparse  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
  ap.add_argument("--peaks", action="store_true", help="measure and print the peaks")
  ap.add_argument("--reps", type=int, default=10, help="repetitions (best of)")
  add_flags(ap)
  args = ap.parse_args(argv)
  if not args.peaks:
    ap.error("nothing to do: pass --peaks")
  facts = machine_facts()
  load = Load(interval_s=1.0)
  with load:
    print_header(facts, load)
    peaks = all_peaks(args.reps)
  text = describe_peaks(peaks["flops_peak"], peaks["bw_peak"], peaks["bf16_flops_peak"])
  print(load.tag(f"peaks: {text}"))
  print(load.verdict())
  write_json(args.json, load, facts, peaks)


if __name__ == "__main__":
  main()
