"""The run's meshes and shardings: the decode and train meshes, their rules tables.

The samplers decode on the config's (data, fsdp, tensor) mesh under mesh.rules; the learners
live on the train mesh (the same one unless mesh.train_tensor lays its devices out again)
under the train rules (mesh.train_layout).
"""

from typing import Callable

import jax
import numpy as np

from vapo_jax import sharding as shd
from vapo_jax.rl import batch as batch_lib


def rules_of(cfg) -> shd.Rules:
  """The rules table of the rollout engine's decode replicas (and, with
  mesh.train_layout="shared", of the train passes): mesh.rules, else the default."""
  return tuple((str(k), v if v is None or isinstance(v, str) else tuple(v))
               for k, v in cfg.mesh.rules) if cfg.mesh.rules else shd.DEFAULT_RULES


def train_rules_of(cfg) -> shd.Rules:
  """The rules table of the trained networks' parameters, optimizer states and train
  passes (mesh.train_layout): `rules_of(cfg)`, or with "fsdp" `sharding.fsdp_only` of it."""
  rules = rules_of(cfg)
  return shd.fsdp_only(rules) if cfg.mesh.train_layout == "fsdp" else rules


def build_mesh(cfg):
  """The config's (data, fsdp, tensor) mesh; with no -1 size it uses the first devices."""
  sizes = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
  devices = None
  if -1 not in sizes:
    need = int(np.prod(sizes))
    if need > jax.device_count():
      raise ValueError(f"config.mesh {sizes} needs {need} devices, "
                       f"only {jax.device_count()} are present")
    if jax.process_count() > 1 and need != jax.device_count():
      raise ValueError(f"config.mesh {sizes} uses {need} of the {jax.device_count()} devices "
                       f"of {jax.process_count()} processes; a multi-process mesh must use "
                       "every device (set one size to -1)")
    devices = jax.devices()[:need]
  return shd.make_mesh(*sizes, devices=devices)


def build_train_mesh(cfg, mesh):
  """The learners' mesh from the decode mesh (mesh.train_tensor = t).

  t = 0, or t = the decode mesh's own tensor size: `mesh` itself (one mesh). Else a second
  `Mesh` over the same N devices in the same flat order, (data, N / (data t), t), the same
  axis names and types: an array moves between the two by `jax.device_put` or a jit's
  `out_shardings`. ValueError when data x t does not divide N.
  """
  t = cfg.mesh.train_tensor
  if not t or mesh is None or t == mesh.shape["tensor"]:
    return mesh
  n, data = mesh.size, mesh.shape["data"]
  if n % (data * t):
    raise ValueError(f"config.mesh.train_tensor={t}: the train mesh (data={data}, fsdp, "
                     f"tensor={t}) must split the {n} devices of the mesh {dict(mesh.shape)}, "
                     f"and data x train_tensor = {data * t} does not divide {n}")
  return jax.sharding.Mesh(mesh.devices.reshape(data, n // (data * t), t), mesh.axis_names,
                           axis_types=mesh.axis_types)


def to_train_mesh(mesh, train_mesh, batch_axes_) -> Callable | None:
  """place(tree) -> the tree's [B, ...] arrays on the train mesh, rows split over its batch
  axes (one jitted reshard, multi-process safe), or None when the meshes are one."""
  if train_mesh is mesh:
    return None
  return jax.jit(lambda tree: tree, out_shardings=batch_lib.batch_sharding(train_mesh,
                                                                           batch_axes_))


def device_count_check(cfg, mesh, rules, *, train: bool = False) -> None:
  """The samplers' batches must split evenly over the batch shards of the mesh under
  `rules`; with `train` (the train rules) the rows the train passes see: a rollout's
  responses and an SFT batch."""
  axes = shd.batch_axes(mesh, rules)
  shards = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  rl = cfg.rl
  sizes = ((("rl.prompts_per_step × rl.responses_per_prompt",
             rl.rollout_prompts * rl.group_size),
            ("sft.batch_size", cfg.sft.batch_size if cfg.sft.enabled else 0))
           if train else
           (("rl.prompts_per_step", rl.rollout_prompts),
            ("eval.batch_prompts", cfg.eval.batch_prompts),
            ("sft.batch_size", cfg.sft.batch_size),
            ("sampling.prompts_per_call", cfg.sampling.prompts_per_call)))
  for what, rows in sizes:
    if rows % shards:
      layout = (f" (mesh.train_layout={cfg.mesh.train_layout!r}, mesh.train_tensor="
                f"{cfg.mesh.train_tensor})" if train else "")
      raise ValueError(f"config.{what}={rows} must be a multiple of the {shards} batch "
                       f"shards of the mesh {dict(mesh.shape)}{layout}")
