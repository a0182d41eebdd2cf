"""Test set-up: eight fake CPU devices, strict rank promotion, the `floor` marker.

XLA_FLAGS must be set before jax is imported anywhere, which is why it lives here.
"""

import os

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
