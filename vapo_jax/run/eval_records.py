"""Per-problem records of an evaluation: one JSON line per problem, beside its summary.

    workdir/eval/rl_step_<N>.jsonl   the run's own evaluations (N: the RL step, as the
                                     "eval" records of metrics.jsonl count it)
    workdir/eval/step_<N>.jsonl      `tools.evaluate` (N: the checkpoint), beside step_<N>.json

A line:

    {"index": 3, "uid": "word/0/test/3", "problem": "...", "answer": "26",
     "ops": ["+", "*"], "n_ops": 2,            # from a one-step-per-line worked solution, else null
     "correct": [false, true, true, false],    # each of the k samples (score >= threshold)
     "lengths": [41, 23, 25, 128], "truncated": [false, false, false, true],
     "greedy": true, "greedy_length": 24,      # null when greedy decoding was not evaluated
     "shortcuts": {"sum": false, ...}}         # data.shortcuts.verdicts on the same problem

A file is written whole, to a temporary name then renamed: a killed run leaves the previous
file or none, never half of one, and a resumed run that repeats an evaluation replaces its
file instead of adding lines. Only process 0 writes (every host holds the same scores).
`tools.compare` reads them and bootstraps over problems (`vapo_jax.bootstrap`).
"""

import json
import os

import jax
import numpy as np

from vapo_jax.data import shortcuts
from vapo_jax.data import sources

DIR = "eval"


def run_path(workdir: str, rl_step: int) -> str:
  """Where the run writes the records of its evaluation at `rl_step`."""
  return os.path.join(workdir, DIR, f"rl_step_{int(rl_step)}.jsonl")


def build(examples, correct_Nxk=None, lengths_Nxk=None, truncated_Nxk=None, greedy_N=None,
          greedy_lengths_N=None) -> list[dict]:
  """One record per example (see the module doc); absent parts are null."""
  def col(x, i):
    return None if x is None else np.asarray(x)[i].tolist()

  out = []
  for i, ex in enumerate(examples):
    ops = shortcuts.operations(ex.solution)
    out.append({
        "index": i, "uid": ex.uid, "problem": ex.problem, "answer": ex.answer,
        "ops": ops, "n_ops": None if ops is None else len(ops),
        "correct": col(correct_Nxk, i), "lengths": col(lengths_Nxk, i),
        "truncated": col(truncated_Nxk, i), "greedy": col(greedy_N, i),
        "greedy_length": col(greedy_lengths_N, i), "shortcuts": shortcuts.verdicts(ex)})
  return out


def write(path: str, records: list[dict]) -> None:
  """Writes `records` as JSON lines at `path`, atomically (process 0 only)."""
  if jax.process_index() != 0:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


def read(path: str) -> list[dict]:
  """The records of one file, in order.

  Raises:
    data.DataError: a malformed line (named `path:line`) or an empty file."""
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise sources.DataError(f"{path}:{n}: not a JSON line ({e.msg})") from None
      if not isinstance(rec, dict) or "uid" not in rec or "correct" not in rec:
        raise sources.DataError(f"{path}:{n}: not a per-problem evaluation record (needs uid and "
                         "correct)")
      out.append(rec)
  if not out:
    raise sources.DataError(f"{path}: no records")
  return out
