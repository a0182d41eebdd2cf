"""The ablation table's figures and files, from what the runs wrote (`ablate` runs them).

Per run: its eval curve and final metrics (`run_record`); per row: mean and 95% t-interval
over seeds and the paired difference against VAPO (`row_summary`); the table
(`markdown`), the plot (`plot`), and W/metrics/ (every run's per-step metrics.jsonl,
`keep_metrics`). Runs and rows are read by attribute (name, kind, seed, directory; name,
label, paper), so this module needs nothing of `ablate`.
"""

import json
import math
import os
import re
import shutil
from typing import Sequence

from experiments.ablation import paired_problems
from experiments.ablation import sft_band

STATUS = "ablate_status.json"
BAND_DIR = "band"  # <shared SFT stage>/band: the SFT_BAND check's run


def read_status(run) -> dict | None:
  """A run's saved status (state, return code, wall time, command), or None."""
  path = os.path.join(run.directory, STATUS)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def hms(seconds: float) -> str:
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  return (f"{h}h" if h else "") + f"{rest // 60:d}m{rest % 60:02d}s"


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
  """The 97.5% quantile of Student's t with `df` degrees of freedom (table to 30, then the
  Cornish-Fisher expansion around the normal's 1.95996)."""
  if df < 1:
    raise ValueError("df must be >= 1")
  if df <= len(_T975):
    return _T975[df - 1]
  z = 1.959964
  return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(values: Sequence[float]) -> tuple[float, float | None]:
  """(mean, half-width of the 95% t-interval) of the values; no interval for fewer than 2."""
  n = len(values)
  if not n:
    return math.nan, None
  mean = sum(values) / n
  if n < 2:
    return mean, None
  sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
  return mean, t_quantile_975(n - 1) * sd / math.sqrt(n)


def first_step_reaching(curve: Sequence[tuple[int, float]], target: float) -> int | None:
  """The first RL step whose held-out score is >= target (None: never)."""
  return next((step for step, value in sorted(curve) if value >= target - 1e-12), None)


def run_record(run, status: dict | None) -> dict:
  """What a run's files say: its eval curve, final metrics and entropy at the end."""
  rec = {"kind": "run", "row": run.name, "seed": run.seed, "directory": run.directory,
         "state": status["state"] if status else "not run",
         "wall_s": status.get("wall_s") if status else None}
  path = os.path.join(run.directory, "metrics.jsonl")
  if not os.path.exists(path):
    return rec
  from vapo_jax.run import metrics as metrics_lib  # pylint: disable=import-outside-toplevel
  records = metrics_lib.read_jsonl(path)
  evals = {r["step"]: r for r in records if r.get("stage") == "eval"}
  rls = [r for r in records if r.get("stage") == "rl"]
  first = next((key for key in evals.get(min(evals, default=0), {})
                if re.fullmatch(r"avg@\d+", key)), None)
  if first is not None:
    k = first.split("@")[1]
    rec["k"] = int(k)
    rec["curve"] = [(s, _num(evals[s].get(f"avg@{k}"))) for s in sorted(evals)]
    rec["length_curve"] = [(s, _num(evals[s].get("response_length"))) for s in sorted(evals)]
    last = evals[max(evals)]
    rec["final_step"] = max(evals)
    rec["avg"] = _num(last.get(f"avg@{k}"))
    rec["pass"] = _num(last.get(f"pass@{k}"))
    rec["response_length"] = _num(last.get("response_length"))
    rec["greedy_accuracy"] = _num(last.get("greedy_accuracy"))
    for key in last:  # avg@k per kind of problem (`evaluation.kind_metrics`), if logged
      if key.startswith(f"avg@{k}/"):
        rec[f"avg/{key.split('/', 1)[1]}"] = _num(last[key])
    if "short_frac" in last:
      rec["guess_rate"] = _num(last["short_frac"])
  if rls:
    rec["entropy"] = _num(rls[-1].get("entropy"))
    rec["rl_steps"] = rls[-1]["step"]
  return rec


def _num(v) -> float:
  try:
    return float(v)
  except (TypeError, ValueError):
    return math.nan


def kind_keys(records: Sequence[dict]) -> list[str]:
  """The per-kind held-out scores the runs logged ("avg/long", ...), sorted."""
  return sorted({k for r in records for k in r if k.startswith("avg/")})


def row_summary(row, records: Sequence[dict], target: float | None,
                vapo_by_seed: dict[int, float] | None = None,
                vapo_kinds: dict[int, dict] | None = None) -> dict:
  """A row's figures over its seeds (finished runs; crashed ones are counted).

  `vapo_by_seed` (seed -> VAPO's final avg@k) gives the paired difference: per seed, this
  row's final avg@k minus VAPO's from the same shared stages (so the seeds' different SFT
  starts cancel), then mean and 95% t-interval over the seeds both finished.
  `vapo_kinds` (seed -> VAPO's run record) gives the same per kind of problem
  (`avg/<kind>_minus_vapo`) where the runs logged one (`evaluation.kind_metrics`).
  """
  done = [r for r in records if r["state"] == "finished" and "avg" in r]
  out = {"kind": "row", "row": row.name, "label": row.label, "paper": row.paper,
         "seeds": len(records), "finished": len(done),
         "crashed": sum(r["state"] == "crashed" for r in records)}
  for key in ("avg", "pass", "response_length", "entropy", "guess_rate"):
    mean, half = mean_interval([r[key] for r in done if key in r and not math.isnan(r[key])])
    out[key], out[f"{key}_ci95"] = mean, half
  if vapo_by_seed:
    diffs = [r["avg"] - vapo_by_seed[r["seed"]] for r in done
             if r["seed"] in vapo_by_seed and not math.isnan(r["avg"])]
    out["avg_minus_vapo"], out["avg_minus_vapo_ci95"] = (
        mean_interval(diffs) if diffs else (math.nan, None))
    out["paired_seeds"] = len(diffs)
  for key in kind_keys(done):
    mean, half = mean_interval([r[key] for r in done if key in r and not math.isnan(r[key])])
    out[key], out[f"{key}_ci95"] = mean, half
    diffs = [r[key] - vapo_kinds[r["seed"]][key] for r in done
             if key in r and key in vapo_kinds.get(r["seed"], {})] if vapo_kinds else []
    if diffs:
      out[f"{key}_minus_vapo"], out[f"{key}_minus_vapo_ci95"] = mean_interval(diffs)
  if target is not None:
    steps = [first_step_reaching(r["curve"], target) for r in done]
    reached = [s for s in steps if s is not None]
    out["steps_to_vapo"] = sum(reached) / len(reached) if reached else None
    out["reached_vapo"] = len(reached)
  return out


def summarize(runs: Sequence, rows: Sequence) -> tuple[list[dict], list[dict]]:
  """(run records, row summaries) from the runs' files."""
  records = [run_record(r, read_status(r)) for r in runs if r.kind == "row"]
  by_row = {row.name: [r for r in records if r["row"] == row.name] for row in rows}
  vapo_by_seed = {r["seed"]: r["avg"] for r in by_row.get("vapo", [])
                  if r["state"] == "finished" and "avg" in r}
  vapo_kinds = {r["seed"]: r for r in by_row.get("vapo", [])
                if r["state"] == "finished" and "avg" in r}
  vapo = list(vapo_by_seed.values())
  target = sum(vapo) / len(vapo) if vapo else None
  return records, [row_summary(row, by_row[row.name], target, vapo_by_seed, vapo_kinds)
                   for row in rows]


def _fmt(mean: float, half: float | None, digits: int = 3, scale: float = 1.0) -> str:
  if mean is None or math.isnan(mean):
    return "—"
  text = f"{mean * scale:.{digits}f}"
  return text + (f" ± {half * scale:.{digits}f}" if half is not None else "")


def _pct(summary: dict, key: str) -> str:
  return _fmt(summary.get(key, math.nan), summary.get(f"{key}_ci95"), 1, 100)


def markdown(summaries: Sequence[dict], records: Sequence[dict], header: dict) -> str:
  """The table (accuracies in %, as the paper's)."""
  k = next((r["k"] for r in records if "k" in r), "k")
  lines = [f"# Ablation: {header['config']}", "",
           f"`{header['command']}`", "",
           f"Seeds {header['seeds']}; held-out avg@{k} and pass@{k} in % at the end of RL "
           f"(mean ± half-width of the 95% t-interval over the finished seeds); response "
           f"length (held-out, tokens), the share of held-out samples no longer than "
           f"eval.short_response_tokens (where set: guesses) and policy entropy (last RL "
           f"batch) at the end; RL "
           f"steps until held-out avg@{k} first reaches VAPO's final mean (seeds that reach "
           f"it). Paired Δ: per seed, the row's final avg@{k} minus VAPO's from the same "
           f"shared stages, mean ± 95% t-interval over the seeds (the seeds' SFT starts "
           f"cancel; an interval that excludes 0 is a difference). Paper: Qwen2.5-32B, AIME "
           f"2024 avg@32.", "",
           f"| row | paper AIME | avg@{k} % | paired Δ vs VAPO, points | pass@{k} % | "
           "response length | short answers % | entropy | steps to VAPO's final | crashed | "
           "seeds done |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for s in summaries:
    steps = ("—" if s.get("steps_to_vapo") is None
             else f"{s['steps_to_vapo']:.0f} ({s['reached_vapo']}/{s['finished']})")
    if "steps_to_vapo" not in s:
      steps = "— (no VAPO row)"
    lines.append(
        f"| {s['row']} ({s['label']}) | {'—' if s['paper'] is None else s['paper']} | "
        f"{_fmt(s['avg'], s['avg_ci95'], 1, 100)} | "
        f"{_fmt(s.get('avg_minus_vapo'), s.get('avg_minus_vapo_ci95'), 1, 100)} | "
        f"{_fmt(s['pass'], s['pass_ci95'], 1, 100)} | "
        f"{_fmt(s['response_length'], s['response_length_ci95'], 1)} | "
        f"{_fmt(s['guess_rate'], s['guess_rate_ci95'], 1, 100)} | "
        f"{_fmt(s['entropy'], s['entropy_ci95'], 3)} | {steps} | "
        f"{s['crashed']}/{s['seeds']} | {s['finished']}/{s['seeds']} |")
  kinds = kind_keys(summaries)
  kinds = [k for k in kinds if not k.endswith(("_ci95", "_minus_vapo"))]
  if kinds:
    names = [k.split("/", 1)[1] for k in kinds]
    lines += ["", f"Held-out avg@{k} % by kind of problem (`avg@{k}/<kind>`), and the paired "
              "Δ vs VAPO on each kind, points:", "",
              "| row | " + " | ".join(f"{n} | Δ {n}" for n in names) + " |",
              "|---|" + "---|---|" * len(names)]
    for s in summaries:
      cells = [f"{_pct(s, key)} | {_pct(s, f'{key}_minus_vapo')}" for key in kinds]
      lines.append(f"| {s['row']} | " + " | ".join(cells) + " |")
  walls = [r["wall_s"] for r in records if r.get("wall_s")]
  lines += ["", f"Wall time of the row runs: {hms(sum(walls))} "
            f"(stage runs: {hms(header['stage_wall_s'])})."]
  return "\n".join(lines) + "\n"


def plot(records: Sequence[dict], rows: Sequence, out_png: str) -> str:
  """Held-out avg@k and response length over RL steps: per row the mean over seeds and a
  band from the lowest to the highest seed."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("ablation.png needs matplotlib: pip install 'vapo_jax[plot]'") from e
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
  k = next((r["k"] for r in records if "k" in r), "k")
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, row in enumerate(rows):
    curves = [r for r in records if r["row"] == row.name and r.get("curve")]
    if not curves:
      continue
    color = colors[i % len(colors)]
    style = "-" if i < len(colors) else "--"
    for ax, key, scale in ((axes[0], "curve", 100.0), (axes[1], "length_curve", 1.0)):
      steps = sorted(set.intersection(*[{s for s, _ in r[key]} for r in curves]))
      values = [[dict(r[key])[s] * scale for r in curves] for s in steps]
      ax.plot(steps, [sum(v) / len(v) for v in values], style, color=color, marker="o",
              markersize=3, label=f"{row.name} ({len(curves)})")
      if len(curves) > 1:
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values],
                        color=color, alpha=0.15)
  axes[0].set_title(f"held-out avg@{k} (%), mean and range over seeds")
  axes[1].set_title("held-out response length (tokens)")
  for ax in axes:
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
  if axes[0].get_legend_handles_labels()[0]:
    axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out_png, dpi=90)
  plt.close(fig)
  return out_png


def band_verdict(directory: str) -> str:
  """Why a shared SFT start was refused (its band check's verdict), or ""."""
  path = os.path.join(directory, BAND_FILE)
  if os.path.basename(directory) != BAND_DIR or not os.path.exists(path):
    return ""
  with open(path, encoding="utf-8") as f:
    verdict = json.load(f)
  return "" if verdict["accepted"] else "SFT start outside SFT_BAND: " + "; ".join(
      verdict["failures"])


BAND_FILE = sft_band.OUT      # a band check's verdict
METRICS_DIR = "metrics"      # W/metrics/<run's path under W>.jsonl: each run's metrics.jsonl


def keep_metrics(workdir: str, runs: Sequence) -> None:
  """Copies every run's metrics.jsonl (and a band check's verdict) to W/metrics/, so a
  results folder made of W's top-level files holds each row's per-step record."""
  for run in runs:
    rel = os.path.relpath(run.directory, workdir)
    for name, suffix in (("metrics.jsonl", ".jsonl"), (BAND_FILE, ".json")):
      src = os.path.join(run.directory, name)
      if os.path.exists(src):
        dst = os.path.join(workdir, METRICS_DIR, rel + suffix)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)


def write_reports(workdir: str, runs: Sequence, rows: Sequence, header: dict
                  ) -> list[dict]:
  """ablation.jsonl, ablation.md and ablation.png from the runs' files, and the runs'
  metrics.jsonl under W/metrics/; returns the rows."""
  keep_metrics(workdir, runs)
  records, summaries = summarize(runs, rows)
  problems = paired_problems.paired(records, [row.name for row in rows])
  if not any("gain" in p or "vapo_minus_row" in p for p in problems):  # no records
    problems = []
  stage_wall = sum((read_status(r) or {}).get("wall_s") or 0 for r in runs if r.kind == "stage")
  with open(os.path.join(workdir, "ablation.jsonl"), "w", encoding="utf-8") as f:
    for rec in [*records, *summaries, *problems]:
      f.write(json.dumps(rec, default=_json_default) + "\n")
  with open(os.path.join(workdir, "ablation.md"), "w", encoding="utf-8") as f:
    f.write(markdown(summaries, records, {**header, "stage_wall_s": stage_wall})
            + paired_problems.markdown(problems))
  try:
    plot(records, rows, os.path.join(workdir, "ablation.png"))
  except ImportError as e:
    print(f"[ablate] no ablation.png: {e}", flush=True)
  return summaries


def _json_default(v):
  return None if isinstance(v, float) and math.isnan(v) else repr(v)
