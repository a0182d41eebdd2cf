"""A finished run's summary, small enough for the tree: held-out before / after, curves, manifest.

  python benchmarks/run_summary.py WORKDIR OUT_DIR --command="python -m vapo_jax.main ..." \\
      [--time_log=FILE] [--peaks=FILE]

Reads `WORKDIR/metrics.jsonl` (and `WORKDIR/curves.png` if the run drew it) and writes to
OUT_DIR: `summary.json` (every held-out evaluation record, the RL stage's per-step figures a
reader needs for the curves — reward, response length, entropy, explained variance, the
log-prob gap, step times — the command, commit, date, wall time and peak RSS from a
`/usr/bin/time -v` log, the machine's peaks if given, and the sha256 and size of the raw
metrics.jsonl, which stays out of the tree), `curves.png` (copied) and prints the markdown
table of the evaluations with the change from the first to the last.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess

PER_STEP = ("reward/mean", "reward/accuracy", "response/length_mean", "response/truncated_frac",
            "entropy", "value/explained_variance", "value_loss", "approx_kl", "clip_frac_high",
            "rollout/logp_gap_abs", "rollout/logp_gap_k3", "rollout/ratio_outside_frac",
            "time/step_s", "time/rollout_s", "time/reward_and_forward_s", "time/update_s")
EVAL = ("avg@", "pass@", "boxed_frac", "greedy_accuracy", "response_length", "truncated_frac")


def records(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def time_log(path: str) -> dict:
  """Wall seconds and peak RSS (GB) from `/usr/bin/time -v` output."""
  text = open(path, encoding="utf-8", errors="replace").read()
  out = {}
  m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
  if m:
    parts = [float(x) for x in m.group(1).split(":")]
    out["wall_s"] = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
  m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
  if m:
    out["peak_rss_gb"] = int(m.group(1)) / 1e6
  m = re.search(r"Exit status: (\d+)", text)
  if m:
    out["exit_status"] = int(m.group(1))
  return out


def summarize(workdir: str) -> dict:
  recs = records(os.path.join(workdir, "metrics.jsonl"))
  evals = [{k: v for k, v in r.items() if k == "step" or k.startswith(EVAL)}
           for r in recs if r.get("stage") == "eval"]
  steps = [{"stage": r["stage"], "step": r["step"],
            **{k: r[k] for k in PER_STEP if k in r}}
           for r in recs if r.get("stage") in ("value_pretrain", "rl")]
  return {"evals": evals, "steps": steps}


def table(evals: list[dict]) -> str:
  keys = [k for k in evals[0] if k != "step"]
  lines = ["| held-out | " + " | ".join(f"RL step {e['step']}" for e in evals) + " | change |",
           "|---|" + "---|" * (len(evals) + 1)]
  for k in keys:
    vals = [e.get(k) for e in evals]
    if any(v is None for v in vals):
      continue
    change = vals[-1] - vals[0]
    pts = k.startswith(("avg@", "pass@", "boxed", "greedy", "truncated"))
    fmt = (lambda v: f"{100 * v:.1f}%") if pts else (lambda v: f"{v:.1f}")
    delta = f"{100 * change:+.1f} points" if pts else f"{change:+.1f}"
    lines.append(f"| {k} | " + " | ".join(fmt(v) for v in vals) + f" | {delta} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("workdir")
  ap.add_argument("out")
  ap.add_argument("--command", required=True)
  ap.add_argument("--commit", default="")
  ap.add_argument("--time_log", default="")
  ap.add_argument("--peaks", default="", help="a file with quiet.py --peaks output")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  s = summarize(args.workdir)
  raw = os.path.join(args.workdir, "metrics.jsonl")
  with open(raw, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
  s["manifest"] = {"command": args.command, "commit": commit,
                   "raw_metrics": {"file": "metrics.jsonl", "sha256": digest,
                                   "bytes": os.path.getsize(raw),
                                   "regenerate": "run the command at the commit"}}
  if args.time_log:
    s["manifest"].update(time_log(args.time_log))
  if args.peaks:
    s["manifest"]["machine_peaks"] = open(args.peaks, encoding="utf-8").read().strip()
  with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(s, f, indent=1)
  curves = os.path.join(args.workdir, "curves.png")
  if os.path.exists(curves):
    shutil.copy(curves, os.path.join(args.out, "curves.png"))
  if s["evals"]:
    print(table(s["evals"]))


if __name__ == "__main__":
  main()
