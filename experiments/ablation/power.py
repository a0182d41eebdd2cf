"""What an ablation table can detect: paired Δ, its "±", and the minimum detectable effect.

  python -m experiments.ablation.power A/ablation.jsonl [B/ablation.jsonl ...] [--step=10]

From `ablate`'s ablation.jsonl (kind "run" records: per row and seed the final held-out avg@k
`avg` and the curve `[[step, avg@k], ...]`), per row: Δ_s = row − vapo per seed (the same
shared start and held-out set), at the final step or, with --step, at that evaluation.

  mean Δ ± h,     h = t_{0.975, n−1} · sd/√n          (the tables' "±": a 95% t half-width,
                                                        sd with n − 1, df = n − 1)
  MDE_80 ≈ (t_{0.975, n−1} + t_{0.80, n−1}) · sd/√n    (two-sided α = 0.05, power 0.8, the
                                                        usual approximation to the paired t's
                                                        noncentral power)
  MDE_80 exact: the δ at which a two-sided paired t-test with noncentrality δ√n/sd rejects
                with probability 0.8 (scipy's noncentral t)

Each is given at the table's own n, and, from the same sd, at n = 3, 6 and 8 seeds. Several
files are pooled by seed (seeds must not repeat). Accuracies are printed in points.
"""

import argparse
import json
import math
import sys


def load(paths) -> list[dict]:
  out = []
  for p in paths:
    with open(p, encoding="utf-8") as f:
      out += [json.loads(line) for line in f if line.strip()]
  return [r for r in out if r.get("kind") == "run" and r.get("state") == "finished"]


def value(record: dict, step: int | None) -> float | None:
  if step is None:
    return record.get("avg")
  return next((a for s, a in record.get("curve", []) if s == step), None)


def deltas(records, row: str, step: int | None = None) -> dict[int, float]:
  """Per seed, row − vapo (points)."""
  by = {}
  for r in records:
    key = (r["row"], r["seed"])
    if key in by:
      raise ValueError(f"row {r['row']} seed {r['seed']} appears twice")
    by[key] = value(r, step)
  seeds = sorted(s for (name, s) in by if name == row)
  return {s: 100 * (by[(row, s)] - by[("vapo", s)]) for s in seeds
          if by.get(("vapo", s)) is not None and by[(row, s)] is not None}


def t_quantile(q: float, df: int) -> float:
  from scipy import stats  # pylint: disable=import-outside-toplevel
  return float(stats.t.ppf(q, df))


def mde(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> tuple[float, float]:
  """(the approximation, the exact noncentral-t value) of the effect detectable with
  `power` by a two-sided paired t-test at `alpha` with n pairs of sd `sd`."""
  from scipy import optimize  # pylint: disable=import-outside-toplevel
  from scipy import stats  # pylint: disable=import-outside-toplevel
  df = n - 1
  crit = t_quantile(1 - alpha / 2, df)
  approx = (crit + t_quantile(power, df)) * sd / math.sqrt(n)

  def miss(delta):
    nc = delta * math.sqrt(n) / sd
    low = stats.nct.cdf(-crit, df, nc)  # the wrong-sided rejections (≈ 0; NaN far out)
    return stats.nct.sf(crit, df, nc) + (0.0 if math.isnan(low) else low) - power

  exact = optimize.brentq(miss, 1e-6 * sd, 12 * sd / math.sqrt(n))  # noncentrality in (0, 12]
  return approx, float(exact)


def summary(records, step: int | None = None) -> list[dict]:
  rows = sorted({r["row"] for r in records} - {"vapo"})
  out = []
  for row in rows:
    d = deltas(records, row, step)
    n = len(d)
    if n < 2:
      continue
    vals = list(d.values())
    mean = sum(vals) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in vals) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    t = mean / (sd / math.sqrt(n)) if sd > 0 else float("nan")
    out.append({"row": row, "n": n, "deltas": d, "mean": mean, "sd": sd, "half": half, "t": t,
                "negative": sum(x < 0 for x in vals),
                "mde": {k: mde(sd, k) for k in sorted({n, 3, 6, 8})}})
  return out


def markdown(rows: list[dict], step: int | None) -> str:
  at = "the final step" if step is None else f"RL step {step}"
  ns = sorted({k for r in rows for k in r["mde"]})
  lines = [f"Paired Δ = row − vapo at {at} (points of avg@k); ± = 95% t half-width "
           "(df = n − 1); MDE_80 at n seeds from this sd (approximation / exact)", "",
           "| row | n | Δ per seed | mean Δ ± h | sd | t | seeds < 0 | "
           + " | ".join(f"MDE_80 n={k}" for k in ns) + " |",
           "|---|---|---|---|---|---|---|" + "---|" * len(ns)]
  for r in rows:
    per = " / ".join(f"{x:+.1f}" for x in r["deltas"].values())
    cells = [f"{r['mde'][k][0]:.1f} / {r['mde'][k][1]:.1f}" if k in r["mde"] else "—"
             for k in ns]
    lines.append(f"| {r['row']} | {r['n']} | {per} | {r['mean']:+.1f} ± {r['half']:.1f} | "
                 f"{r['sd']:.1f} | {r['t']:+.2f} | {r['negative']}/{r['n']} | "
                 + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("jsonl", nargs="+")
  ap.add_argument("--step", type=int, default=None, help="an evaluation step (default: final)")
  a = ap.parse_args(argv)
  print(markdown(summary(load(a.jsonl), a.step), a.step), end="")


if __name__ == "__main__":
  main(sys.argv[1:])
