"""The package's imports run one way: no cycles, no import from a floor above.

The floors are the numbered list of docs/design.md ("Imports run one way, down these
floors", top floor first): each backticked name of an item that is a top-level module or
package of vapo_jax (`config`, `rl/`, `main.py`) or a folder of the repository
(`benchmarks/`) is on that floor. Every import of every module of vapo_jax/ counts, read
with `ast`: module level, inside functions (lazy), under `if TYPE_CHECKING`.
"""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "vapo_jax")
# tools/ablate <-> tools/sft_band import each other (lazily); issue 41 moves the three
# research tools out of the package to experiments/. Until then the cycle among them is
# not counted (their imports still must point down the floors); once moved this is a no-op.
LEAVING = frozenset(f"vapo_jax.tools.{m}" for m in ("ablate", "sft_band", "ablation_report")
                    if os.path.exists(os.path.join(PKG, "tools", f"{m}.py")))


def modules() -> dict[str, str]:
  """{dotted module name: file} of every module of vapo_jax (a package is its __init__)."""
  out = {}
  for dirpath, dirnames, files in os.walk(PKG):
    dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
        out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(dirpath, f)
  return out


def imports(name: str, path: str, known) -> set[str]:
  """The modules `name` imports: `from a.b import c` is a.b.c when that is a module, else
  the package a.b; relative imports resolved; imports outside vapo_jax kept by top name."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      for a in node.names:
        out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
  return out


def graph() -> dict[str, set[str]]:
  """{module: what it imports (vapo_jax modules, and the top names of anything else)}."""
  mods = modules()
  return {m: imports(m, p, mods) for m, p in mods.items()}


def floors() -> dict[str, int]:
  """{top-level name (`config`, `rl`, `benchmarks`): its floor, 1 = the top}."""
  text = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()
  start = text.index("\n1. ", text.index("Imports run one way, down these floors"))
  items = re.findall(r"^(\d+)\. (.*(?:\n   .*)*)", text[start:text.index("\n\n", start)], re.M)
  out = {}
  for number, body in items:
    for token in re.findall(r"`([^`]+)`", body):
      top = token.removesuffix("/").removesuffix(".py")
      if not re.fullmatch(r"\w+", top):
        continue  # a dotted name (`rl.advantages.ESTIMATORS`) is not a floor entry
      if (os.path.exists(os.path.join(PKG, top + ".py")) or os.path.isdir(os.path.join(PKG, top))
          or (token.endswith("/") and os.path.isdir(os.path.join(ROOT, top)))):
        assert top not in out, f"docs/design.md puts `{top}` on floors {out[top]} and {number}"
        out[top] = int(number)
  # `pod/` (the pod sizing tools, issue 55) is on the top floor with the user commands of
  # `tools/` it left: it imports run/ and below, nothing imports it. Placed here until the
  # list in docs/design.md names it (then the list's floor is the one checked).
  out.setdefault("pod", out["tools"])
  return out


def floor_of(module: str, table: dict[str, int]) -> int:
  parts = module.split(".")
  if len(parts) == 1:
    return max(table.values())  # vapo_jax/__init__: a docstring and __version__
  return table[parts[1]]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (or a self-import)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(g.get(v, ())):
      if w not in g:
        continue
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1 or v in g.get(v, ()):
        out.append(sorted(comp))

  for v in sorted(g):
    if v not in index:
      visit(v)
  return out


def upward(g: dict[str, set[str]], table: dict[str, int]) -> list[str]:
  """Each import of a module from a floor above its own, as a line."""
  bad = []
  for m, targets in sorted(g.items()):
    for t in sorted(targets):
      if t in g and floor_of(t, table) < floor_of(m, table):
        bad.append(f"{m} (floor {floor_of(m, table)}) imports {t} (floor {floor_of(t, table)})")
  return bad


def outside(g: dict[str, set[str]]) -> list[str]:
  """Imports by vapo_jax of the repository's other code: its folders (benchmarks/,
  experiments/, tests/, ...) or a script in one of them (`import quiet`)."""
  local = set()
  for entry in os.listdir(ROOT):
    full = os.path.join(ROOT, entry)
    if entry == "vapo_jax" or entry.startswith("."):
      continue
    if os.path.isdir(full):
      local.add(entry)
      local.update(f[:-3] for f in os.listdir(full) if f.endswith(".py"))
    elif entry.endswith(".py"):
      local.add(entry[:-3])
  return [f"{m} imports {t}" for m, targets in sorted(g.items()) for t in sorted(targets)
          if t not in g and t.split(".")[0] in local]


@pytest.fixture(scope="module")
def real():
  return graph(), floors()


def test_every_module_has_a_floor(real):
  g, table = real
  assert {"config", "rl", "sampler", "losses", "tools", "pod", "main", "benchmarks"} <= set(table)
  assert table["pod"] < table["run"]  # the pod tools ask run/ (`run.pass_sizes`), never the reverse
  missing = sorted({m.split(".")[1] for m in g if "." in m} - set(table))
  assert not missing, f"give these a floor in docs/design.md: {missing}"


def test_no_import_cycles(real):
  g, _ = real
  g = {m: {t for t in ts if not (m in LEAVING and t in LEAVING)} for m, ts in g.items()}
  assert cycles(g) == [], "import cycles"


def test_no_upward_imports(real):
  g, table = real
  assert upward(g, table) == []


def test_the_package_imports_none_of_the_repositorys_other_code(real):
  g, _ = real
  assert outside(g) == []


def test_the_checks_catch_a_planted_cycle_and_upward_import(real):
  g, table = real
  planted = {m: set(ts) for m, ts in g.items()}
  planted["vapo_jax.losses"].add("vapo_jax.rl.advantages")  # the shim issue 41 removed
  assert ["vapo_jax.losses", "vapo_jax.rl.advantages"] in [
      [m for m in c if m in ("vapo_jax.losses", "vapo_jax.rl.advantages")] for c in cycles(planted)]
  assert "vapo_jax.losses (floor 7) imports vapo_jax.rl.advantages (floor 4)" in upward(
      planted, table)
  planted["vapo_jax.run.learners"].add("vapo_jax.pod.step.setup")  # run/ asking the pod tools
  assert (f"vapo_jax.run.learners (floor {table['run']}) imports vapo_jax.pod.step.setup "
          f"(floor {table['pod']})") in upward(planted, table)
  planted["vapo_jax.gae"].add("quiet")  # benchmarks/quiet.py
  assert outside(planted) == ["vapo_jax.gae imports quiet"]
  # Lazy imports inside functions count (config.rl checks names against rl's tables).
  mods = modules()
  assert "vapo_jax.rl.advantages" in imports("vapo_jax.config.rl", mods["vapo_jax.config.rl"],
                                             mods)
