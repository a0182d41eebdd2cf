"""Test set-up: eight fake CPU devices, strict rank promotion, the `floor` marker, and tests/
on sys.path.

The tests live in folders shaped like the package (tests/rl/, tests/run/, ..., and one per
top-level folder: tests/experiments/, tests/benchmarks/, tests/repo/); the helper modules they
share (tiny_trainer, checkpoint_runs, tiny_hf, trainer_plugins, ...) live here, at tests/'s top,
and are imported by name. Test files have no __init__.py, so their basenames are unique.

XLA_FLAGS must be set before jax is imported anywhere, which is why it lives here.
"""

import os
import sys

# pytest's default (prepend) import mode puts this folder first on sys.path already; said
# here so that the helpers' home does not hang on the import mode.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
  sys.path.insert(0, _HERE)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
  # CI's floor leg (Python 3.11, jax 0.10.2) runs only these: `pytest -m floor tests`.
  config.addinivalue_line(
      "markers", "floor: also run on the oldest supported jax (CI's floor leg); together the "
      "marked tests exercise each part of the package once")
