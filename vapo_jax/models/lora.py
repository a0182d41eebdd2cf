"""LoRA adapters on the decoder's projections, for the policy and the critic.

For a targeted projection W [*in, *out] (q, k, v, o of `layers.Attention`; gate, up, down of
`layers.MLP`) the module holds two more parameters and computes

  y = x W + (alpha / r) (x A) B,   A [*in, r] he-uniform,  B [r, *out] zeros,

so an adapted model starts equal to its base. A and B are `LoraParam`s named `<w>_lora_a` /
`<w>_lora_b` beside W (as qwix names them), with W's logical axis names on their in/out
axes and "lora_rank" (replicated) on r, so they shard like W. With adapters present only
they (and the critic's value head, `HEAD`) are trained: `split_trainable` is what the train
steps differentiate and the optimizer holds; the base can be stored in bfloat16.

Why not qwix's `LoraProvider`: it adds the delta when it intercepts a `dot_general`/einsum
whose right operand *is* a module parameter, creating the adapters lazily on that first
call. Here every projection goes through `matmul.matmul` (a custom_vjp over a cast copy of
the weight) and decoder blocks run split/merged inside `transformer.remat_block`, so its
interception would see no parameter, and its lazily created adapters would not survive the
block's split; its adapters also take the base's dtype (bfloat16 adapters for a bfloat16
base). The same math is written out here, over the same `matmul`. With stacked blocks
(`models.stacked`) A and B carry the leading layer axis too: [L, *in, r], [L, r, *out].
"""

from __future__ import annotations

import math
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax import sharding as shd
from vapo_jax.models.config import LORA_TARGETS
from vapo_jax.models.matmul import matmul

TARGETS = LORA_TARGETS
SUFFIXES = ("_lora_a", "_lora_b")


class LoraParam(nnx.Param):
  """A LoRA adapter matrix (A or B)."""


def enabled(cfg, name: str) -> bool:
  """Whether projection `name` of a model with ModelConfig `cfg` is adapted."""
  return cfg.lora_rank > 0 and name in cfg.lora_targets


def base_config(cfg):
  """The ModelConfig without adapters (what a checkpoint's base weights fill)."""
  return cfg.replace(lora_rank=0)


def add(module: nnx.Module, name: str, rngs: nnx.Rngs, in_shape: tuple[int, ...],
        in_names: tuple, out_shape: tuple[int, ...], out_names: tuple) -> None:
  """Creates `<name>_lora_a` [*in, r] and `<name>_lora_b` [r, *out] on module, if targeted.

  A ~ U(-b, b) with b = sqrt(6 / prod(in)) (he-uniform over the fan-in), B = 0; both float32.
  """
  cfg = module.cfg
  if not enabled(cfg, name):
    return
  r = cfg.lora_rank
  bound = math.sqrt(6.0 / math.prod(in_shape))
  a = jax.random.uniform(rngs.params(), (*in_shape, r), jnp.float32, -bound, bound)
  setattr(module, name + "_lora_a", LoraParam(
      a, out_sharding=(*in_names, "lora_rank"), eager_sharding=False))
  setattr(module, name + "_lora_b", LoraParam(
      jnp.zeros((r, *out_shape), jnp.float32), out_sharding=("lora_rank", *out_names),
      eager_sharding=False))


def project(module: nnx.Module, name: str, x: jax.Array, n_in: int, dtype: Any) -> jax.Array:
  """x @ W (+ (alpha/r) (x @ A) @ B when adapted), matmuls in `dtype`, over n_in axes of x."""
  x = x.astype(dtype)
  y = matmul(x, getattr(module, name)[...].astype(dtype), n_in)
  a = getattr(module, name + "_lora_a", None)
  if a is None:
    return y
  b = getattr(module, name + "_lora_b")[...]
  xa = matmul(x, a[...].astype(dtype), n_in)
  delta = matmul(xa, b.astype(dtype), 1)
  return y + scale(module.cfg) * delta


def scale(cfg) -> float:
  """alpha / r, the factor of an adapter's (x A) B."""
  return cfg.lora_alpha / cfg.lora_rank


# ------------------------------------------------------------------ trainable parameters


# The value head's parameters (`critic.Critic`'s w, `critic.CriticWithBias`'s b): trained
# beside the adapters.
HEAD = ("score", "score_bias")


def _is_trainable(path, _) -> bool:
  last = str(path[-1]) if path else ""
  return last.endswith(SUFFIXES) or (len(path) == 1 and str(path[0]) in HEAD)


def has_adapters(params) -> bool:
  """Whether parameters (an nnx.State, or any pytree such as a dict) hold LoRA adapters."""
  if isinstance(params, nnx.State):
    return any(str(p[-1]).endswith(SUFFIXES) for p in nnx.to_flat_state(params).paths)
  return any(_last_name(p).endswith(SUFFIXES)
             for p, _ in jax.tree_util.tree_leaves_with_path(params))


def _last_name(path) -> str:
  """The last key of a pytree path as a string ("" for the root)."""
  if not path:
    return ""
  k = path[-1]
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def split_trainable(params):
  """(trainable, frozen) of an nnx.State: (params, None) without adapters, else (adapters and
  the value head `HEAD`, everything else)."""
  if not has_adapters(params):
    return params, None
  if not isinstance(params, nnx.State):
    raise TypeError("LoRA adapters are split from an nnx.State; got "
                    f"{type(params).__name__}")
  return nnx.split_state(params, _is_trainable, ...)


def join(trainable, frozen):
  """The inverse of `split_trainable`."""
  return trainable if frozen is None else nnx.merge_state(trainable, frozen)


# ------------------------------------------------------------------------ build / merge


def attach(model: nnx.Module, cfg, mesh, rules: shd.Rules = shd.DEFAULT_RULES,
           seed: int = 0) -> nnx.Module:
  """`model` (a Transformer or Critic without adapters) with fresh adapters per `cfg`.

  The adapters are initialised under jit directly in their shardings (the rest of that
  init is dead code XLA drops); the base's arrays are reused as they are.
  """
  if cfg.lora_rank == 0:
    return model

  def build(rngs):
    return type(model)(cfg, rngs=rngs)

  graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(seed))))
  abs_adapters = nnx.filter_state(abs_state, LoraParam)
  init = jax.jit(lambda: nnx.state(build(nnx.Rngs(seed)), LoraParam),
                 out_shardings=shd.state_shardings(abs_adapters, mesh, rules))
  base = nnx.state(model)
  return nnx.merge(graphdef, nnx.merge_state(base, init()))


def _delta(a: jax.Array, b: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """A B in float32 as an array of `shape`: A [*lead, *in, r], B [*lead, r, *out] with
  leading axes shared (a stacked layer axis [L] has one: `models.stacked`)."""
  lead = a.ndim + b.ndim - 2 - len(shape)
  a32 = a.astype(jnp.float32).reshape(*a.shape[:lead], -1, a.shape[-1])
  b32 = b.astype(jnp.float32).reshape(*b.shape[:lead + 1], -1)
  return jnp.matmul(a32, b32).reshape(shape)


def merged(model: nnx.Module) -> nnx.Module:
  """A model without adapters whose adapted weights are W + (alpha/r) A B, in float32 (a
  bfloat16 base plus a small delta would round the delta away); the rest as they are.

  Models without adapters come back unchanged.
  """
  cfg = model.cfg
  state = nnx.to_pure_dict(nnx.state(model))
  if cfg.lora_rank == 0:
    return model
  scale = cfg.lora_alpha / cfg.lora_rank

  def fold(d):
    for key in [k for k in d if isinstance(k, str) and k.endswith("_lora_a")]:
      name = key[:-len("_lora_a")]
      a, b = d.pop(key), d.pop(name + "_lora_b")
      w = d[name]
      d[name] = w.astype(jnp.float32) + scale * _delta(a, b, w.shape)
    for v in d.values():
      if isinstance(v, dict):
        fold(v)
    return d

  fold(state)
  graphdef, abs_state = nnx.split(
      nnx.eval_shape(lambda: type(model)(base_config(cfg), rngs=nnx.Rngs(0))))
  nnx.replace_by_pure_dict(abs_state, state)
  return nnx.merge(graphdef, abs_state)
