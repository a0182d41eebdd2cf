"""notebooks/quickstart.ipynb runs top to bottom on a CPU, so it cannot rot.

Its Hub cell is pointed at a tiny model in a Hub cache built here (offline); its install cell
is skipped (this checkout is the package); its accelerator cell says it skips on a CPU.
"""

import hashlib
import os

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

import hub_cache  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def test_quickstart_notebook_runs_on_cpu(tmp_path, monkeypatch):
  src = tmp_path / "tiny"
  hub_cache.tiny_checkpoint(src, seed=0)
  hub_cache.add_snapshot(tmp_path / "cache", "tiny-org/tiny-qwen2", hub_cache.dir_files(src),
                         hashlib.sha1(b"nb").hexdigest(), not_downloaded=("pytorch_model.bin",))
  for name, value in {"VAPO_SKIP_INSTALL": "1", "VAPO_NOTEBOOK_MODEL": "tiny-org/tiny-qwen2",
                      "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"),
                      "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}.items():
    monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": ROOT}})
  client.execute()  # raises CellExecutionError naming the cell that failed

  def text(cell):
    return "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.get("outputs", []))

  outputs = [text(c) for c in nb.cells if c.cell_type == "code"]
  import jax  # pylint: disable=import-outside-toplevel
  assert f"with jax {jax.__version__} (the preinstalled one, kept)" in outputs[0], outputs[0]
  assert any('"eval_after_rl"' in o for o in outputs), outputs
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
  assert images, "the curves were not drawn inline"
  assert any("tiny-org/tiny-qwen2: 2 layers" in o for o in outputs), outputs
  assert any("--- sample 1" in o for o in outputs), outputs
  assert "skipping the Colab config" in outputs[-1], outputs[-1]
