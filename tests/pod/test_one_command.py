"""The pod figure's one command: the README's pod row and docs/step_model.md give the same
command, and CI runs it. It prints the figure from the stamped train-collectives file of
benchmarks/hlo/ when that file is there, else it says, in one line, how to make it (the
config's collective matmuls are beyond the layout's arithmetic)."""

import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = ("python -m vapo_jax.pod.step_model --config=configs/qwen32b.py "
           "--arch=qwen2.5-32b --hfu=0.5")


def _read(path):
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def test_readme_and_docs_give_the_same_command():
  readme = [line for line in _read("README.md").splitlines() if "v5p-128 pod" in line]
  assert len(readme) == 1 and f"`{COMMAND}`" in readme[0]
  docs = _read("docs/step_model.md")
  today = docs.split("\n## ")[1]
  assert today.startswith("The step today") and COMMAND in today   # the page's first section


def test_the_command_prints_the_figure_or_how_to_make_its_file():
  out = subprocess.run([sys.executable] + shlex.split(COMMAND)[1:] + ["--host_chunk_ms=6"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  if out.returncode == 0:   # the stamped file is in the tree: it says which, and the figures
    assert re.search(r"train_collectives: \S*benchmarks/hlo/\S+\.json \(stamp ", out.stdout)
    assert len(re.findall(r"ratio [\d.]+×\n", out.stdout)) == 3
    assert out.stdout.count("optimistic reading") == 3
    assert out.stdout.count("tokens/s per chip") == 3
  else:
    err = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in err, err
    assert "cannot count model.collective_matmul" in err
    assert ("python -m vapo_jax.pod.train_hlo --config=configs/qwen32b.py "
            "--arch=qwen2.5-32b --topology=v5p-128 --layers=4,8 "
            "--json=benchmarks/hlo/train_collectives_v5p-128_") in err
