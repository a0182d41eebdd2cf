"""What an RL-step benchmark records per round besides its seconds, and how it sums them up.

  * `summarize(runs)`: per phase the mean and the median over the timed rounds, every round
    counted (a round that compiled is a round a run pays for too); `ratio_of_means` is the
    headline of a comparison (the peer's mean step / ours); `steady` the rounds after the
    first timed one, `quiet_rounds` the rounds that compiled nothing; `step_results` /
    `step_lines` the JSON and the printed figures of a whole comparison.
  * `CompileEvents`: JAX's compile events (`jax.monitoring`), per round: how many programs
    XLA compiled (or loaded from the persistent cache), their seconds, the largest by name.
    The event names, the same on jax 0.10.2 and 0.12.0.1: "/jax/core/compile/
    {jaxpr_trace,jaxpr_to_mlir_module,backend_compile}_duration" (durations, with
    fun_name=) and "/jax/compilation_cache/{cache_hits,cache_misses}" (events).
  * `PackedShapes`: the packed shape and token efficiency of every packed pass
    (`vapo_jax.rl.layout.Packed`, by pass name), read from each call's host plan.

Pure Python but for `CompileEvents.start` (jax) and `PackedShapes.install` (vapo_jax).
"""

from __future__ import annotations

import statistics
import threading
from typing import Iterable, Sequence

PHASES = ("rollout", "forward", "reward", "updates")
BACKEND = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HITS = "/jax/compilation_cache/cache_hits"
CACHE_MISSES = "/jax/compilation_cache/cache_misses"


# ----------------------------------------------------------------------------- summary math
def with_other(run: dict) -> dict:
  """`run` with "other" = step − (rollout + forward + reward + updates), where it has a
  step (for ours: advantages, tokenizing, and overlap, since ours times the reward and the
  forwards again alone)."""
  if "step" not in run:
    return dict(run)
  return {**run, "other": run["step"] - sum(run.get(k, 0.0) for k in PHASES)}


def stats(values: Sequence[float]) -> dict:
  """{"mean", "median", "min", "max", "n"} of `values` (None for each figure when empty)."""
  values = [float(v) for v in values]
  if not values:
    return {"mean": None, "median": None, "min": None, "max": None, "n": 0}
  return {"mean": statistics.fmean(values), "median": statistics.median(values),
          "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: Sequence[dict], keys: Iterable[str] = (*PHASES, "other", "step")
              ) -> dict[str, dict]:
  """Per key, `stats` over `runs` (each a round's dict of seconds) of the rounds that have
  it; "other" is derived (`with_other`). No round is dropped: a compile is counted."""
  runs = [with_other(r) for r in runs]
  return {k: stats([r[k] for r in runs]) for k in keys if runs and all(k in r for r in runs)}


def ratio_of_means(ours: Sequence[float], peer: Sequence[float]) -> float | None:
  """mean(peer) / mean(ours) over the same rounds: > 1 when we are faster on average."""
  n = min(len(ours), len(peer))
  if n == 0 or sum(ours[:n]) <= 0:
    return None
  return statistics.fmean(peer[:n]) / statistics.fmean(ours[:n])


def quiet_rounds(compiles: Sequence[int | None]) -> list[int]:
  """Indices of the rounds in which ours compiled nothing (0 backend compiles; None, not
  recorded, counts as unknown and is left out)."""
  return [i for i, c in enumerate(compiles) if c == 0]


def comparison(ours: Sequence[dict], peer: Sequence[dict], key: str = "step") -> dict:
  """The step of two sides over their common timed rounds: the headline (ratio of means,
  every round counted), the median of per-round ratios, the steady state (the rounds after
  the first timed one) and the rounds where ours compiled nothing."""
  n = min(len(ours), len(peer))
  o, p = [r[key] for r in ours[:n]], [r[key] for r in peer[:n]]
  per_round = [b / a for a, b in zip(o, p) if a > 0]
  compiles = [r.get("jax_compile", {}).get("backend_compiles") for r in ours[:n]]
  idle = quiet_rounds(compiles)
  return {"rounds": n, "ratio_of_means": ratio_of_means(o, p),
          "ratio_per_round": per_round,
          "median_of_ratios": statistics.median(per_round) if per_round else None,
          "steady": {"rounds": max(n - 1, 0), "ours": stats(o[1:]), "peer": stats(p[1:]),
                     "ratio_of_means": ratio_of_means(o[1:], p[1:])},
          "without_our_compiles": {"round_indices": idle,
                                   "ours": stats([o[i] for i in idle]),
                                   "peer": stats([p[i] for i in idle]),
                                   "ratio_of_means": ratio_of_means([o[i] for i in idle],
                                                                    [p[i] for i in idle])}}


def mean_median_lines(name: str, summary: dict[str, dict]) -> list[str]:
  """`name`'s step and split as mean / median seconds, each with its share of the mean."""
  step = summary["step"]["mean"]
  out = [f"{name}: step mean {step:.3f} s, median {summary['step']['median']:.3f} s "
         f"({summary['step']['n']} rounds, compiles counted)"]
  for k in (*PHASES, "other"):
    if k in summary:
      s = summary[k]
      out.append(f"  {k:9s} mean {s['mean']:8.3f} s  median {s['median']:8.3f} s  "
                 f"{s['mean'] / step if step else 0.0:6.1%}")
  return out


def fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
  """`x` formatted with its unit, "n/a" when None."""
  return "n/a" if x is None else format(x, spec) + unit


# ------------------------------------------------------------------ a comparison's JSON
def step_results(ours: list[dict], trl: list[dict]) -> dict:
  """The JSON of an RL-step comparison (ours against TRL's): every round of each side (round
  0 the warm-up), and over the timed rounds (1 ..) both sides' mean / median summaries and
  their `comparison`."""
  n = min(len(ours), len(trl))
  timed_o, timed_t = ours[1:n], trl[1:n]
  return {"rounds_timed": max(n - 1, 0),
          "ours": {"warmup": ours[0] if ours else None, "per_round": timed_o,
                   "summary": summarize(timed_o)},
          "trl": {"warmup": trl[0] if trl else None, "per_round": timed_t,
                  "summary": summarize(timed_t)},
          "comparison": comparison(timed_o, timed_t) if timed_o and timed_t else None}


def step_lines(res: dict, skip_phase: str | None = None) -> list[str]:
  """The printed figures of `step_results`: each side's mean / median split, the headline
  ratio of means, steady state, the rounds without our compiles, what each round compiled,
  generated and packed (packed passes of `skip_phase` left out)."""
  c = res["comparison"]
  if c is None:
    return ["no timed round finished (only the warm-up): no figures"]
  o, t = res["ours"], res["trl"]
  lines = mean_median_lines("ours (vapo_jax grpo)", o["summary"])
  lines += mean_median_lines("TRL GRPOTrainer", t["summary"])
  per = ", ".join(f"{r:.2f}" for r in c["ratio_per_round"])
  lines.append(f"RL step from step 2, TRL's mean / ours: {fmt(c['ratio_of_means'], unit='x')} "
               f"(> 1: we are faster) over {c['rounds']} timed round(s), compiles counted; "
               f"per round {per}; median of per-round ratios "
               f"{fmt(c['median_of_ratios'], unit='x')}")
  st = c["steady"]
  lines.append(f"  steady state (timed rounds after the first, {st['rounds']}): ours mean "
               f"{fmt(st['ours']['mean'], '.3f', ' s')}, TRL "
               f"{fmt(st['peer']['mean'], '.3f', ' s')}: {fmt(st['ratio_of_means'], unit='x')}")
  nc = c["without_our_compiles"]
  lines.append(f"  rounds where ours compiled nothing ({len(nc['round_indices'])} of "
               f"{c['rounds']}): {fmt(nc['ratio_of_means'], unit='x')}")
  for k in ("rollout", "forward", "updates"):
    so, stt = o["summary"].get(k), t["summary"].get(k)
    if so and stt and so["mean"]:
      lines.append(f"  {k}: TRL / ours {stt['mean'] / so['mean']:.2f}x (means)")
  warm = o["warmup"].get("jax_compile", {}) if o["warmup"] else {}
  lines.append(describe_compiles([r.get("jax_compile", {}) for r in o["per_round"]])
               + f"; warm-up: {warm.get('backend_compiles', 0)} "
               f"({warm.get('compile_s', 0.0):.1f} s)")
  gen = []
  for i, (ro, rt) in enumerate(zip(o["per_round"], t["per_round"])):
    lo, lt = ro.get("generated_lengths"), rt.get("generated_lengths")
    gen.append(f"r{i + 1}: {sum(lo) if lo else '?'} / {sum(lt) if lt else '?'}")
  lines.append("generated response tokens per round, ours / TRL: " + ", ".join(gen))
  shapes = [f"r{i + 1}: " + "; ".join(f"{name} {sh}" for name, sh in
                                       shapes_by_pass(r.get("packed", []),
                                                      skip_phase).items())
            for i, r in enumerate(o["per_round"])]
  lines.append("ours' packed shapes [n, K, T] per pass: " + (", ".join(shapes) or "none"))
  return lines


# --------------------------------------------------------------------------- compile events
class CompileEvents:
  """JAX's compile events since the last `take()` (see the module doc). Thread-safe; the
  listeners stay registered from `start()` to `stop()`."""

  def __init__(self, listed_s: float = 0.5, top: int = 5):
    self.listed_s, self.top = listed_s, top
    self._lock = threading.Lock()
    self._reset()
    self._started = False

  def _reset(self):
    self._seconds: dict[str, float] = {}
    self._counts: dict[str, int] = {}
    self._largest: list[tuple[str, float]] = []

  def on_duration(self, event: str, duration: float, **kw):
    if not event.startswith(("/jax/core/compile/", "/jax/compilation_cache/")):
      return
    with self._lock:
      self._seconds[event] = self._seconds.get(event, 0.0) + float(duration)
      self._counts[event] = self._counts.get(event, 0) + 1
      if event == BACKEND and duration >= self.listed_s:
        self._largest.append((str(kw.get("fun_name", "?")), float(duration)))

  def on_event(self, event: str, **_):
    if event in (CACHE_HITS, CACHE_MISSES):
      with self._lock:
        self._counts[event] = self._counts.get(event, 0) + 1

  def start(self) -> "CompileEvents":
    import jax  # pylint: disable=import-outside-toplevel
    if not self._started:
      jax.monitoring.register_event_duration_secs_listener(self.on_duration)
      jax.monitoring.register_event_listener(self.on_event)
      self._started = True
    return self

  def stop(self) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    if self._started:
      jax.monitoring.unregister_event_duration_listener(self.on_duration)
      jax.monitoring.unregister_event_listener(self.on_event)
      self._started = False

  def take(self) -> dict:
    """The events since the last take, then forgets them: backend_compiles (XLA compiles or
    persistent-cache loads), compile_s (trace + lower + backend), each part's seconds, the
    persistent cache's hits and misses, and the largest backend compiles [name, s]."""
    with self._lock:
      sec, cnt, big = self._seconds, self._counts, self._largest
      self._reset()
    core = {k: v for k, v in sec.items() if k.startswith("/jax/core/compile/")}
    return {"backend_compiles": cnt.get(BACKEND, 0), "compile_s": sum(core.values()),
            "backend_compile_s": sec.get(BACKEND, 0.0), "trace_s": sec.get(TRACE, 0.0),
            "lower_s": sec.get(LOWER, 0.0), "cache_hits": cnt.get(CACHE_HITS, 0),
            "cache_misses": cnt.get(CACHE_MISSES, 0),
            "largest": [[n, round(s, 3)] for n, s in
                        sorted(big, key=lambda x: -x[1])[:self.top]]}


def describe_compiles(per_round: Sequence[dict]) -> str:
  """One line: per timed round, how many programs ours compiled and their seconds."""
  parts = [f"r{i + 1}: {c.get('backend_compiles', 0)} ({c.get('compile_s', 0.0):.1f} s)"
           for i, c in enumerate(per_round)]
  return "ours, JAX compiles per timed round (programs, seconds): " + ", ".join(parts)


# ---------------------------------------------------------------------------- packed shapes
class _Recorded:
  """A packed pass (a `Packed.step` or `.forward` callable) that records each call's plan;
  every attribute reads and writes through to the pass itself."""

  def __init__(self, inner, name: str, book: "PackedShapes"):
    object.__setattr__(self, "_inner", inner)
    object.__setattr__(self, "_name", name)
    object.__setattr__(self, "_book", book)

  def __call__(self, *a, **k):
    out = self._inner(*a, **k)
    self._book.note(self._name)
    return out

  def __getattr__(self, attr):
    return getattr(self._inner, attr)

  def __setattr__(self, attr, value):
    setattr(self._inner, attr, value)


def plan_record(name: str, arrays, plan, phase: str | None = None) -> dict:
  """A call's record: pass name, the caller's phase (set by the bench, e.g. "update"), the
  plan's shape ([n, K, T] today) and real / computed tokens, and the shapes of the arrays the
  compiled program takes (whatever the planner calls them: these fix what is compiled)."""
  shape = getattr(plan, "shape", None)
  eff = getattr(plan, "efficiency", None)
  rec = {"pass": name, "phase": phase,
         "shape": None if shape is None else [int(x) for x in shape],
         "efficiency": None if eff is None else round(float(eff), 4)}
  if isinstance(arrays, dict):
    rec["arrays"] = {k: [int(x) for x in getattr(v, "shape", ())] for k, v in arrays.items()}
  return rec


class PackedShapes:
  """Records the plan of every packed pass while installed (patches `Packed.plan`, `.step`
  and `.forward` of `vapo_jax.rl.layout` on the class: install before the trainer builds
  its learners). `take()` returns the calls since the last take; `phase`, set by the caller,
  is written into each call's record."""

  def __init__(self):
    self._calls: list[dict] = []
    self._last = None
    self._saved: dict = {}
    self.installed = False
    self.phase: str | None = None

  def note(self, name: str):
    if self._last is not None:
      self._calls.append(plan_record(name, *self._last, phase=self.phase))
      self._last = None

  def take(self) -> list[dict]:
    calls, self._calls = self._calls, []
    return calls

  def install(self) -> bool:
    """Patches the layout; False (with nothing patched) where it has no such methods."""
    from vapo_jax.rl import layout  # pylint: disable=import-outside-toplevel
    cls = getattr(layout, "Packed", None)
    if cls is None or not all(hasattr(cls, m) for m in ("plan", "step", "forward")):
      return False
    self._saved = {m: getattr(cls, m) for m in ("plan", "step", "forward")}
    plan, step, forward, book = (*self._saved.values(), self)

    def rec_plan(obj, *a, **k):
      out = plan(obj, *a, **k)
      book._last = out  # pylint: disable=protected-access
      return out

    def rec_step(obj, name, *a, **k):
      return _Recorded(step(obj, name, *a, **k), name, book)

    def rec_forward(obj, name, *a, **k):
      return _Recorded(forward(obj, name, *a, **k), name, book)

    cls.plan, cls.step, cls.forward = rec_plan, rec_step, rec_forward
    self.installed = True
    return True

  def uninstall(self) -> None:
    if self.installed:
      from vapo_jax.rl import layout  # pylint: disable=import-outside-toplevel
      for m, fn in self._saved.items():
        setattr(layout.Packed, m, fn)
      self.installed = False


def shapes_by_pass(calls: Sequence[dict], skip_phase: str | None = None) -> dict[str, list]:
  """{pass: [shape of each call]} of one round's `PackedShapes.take()`, leaving out the calls
  of `skip_phase`."""
  out: dict[str, list] = {}
  for c in calls:
    if skip_phase is None or c.get("phase") != skip_phase:
      out.setdefault(c["pass"], []).append(c["shape"])
  return out
