"""Length specs for the step model: response (or prompt) lengths of one RL step, from a name.

  lognormal:MEDIAN,SIGMA     ℓ = MEDIAN · exp(SIGMA · z), z ~ N(0, 1), clipped to [lo, cap]
  uniform:A,B                ℓ uniform on [A, B], clipped to [lo, cap]
  fixed:N                    every row N
  early | mid | late         the pod-speed review's phases (lognormal 900,0.7 / 2600,0.8 /
                             4700,0.85), for response lengths
  review                     all three phases (`phases` returns three specs)
  PATH[@STEP]                a run's metrics.jsonl: the quantiles `response/length_p10, _p50,
                             _p90, _p99, _max` (and `_min`) the trainer logs per RL step
                             (`rl.length_stats`), of the last line that has them, or of
                             the line whose "step" is STEP (lines of the "rl" stage
                             first); lengths by linear interpolation of that quantile
                             function

`sample(spec, n, cap)` gives n lengths deterministically: the quantiles (i + 1/2) / n of the
distribution (stratified, so a phase's mean and tail are exact at any n), then shuffled with a
fixed seed so that consecutive rows (one sampler call) mix short and long ones as a real
rollout does.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np

PHASES = {"early": "lognormal:900,0.7", "mid": "lognormal:2600,0.8",
          "late": "lognormal:4700,0.85"}
QUANTILE_KEYS = (("min", 0.0), ("p10", 0.10), ("p50", 0.50), ("p90", 0.90), ("p99", 0.99),
                 ("max", 1.0))


def phases(spec: str) -> list[tuple[str, str]]:
  """[(label, spec)]: "review" → the three phases; "a;b" → both; else [(spec, spec)]."""
  out = []
  for part in spec.split(";"):
    part = part.strip()
    if part == "review":
      out += list(PHASES.items())
    elif part in PHASES:
      out.append((part, PHASES[part]))
    else:
      out.append((os.path.basename(part) if os.path.exists(part.split("@")[0]) else part, part))
  return out


def _quantile_fn(spec: str, prefix: str = "response/length_"):
  """u in [0, 1) -> length (float), and the spec's kind."""
  spec = PHASES.get(spec, spec)
  kind, _, args = spec.partition(":")
  if kind == "lognormal":
    try:
      median, sigma = (float(x) for x in args.split(","))
    except ValueError:
      raise ValueError(f"{spec!r}: write lognormal:MEDIAN,SIGMA, e.g. lognormal:900,0.7") from None
    if median <= 0 or sigma < 0:
      raise ValueError(f"{spec!r}: MEDIAN > 0 and SIGMA >= 0 are needed")
    nd = statistics.NormalDist()
    return lambda u: median * np.exp(sigma * np.array([nd.inv_cdf(x) for x in u]))
  if kind == "uniform":
    try:
      a, b = (float(x) for x in args.split(","))
    except ValueError:
      raise ValueError(f"{spec!r}: write uniform:A,B, e.g. uniform:80,400") from None
    if b < a:
      raise ValueError(f"{spec!r}: A <= B is needed")
    return lambda u: a + (b - a) * np.asarray(u)
  if kind == "fixed":
    n = float(args)
    return lambda u: np.full(len(u), n)
  path, _, step = spec.partition("@")
  if os.path.exists(path):
    qs = _metrics_quantiles(path, int(step) if step else None, prefix)
    us, xs = zip(*qs)
    return lambda u: np.interp(u, us, xs)
  raise ValueError(f"unknown length spec {spec!r}: use lognormal:MEDIAN,SIGMA, uniform:A,B, "
                   f"fixed:N, {'/'.join(PHASES)}, review, or a metrics.jsonl path")


def _metrics_quantiles(path: str, step: int | None, prefix: str = "response/length_"):
  """[(u, length)] of a metrics.jsonl line (see the module docstring)."""
  best = best_rl = None
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f):
      line = line.strip()
      if not line:
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{i + 1}: not JSON ({e})") from None
      if f"{prefix}p50" not in row:
        continue
      if step is None or row.get("step") == step:
        best = row
        if row.get("stage") == "rl":
          best_rl = row
  best = best_rl or best  # RL steps first (value pretraining logs the same keys)
  if best is None:
    raise ValueError(f"{path}: no line with {prefix}p50"
                     + (f" at step {step}" if step is not None else "")
                     + " (the trainer logs it per RL step; see rl/length_stats.py)")
  qs = [(u, float(best[prefix + k])) for k, u in QUANTILE_KEYS if prefix + k in best]
  if qs[0][0] > 0:
    qs.insert(0, (0.0, min(1.0, qs[0][1])))
  if qs[-1][0] < 1:
    qs.append((1.0, qs[-1][1]))
  return qs


def sample(spec: str, n: int, cap: int, lo: int = 1, seed: int = 0,
           prefix: str = "response/length_") -> np.ndarray:
  """n int64 lengths in [lo, cap] (see the module docstring; prompts: prefix "prompt/length_")."""
  if n < 1:
    raise ValueError(f"n={n} rows: need at least one")
  u = (np.arange(n) + 0.5) / n
  x = np.clip(np.rint(_quantile_fn(spec, prefix)(u)), lo, cap).astype(np.int64)
  return np.random.default_rng(seed).permutation(x)
