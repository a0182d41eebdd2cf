"""The backend a program is traced for: the default backend, unless overridden.

A few kernels have a CPU-specific form (see `layers.decode_attention` and
`sampler.ops.last_logits`). Tracing picks it from `target()`, which is
`jax.default_backend()` except inside `targeting(name)`: an ahead-of-time
compile for another platform from this machine (the TPU compile check on a
CPU host) sets the target so the program is the one that platform would run.
Jitted functions do not key their trace cache on this: trace a fresh
`jax.jit` wrapper under the override.
"""

from __future__ import annotations

import contextlib
import threading

import jax

_state = threading.local()


def target() -> str:
  """"cpu", "tpu", "gpu", ...: the platform being traced for."""
  return getattr(_state, "name", None) or jax.default_backend()


@contextlib.contextmanager
def targeting(name: str):
  """Within the block, `target()` returns `name`."""
  previous = getattr(_state, "name", None)
  _state.name = name
  try:
    yield
  finally:
    _state.name = previous
