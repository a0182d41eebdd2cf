"""Evidence is data (issue 65 item 3): the results folders stay small, each says how its
files were made, and none holds code that imports the package.

The results folders: `benchmarks/results/` and `experiments/*/results/`, as git tracks them.
- Their tracked bytes stay at most `LIMIT` (per-problem and per-step records are kept
  gzipped; raw outputs a README can regenerate are left out).
- Every file sits in a folder of its own (a direct subfolder of a results dir, e.g.
  `benchmarks/results/trl-bench-2026-12-07/`), and every such folder has a README.md with a
  `Commit:` line naming a commit (7 to 40 hex digits) and a `Machine:` line (the CPU model, or
  "CPU not recorded"): the same command differs 2× between this project's machines.
- No file under them contains `import vapo_jax` or `from vapo_jax`: a script that made a
  figure lives in `benchmarks/` or `experiments/` as a tested tool, or is deleted and its
  README names the commit to `git show` it from.
"""

import gzip
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 3_000_000   # bytes
COMMIT = re.compile(r"Commit:\**.*?\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
MACHINE = re.compile(r"Machine:\**\s*\S")
IMPORT = re.compile(rb"\b(?:import|from) vapo_jax\b")


def tracked(root: str = ROOT) -> list[str]:
  """The tracked files under the results folders, relative to `root`."""
  out = subprocess.run(["git", "ls-files", "-z", "--", "benchmarks/results",
                        "experiments/*/results/*"], cwd=root, capture_output=True, check=True)
  return sorted(p for p in out.stdout.decode().split("\0") if p)


def results_dir(path: str) -> str:
  """The results dir a path lies under: `benchmarks/results` or `experiments/X/results`."""
  parts = path.split("/")
  return "/".join(parts[:parts.index("results") + 1])


def folders(paths) -> tuple[list[str], list[str]]:
  """(the folders directly under a results dir that hold files, the files lying loose in a
  results dir itself)."""
  found, loose = set(), []
  for p in paths:
    rest = p[len(results_dir(p)) + 1:].split("/")
    if len(rest) == 1:
      loose.append(p)
    else:
      found.add(f"{results_dir(p)}/{rest[0]}")
  return sorted(found), loose


def total_bytes(root: str, paths) -> int:
  return sum(os.lstat(os.path.join(root, p)).st_size for p in paths
             if os.path.lexists(os.path.join(root, p)))


def readme_faults(folder: str) -> list[str]:
  """What a results folder's README lacks: the file, its commit line or its machine line."""
  path = os.path.join(folder, "README.md")
  if not os.path.exists(path):
    return ["no README.md"]
  text = open(path, encoding="utf-8").read()
  return ([] if COMMIT.search(text) else ["no `Commit:` line with a commit hash"]) + (
      [] if MACHINE.search(text) else ["no `Machine:` line"])


def imports_the_package(path: str) -> bool:
  with open(path, "rb") as f:
    data = f.read()
  if path.endswith(".gz"):
    data = gzip.decompress(data)
  return bool(IMPORT.search(data))


# ---------------------------------------------------------------------- the helpers, on a fake tree


def make_tree(tmp_path, files: dict[str, str]) -> str:
  for rel, text in files.items():
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(gzip.compress(text.encode()) if rel.endswith(".gz") else text.encode())
  subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
  subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
  return str(tmp_path)


GOOD = "# x\n**Command:** `python x.py`\n**Commit:** 3c8393c\n**Machine:** CPU not recorded\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_helpers_find_each_fault(tmp_path):
  root = make_tree(tmp_path, {
      "benchmarks/results/good-2026-12-07/README.md": GOOD,
      "benchmarks/results/good-2026-12-07/sub/r.json": "{}",
      "benchmarks/results/no-readme/r.json": "{}",
      "benchmarks/results/loose.json": "{}",
      "experiments/a/results/no-commit/README.md": "Commit: the one of 2026-12-07\nMachine: x\n",
      "experiments/a/results/no-machine/README.md": "**Commit:** deadbeef1\n",
      "experiments/a/results/code/README.md": GOOD,
      "experiments/a/results/code/probe.py": "import jax\nfrom vapo_jax.pod import slices\n",
      "experiments/a/results/code/probe.py.txt.gz": "import vapo_jax\n",
      "experiments/a/notes.py": "import vapo_jax\n",             # not under results/
  })
  paths = tracked(root)
  assert "experiments/a/notes.py" not in paths and len(paths) == 9
  found, loose = folders(paths)
  assert loose == ["benchmarks/results/loose.json"]
  assert found == ["benchmarks/results/good-2026-12-07", "benchmarks/results/no-readme",
                   "experiments/a/results/code", "experiments/a/results/no-commit",
                   "experiments/a/results/no-machine"]
  faults = {f: readme_faults(os.path.join(root, f)) for f in found}
  assert faults == {
      "benchmarks/results/good-2026-12-07": [], "experiments/a/results/code": [],
      "benchmarks/results/no-readme": ["no README.md"],
      "experiments/a/results/no-commit": ["no `Commit:` line with a commit hash"],
      "experiments/a/results/no-machine": ["no `Machine:` line"]}
  assert [p for p in paths if imports_the_package(os.path.join(root, p))] == [
      "experiments/a/results/code/probe.py", "experiments/a/results/code/probe.py.txt.gz"]
  assert total_bytes(root, paths) == sum(
      os.path.getsize(os.path.join(root, p)) for p in paths)


def test_a_date_or_a_word_is_not_a_commit():
  assert not COMMIT.search("Commit: 20261207 (a date), decade, faced")
  assert COMMIT.search("**Commit:** 96cc85f (the probes)")
  assert COMMIT.search("Commit: at a1c82ea, then 98d2706")


# ------------------------------------------------------------------------------- the repository


@pytest.fixture(scope="module")
def paths():
  try:
    got = tracked()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  assert got, "no results folder tracked"
  return got


def test_tracked_results_stay_small(paths):
  assert total_bytes(ROOT, paths) <= LIMIT, (
      f"{total_bytes(ROOT, paths):,} bytes under the results folders (limit {LIMIT:,}): gzip "
      "records, keep one copy of identical files, drop raw outputs the README regenerates")


def test_every_results_folder_says_how_it_was_made(paths):
  found, loose = folders(paths)
  assert not loose, f"files directly in a results dir (give them a folder and a README): {loose}"
  faults = {f: readme_faults(os.path.join(ROOT, f)) for f in found}
  assert not {f: v for f, v in faults.items() if v}


def test_nothing_under_results_imports_the_package(paths):
  assert not [p for p in paths if os.path.exists(os.path.join(ROOT, p))
              and imports_the_package(os.path.join(ROOT, p))]
