"""The experiments' commands define their absl flags when they run, not when imported.

Tests import the experiments' pure functions (`critic_fit.choose`, `ablate`'s planner) in
one pytest process beside the package's own commands; a module-level `DEFINE_*` there makes
the second module that defines `--config` fail with DuplicateFlagError, depending on test
order (the CI of 2026-12-06 failed so). Read with `ast`: a `DEFINE_*` call outside every
function body is the fault.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_level_defines(path: str) -> list[int]:
  """Line numbers of `*.DEFINE_*(...)` calls not inside a function or lambda."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  inside = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      inside.update(id(n) for n in ast.walk(node) if n is not node)
  return sorted(n.lineno for n in ast.walk(tree)
                if isinstance(n, ast.Call) and id(n) not in inside
                and isinstance(n.func, ast.Attribute) and n.func.attr.startswith("DEFINE_"))


def test_the_reader_finds_a_module_level_define(tmp_path):
  p = tmp_path / "m.py"
  p.write_text("from absl import flags\n_X = flags.DEFINE_string('x', '', '')\n"
               "def define():\n  flags.DEFINE_bool('y', False, '')\n")
  assert module_level_defines(str(p)) == [2]


def test_no_experiment_defines_flags_at_import():
  bad = {}
  for dirpath, dirnames, files in os.walk(os.path.join(ROOT, "experiments")):
    dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        if lines := module_level_defines(path):
          bad[os.path.relpath(path, ROOT)] = lines
  assert not bad, f"define these flags in a function called under __main__: {bad}"
