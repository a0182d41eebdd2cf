"""The decode copy of the policy: cast to `decode_dtype`, resharded into a decode layout.

Once per RL step (per engine call) the rollout engine turns the training parameters into
its own copy and never reads the training copy again:

  * LoRA: the adapters are folded in, W + (alpha / r) A B in float32 (`models.lora.merged`),
    so decode runs the weights the train step scores, as one matmul per projection;
  * every floating parameter is cast to `dtype` (bfloat16 at pod scale: half the bytes per
    decode step; float32 keeps the engine bit-comparable with the training forward);
  * the layout drops FSDP from the weights (`decode_rules`: logical axes that the training
    rules put on the batch axes -- `embed` over fsdp -- are replicated): each data x fsdp
    group holds a whole tensor-parallel replica, so a decode step needs no weight
    all-gather (the test counts all-gathers in the compiled decode loop).

The cast and the reshard run in one jit with `out_shardings`, so no host holds the model.
"""

from __future__ import annotations

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax import sharding as shd
from vapo_jax.models import lora


def decode_rules(mesh: jax.sharding.Mesh | None, rules: shd.Rules = shd.DEFAULT_RULES
                 ) -> shd.Rules:
  """`rules` with every weight axis that maps onto a batch mesh axis replicated."""
  batch = set(shd.batch_axes(mesh, rules)) if mesh is not None else {"data", "fsdp"}
  out = []
  for logical, axes in rules:
    if logical != "batch" and axes is not None:
      names = (axes,) if isinstance(axes, str) else tuple(axes)
      kept = tuple(a for a in names if a not in batch)
      axes = None if not kept else (kept[0] if len(kept) == 1 else kept)
    out.append((logical, axes))
  return tuple(out)


def _cast(dtype):
  def one(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(dtype)
    return x
  return one


def decode_copy(graphdef, params, dtype: Any, mesh: jax.sharding.Mesh | None = None,
                rules: shd.Rules = shd.DEFAULT_RULES):
  """(graphdef, params) of the decode copy: adapters merged, cast, decode layout.

  Args:
    graphdef, params: `nnx.split` of the policy (params: an nnx.State, any sharding).
    dtype: the decode dtype (e.g. jnp.bfloat16).
    mesh: the mesh to lay the copy out on (None: wherever jit puts it).
  Returns:
    The graphdef to merge the copy with (the adapter-free one for LoRA) and the copy.
  """
  dtype = jnp.dtype(dtype)
  merge = lora.has_adapters(params)

  def build(p):
    model = nnx.merge(graphdef, p)
    if merge:
      model = lora.merged(model)
    state = nnx.state(model)
    return jax.tree.map(_cast(dtype), state)

  abstract = jax.eval_shape(build, params)
  if merge:
    base_cfg = lora.base_config(nnx.merge(graphdef, params).cfg)
    model_type = type(nnx.merge(graphdef, params))
    out_graphdef, _ = nnx.split(nnx.eval_shape(
        lambda: model_type(base_cfg, rngs=nnx.Rngs(0))))
  else:
    out_graphdef = graphdef
  shardings = None
  if mesh is not None:
    shardings = shd.state_shardings(abstract, mesh, decode_rules(mesh, rules))
  return out_graphdef, jax.jit(build, out_shardings=shardings)(params)
