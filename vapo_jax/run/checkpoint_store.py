"""Training checkpoints with orbax: save in the background, restore onto any mesh, survive rot.

    workdir/checkpoints/<step>/arrays   named groups of jax arrays (orbax StandardSave, OCDBT)
    workdir/checkpoints/<step>/meta     JSON: where the run was, iterator states, PRNG key,
                                        counters, config, and each array's checksum, shape, dtype
    workdir/checkpoints_corrupt/<step>  damaged checkpoints (unreadable, or checksums that
                                        disagree), moved aside

A checkpoint is `groups` — {"policy": TrainState, "critic": TrainState, ...}, any pytrees of
jax arrays — plus a JSON `meta` dict. Trees are stored as their flat list of leaves, with the
leaves' key paths in `meta`, so restoring needs only a *like* tree (the new run's freshly
built state): its structure gives the tree back, and its leaves' shapes, dtypes and
shardings say where each array goes. A run restarted on a different mesh therefore gets its
arrays in its own shardings; orbax reads just the slices each device owns.

Two ways a checkpoint can fail to restore, told apart because they call for opposite actions:

  CheckpointMismatch  it does not fit this run (a group is missing, the trees' key paths or a
                      leaf's shape or dtype differ — typically the config changed): the run
                      stops with the difference and every checkpoint stays where it is.
  CheckpointDamaged   its files are damaged: they cannot be read, or a leaf's checksum (the
                      wrapping uint32 sum of its bits, an exact integer that does not depend
                      on how the array is sharded or in which order the sum runs) disagrees
                      with the one saved. It is reported with a warning, moved aside, and the
                      next older one is tried.

Checkpoints written before the decoder's blocks were stacked (2026-12-05: per-layer leaves
`['blocks'][i][...]` where this run has one `['blocks'][...]` leaf [L, ...]) restore
converted: each stacked leaf is read as its L saved layers (each checked against its own
checksum) and stacked (`models.stacked`).

Orbax writes into a temporary directory and renames it when the save is complete, so a save
cut short by a kill is never mistaken for a checkpoint.

Retention: the newest `keep` checkpoints, plus (with `keep_best`) the one with the highest
`score` (eval avg@k) among those saved with one.
"""

import os
import shutil
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_managers

from vapo_jax import distributed as dist

ARRAYS = "arrays"
META = "meta"


class CheckpointError(RuntimeError):
  """No checkpoint could be restored, or one does not fit the run that restores it."""


class CheckpointMismatch(CheckpointError):
  """The checkpoint is intact but does not fit this run (its trees, shapes or settings)."""


class CheckpointDamaged(CheckpointError):
  """The checkpoint's files cannot be read, or what was read disagrees with its checksums."""


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


def _stack(layers: list[jax.Array], like: Any) -> jax.Array:
  """Saved per-layer arrays as one stacked [L, ...] array in `like`'s sharding."""
  return jax.jit(lambda *xs: jnp.stack(xs), out_shardings=like.sharding)(*layers)


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return lines[0][:300] if lines else ""


def key_paths(tree: Any) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _flat(tree: Any) -> dict[str, Any]:
  return {f"{i:05d}": x for i, x in enumerate(jax.tree.leaves(tree))}


def _abstract(leaves: list[Any], indices: list[Any]) -> dict[str, jax.ShapeDtypeStruct]:
  """Restore targets: leaf k of `leaves` is the saved leaf number indices[k], or stacked
  from the saved per-layer leaves indices[k] (a list)."""
  out = {}
  for ix, x in zip(indices, leaves):
    if isinstance(ix, int):
      out[f"{ix:05d}"] = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
      continue
    sharding = x.sharding
    if isinstance(sharding, NamedSharding):  # the layer axis is never sharded: drop it
      sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))
    for i in ix:
      out[f"{i:05d}"] = jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sharding)
  return out


_BLOCKS = "['blocks']"


def _layer_paths(path: str, n: int) -> list[str]:
  """The per-layer key paths (checkpoints before stacked blocks) of a stacked leaf's path."""
  at = path.find(_BLOCKS) + len(_BLOCKS)
  if at < len(_BLOCKS) or path[at:at + 1] != "[" or path[at + 1:at + 2].isdigit():
    return []
  return [f"{path[:at]}[{i}]{path[at:]}" for i in range(n)]


def _per_layer(theirs: list[str], tree: Any) -> list[Any] | None:
  """For each leaf of `tree`: its position in `theirs`, or (a stacked leaf saved per layer)
  the list of its layers' positions; None unless that uses every saved leaf exactly once."""
  where = {p: i for i, p in enumerate(theirs)}
  out = []
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    p = jax.tree_util.keystr(path)
    layers = _layer_paths(p, x.shape[0]) if p not in where and x.ndim else []
    if p not in where and not (layers and all(q in where for q in layers)):
      return None
    out.append(where[p] if p in where else [where[q] for q in layers])
  used = [i for ix in out for i in ([ix] if isinstance(ix, int) else ix)]
  return out if sorted(used) == list(range(len(theirs))) else None


def _flat_indices(indices: list[Any]) -> list[int]:
  return [i for ix in indices for i in ([ix] if isinstance(ix, int) else ix)]


def _under(path: str, prefix: str) -> bool:
  """Whether key path `path` lies in the subtree at `prefix` ("" is the whole tree)."""
  return path.startswith(prefix) and (len(path) == len(prefix) or path[len(prefix)] in ".[")


def _describe(shape, dtype) -> str:
  return f"{dtype}[{','.join(str(int(d)) for d in shape)}]"


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
                groups={name: {"paths": key_paths(tree), "checksums": checksums(tree),
                               "shapes": [list(x.shape) for x in jax.tree.leaves(tree)],
                               "dtypes": [str(x.dtype) for x in jax.tree.leaves(tree)]}
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
    """The JSON meta of checkpoint `step`; CheckpointDamaged if it cannot be read."""
    try:
      out = self._manager.restore(step, args=ocp.args.Composite(**{
          META: ocp.args.JsonRestore()}))
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointDamaged(f"checkpoint {step}: its meta cannot be read "
                              f"({type(e).__name__}: {_first_line(e)})") from e
    return out[META]

  def _select(self, step: int, name: str, saved: dict[str, Any], tree: Any,
              prefix: str | None) -> list[int]:
    """The saved leaf numbers `tree`'s leaves restore from; CheckpointMismatch if they don't
    fit. prefix: `tree` is the saved group's subtree at that key path (None: all of it)."""
    paths = saved["paths"]
    indices = list(range(len(paths))) if prefix is None else [
        i for i, p in enumerate(paths) if _under(p, prefix)]
    theirs = [paths[i][len(prefix or ""):] for i in indices]
    mine = key_paths(tree)
    where = f"{name}{prefix or ''}"
    picks: list[Any] = list(range(len(theirs)))
    if mine != theirs:
      picks = _per_layer(theirs, tree)  # (saved before the blocks were stacked?)
      if picks is None:
        diff = next(((a, b) for a, b in zip(theirs, mine) if a != b), None)
        raise CheckpointMismatch(
            f"checkpoint {step}: {where!r} has other leaves than this run's (first "
            "difference: " + (f"saved {where}{diff[0]}, this run {where}{diff[1]})" if diff
                              else f"{len(theirs)} leaves saved, {len(mine)} in this run)"))
    if "shapes" in saved and "dtypes" in saved:  # (checkpoints since they were stored)
      for ix, path, x in zip(picks, mine, jax.tree.leaves(tree)):
        for i in ([ix] if isinstance(ix, int) else ix):
          shape = x.shape if isinstance(ix, int) else x.shape[1:]
          want = _describe(saved["shapes"][indices[i]], saved["dtypes"][indices[i]])
          have = _describe(shape, x.dtype)
          if want != have:
            layer = "" if isinstance(ix, int) else f" (a layer of {where}{path})"
            raise CheckpointMismatch(f"checkpoint {step}: {where}{theirs[i]} is {want} "
                                     f"there but {have} in this run{layer}")
    return [indices[ix] if isinstance(ix, int) else [indices[i] for i in ix]
            for ix in picks]

  def check(self, step: int, like: dict[str, Any], *,
            subtrees: dict[str, str] | None = None) -> dict[str, list[int]]:
    """Raises CheckpointMismatch unless `like` fits checkpoint `step` (see `restore`); reads
    only its meta. Returns, per group, the saved leaf numbers that `like`'s leaves are."""
    subtrees = subtrees or {}
    saved = self.read_meta(step).get("groups", {})
    indices = {}
    for name, tree in like.items():
      if name not in saved:
        raise CheckpointMismatch(f"checkpoint {step} has no {name!r} (it has {sorted(saved)})")
      indices[name] = self._select(step, name, saved[name], tree, subtrees.get(name))
    return indices

  def restore(self, step: int, like: dict[str, Any], *,
              subtrees: dict[str, str] | None = None) -> dict[str, Any]:
    """Restores groups of checkpoint `step` into the structure and shardings of `like`.

    Args:
      step: the checkpoint.
      like: {group: the new run's tree}; only those groups are read.
      subtrees: {group: key path} (e.g. ".params") for groups of which only that subtree is
        restored; like[group] is then that subtree of the new run's tree. The other leaves
        are not read at all.

    Raises:
      CheckpointMismatch: a group is missing, or its key paths, shapes or dtypes differ from
        `like`'s (checked on the meta, before any array is read).
      CheckpointDamaged: the arrays cannot be read, or a checksum does not match.
    """
    subtrees = subtrees or {}
    saved = self.read_meta(step).get("groups", {})
    indices = self.check(step, like, subtrees=subtrees)
    target = {name: _abstract(jax.tree.leaves(tree), indices[name])
              for name, tree in like.items()}
    try:
      if not subtrees:
        out = self._manager.restore(step, args=ocp.args.Composite(**{
            ARRAYS: ocp.args.StandardRestore(target)}))[ARRAYS]
      else:  # StandardRestore reads every saved leaf; PyTreeRestore can read a subset
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape,
                                           dtype=x.dtype), target)
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
          out = reader.restore(os.path.join(self.directory, str(step), ARRAYS),
                               args=ocp.args.PyTreeRestore(target, restore_args=restore_args,
                                                           partial_restore=True))
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointDamaged(f"checkpoint {step}: its arrays cannot be read "
                              f"({type(e).__name__}: {_first_line(e)})") from e
    groups = {}
    for name, tree in like.items():
      flat = _flat_indices(indices[name])
      read = [out[name][f"{i:05d}"] for i in flat]
      want = [saved[name]["checksums"][i] for i in flat]
      got = checksums(read)
      if got != want:
        bad = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
        path = saved[name]["paths"][flat[bad]]
        raise CheckpointDamaged(f"checkpoint {step}: {name}{path} does not match its stored "
                                f"checksums (read {got[bad]}, saved {want[bad]}): damaged "
                                "files")
      arrays = {i: x for i, x in zip(flat, read)}
      leaves = [arrays[ix] if isinstance(ix, int) else _stack([arrays[i] for i in ix], x)
                for ix, x in zip(indices[name], jax.tree.leaves(tree))]
      groups[name] = jax.tree.unflatten(jax.tree.structure(tree), leaves)
    return groups

  def restore_latest(self, restore_fn: Callable[[int, dict[str, Any]], Any]) -> Any:
    """Newest checkpoint that restores: `restore_fn(step, meta)`; damaged ones moved aside.

    `restore_fn` builds the like-trees that `meta` calls for and calls `self.restore`. A
    CheckpointDamaged from it (or from reading the meta) sets that checkpoint aside and the
    next older one is tried. Anything else stops the restore and is raised, with every
    checkpoint left where it is: a CheckpointMismatch (the checkpoint is fine, this run's
    config does not fit it) or an unexpected error (a bug is not damage either). All hosts
    take the same branch. Returns None when there is no checkpoint.
    """
    for step in reversed(self.steps()):
      error = None
      try:
        found = restore_fn(step, self.read_meta(step))
      except Exception as e:  # pylint: disable=broad-except
        error = e
      # Every host takes the same branch: a checkpoint damaged in one host's slices only is
      # set aside by all (otherwise the hosts would go on with different states and meet
      # in different collectives), and one that does not fit on any host stops all.
      if not dist.any_process(error is not None):
        return found
      if dist.any_process(error is not None and not isinstance(error, CheckpointDamaged)):
        if error is not None and not isinstance(error, CheckpointDamaged):
          raise error
        raise CheckpointMismatch(f"checkpoint {step} failed to restore on another host (see "
                                 "its error); every checkpoint was left in place")
      reason = (f"{type(error).__name__}: {str(error)[:300]}" if error is not None
                else "it is damaged on another host")
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
