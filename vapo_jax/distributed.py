"""Multi-host runs: start-up, host-local ↔ global arrays, and "process 0 only" helpers.

Every host of a pod runs the same command. `initialize()` joins them into one JAX runtime:

  mode      when                          how
  ------    ----------------------------  ---------------------------------------------------
  auto      the default                   TPU pod VM (TPU_* env) or SLURM job with > 1 task:
                                          `jax.distributed.initialize()` finds the cluster by
                                          itself; JAX_COORDINATOR_ADDRESS set: explicit (below);
                                          otherwise one process, nothing to do
  explicit  local multi-process, any      coordinator "host:port", num_processes, process_id
            cluster JAX cannot detect     (flags, or JAX_COORDINATOR_ADDRESS,
                                          JAX_NUM_PROCESSES, JAX_PROCESS_ID)
  none      tests, notebooks              nothing

On CPU the collectives between processes use gloo (set before initialisation).

Data path. The trainer computes the *global* batch of a step identically on every host (same
iterator, same seed), then each host touches only the rows its own devices hold:

  rows = host_rows(sharding, B)              # e.g. [0..B/2) on host 0 of 2
  x = global_array(local_x, rows, (B, ...), sharding)   # assemble without any copy of others'
  rows, local = local_rows(x)                 # read back only what is addressable here
  full = to_host(x)                           # small arrays every host needs (metrics)

so each host tokenizes, transfers and scores only its share, and the global batch (and so the
result) is the same for 1 process × 4 devices and 2 processes × 2 devices.

This module imports only jax and numpy (floor 1).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

MODES = ("auto", "explicit", "none")


def _env_int(name: str) -> int | None:
  v = os.environ.get(name)
  return int(v) if v not in (None, "") else None


def detect(env: dict[str, str] | None = None) -> str:
  """Which cluster this process is in: 'tpu', 'slurm', 'explicit' or 'single'."""
  env = os.environ if env is None else env
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "explicit"
  if env.get("TPU_WORKER_HOSTNAMES") or env.get("TPU_WORKER_ID") is not None and env.get(
      "TPU_ACCELERATOR_TYPE"):
    return "tpu"
  if env.get("SLURM_JOB_ID") and int(env.get("SLURM_NTASKS", "1")) > 1:
    return "slurm"
  return "single"


def initialize(mode: str = "auto", *, coordinator: str | None = None,
               num_processes: int | None = None, process_id: int | None = None,
               local_device_ids: Sequence[int] | None = None) -> str:
  """Joins this process to the run's other processes (call before any other jax call).

  Returns what was done: 'none', 'single', 'tpu', 'slurm' or 'explicit'.

  Raises:
    ValueError: an unknown mode, or explicit mode without all three of coordinator,
      num_processes and process_id.
  """
  if mode not in MODES:
    raise ValueError(f"distributed mode {mode!r}; allowed: {MODES}")
  if mode == "none":
    return "none"
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = num_processes if num_processes is not None else _env_int(
      "JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  kind = "explicit" if (mode == "explicit" or coordinator) else detect()
  if kind == "single":
    return kind
  if kind == "explicit":
    missing = [n for n, v in (("coordinator", coordinator), ("num_processes", num_processes),
                              ("process_id", process_id)) if v is None]
    if missing:
      raise ValueError(f"explicit multi-process start needs {', '.join(missing)} (flags "
                       "--coordinator/--num_processes/--process_id or JAX_COORDINATOR_ADDRESS"
                       "/JAX_NUM_PROCESSES/JAX_PROCESS_ID)")
  if _wants_cpu():
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if kind == "explicit":
    jax.distributed.initialize(coordinator, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)
  else:  # TPU pods and SLURM: JAX reads the cluster from the environment.
    jax.distributed.initialize(local_device_ids=local_device_ids)
  return kind


def _wants_cpu() -> bool:
  platforms = os.environ.get("JAX_PLATFORMS", "") or str(jax.config.jax_platforms or "")
  return platforms.split(",")[0].strip() == "cpu"


def pace(x: Any) -> Any:
  """Waits for `x` on multi-process CPU runs (elsewhere returns it at once); returns x.

  Call it once per iteration of a host loop that dispatches collective programs (update
  minibatches, sampler calls). XLA's CPU client deadlocks when about 40 programs with
  cross-process collectives are dispatched ahead of their execution: the per-device
  in-flight semaphore is taken out of order while launches are chained in order. TPU and GPU
  runtimes queue per device and need no pacing.
  """
  if jax.process_count() > 1 and jax.default_backend() == "cpu":
    jax.block_until_ready(x)
  return x


def any_process(flag: bool) -> bool:
  """True on every process if `flag` is True on any (one small collective; call on all)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


def is_main() -> bool:
  """True on process 0: the one that writes logs, metrics and other files."""
  return jax.process_index() == 0


def main_print(*args, **kwargs) -> None:
  if is_main():
    print(*args, **kwargs)


# ---------------------------------------------------------------- host-local ↔ global arrays


def host_rows(sharding: jax.sharding.Sharding, rows: int) -> np.ndarray:
  """Sorted global row indices (dimension 0) of a [rows, ...] array that this process holds.

  Rows replicated on several local devices (tensor axis) appear once; rows that several
  processes hold (a batch shard spanning hosts) appear on each of them.
  """
  out = set()
  for index in sharding.addressable_devices_indices_map((rows,)).values():
    out.update(range(rows)[index[0]])
  return np.asarray(sorted(out), np.int64)


def global_array(local: np.ndarray, rows: np.ndarray, global_shape: tuple[int, ...],
                 sharding: jax.sharding.Sharding) -> jax.Array:
  """The global [B, ...] array from this process's rows (`local[i]` is global row `rows[i]`).

  Only the rows of this process's devices are read, so each host passes only its share.
  """
  local = np.asarray(local)
  where = {int(r): i for i, r in enumerate(rows)}
  if local.shape[1:] != tuple(global_shape[1:]) or len(local) != len(rows):
    raise ValueError(f"local rows {local.shape} do not match {len(rows)} rows of "
                     f"global shape {global_shape}")

  def piece(index):
    want = range(global_shape[0])[index[0]]
    try:
      block = local[[where[r] for r in want]]
    except KeyError as e:
      raise ValueError(f"row {e} of the global batch belongs to this process "
                       f"{jax.process_index()} but was not given") from None
    return block[(slice(None),) + tuple(index[1:])]

  return jax.make_array_from_callback(tuple(global_shape), sharding, piece)


def local_rows(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
  """(rows, data) of this process's addressable rows of a row-sharded array, rows sorted.

  Needs the non-row dimensions whole on each device (true of batch-sharded arrays).
  """
  blocks = {}
  for shard in x.addressable_shards:
    rs = range(x.shape[0])[shard.index[0]]
    if rs.start not in blocks:
      blocks[rs.start] = (rs, np.asarray(shard.data))
  rows, data = [], []
  for start in sorted(blocks):
    rs, d = blocks[start]
    if d.shape[1:] != x.shape[1:]:
      raise ValueError(f"local_rows needs whole rows on each device; shard {d.shape} "
                       f"of {x.shape}")
    rows.extend(rs)
    data.append(d)
  return np.asarray(rows, np.int64), np.concatenate(data)


def to_host(x: Any) -> Any:
  """The full value of (a pytree of) arrays as numpy on every process.

  One process, or a fully replicated array: a plain copy. Otherwise an all-gather across
  processes, so keep it for small arrays (lengths, scores, metrics).
  """

  def one(a):
    if not isinstance(a, jax.Array) or a.is_fully_addressable or a.is_fully_replicated:
      return np.asarray(jax.device_get(a))
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    return np.asarray(multihost_utils.process_allgather(a, tiled=True))

  return jax.tree.map(one, x)


def replicated(x: Any, mesh: jax.sharding.Mesh) -> Any:
  """A host value that every process holds identically, as a replicated global array."""
  sh = NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(lambda a: jax.make_array_from_callback(
      np.shape(a), sh, lambda idx, a=np.asarray(a): a[idx]), x)
