"""Decoder blocks per shard: a sequence-parallel residual and ring collective matmuls.

With `ModelConfig.collective_matmul` and an activation mesh whose `tensor` axis has n > 1
shards, a cache-free call (the train passes) runs each block inside `jax.shard_map` over the
whole mesh. Per shard, for b rows (the batch axes' share) and t = T / n positions:

  x [b, t, D]                       rows over the batch axes, positions over `tensor`
  h = norm(x)
  q, k, v = all_gather_matmuls(h, [Wq, Wk, Wv])       [b, T, H/n, Dh], [b, T, K/n, Dh]
  a = attention(rope(q), rope(k), v)                  this shard's heads, every position
  x = x + matmul_reduce_scatters([(a, Wo)])           [b, t, D]
  h = norm(x)
  g, u = all_gather_matmuls(h, [Wg, Wu])              [b, T, F/n]
  x = x + matmul_reduce_scatters([(silu(g) u, Wd)])

(`models.collective_matmul`: rings of `ppermute` whose transfers run beside the matmuls.)
Under the partitioner the same block is Megatron tensor parallelism whose two all-reduces
per block the v5p compile keeps synchronous; here their bytes travel as collective-permutes
beside the products. Weights come in as the rules shard them and are gathered over every
mesh axis but `tensor` (the FSDP all-gather the partitioner would insert; its transpose
reduce-scatters the gradients); a LoRA A of a column projection rides the same ring as its
W, and a row projection's (a A) B joins the ring's partial sums. The values equal the
partitioned block's (tests/models/test_sequence_parallel.py: one device against 8).

A call that cannot be laid out this way runs the plain partitioned block, with one line
saying why (`why_not`): a tensor axis of 1, rows or positions that the mesh does not divide,
a weight whose heads (or MLP width) are not split over `tensor`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from flax import nnx
import jax
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from vapo_jax import sharding as shd
from vapo_jax.models import collective_matmul as cm
from vapo_jax.models import layers
from vapo_jax.models import stacked
from vapo_jax.models.matmul import matmul

AXIS = "tensor"
SPLIT = ("heads", "kv_heads", "mlp")  # the logical names a block splits over AXIS
_SAID: set[str] = set()
CHECK_VMA = False


def _varying(x: jax.Array) -> frozenset:
  """The manual mesh axes x varies over (`jax.typeof(x).manual_axis_type.varying`)."""
  return jax.typeof(x).manual_axis_type.varying


def _vary(x: jax.Array, like: jax.Array) -> jax.Array:
  """x marked as varying over every manual axis `like` varies over (shard_map's types:
  a weight the same on every shard times rows that differ; the transpose then sums the
  weight's gradient over those axes)."""
  missing = tuple(sorted(_varying(like) - _varying(x)))
  return lax.pcast(x, missing, to="varying") if missing else x


def _dot(a: jax.Array, w: jax.Array) -> jax.Array:
  """a @ w by `matmul.matmul` (its custom backward), over operands of one shard_map type."""
  return matmul(_vary(a, w), _vary(w, a), 1)


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


def why_not(cfg, mesh, rules, specs, names, rows: int, t: int) -> str:
  """Why a cache-free call of `rows` x `t` cannot run sequence-parallel ("" if it can)."""
  n = mesh.shape.get(AXIS, 1)
  if n == 1:
    return f"the mesh's {AXIS} axis has 1 shard"
  batch = shd.batch_axes(mesh, rules)
  if AXIS in batch:
    return f"the rows are split over {AXIS} (an FSDP-only train layout)"
  shards = math.prod(mesh.shape[a] for a in batch)
  if rows % shards:
    return f"{rows} rows do not split over the batch axes' {shards} shards"
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


def _gather(leaf: jax.Array, spec: P) -> jax.Array:
  """Per shard: leaf gathered over every mesh axis of its spec but AXIS."""
  for dim, entry in enumerate(spec):
    other = tuple(a for a in _axes(entry) if a != AXIS)
    if other:
      leaf = lax.all_gather(leaf, other, axis=dim, tiled=True)
  return leaf


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
      y = y + (mod.cfg.lora_alpha / mod.cfg.lora_rank) * delta
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
    scale = mod.cfg.lora_alpha / mod.cfg.lora_rank
    pairs.append(((scale * u).astype(dt), b.reshape(b.shape[0], -1)))
  return cm.matmul_reduce_scatters(pairs, AXIS, n, _dot)


def block(blk: layers.Block, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
          seg: jax.Array | None, n: int) -> jax.Array:
  """One cache-free decoder block per shard (module docstring); x [b, t, D] -> [b, t, D].

  cos, sin [b, T, Dh/2], mask ([b, T] or [b, 1, T, T]) and seg ([b, T] or None) cover
  every position of this shard's rows. The `checkpoint_name`s are `layers`' (a selective
  remat keeps the same outputs, here this shard's share of them).
  """
  att, mlp, cfg = blk.attn, blk.mlp, blk.attn.cfg
  dt = cfg.dtype
  q, k, v = _column(att, ("q", "k", "v"), blk.attn_norm(x), n, dt)
  if cfg.qkv_bias:
    q = layers._bias(q, att.q_bias[...])  # pylint: disable=protected-access
    k = layers._bias(k, att.k_bias[...])  # pylint: disable=protected-access
    v = layers._bias(v, att.v_bias[...])  # pylint: disable=protected-access
  q, k, v = checkpoint_name(q, "q"), checkpoint_name(k, "k"), checkpoint_name(v, "v")
  if cfg.qk_norm:
    q, k = att.q_norm(q), att.k_norm(k)
  q, k = layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin)
  y = _row(att, "o", att.attend(q, k, v, mask, seg=seg), 2, n, dt)
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


def runner(graphdef, state, cfg, rows: int, t: int, log: Callable = print) -> Callable | None:
  """A function (layer_state, x, cos, sin, mask, seg) -> x that runs one block (of
  `state`: one layer's, or the stacked layers' of which layer_state is a slice)
  sequence-parallel over the activation mesh; or None where the call runs partitioned (no
  `collective_matmul`, no activation mesh, or `why_not`, said once).

  x [B, T, D] (global) comes in and goes out split as P(batch, AXIS, None).
  """
  ctx = shd.activation_mesh()
  if not getattr(cfg, "collective_matmul", False) or ctx is None:
    return None
  mesh, rules = ctx
  specs, names = _layer_specs(state, mesh, rules)
  why = why_not(cfg, mesh, rules, specs, names, rows, t)
  if why:
    if why not in _SAID:
      _SAID.add(why)
      log(f"[model] collective_matmul: the partitioned block instead: {why}", flush=True)
    return None
  n = mesh.shape[AXIS]
  batch = shd.batch_axes(mesh, rules) or None
  rows_spec = lambda nd: P(batch, *([None] * (nd - 1)))  # noqa: E731
  treedef = jax.tree.structure(state)

  def per_shard(leaves, x, cos, sin, mask, *seg):
    seg = seg[0] if seg else None
    layer = jax.tree.unflatten(treedef, [_gather(a, s) for a, s in zip(leaves, specs)])
    with shd.per_shard():
      return block(nnx.merge(graphdef, layer), x, cos, sin, mask, seg, n)

  def run(layer, x, cos, sin, mask, seg):
    args = (x, cos, sin, mask) + (() if seg is None else (seg,))
    in_specs = (specs, P(batch, AXIS, None)) + tuple(rows_spec(a.ndim) for a in args[1:])
    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs,
                       out_specs=P(batch, AXIS, None), check_vma=CHECK_VMA)
    return fn(jax.tree.leaves(layer), *args)

  return run
