"""The backend a program is traced for: the default backend, unless overridden.

A few kernels have a CPU-specific form (see `layers.decode_attention` and
`sampler.ops.last_logits`). Tracing picks it from `target()`, which is
`jax.default_backend()` except inside `targeting(name)`: an ahead-of-time
compile for another platform from this machine (the TPU compile check on a
CPU host) sets the target so the program is the one that platform would run.
Jitted functions do not key their trace cache on this: trace a fresh
`jax.jit` wrapper under the override.

`choose_kernel` picks between a TPU kernel and its pure-JAX path for a
setting's "auto" / "jax" / "tpu" (the train passes' splash attention, the
engine's paged attention).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

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


# How a kernel's refusal begins when the program is not for TPU: "auto" says nothing then.
OFF_TPU = "it runs on TPU only"

_SAID: set[tuple[str, str]] = set()


def choose_kernel(want: str, refusal: Callable[[], str | None], setting: str,
                  fallback: str, log=print) -> str:
  """"tpu" (the kernel) or "jax" (the pure-JAX path) for the kernel setting `setting`.

  want: "jax"; "tpu" -> ValueError with the reason `refusal()` gives, where it gives one;
  "auto" -> "tpu" where `refusal()` gives none, else "jax", logging `fallback: reason`
  once per process for each reason other than being off TPU (`OFF_TPU`).
  """
  if want == "jax":
    return "jax"
  why = refusal()
  if want == "tpu":
    if why:
      raise ValueError(f"{setting}='tpu': {why}; use 'auto' or 'jax'")
    return "tpu"
  if want != "auto":
    raise ValueError(f"attention kernel {want!r}: must be 'auto', 'jax' or 'tpu'")
  if why and not why.startswith(OFF_TPU) and (fallback, why) not in _SAID:
    _SAID.add((fallback, why))
    log(f"{fallback}: {why}", flush=True)
  return "jax" if why else "tpu"
