"""Carry a long ablation across machines: its finished runs' small files into the repository,
and back into a fresh workdir, so the same ablation command skips them there.

  python -m experiments.real_model.keep save W experiments/real_model/results/<name>
  python -m experiments.real_model.keep restore experiments/real_model/results/<name> W

The registered comparison (docs/real_model.md) needs more hours than one session has, and a
later session may start on another machine without the workdir. A run that finished is
summed up by a few files (`FILES`: its status, metrics, per-problem evaluation records and
the tail of its log; no checkpoints): `save` copies those of every finished run of W (and
W's reports) into the folder, `restore` copies them back into W. The ablation command then
counts those runs as done (`ablate_status.json`) and reads their figures for its table, and
it resumes or starts the others. A run that had not finished is not kept: it starts again
(from its own checkpoints where W survived).
"""

import json
import os
import shutil
import sys

STATUS = "ablate_status.json"
FILES = (STATUS, "metrics.jsonl")
FOLDERS = ("eval",)
LOG = "log.txt"
LOG_TAIL = 200        # lines of a run's log kept
REPORTS = ("ablation.md", "ablation.jsonl", "ablation.png")


def finished_runs(workdir: str) -> list[str]:
  """Directories (relative to workdir) of the runs whose status says finished."""
  out = []
  for root, _, files in os.walk(workdir):
    if STATUS in files:
      with open(os.path.join(root, STATUS), encoding="utf-8") as f:
        if json.load(f).get("state") == "finished":
          out.append(os.path.relpath(root, workdir))
  return sorted(out)


def _copy_run(src: str, dst: str, tail: bool) -> None:
  os.makedirs(dst, exist_ok=True)
  for name in FILES:
    if os.path.exists(os.path.join(src, name)):
      shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
  for name in FOLDERS:
    if os.path.isdir(os.path.join(src, name)):
      shutil.copytree(os.path.join(src, name), os.path.join(dst, name), dirs_exist_ok=True)
  if os.path.exists(os.path.join(src, LOG)):
    with open(os.path.join(src, LOG), encoding="utf-8", errors="replace") as f:
      lines = f.readlines()
    with open(os.path.join(dst, LOG), "w", encoding="utf-8") as f:
      f.writelines(lines[-LOG_TAIL:] if tail else lines)


def save(workdir: str, folder: str) -> list[str]:
  """Copies every finished run's files and W's reports into `folder`; returns the runs."""
  runs = finished_runs(workdir)
  os.makedirs(folder, exist_ok=True)   # the reports are kept before any run has finished too
  for rel in runs:
    _copy_run(os.path.join(workdir, rel), os.path.join(folder, "runs", rel), tail=True)
  for name in REPORTS:
    if os.path.exists(os.path.join(workdir, name)):
      shutil.copyfile(os.path.join(workdir, name), os.path.join(folder, name))
  return runs


def restore(folder: str, workdir: str) -> list[str]:
  """Copies the kept runs back into `workdir` (a run already finished there is left as it
  is); returns the runs restored."""
  kept = os.path.join(folder, "runs")
  done = set(finished_runs(workdir)) if os.path.isdir(workdir) else set()
  out = []
  for rel in finished_runs(kept) if os.path.isdir(kept) else []:
    if rel not in done:
      _copy_run(os.path.join(kept, rel), os.path.join(workdir, rel), tail=False)
      out.append(rel)
  return out


def main(argv: list[str]) -> int:
  if len(argv) != 3 or argv[0] not in ("save", "restore"):
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2
  verb, src, dst = argv
  if not os.path.isdir(src):
    print(f"{src}: no such folder", file=sys.stderr)
    return 1
  runs = save(src, dst) if verb == "save" else restore(src, dst)
  print(f"{verb}: {len(runs)} finished run(s)" + "".join(f"\n  {r}" for r in runs))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
