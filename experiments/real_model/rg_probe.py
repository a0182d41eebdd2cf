"""The probe before any RL run: how a policy does on each reasoning-gym arm of a config.

    python -m experiments.real_model.rg_probe --config=configs/smollm2_rg.py \\
        --per_arm=64 --k=8 --out=experiments/real_model/results/rg-probe-2026-12-07/base.json
    python -m experiments.real_model.rg_probe --config=configs/smollm2_rg.py \\
        --workdir=/tmp/rg_sft --out=.../after_sft.json      # the newest checkpoint's policy
    python -m experiments.real_model.rg_probe --records=WORKDIR/eval/rl_step_0.jsonl \\
        --out=...                 # the table of a run's own evaluation (no sampling)

For each arm of `data.rg_arms` it samples k responses (the config's sampling temperature)
to the first `--per_arm` held-out problems of that arm (the split the runs evaluate on,
`data.reasoning_gym`) with the run's own sampler and checker (`Trainer.evaluate`), and
prints one row per arm and one pooled:

  avg@k, pass@k     as the run's evaluation reports them (lenient checker, score ≥ 1)
  share             the between-problem share of the 0/1 reward's variance (one-way ANOVA,
                    `variance_share.between_share`): what a value of the prompt alone can
                    explain; ≥ 0.2 means the arm is graded, not luck
  best shortcut     the highest share of problems an op-ignoring answer gets right
                    (`data.reasoning_gym.shortcut_hits` on the signed numbers: the sum, the
                    product, the last number, ..., 2 or 4 legs each)
  const             the share of problems whose answer is the arm's most frequent answer
  length, boxed     mean response tokens and the share of samples with a `\\boxed{}`
  greedy            the argmax decode's accuracy

The table goes to stdout and, with --out, to a JSON (rows, command, commit, CPU) and a
markdown file beside it.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from experiments.real_model import ceiling
from experiments.real_model import variance_share
from vapo_jax.data.reasoning_gym import arm_of

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined only when run as a command, so the module imports freely)."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "A run whose newest checkpoint's policy to probe (none: "
                      "the config's model).")
  flags.DEFINE_integer("per_arm", 64, "Held-out problems per arm.")
  flags.DEFINE_integer("k", 8, "Samples per problem.")
  flags.DEFINE_string("arms", "", "Probe only these arms (comma list; default every arm). The "
                      "config's arm list stays as it is: an arm's held-out problems depend on "
                      "its place in that list, so these are the problems the runs use.")
  flags.DEFINE_string("out", None, "Write the rows here (JSON; .md beside it).")
  flags.DEFINE_string("records", None, "Read an evaluation's per-problem records "
                      "(run.eval_records) instead of sampling; --config unused.")


def by_arm(examples, per_arm: int, only: str = "") -> dict[str, list]:
  """The first `per_arm` examples of each arm, arms in order of first appearance; with
  `only` (a comma list), those arms alone (an unknown name is an error)."""
  out = collections.OrderedDict()
  for ex in examples:
    rows = out.setdefault(arm_of(ex), [])
    if len(rows) < per_arm:
      rows.append(ex)
  if not only:
    return out
  names = [n.strip() for n in only.split(",") if n.strip()]
  unknown = [n for n in names if n not in out]
  if unknown:
    raise ValueError(f"--arms: {unknown} not among the config's arms {list(out)}")
  return collections.OrderedDict((n, out[n]) for n in out if n in names)


def row(records: list[dict], summary: dict, k: int) -> dict:
  """One table row from an evaluation's per-problem records and summary."""
  correct = np.array([r["correct"] for r in records], bool)
  answers = collections.Counter(r["answer"] for r in records)
  verdicts = [hits(r) for r in records]
  names = sorted({n for v in verdicts for n in v})
  shortcut = {n: float(np.mean([bool(v.get(n)) for v in verdicts])) for n in names}
  best = max(shortcut.items(), key=lambda kv: kv[1]) if shortcut else ("none", 0.0)
  return {"problems": len(records), f"avg@{k}": float(correct.mean()),
          f"pass@{k}": float(correct.any(1).mean()),
          "share": variance_share.between_share(correct)["share"],
          "best_shortcut": best[0], "best_shortcut_frac": best[1],
          "any_shortcut_frac": float(np.mean([any(v.values()) for v in verdicts])),
          "const_frac": answers.most_common(1)[0][1] / len(records),
          "length": float(np.mean([r["lengths"] for r in records])),
          "truncated": float(np.mean([r["truncated"] for r in records])),
          "boxed": summary.get("boxed_frac"), "greedy": summary.get("greedy_accuracy")}


def hits(record: dict) -> dict[str, bool]:
  """The op-ignoring shortcuts' verdicts on a record's problem: reasoning-gym's signed
  numbers for its problems (regenerated from the uid), else the record's own."""
  if not record["uid"].startswith("rg:"):
    return record.get("shortcuts") or {}
  from vapo_jax.data import reasoning_gym as rg  # pylint: disable=import-outside-toplevel
  _, entry = rg.entry_of(record["uid"])
  task = rg.parse_arm(rg_arm(record["uid"]))[1].task
  names = rg.shortcut_hits(task, entry)
  return {n: True for n in names} | {"none": False}


def from_records(path: str, per_arm: int, k: int) -> dict[str, dict]:
  """The table of an evaluation's records (boxed rate unknown per arm: none)."""
  from vapo_jax.run import eval_records  # pylint: disable=import-outside-toplevel
  records = eval_records.read(path)
  arms = collections.OrderedDict()
  for r in records:
    rows = arms.setdefault(rg_arm(r["uid"]), [])
    if len(rows) < per_arm:
      rows.append(r)
  def greedy(rs):
    g = [r["greedy"] for r in rs if r.get("greedy") is not None]
    return float(np.mean(g)) if g else None
  out = {name: row(rs, {"greedy_accuracy": greedy(rs)}, k) for name, rs in arms.items()}
  pooled = [r for rs in arms.values() for r in rs]
  out["pooled"] = row(pooled, {"greedy_accuracy": greedy(pooled)}, k)
  return out


def rg_arm(uid: str) -> str:
  return uid.rsplit(":", 2)[0][len("rg:"):]


def markdown(rows: dict[str, dict], k: int) -> str:
  head = (f"| arm | problems | avg@{k} | pass@{k} | share | best shortcut | const | length | "
          "truncated | boxed | greedy |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
  lines = []
  for name, r in rows.items():
    lines.append(
        f"| {name} | {r['problems']} | {r[f'avg@{k}']:.3f} | {r[f'pass@{k}']:.3f} | "
        f"{r['share']:.3f} | {r['best_shortcut']} {r['best_shortcut_frac']:.3f} | "
        f"{r['const_frac']:.3f} | {r['length']:.1f} | {r['truncated']:.3f} | "
        + (f"{r['boxed']:.3f}" if r["boxed"] is not None else "–") + " | "
        + (f"{r['greedy']:.3f}" if r["greedy"] is not None else "–") + " |")
  return head + "\n".join(lines) + "\n"


def probe(cfg, workdir: str | None, per_arm: int, k: int, only: str = "") -> dict[str, dict]:
  """{arm: row, ..., "pooled": row} of the policy (the config's, or the workdir's newest)."""
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  t = trainer_lib.Trainer(cfg, workdir, progress=False, read_only=True)
  rows, pooled, summaries = {}, [], []
  try:
    if workdir:
      t.resume()
    arms = by_arm(t.parts.eval_examples, per_arm, only)
    for name, examples in arms.items():
      with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.jsonl")
        summary = t.evaluate(examples, records_path=path)
        with open(path, encoding="utf-8") as f:
          records = [json.loads(line) for line in f if line.strip()]
      rows[name] = row(records, summary, k)
      print(f"{name}: {json.dumps(rows[name])}", flush=True)
      pooled += records
      summaries.append((summary, len(records)))
  finally:
    t.close()
  n = sum(c for _, c in summaries)
  mean = lambda key: (sum(s[key] * c for s, c in summaries) / n  # noqa: E731
                      if all(s.get(key) is not None for s, _ in summaries) else None)
  rows["pooled"] = row(pooled, {"boxed_frac": mean("boxed_frac"),
                                "greedy_accuracy": mean("greedy_accuracy")}, k)
  return rows


def main(argv):
  del argv
  if FLAGS.records:
    rows = from_records(FLAGS.records, FLAGS.per_arm, FLAGS.k)
    return report(rows, FLAGS.k)
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  c = FLAGS.config
  c.unlock()
  c.eval.samples_per_problem = FLAGS.k
  c.eval.num_examples = 1 << 20  # (every problem passed: the arm's own list)
  c.metrics.critic_heldout_batches = 0
  c.lock()
  cfg = config_lib.from_command_line(c)
  return report(probe(cfg, FLAGS.workdir, FLAGS.per_arm, FLAGS.k, FLAGS.arms), FLAGS.k)


def report(rows: dict[str, dict], k: int) -> None:
  table = markdown(rows, k)
  print(table)
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w", encoding="utf-8") as f:
      json.dump({"rows": rows, "command": " ".join(sys.argv), **ceiling.provenance(),
                 "workdir": FLAGS.workdir, "records": FLAGS.records}, f, indent=1)
    with open(os.path.splitext(FLAGS.out)[0] + ".md", "w", encoding="utf-8") as f:
      f.write(table)


if __name__ == "__main__":
  define_flags()
  app.run(main)
