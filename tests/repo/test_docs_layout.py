"""The repository's one layout tree (docs/design.md, "Layout") agrees with the files.

The tree is the first fenced block under "## Layout". A line that starts (after its indent)
with a path, `run/` or `trainer.py` or several joined by ", ", names those paths; its indent
over 2 is its depth, so it sits in the folder named by the nearest shallower line above it.
Any other line continues a description. Checked: every named path exists; every module of
`vapo_jax/` (a `.py` file other than `__init__.py`, or a package) and of each folder the tree
opens (names something inside) is named; every top-level folder of the repository is named.
"""

import fnmatch
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = r"[\w.-]+/?"
ENTRY = re.compile(rf"( *)({NAME}(?:, {NAME})*)(?:  +\S.*)?$")


def tree_text(design: str) -> str:
  """The first fenced block after the `## Layout` heading."""
  start = design.index("```\n", design.index("\n## Layout\n")) + 4
  return design[start:design.index("```", start)]


def entries(tree: str) -> list[str]:
  """Every path the tree names, relative to the repository root (folders end in `/`)."""
  out, stack = [], []  # stack: (depth, folder path) of the open folders
  for line in tree.splitlines():
    m = ENTRY.match(line)
    if not m or not any(n.endswith(("/", ".py", ".md")) for n in m.group(2).split(", ")):
      continue  # a description's continuation
    depth = len(m.group(1)) // 2
    while stack and stack[-1][0] >= depth:
      stack.pop()
    parent = stack[-1][1] if stack else ""
    for name in m.group(2).split(", "):
      out.append(parent + name)
    if len(m.group(2).split(", ")) == 1 and m.group(2).endswith("/"):
      stack.append((depth, parent + m.group(2)))
  return out


def ignored(root: str) -> list[str]:
  """The top-level names .gitignore leaves out (`/build/`, `*.egg-info/`): not the tree's."""
  path = os.path.join(root, ".gitignore")
  lines = open(path, encoding="utf-8").read().split() if os.path.exists(path) else []
  return [line.strip("/") for line in lines if line.endswith("/")]


def members(root: str, folder: str) -> set[str]:
  """The modules of a folder as the tree names them: `x.py` and packages `x/`; at the
  repository's top, its folders (not hidden, not ignored)."""
  path = os.path.join(root, folder)
  out, skip = set(), ignored(root)
  for name in os.listdir(path):
    full = os.path.join(path, name)
    if folder == "":
      if (os.path.isdir(full) and not name.startswith(".")
          and not any(fnmatch.fnmatch(name, pat) for pat in skip)):
        out.add(name + "/")
    elif name.endswith(".py") and name != "__init__.py":
      out.add(folder + name)
    elif os.path.isfile(os.path.join(full, "__init__.py")):
      out.add(folder + name + "/")
  return out


def problems(root: str, tree: str) -> list[str]:
  """What is wrong with the tree against the files under `root`, one line each."""
  named = entries(tree)
  out = [f"{p}: named in the tree, not in the repository" for p in named
         if not os.path.exists(os.path.join(root, p))]
  opened = {"", "vapo_jax/"} | {os.path.dirname(p.rstrip("/")) + "/" for p in named if "/" in
                                p.rstrip("/")}
  for folder in sorted(f for f in opened if os.path.isdir(os.path.join(root, f))):
    out += [f"{p}: in the repository, not in the tree" for p in
            sorted(members(root, folder) - set(named))]
  return out


def test_the_layout_tree_matches_the_files():
  design = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()
  tree = tree_text(design)
  assert "vapo_jax/main.py" in entries(tree) and "vapo_jax/rl/update.py" in entries(tree)
  assert not problems(ROOT, tree), "update docs/design.md's Layout:\n" + "\n".join(
      problems(ROOT, tree))


def test_a_missing_or_unlisted_module_is_found(tmp_path):
  for f in ("pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/sub/__init__.py", "pkg/sub/c.py",
            "pkg/sub/d.py", "docs/x.md"):
    (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / f).write_text("")
  tree = ("pkg/\n"
          "  a.py, gone.py          two modules, one of them gone\n"
          "  sub/                   a package\n"
          "    c.py                   c, whose description\n"
          "                           goes on: d.py is not named\n"
          "docs/\n")
  assert entries(tree) == ["pkg/", "pkg/a.py", "pkg/gone.py", "pkg/sub/", "pkg/sub/c.py", "docs/"]
  assert problems(str(tmp_path), tree.replace("pkg/\n", "vapo_jax/\n")) == [
      "vapo_jax/: named in the tree, not in the repository",
      "vapo_jax/a.py: named in the tree, not in the repository",
      "vapo_jax/gone.py: named in the tree, not in the repository",
      "vapo_jax/sub/: named in the tree, not in the repository",
      "vapo_jax/sub/c.py: named in the tree, not in the repository",
      "pkg/: in the repository, not in the tree"]
  assert problems(str(tmp_path), tree) == [
      "pkg/gone.py: named in the tree, not in the repository",
      "pkg/b.py: in the repository, not in the tree",
      "pkg/sub/d.py: in the repository, not in the tree"]
