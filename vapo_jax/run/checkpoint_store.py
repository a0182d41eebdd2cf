"""Training checkpoints with orbax: save in the background, restore onto any mesh, survive rot.

    workdir/checkpoints/<step>/arrays   named groups of jax arrays (orbax StandardSave, OCDBT)
    workdir/checkpoints/<step>/meta     JSON: where the run was, iterator states, PRNG key,
                                        counters, config, and a checksum per array
    workdir/checkpoints_corrupt/<step>  checkpoints that failed to restore, moved aside

A checkpoint is `groups` — {"policy": TrainState, "critic": TrainState, ...}, any pytrees of
jax arrays — plus a JSON `meta` dict. Trees are stored as their flat list of leaves, with the
leaves' key paths in `meta`, so restoring needs only a *like* tree (the new run's freshly
built state): its structure gives the tree back, and its leaves' shapes, dtypes and
shardings say where each array goes. A run restarted on a different mesh therefore gets its
arrays in its own shardings; orbax reads just the slices each device owns.

Integrity: each leaf's checksum is the wrapping uint32 sum of its bits, an exact integer that
does not depend on how the array is sharded or in which order the sum runs. A checkpoint that
does not restore, or whose checksums disagree, is reported with a warning, moved aside, and
the next older one is tried. Orbax writes into a temporary directory and renames it when the
save is complete, so a save cut short by a kill is never mistaken for a checkpoint.

Retention: the newest `keep` checkpoints, plus (with `keep_best`) the one with the highest
`score` (eval avg@k) among those saved with one.
"""

import os
import shutil
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_managers

from vapo_jax import distributed as dist

ARRAYS = "arrays"
META = "meta"


class CheckpointError(RuntimeError):
  """No checkpoint could be restored, or one does not fit the run that restores it."""


def _bits_u32(x: jax.Array) -> jax.Array:
  """The raw bits of x as uint32 words (one per element; 8-byte types give two)."""
  size = jnp.dtype(x.dtype).itemsize
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if size == 8:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  word = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
  return jax.lax.bitcast_convert_type(x, word).astype(jnp.uint32)


@jax.jit
def _checksums(leaves: list[jax.Array]) -> jax.Array:
  """uint32 [len(leaves)]: the wrapping sum of each leaf's bits, in one program."""
  return jnp.stack([jnp.sum(_bits_u32(x), dtype=jnp.uint32) for x in leaves])


def checksums(tree: Any) -> list[int]:
  """Per-leaf wrapping uint32 sums of the bits: equal iff (almost surely) the bits are.

  One jitted program per set of devices the leaves live on (one for a run's state), and one
  transfer of the results to the host. Not one program per leaf: on a multi-process run each
  reduction of a sharded leaf is a cross-process collective, and XLA's CPU client deadlocks
  when ~40 collective programs are dispatched ahead of their execution (the per-device
  in-flight semaphore is taken out of order while launches are chained in order) — a
  ~100-leaf state saved leaf by leaf hung every multi-process CPU run at its first saves.
  """
  leaves = jax.tree.leaves(tree)
  groups: dict[Any, list[int]] = {}
  for i, x in enumerate(leaves):
    groups.setdefault(frozenset(x.sharding.device_set), []).append(i)
  sums: list[int] = [0] * len(leaves)
  for idx in groups.values():
    values = jax.device_get(_checksums([leaves[i] for i in idx]))
    for i, v in zip(idx, values):
      sums[i] = int(v)
  return sums


def key_paths(tree: Any) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _flat(tree: Any) -> dict[str, Any]:
  return {f"{i:05d}": x for i, x in enumerate(jax.tree.leaves(tree))}


def _abstract(tree: Any) -> dict[str, jax.ShapeDtypeStruct]:
  return {f"{i:05d}": jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
          for i, x in enumerate(jax.tree.leaves(tree))}


class CheckpointStore:
  """The run's checkpoint directory.

  Args:
    directory: where checkpoints live (created).
    keep: how many of the newest checkpoints to keep.
    keep_best: also keep the best-scoring one (saves given a `score`).
    async_save: return from `save` once the arrays are copied off the devices and write
      them to disk in the background (the next save, `wait` or `close` waits for it).
    read_only: only restore (tools reading a run that may still be training): nothing is
      saved, cleaned up or moved aside.
  """

  def __init__(self, directory: str, *, keep: int = 3, keep_best: bool = True,
               async_save: bool = True, read_only: bool = False):
    self.directory = os.path.abspath(directory)
    self.read_only = read_only
    policies = [ocp_managers.LatestN(n=keep)]
    if keep_best:
      policies.append(ocp_managers.BestN(get_metric_fn=lambda m: m["score"], n=1,
                                         keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp_managers.AnyPreservationPolicy(policies),
        enable_async_checkpointing=async_save, create=not read_only, read_only=read_only,
        # A reader (evaluate / export of a live run) must not touch the writer's saves.
        cleanup_tmp_directories=not read_only)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={ARRAYS: ocp.StandardCheckpointHandler(),
                       META: ocp.JsonCheckpointHandler()})

  # ------------------------------------------------------------------------------ save
  def save(self, step: int, groups: dict[str, Any], meta: dict[str, Any], *,
           score: float | None = None) -> None:
    """Saves `groups` (pytrees of jax arrays) and `meta` (JSON) as checkpoint `step`.

    Returns once the arrays are safe to donate: orbax copies them to host memory before
    handing the write to a background thread.
    """
    meta = dict(meta, score=score,
                groups={name: {"paths": key_paths(tree), "checksums": checksums(tree)}
                        for name, tree in groups.items()})
    arrays = {name: _flat(tree) for name, tree in groups.items()}
    self._manager.save(step, args=ocp.args.Composite(**{
        ARRAYS: ocp.args.StandardSave(arrays), META: ocp.args.JsonSave(meta)}),
                       metrics=None if score is None else {"score": float(score)}, force=True)

  def wait(self) -> None:
    """Blocks until every save has been written."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  # --------------------------------------------------------------------------- restore
  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def best_step(self) -> int | None:
    """The kept checkpoint with the highest score, or None if none has one."""
    scored = [(m["score"], s) for s in self.steps()
              if (m := self.read_meta(s)).get("score") is not None]
    return max(scored)[1] if scored else None

  def read_meta(self, step: int) -> dict[str, Any]:
    out = self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
    return out[META]

  def restore(self, step: int, like: dict[str, Any]) -> dict[str, Any]:
    """Restores groups of checkpoint `step` into the structure and shardings of `like`.

    Raises:
      CheckpointError: a group is missing, its tree differs from `like`'s, or a checksum
        does not match (the files were damaged).
    """
    meta = self.read_meta(step)
    saved = meta.get("groups", {})
    for name, tree in like.items():
      if name not in saved:
        raise CheckpointError(f"checkpoint {step} has no {name!r} (it has {sorted(saved)})")
      mine, theirs = key_paths(tree), saved[name]["paths"]
      if mine != theirs:
        diff = next((f"{a} vs {b}" for a, b in zip(mine, theirs) if a != b),
                    f"{len(mine)} leaves vs {len(theirs)}")
        raise CheckpointError(f"checkpoint {step}: {name!r} does not match this run's model "
                              f"or optimizer (first difference: {diff})")
    target = {name: _abstract(tree) for name, tree in like.items()}
    out = self._manager.restore(step, args=ocp.args.Composite(**{
        ARRAYS: ocp.args.StandardRestore(target)}))[ARRAYS]
    groups = {}
    for name, tree in like.items():
      leaves = [out[name][f"{i:05d}"] for i in range(len(jax.tree.leaves(tree)))]
      groups[name] = jax.tree.unflatten(jax.tree.structure(tree), leaves)
      if checksums(groups[name]) != saved[name]["checksums"]:
        raise CheckpointError(f"checkpoint {step}: {name!r} restored with wrong checksums "
                              "(damaged files)")
    return groups

  def restore_latest(self, restore_fn: Callable[[int, dict[str, Any]], Any]) -> Any:
    """Newest checkpoint that restores: `restore_fn(step, meta)`; damaged ones moved aside.

    `restore_fn` builds the like-trees that `meta` calls for and calls `self.restore`; any
    exception it raises marks the checkpoint as bad. Returns None when there is none.
    """
    for step in reversed(self.steps()):
      error = None
      try:
        found = restore_fn(step, self.read_meta(step))
      except Exception as e:  # pylint: disable=broad-except
        error = e
      # Every host takes the same branch: a checkpoint damaged in one host's slices only is
      # set aside by all (otherwise the hosts would go on with different states and meet
      # in different collectives).
      if not dist.any_process(error is not None):
        return found
      reason = (f"{type(error).__name__}: {str(error)[:300]}" if error is not None
                else "it failed to restore on another host")
      where = "leaving it" if self.read_only else f"moving it to {self._quarantine_dir()}"
      warnings.warn(f"checkpoint {step} in {self.directory} cannot be restored ({reason}); "
                    f"{where} and trying the previous one")
      if not self.read_only:
        self._quarantine(step)
    return None

  def _quarantine_dir(self) -> str:
    return self.directory.rstrip("/") + "_corrupt"

  def _quarantine(self, step: int) -> None:
    if jax.process_index() == 0:
      src = os.path.join(self.directory, str(step))
      dst = os.path.join(self._quarantine_dir(), str(step))
      if os.path.exists(dst):
        shutil.rmtree(dst)
      os.makedirs(self._quarantine_dir(), exist_ok=True)
      if os.path.exists(src):
        shutil.move(src, dst)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices(f"vapo_quarantine_{step}")
    self._manager.reload()
