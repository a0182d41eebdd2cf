"""Two evaluations (or rows of several seeds) on the same problems, with paired bootstrap
intervals over problems, beside the shortcut baselines of those problems.

  # one run, before vs after (its own evaluations at RL steps 0 and 20): B − A
  python -m vapo_jax.tools.compare /tmp/run/eval/rl_step_0.jsonl /tmp/run/eval/rl_step_20.jsonl
  # two configs at the same step, three seeds each (comma-separated, one file per seed)
  python -m vapo_jax.tools.compare grpo_s0/eval/rl_step_20.jsonl,grpo_s1/...,grpo_s2/... \\
      vapo_s0/eval/rl_step_20.jsonl,vapo_s1/...,vapo_s2/... --labels=grpo,vapo --by_ops
  # one row alone: its scores with intervals over problems (and seeds)
  python -m vapo_jax.tools.compare /tmp/run/eval/step_28.jsonl

Each file is the per-problem records of one evaluation (`run.eval_records`: written by every
run in `workdir/eval/rl_step_<N>.jsonl` and by `tools.evaluate`). Problems are matched by
uid (and must have the same text); only problems in every file are compared. When the
seeds drew problems of their own (a held-out split generated per seed) and the rows have as
many seeds, seed s of every row is compared on seed s's problems (file s of each row), and
the [seeds, problems] matrices are aligned that way. Per problem:
avg = correct samples / k, pass = any correct, greedy = the greedy answer correct. The
difference B − A of the rows' mean scores gets a paired percentile bootstrap interval
(`vapo_jax.bootstrap`: problems resampled once for both rows, seeds per row), deterministic
given `--seed`. `--by_ops` repeats avg per structure of operations (the order of kinds, "+*").
The shortcut rows are the answers that ignore the operations (`data.shortcuts`), scored on
the same problems: a score at or below them is no evidence of solving.
"""

import json

import numpy as np
from absl import app
from absl import flags

from vapo_jax import bootstrap
from vapo_jax.data import shortcuts
from vapo_jax.data import sources
from vapo_jax.run import eval_records

METRICS = {
    "avg": lambda r: float(np.mean(r["correct"])),
    "pass": lambda r: float(any(r["correct"])),
    "greedy": lambda r: None if r.get("greedy") is None else float(r["greedy"]),
}


def _paired(rows: list[list[list[dict]]]
            ) -> tuple[list[str] | None, list[list[str]], list[list[dict[str, dict]]]]:
  """(shared uids or None, the uids of each seed position, each file's records by uid).

  Shared: the problems every file holds (in the first file's order), the same for every seed
  position. Otherwise, when each seed drew problems of its own (a split generated per seed)
  and every row has the same number of files: per position s the problems of file s of
  every row, the same number at every position (row r's file s is paired with file s of
  every other row)."""
  by_uid = [[{r["uid"]: r for r in recs} for recs in row] for row in rows]
  first = by_uid[0][0]
  common = [u for u in first if all(u in f for row in by_uid for f in row)]
  if common:
    shared, cols = common, [common] * len(by_uid[0])
  else:
    seeds = {len(row) for row in by_uid}
    if len(seeds) != 1:
      raise sources.DataError("the evaluations share no problem (uid), and the rows have "
                              "different numbers of seeds to pair seed by seed")
    shared = None
    cols = [[u for u in by_uid[0][s] if all(u in row[s] for row in by_uid)]
            for s in range(seeds.pop())]
    if not all(cols) or len({len(c) for c in cols}) != 1:
      raise sources.DataError(
          "the evaluations share no problem (uid); seed by seed they share "
          + ", ".join(str(len(c)) for c in cols) + " problems (pairing needs one number > 0)")
  for row in by_uid:
    for s, f in enumerate(row):
      ref = first if shared else by_uid[0][s]
      for u in (shared or cols[s]):
        if "problem" in f[u] and "problem" in ref[u] and f[u]["problem"] != ref[u]["problem"]:
          raise sources.DataError(f"problem {u} has different texts in two evaluations: "
                                  "not the same problems (was the generator changed?)")
  return shared, cols, by_uid


def _matrix(row: list[dict[str, dict]], cols: list[list[str]], metric: str
            ) -> np.ndarray | None:
  """[seeds, problems] per-problem scores of one row (file s on problems `cols[s]`), or None
  if a record lacks the metric."""
  vals = [[METRICS[metric](f[u]) for u in cols[s]] for s, f in enumerate(row)]
  if any(v is None for seed in vals for v in seed):
    return None
  return np.asarray(vals, np.float64)


def _structure(rec: dict) -> str:
  return "".join(rec["ops"]) if rec.get("ops") else "?"


def compare(rows: list[list[list[dict]]], *, metrics=("avg", "pass", "greedy"),
            num_samples: int = 10_000, seed: int = 0, level: float = 0.95,
            by_ops: bool = False) -> dict:
  """Scores of one or two rows (each a list of per-seed record lists) on their shared
  problems, the difference (row 2 − row 1) with its paired bootstrap interval, and the
  shortcut baselines. Returns a JSON-able dict (see `format_table`)."""
  if not 1 <= len(rows) <= 2 or not all(rows):
    raise ValueError("give one or two rows, each of one or more evaluations")
  shared, cols, by_uid = _paired(rows)

  def cols_of(row, uids=None):
    return [uids or shared] * len(row) if shared else cols

  first = by_uid[0][0]
  out = {"problems": len(cols[0]), "seeds": [len(r) for r in rows],
         "problems_per_file": [[len(f) for f in row] for row in by_uid], "metrics": {}}
  kw = dict(num_samples=num_samples, seed=seed, level=level)
  if not shared:
    out["problems_per_seed"] = "own"   # seed s of every row on seed s's problems
  for m in metrics:
    mats = [_matrix(row, cols_of(row), m) for row in by_uid]
    if any(x is None for x in mats):
      continue
    entry = {"rows": [bootstrap.interval(x, **kw).as_dict() for x in mats]}
    if len(mats) == 2:
      entry["diff"] = bootstrap.interval(mats[1], mats[0], **kw).as_dict()
    out["metrics"][m] = entry
  if by_ops and not shared:
    raise sources.DataError("--by_ops needs the same problems in every file (here each seed "
                            "has problems of its own)")
  if by_ops:
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(shared):
      groups.setdefault(_structure(first[u]), []).append(i)
    out["by_ops"] = {}
    for g, idx in sorted(groups.items()):
      mats = [_matrix(row, cols_of(row, [shared[i] for i in idx]), "avg") for row in by_uid]
      entry = {"problems": len(idx), "rows": [float(x.mean()) for x in mats]}
      if len(mats) == 2:
        entry["diff"] = bootstrap.interval(mats[1], mats[0], **kw).as_dict()
      out["by_ops"][g] = entry
  # The shortcuts on the problems compared: every seed's, when the seeds have their own.
  recs = ([first[u] for u in shared] if shared else
          [by_uid[0][s][u] for s, c in enumerate(cols) for u in c])
  if all("shortcuts" in r for r in recs):
    out["shortcuts"] = {k: float(np.mean([r["shortcuts"][k] for r in recs]))
                        for k in recs[0]["shortcuts"]}
    out["shortcuts"]["best"] = max(out["shortcuts"].values())
  if all("problem" in r and "answer" in r for r in recs):
    out.setdefault("shortcuts", {})["template"] = shortcuts.template_score(
        [sources.Example(problem=r["problem"], answer=r["answer"]) for r in recs])
  return out


def _pct(x: float) -> str:
  return f"{100 * x:.1f}%"


def _row(iv: dict) -> str:
  return f"{_pct(iv['estimate'])} [{_pct(iv['lo'])}, {_pct(iv['hi'])}]"


def _pts(iv: dict) -> str:
  return (f"{100 * iv['estimate']:+.1f} [{100 * iv['lo']:+.1f}, {100 * iv['hi']:+.1f}]")


def format_table(result: dict, labels=("A", "B"), level: float = 0.95) -> str:
  """The comparison as text: one line per metric, then the shortcuts."""
  seeds = result["seeds"]
  where = ("per seed, each seed's own (seed s of each row paired)"
           if result.get("problems_per_seed") == "own" else "in every evaluation")
  lines = [f"{result['problems']} problems {where}; "
           + ", ".join(f"{lab}: {s} evaluation(s)" for lab, s in zip(labels, seeds))]
  head = "  ".join(f"{lab + ' [' + str(round(100 * level)) + '%]':>26}" for lab in labels)
  diff = f"{labels[1]} − {labels[0]}, points [{round(100 * level)}% interval]" \
      if len(seeds) == 2 else ""
  lines.append(f"{'metric':<8}{head}  {diff}")
  for m, e in result["metrics"].items():
    cells = "  ".join(f"{_row(r):>26}" for r in e["rows"])
    lines.append(f"{m:<8}{cells}  {_pts(e['diff']) if 'diff' in e else ''}")
  for g, e in result.get("by_ops", {}).items():
    cells = "  ".join(f"{_pct(r):>26}" for r in e["rows"])
    lines.append(f"{'avg ' + g:<8}{cells}  {_pts(e['diff']) if 'diff' in e else ''}"
                 f"  ({e['problems']} problems)")
  if "shortcuts" in result:
    sc = result["shortcuts"]
    lines.append("shortcuts on these problems: " + ", ".join(
        f"{k} {_pct(v)}" for k, v in sc.items()))
  return "\n".join(lines)


def define_flags() -> None:
  """The command's flags (defined only when run as a command, so the module imports freely)."""
  flags.DEFINE_list("labels", None, "A name per row (default: A, B).")
  flags.DEFINE_list("metrics", ["avg", "pass", "greedy"], "Of avg, pass, greedy.")
  flags.DEFINE_integer("samples", 10_000, "Bootstrap replicates.")
  flags.DEFINE_integer("seed", 0, "Bootstrap seed.")
  flags.DEFINE_float("level", 0.95, "Interval level.")
  flags.DEFINE_bool("by_ops", False, "Also avg per structure of operations.")
  flags.DEFINE_string("json", None, "Also write the result as JSON here.")


def main(argv):
  f = flags.FLAGS
  args = argv[1:]
  if not 1 <= len(args) <= 2:
    raise app.UsageError("give one or two rows: FILE[,FILE...] [FILE[,FILE...]]")
  if set(f.metrics) - set(METRICS):
    raise app.UsageError(f"--metrics must be of {sorted(METRICS)}, got {f.metrics}")
  labels = f.labels or ["A", "B"][:len(args)]
  if len(labels) != len(args):
    raise app.UsageError(f"--labels has {len(labels)} names for {len(args)} rows")
  rows = [[eval_records.read(p) for p in arg.split(",") if p] for arg in args]
  result = compare(rows, metrics=f.metrics, num_samples=f.samples, seed=f.seed, level=f.level,
                   by_ops=f.by_ops)
  result["files"] = [arg.split(",") for arg in args]
  print(format_table(result, labels, f.level))
  if f.json:
    with open(f.json, "w", encoding="utf-8") as out:
      json.dump(result, out, indent=1)


if __name__ == "__main__":
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel
  define_flags()
  cli.run(main)
