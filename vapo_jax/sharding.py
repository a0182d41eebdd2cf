"""Device meshes and logical-axis sharding rules.

Modules annotate every parameter with *logical* axis names (one per array
dimension, or None for "never shard"). One ordered rules table maps logical
names to *mesh* axes. Changing the parallelism of a run is changing the mesh
shape or the table, never the model code.

Logical names used by vapo_jax:

  batch     the example dimension of activations
  embed     the model (residual stream) width D
  heads     query heads H
  kv_heads  key/value heads K (GQA: K divides H)
  head_dim  per-head width Dh
  mlp       the MLP hidden width F
  vocab     the vocabulary V
  layers    a stacked-layer dimension (reserved for scanned layers)
  lora_rank the rank r of LoRA adapters (replicated: A [*in, r] and B [r, *out]
            shard like their weight over in / out)

Mesh axes: `data` (pure data parallel, parameters replicated), `fsdp` (data
parallel with parameters and optimizer state sharded, ZeRO-3 style) and
`tensor` (Megatron-style tensor parallel over heads and MLP width).

This module imports only jax.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any, Union

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MeshAxes = Union[str, tuple[str, ...], None]
Rules = tuple[tuple[str, MeshAxes], ...]

MESH_AXES = ("data", "fsdp", "tensor")

# Ordered: when two dimensions of one array would claim the same mesh axis, the
# first dimension (in array order) keeps it and later ones are replicated.
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("lora_rank", None),
)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh with `AxisType.Auto` axes.

  One size may be -1: it takes all remaining devices. The product of the sizes
  must equal the number of devices.

  Args:
    data: size of the `data` axis.
    fsdp: size of the `fsdp` axis.
    tensor: size of the `tensor` axis.
    devices: devices to use (default: `jax.devices()`).

  Returns:
    A `jax.sharding.Mesh` with axis names `MESH_AXES`.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"At most one mesh axis may be -1, got data={data}, "
                     f"fsdp={fsdp}, tensor={tensor}.")
  known = 1
  for s in sizes:
    if s != -1:
      if s < 1:
        raise ValueError(f"Mesh axis sizes must be >= 1 or -1, got {sizes}.")
      known *= s
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices do not divide by {known} "
                       f"(data={data}, fsdp={fsdp}, tensor={tensor}).")
    sizes[sizes.index(-1)] = len(devices) // known
  total = sizes[0] * sizes[1] * sizes[2]
  if total != len(devices):
    raise ValueError(f"Mesh data*fsdp*tensor = {total} but there are "
                     f"{len(devices)} devices.")
  return jax.make_mesh(tuple(sizes), MESH_AXES,
                       axis_types=(AxisType.Auto,) * 3, devices=devices)


def logical_to_spec(names: Sequence[str | None] | None,
                    rules: Rules = DEFAULT_RULES,
                    mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
  """Maps logical axis names to a `PartitionSpec` with the rules table.

  A logical name missing from the rules (or None) is replicated. A mesh axis is
  used at most once per array: a later dimension claiming an axis already used
  is replicated. Given `mesh` and `shape`, mesh axes of size 1 are dropped and a
  dimension that the mesh axes do not divide is replicated (so tiny test models
  shard cleanly on any mesh).

  Args:
    names: one logical name (or None) per array dimension.
    rules: ordered (logical name, mesh axes) pairs.
    mesh: optional mesh for the divisibility check.
    shape: optional array shape for the divisibility check.

  Returns:
    A PartitionSpec with one entry per dimension.
  """
  if names is None:
    return PartitionSpec()
  table = {}
  for logical, axes in rules:
    table.setdefault(logical, axes)
  used: set[str] = set()
  spec = []
  for dim, name in enumerate(names):
    axes = table.get(name) if name is not None else None
    if axes is None:
      spec.append(None)
      continue
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    axes = tuple(a for a in axes if a not in used)
    if mesh is not None:
      axes = tuple(a for a in axes if mesh.shape[a] > 1)
      if shape is not None:
        n = 1
        for a in axes:
          n *= mesh.shape[a]
        if shape[dim] % n:
          axes = ()
    used.update(axes)
    if not axes:
      spec.append(None)
    else:
      spec.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)



def fsdp_only(rules: Rules = DEFAULT_RULES) -> Rules:
  """`rules` as a pure FSDP layout over every mesh axis: the model axes (those not under
  "batch", i.e. `tensor`) are taken off every weight dimension and joined to "batch" and to
  each dimension sharded over a batch axis (`embed` over fsdp -> fsdp x tensor).

  The same devices, one layout per program: a run's train passes can use this table while
  its rollout engine decodes from tensor-parallel replicas of `rules`
  (`config.mesh.train_layout`). Every chip then holds whole rows and 1/N of every weight:
  no activation all-reduce between a layer's matmuls, one weight all-gather per layer and
  pass that can overlap the previous layer's compute.
  """
  table = dict(reversed(rules))  # the first rule of a name wins, as in logical_to_spec
  batch = table.get("batch") or ()
  batch = (batch,) if isinstance(batch, str) else tuple(batch)
  model = tuple(a for a in MESH_AXES if a not in batch)
  out = []
  for logical, axes in rules:
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    if logical == "batch":
      names = names + tuple(a for a in model if a not in names)
    elif any(a in batch for a in names):
      names = tuple(a for a in names if a not in model) + model
    else:
      names = tuple(a for a in names if a not in model)
    out.append((logical, None if not names else (names[0] if len(names) == 1 else names)))
  return tuple(out)


def batch_axes(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> tuple[str, ...]:
  """The mesh axes the logical "batch" axis (rows) is split over, as a tuple."""
  axes = logical_to_spec(("batch",), rules, mesh)[0]
  return (axes,) if isinstance(axes, str) else tuple(axes or ())


def logical_names(variable: Any) -> tuple[str | None, ...] | None:
  """The logical axis names a Flax NNX variable was created with (or None)."""
  get = getattr(variable, "get_metadata", None)
  if get is None:
    return None
  names = get("out_sharding", None)
  return tuple(names) if names is not None else None


def state_shardings(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """NamedShardings for every leaf of an nnx State from its logical names.

  Works on concrete or abstract (`jax.ShapeDtypeStruct`) states, e.g. the
  output of `nnx.split(nnx.eval_shape(...))`. Leaves without annotations are
  replicated.

  Args:
    state: a pytree whose leaves are Flax variables (an `nnx.State`).
    mesh: the device mesh.
    rules: the logical-to-mesh rules table.

  Returns:
    A pytree with the structure of `state` (variables holding NamedShardings),
    usable as `jax.jit(..., out_shardings=...)` or with `jax.device_put`.
  """

  def one(v):
    value = v.get_value() if hasattr(v, "get_value") else v
    shape = getattr(value, "shape", None)
    spec = logical_to_spec(logical_names(v), rules, mesh, shape)
    sharding = NamedSharding(mesh, spec)
    return v.replace(sharding) if hasattr(v, "replace") else sharding

  return jax.tree.map(one, state, is_leaf=_is_variable)


def _is_variable(x: Any) -> bool:
  return hasattr(x, "get_metadata") and hasattr(x, "replace")


# ------------------------------------------------------------------ activations

# (mesh, rules) of the innermost `activation_sharding` context, read while a
# function is traced. Parameters alone do not pin activations: with FSDP
# shardings on `embed`, XLA may shard [B, T, D] activations over D and
# replicate the rows, so that every chip computes every row of the batch.
_ACTIVATION_MESH: list[tuple[Mesh, Rules]] = []


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Within this context `constrain` pins activations to `mesh` by `rules`."""
  _ACTIVATION_MESH.append((mesh, rules))
  try:
    yield
  finally:
    _ACTIVATION_MESH.pop()


def activation_mesh() -> tuple[Mesh, Rules] | None:
  """(mesh, rules) of the innermost `activation_sharding` context, or None outside one."""
  return _ACTIVATION_MESH[-1] if _ACTIVATION_MESH else None


@contextlib.contextmanager
def per_shard():
  """Within this context no activation mesh is set (`constrain` is a no-op): for code
  traced per shard inside a `jax.shard_map`, where the whole mesh's shardings do not apply."""
  saved = _ACTIVATION_MESH[:]
  _ACTIVATION_MESH.clear()
  try:
    yield
  finally:
    _ACTIVATION_MESH[:] = saved


def traced_under(fn: Callable, mesh: Mesh | None,
                 rules: Rules = DEFAULT_RULES) -> Callable:
  """fn, run (so traced, under jit) inside `activation_sharding(mesh, rules)`.

  With mesh None, fn itself.
  """
  if mesh is None:
    return fn

  @functools.wraps(fn)
  def run(*args, **kwargs):
    with activation_sharding(mesh, rules):
      return fn(*args, **kwargs)

  return run


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """x with a sharding constraint from logical `names`, inside an
  `activation_sharding` context; x unchanged outside one.

  A dimension the mesh axes do not divide stays replicated (see
  `logical_to_spec`), so e.g. a micro-batch smaller than the batch axes is
  replicated rather than rejected.
  """
  if not _ACTIVATION_MESH:
    return x
  mesh, rules = _ACTIVATION_MESH[-1]
  spec = logical_to_spec(names, rules, mesh, x.shape)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
