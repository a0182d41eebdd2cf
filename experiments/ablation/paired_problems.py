"""The ablation's rows compared problem by problem: paired bootstrap intervals from the runs'
per-problem evaluation records (`run.eval_records`: <run>/eval/rl_step_<N>.jsonl).

The t-interval of `ablation_report` treats each seed's final avg@k as one number, so with 3
seeds its interval is as wide as the seeds' spread allows, whatever the number of problems.
Here every row is the [seeds, problems] matrix of its final evaluation, and
`vapo_jax.tools.compare` resamples problems once for both rows (the pairing) and seeds per
row (`vapo_jax.bootstrap`):

  VAPO − row   Δ = m(vapo_final) − m(row_final) at the same (final) RL step, on the seeds
               both rows finished (seed s of a row is evaluated on the problems of seed s:
               the held-out split may be drawn per seed, and then problems pair only within
               a seed, `compare` aligning each seed's own problems);
  gain         Δ = m(row_final) − m(row_step0), each seed's own start.

A row enters only when every finished seed has records at the same final step (and at step 0
for its gain); what is missing is said in the `note` of the result instead.
"""

import os
import re
from typing import Sequence

from vapo_jax.run import eval_records
from vapo_jax.tools import compare as compare_lib

METRICS = ("avg", "pass", "greedy")
_STEP = re.compile(r"rl_step_(\d+)\.jsonl$")


def eval_steps(directory: str) -> dict[int, str]:
  """{RL step: path} of a run's per-problem evaluation records."""
  folder = os.path.join(directory, "eval")
  if not os.path.isdir(folder):
    return {}
  return {int(m.group(1)): os.path.join(folder, name) for name in os.listdir(folder)
          if (m := _STEP.fullmatch(name))}


def _row_files(records: Sequence[dict]) -> tuple[dict[int, str] | None, str]:
  """Per finished seed {step: path}; None (and why) if the seeds do not share a final step."""
  done = [r for r in records if r["state"] == "finished"]
  if not done:
    return None, "no finished seed"
  steps = {r["seed"]: eval_steps(r["directory"]) for r in done}
  finals = {max(s) if s else None for s in steps.values()}
  if None in finals or len(finals) != 1:
    return None, "seeds without per-problem records at one shared final step"
  return steps, ""


def _read(paths: Sequence[str]) -> list[list[dict]]:
  return [eval_records.read(p) for p in paths]


def paired(records: Sequence[dict], rows: Sequence[str], base: str = "vapo",
           num_samples: int = 10_000, seed: int = 0) -> list[dict]:
  """Per row: its gain over its start and, for rows other than `base`, base − row, each with
  the paired bootstrap interval of `tools.compare` per metric (kind "paired" records)."""
  files = {name: _row_files([r for r in records if r["row"] == name]) for name in rows}
  out = []
  base_steps = files.get(base, (None, ""))[0]
  for name in rows:
    steps, why = files[name]
    rec = {"kind": "paired", "row": name}
    if steps is None:
      out.append({**rec, "note": why})
      continue
    seeds = sorted(steps)
    final = max(next(iter(steps.values())))
    rec.update(final_step=final, seeds=seeds)
    end = _read([steps[s][final] for s in seeds])
    if all(0 in steps[s] for s in seeds):
      start = _read([steps[s][0] for s in seeds])
      gain = compare_lib.compare([start, end], metrics=METRICS, num_samples=num_samples,
                                 seed=seed)
      rec["gain"] = {m: e["diff"] for m, e in gain["metrics"].items()}
      rec["problems"] = gain["problems"]
      rec["shortcuts"] = gain.get("shortcuts", {})
    if name != base and base_steps is not None:
      base_final = max(next(iter(base_steps.values())))
      if base_final != final:
        rec["note"] = f"{base} ended at RL step {base_final}, this row at {final}"
      else:
        both = sorted(set(seeds) & set(base_steps))   # seed s of one row is paired with s
        if not both:
          rec["note"] = f"no seed finished in both {base} and this row"
        else:
          vs = compare_lib.compare(
              [_read([steps[s][final] for s in both]),
               _read([base_steps[s][final] for s in both])],
              metrics=METRICS, num_samples=num_samples, seed=seed)
          rec[f"{base}_minus_row"] = {m: e["diff"] for m, e in vs["metrics"].items()}
          rec["base_seeds"] = both
          if both != seeds or both != sorted(base_steps):
            rec["note"] = f"{base} − row on the seeds both finished: {both}"
    out.append(rec)
  return out


def _pts(iv: dict | None) -> str:
  if not iv:
    return "—"
  return f"{100 * iv['estimate']:+.1f} [{100 * iv['lo']:+.1f}, {100 * iv['hi']:+.1f}]"


def markdown(results: Sequence[dict], base: str = "vapo") -> str:
  """The section of ablation.md: one line per row, points with 95% intervals."""
  if not any("gain" in r or f"{base}_minus_row" in r for r in results):
    return ""
  lines = ["", "Paired over problems and seeds (the runs' per-problem records, "
           "`vapo_jax.tools.compare`; percentile bootstrap, problems resampled once for both "
           "sides, seeds per side): points with 95% intervals.", "",
           f"| row | final step | seeds | gain avg | gain pass | gain greedy | {base} − row avg"
           f" | {base} − row pass | {base} − row greedy | note |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    gain, vs = r.get("gain", {}), r.get(f"{base}_minus_row", {})
    lines.append(f"| {r['row']} | {r.get('final_step', '—')} | {len(r.get('seeds', []))} | "
                 + " | ".join(_pts(gain.get(m)) for m in METRICS) + " | "
                 + " | ".join(_pts(vs.get(m)) for m in METRICS) + f" | {r.get('note', '')} |")
  shortcuts = next((r["shortcuts"] for r in results if r.get("shortcuts")), None)
  if shortcuts:
    lines += ["", "Shortcuts on the same problems (answers that ignore the operations): "
              + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shortcuts.items()) + "."]
  return "\n".join(lines) + "\n"
