"""The decoder blocks with their parameters stacked on a leading layer axis.

  per-layer (`ModelConfig.scan_layers=False`)    stacked (the default)
  blocks/<i>/attn/q        [D, H, Dh]            blocks/attn/q       [L, D, H, Dh]
  ("embed", "heads", "head_dim")                 ("layers", "embed", "heads", "head_dim")

`StackedBlocks` is one `layers.Block` whose every variable holds the L layers' values
stacked on axis 0, logical name "layers" (replicated by the sharding rules: each chip holds
its shard of every layer). `transformer.Transformer` runs it under `jax.lax.scan`, so a
program traces and compiles one block whatever the depth. `blocks[i]` (and iteration) gives
layer i as a plain Block, for the cached (prefill / decode) paths and for tools.

`stack` / `unstack` convert a whole model (a Transformer, or a module holding one, e.g. the
critic) between the two layouts, values unchanged; `stack_tree` / `unstack_tree` do the same
for nested dicts (`nnx.to_pure_dict`), where a per-layer `blocks` is a dict {0: ..., 1: ...}.
"""

from __future__ import annotations

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax.models import layers
from vapo_jax.models.config import ModelConfig

AXIS = "layers"


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def _names(v: nnx.Variable) -> tuple | None:
  names = v.get_metadata().get("out_sharding")
  return None if names is None else tuple(names)


class StackedBlocks(layers.Block):
  """L decoder blocks as one Block whose parameters are [L, ...] (see module docstring)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    """Layer i's parameters are those of `layers.Block(cfg, rngs=Rngs(params=key_i))`,
    key_i the i-th of L keys split from one `rngs.params()` key (built under `jax.vmap`:
    one block traced)."""
    keys = jax.random.split(rngs.params(), cfg.num_layers)
    state = jax.vmap(lambda k: nnx.state(layers.Block(cfg, rngs=nnx.Rngs(params=k))))(keys)
    super().__init__(cfg, rngs=nnx.Rngs(params=keys[0]))  # the structure (its values dropped)
    nnx.update(self, state)
    for _, v in nnx.iter_graph(self):
      if _is_variable(v) and _names(v) is not None:
        v.set_metadata(out_sharding=(AXIS,) + _names(v))

  def __len__(self) -> int:
    return int(self.attn_norm.scale.shape[0])

  def __getitem__(self, i: int) -> layers.Block:
    """Layer i as a Block (its parameters sliced out of the stack: a copy under jit)."""
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"layer {i} of {n}")
    graphdef, state = nnx.split(self)
    return nnx.merge(graphdef, jax.tree.map(lambda v: _slice(v, i), state,
                                            is_leaf=_is_variable))

  def __iter__(self):
    return (self[i] for i in range(len(self)))


def _slice(v: nnx.Variable, i: int) -> nnx.Variable:
  out = v.replace(v.get_value()[i])
  names = _names(v)
  if names and names[0] == AXIS:
    out.set_metadata(out_sharding=names[1:])
  return out


# ------------------------------------------------------------------ layout conversions


def _per_layer(d: Any) -> bool:
  return isinstance(d, dict) and bool(d) and all(isinstance(k, int) for k in d)


def stack_tree(tree: Any) -> Any:
  """A nested dict with every per-layer `blocks` {0: t0, 1: t1, ...} stacked (jnp.stack)."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for k, v in tree.items():
    if k == "blocks" and _per_layer(v):
      layers_ = [v[i] for i in sorted(v)]
      out[k] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers_)
    else:
      out[k] = stack_tree(v)
  return out


def unstack_tree(tree: Any) -> Any:
  """The inverse of `stack_tree`: a stacked `blocks` dict becomes {i: layer i}."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for k, v in tree.items():
    if k == "blocks" and isinstance(v, dict) and not _per_layer(v):
      n = jax.tree.leaves(v)[0].shape[0]
      out[k] = {i: jax.tree.map(lambda x, i=i: x[i], v) for i in range(n)}
    else:
      out[k] = unstack_tree(v)
  return out


def is_stacked(tree: Any) -> bool:
  """Whether a nested dict (or nnx State) holds stacked blocks (anywhere)."""
  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  if not isinstance(tree, dict):
    return False
  return any((k == "blocks" and isinstance(v, dict) and not _per_layer(v))
             or is_stacked(v) for k, v in tree.items())


def relayout(model: nnx.Module, scan_layers: bool) -> nnx.Module:
  """`model` (a Transformer, or a module built as `type(model)(cfg, rngs=...)` around one)
  with its blocks in the layout of `scan_layers`; the same values. Unchanged if already."""
  cfg = model.cfg
  if cfg.scan_layers == scan_layers:
    return model
  new_cfg = cfg.replace(scan_layers=scan_layers)
  graphdef, abs_state = nnx.split(
      nnx.eval_shape(lambda: type(model)(new_cfg, rngs=nnx.Rngs(0))))
  convert = stack_tree if scan_layers else unstack_tree
  nnx.replace_by_pure_dict(abs_state, convert(nnx.to_pure_dict(nnx.state(model))))
  return nnx.merge(graphdef, abs_state)


def stack(model: nnx.Module) -> nnx.Module:
  """`model` with stacked blocks (`relayout(model, True)`)."""
  return relayout(model, True)


def unstack(model: nnx.Module) -> nnx.Module:
  """`model` with per-layer blocks (`relayout(model, False)`)."""
  return relayout(model, False)
