"""Decoder blocks with a sequence-parallel residual and ring collective matmuls.

With `ModelConfig.collective_matmul` and an activation mesh whose `tensor` axis has n > 1
shards, a cache-free call (the train passes) runs each block's projections inside
`jax.shard_map`s manual over `tensor` only. Per tensor shard, with t = T / n positions:

  x [B, t, D]                        positions split over `tensor` between blocks
  h = norm(x)
  q, k, v = all_gather_matmuls(h, [Wq, Wk, Wv])        [B, T, H/n, Dh], [B, T, K/n, Dh]
  ---- (out of the shard_map) a = attention(rope(q), rope(k), v), heads over `tensor`
  x = x + matmul_reduce_scatters([(a, Wo)])            [B, t, D]
  h = norm(x)
  g, u = all_gather_matmuls(h, [Wg, Wu])               [B, T, F/n]
  x = x + matmul_reduce_scatters([(silu(g) u, Wd)])

(`models.collective_matmul`: rings of `ppermute` whose transfers run beside the matmuls.)
Under the partitioner alone the same block is Megatron tensor parallelism, whose two
activation all-reduces per block the v5p compile keeps synchronous; here their bytes travel
as collective-permutes beside the products. The other mesh axes stay the partitioner's
(automatic inside the shard_maps): the rows' split, the FSDP weight gathers and the weight
gradients' reductions (on v5p windowed products it overlaps), and the attention runs between
the two shard_maps as in the partitioned block (the splash kernel over rows and heads: a
kernel's own shard_map nested in one manual over `tensor` did not compile). A LoRA A of a
column projection rides the same ring as its W, and a row projection's (a A) B joins the
ring's partial sums. The values equal the partitioned block's
(tests/models/test_sequence_parallel.py: one device against 8).

A call that cannot be laid out this way runs the plain partitioned block, with one line
saying why (`why_not`): a tensor axis of 1, positions that do not split into n blocks, a
weight whose heads (or MLP width) are not split over `tensor` alone.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from flax import nnx
import jax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from vapo_jax import sharding as shd
from vapo_jax.models import collective_matmul as cm
from vapo_jax.models import layers
from vapo_jax.models import lora
from vapo_jax.models import stacked
from vapo_jax.models.matmul import matmul

AXIS = "tensor"
SPLIT = ("heads", "kv_heads", "mlp")  # the logical names a block splits over AXIS
_SAID: set[str] = set()


def _dot(a: jax.Array, w: jax.Array) -> jax.Array:
  """a @ w by `matmul.matmul` (its backward: two plain products)."""
  return matmul(a, w, 1)


def _axes(entry) -> tuple[str, ...]:
  return () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))


def _layer_specs(state, mesh, rules) -> tuple[list[P], list[tuple]]:
  """Per leaf of a block's state (one layer's, or the stacked layers'): the spec of one
  layer's values, and their logical names."""
  specs, names = [], []
  for v in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
    nm = tuple(shd.logical_names(v) or (None,) * v.ndim)
    spec = tuple(shd.logical_to_spec(nm, rules, mesh, v.shape))
    if nm and nm[0] == stacked.AXIS:
      nm, spec = nm[1:], spec[1:]
    specs.append(P(*spec))
    names.append(nm)
  return specs, names


def why_not(mesh, rules, specs, names, t: int) -> str:
  """Why a cache-free call of t positions cannot run sequence-parallel ("" if it can)."""
  n = mesh.shape.get(AXIS, 1)
  if n == 1:
    return f"the mesh's {AXIS} axis has 1 shard"
  batch = shd.batch_axes(mesh, rules)
  if AXIS in batch:
    return f"the rows are split over {AXIS} (an FSDP-only train layout)"
  if t % n:
    return f"{t} positions do not split into {n} blocks"
  for spec, nm in zip(specs, names):
    for entry, name in zip(spec, nm):
      axes = _axes(entry)
      if name in SPLIT and axes != (AXIS,):
        return f"a weight's {name} axis is not split over {AXIS} alone ({entry})"
      if name not in SPLIT and AXIS in axes:
        return f"a weight's {name} axis is split over {AXIS}"
  return ""


def _column(mod: nnx.Module, names: tuple[str, ...], h: jax.Array, n: int,
            dt: Any) -> list[jax.Array]:
  """Column-parallel projections of h [b, t, D] (local positions) -> [b, T, *out_local]
  each, one ring for all of them (with their LoRA A's); `lora.project`'s math."""
  ws, plan = [], []
  for name in names:
    w = getattr(mod, name)[...].astype(dt)
    ws.append(w.reshape(w.shape[0], -1))
    a = getattr(mod, name + "_lora_a", None)
    if a is not None:
      ws.append(a[...].astype(dt))
    plan.append((name, w.shape[1:], a is not None))
  ys = cm.all_gather_matmuls(h.astype(dt), ws, AXIS, n, _dot)
  out, j = [], 0
  for name, shape, adapted in plan:
    y = ys[j].reshape(*ys[j].shape[:-1], *shape)
    j += 1
    if adapted:
      b = getattr(mod, name + "_lora_b")[...].astype(dt)
      delta = _dot(ys[j], b)
      j += 1
      y = y + lora.scale(mod.cfg) * delta
    out.append(y)
  return out


def _row(mod: nnx.Module, name: str, a: jax.Array, n_in: int, n: int, dt: Any) -> jax.Array:
  """Row-parallel projection of a [b, T, *in_local] -> [b, t, D], summed over the shards
  and scattered on positions (with its LoRA path in the same ring)."""
  k = math.prod(a.shape[-n_in:])
  a = a.astype(dt).reshape(*a.shape[:-n_in], k)
  w = getattr(mod, name)[...].astype(dt)
  pairs = [(a, w.reshape(k, -1))]
  lora_a = getattr(mod, name + "_lora_a", None)
  if lora_a is not None:
    u = _dot(a, lora_a[...].astype(dt).reshape(k, -1))  # this shard's part of a A
    b = getattr(mod, name + "_lora_b")[...].astype(dt)
    pairs.append(((lora.scale(mod.cfg) * u).astype(dt), b.reshape(b.shape[0], -1)))
  return cm.matmul_reduce_scatters(pairs, AXIS, n, _dot)


def project_qkv(blk: layers.Block, x: jax.Array, cos: jax.Array, sin: jax.Array,
                n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per shard: q, k, v [b, T, H/n or K/n, Dh] (biased, named, qk-normed, rotated) of
  x [b, t, D] (this shard's positions), by one all-gather ring."""
  att, cfg = blk.attn, blk.attn.cfg
  q, k, v = _column(att, ("q", "k", "v"), blk.attn_norm(x), n, cfg.dtype)
  if cfg.qkv_bias:
    q = layers._bias(q, att.q_bias[...])  # pylint: disable=protected-access
    k = layers._bias(k, att.k_bias[...])  # pylint: disable=protected-access
    v = layers._bias(v, att.v_bias[...])  # pylint: disable=protected-access
  q, k, v = checkpoint_name(q, "q"), checkpoint_name(k, "k"), checkpoint_name(v, "v")
  if cfg.qk_norm:
    q, k = att.q_norm(q), att.k_norm(k)
  return layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin), v


def finish(blk: layers.Block, x: jax.Array, a: jax.Array, n: int) -> jax.Array:
  """Per shard: the rest of the block after the attention a [b, T, H/n, Dh]: x + o(a),
  then the MLP, each projection a ring; x [b, t, D] -> [b, t, D]."""
  att, mlp, cfg = blk.attn, blk.mlp, blk.attn.cfg
  dt = cfg.dtype
  y = _row(att, "o", a, 2, n, dt)
  if cfg.o_bias:
    y = layers._bias(y, att.o_bias[...])  # pylint: disable=protected-access
  x = x + checkpoint_name(y, "o")
  g, u = _column(mlp, ("gate", "up"), blk.mlp_norm(x), n, dt)
  if cfg.mlp_bias:
    g = layers._bias(g, mlp.gate_bias[...])  # pylint: disable=protected-access
    u = layers._bias(u, mlp.up_bias[...])  # pylint: disable=protected-access
  g, u = checkpoint_name(g, "gate"), checkpoint_name(u, "up")
  y = _row(mlp, "down", jax.nn.silu(g) * u, 1, n, dt)
  if cfg.mlp_bias:
    y = layers._bias(y, mlp.down_bias[...])  # pylint: disable=protected-access
  return x + y


def runner(graphdef, state, cfg, t: int, log: Callable = print) -> Callable | None:
  """A function (layer_state, x, cos, sin, mask, seg) -> x that runs one block (of
  `state`: one layer's, or the stacked layers' of which layer_state is a slice) with its
  projections as rings over the activation mesh's `tensor` axis; or None where the call
  runs partitioned (no `collective_matmul`, no activation mesh, or `why_not`, said once).

  x [B, T, D] comes in and goes out with its positions split over `tensor`.
  """
  ctx = shd.activation_mesh()
  if not getattr(cfg, "collective_matmul", False) or ctx is None:
    return None
  mesh, rules = ctx
  specs, names = _layer_specs(state, mesh, rules)
  why = why_not(mesh, rules, specs, names, t)
  if why:
    if why not in _SAID:
      _SAID.add(why)
      log(f"[model] collective_matmul: the partitioned block instead: {why}", flush=True)
    return None
  n = mesh.shape[AXIS]
  treedef = jax.tree.structure(state)
  # Only `tensor` is named: the other axes of the weights and rows stay automatic.
  tspecs = [P(*[AXIS if AXIS in _axes(e) else None for e in spec]) for spec in specs]
  heads, resid = P(None, None, AXIS, None), P(None, AXIS, None)

  def merge(leaves):
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, list(leaves)))

  def qkv(leaves, x, cos, sin):
    with shd.per_shard():
      return project_qkv(merge(leaves), x, cos, sin, n)

  def rest(leaves, x, a):
    with shd.per_shard():
      return finish(merge(leaves), x, a, n)

  def manual(fn, in_specs, out_specs):
    # check_vma=False: the pure-JAX attention's and the rings' loops mix values that vary
    # over `tensor` with ones that do not; the gradients are checked against one device.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         axis_names={AXIS}, check_vma=False)

  def run(layer, x, cos, sin, mask, seg):
    leaves = jax.tree.leaves(layer)
    q, k, v = manual(qkv, (tspecs, resid, P(), P()), (heads, heads, heads))(leaves, x, cos,
                                                                           sin)
    a = merge(leaves).attn.attend(q, k, v, mask, seg=seg)
    return manual(rest, (tspecs, resid, heads), resid)(leaves, x, a)

  return run
