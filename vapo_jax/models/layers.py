"""Building blocks of the decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Shapes: B batch, T query length, S key length, D model width, H query heads,
K key/value heads, Dh head width, F MLP width. Parameters carry logical axis
names (see `vapo_jax.sharding`) as their `out_sharding` metadata; they are
created without eager sharding so a model can be built outside a mesh and
placed later with `sharding.state_shardings`. With `cfg.lora_rank > 0` the
targeted projections also hold LoRA adapters (`models.lora`).
"""

from __future__ import annotations

import math
from typing import Any

from flax import nnx
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp
import numpy as np

from vapo_jax import sharding as shd
from vapo_jax.models import attention
from vapo_jax.models import lora
from vapo_jax.models import paged_attention
from vapo_jax.models import platform
from vapo_jax.models import splash_attention
from vapo_jax.models.config import ModelConfig

_INIT_STD = 0.02
# Activations [B, T, D]: rows over the batch axes, the rest replicated (see
# `sharding.constrain`; a no-op outside an `activation_sharding` context).
_ROWS = ("batch", None, None)


def param(rngs: nnx.Rngs | None, shape: tuple[int, ...],
          names: tuple[str | None, ...], dtype: Any, init: str = "normal"
          ) -> nnx.Param:
  """A parameter with logical axis names; init is normal(0.02)/ones/zeros."""
  if init == "normal":
    value = _INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)
    value = value.astype(dtype)
  elif init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    raise ValueError(f"Unknown init {init!r}.")
  return nnx.Param(value, out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, statistics in float32."""

  def __init__(self, dim: int, eps: float, names: tuple[str | None, ...],
               param_dtype: Any):
    self.eps = eps
    self.scale = param(None, (dim,), names, param_dtype, init="ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = (x32 * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
    scale = self.scale[...].astype(x.dtype)
    return y * scale.reshape((1,) * (x.ndim - 1) + scale.shape)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [Dh/2], float32, with optional linear/llama3 scaling.

  inv_freq_i = theta^(-2i/Dh). Llama 3 scaling divides the low frequencies
  (wavelength > L0/low_freq_factor) by `factor`, keeps the high ones
  (wavelength < L0/high_freq_factor) and interpolates smoothly in between,
  with L0 = original_max_position_embeddings.
  """
  dim = cfg.head_dim
  exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
  inv = (1.0 / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
  rope = cfg.rope
  kind = rope.get("rope_type", "default")
  if kind == "linear":
    inv = inv / np.float32(rope["factor"])
  elif kind == "llama3":
    factor = rope["factor"]
    lo, hi = rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    inv = np.where(medium, smoothed, scaled).astype(np.float32)
  return inv


def rope_tables(positions_BxT: jax.Array, inv_freq: np.ndarray
                ) -> tuple[jax.Array, jax.Array]:
  """cos, sin of angles positions * inv_freq, float32 [B, T, Dh/2]."""
  angles = (positions_BxT.astype(jnp.float32)[..., None]
            * jnp.asarray(inv_freq)[None, None, :])
  return jnp.cos(angles), jnp.sin(angles)


def _rotate(x_BxTxNxDh: jax.Array, cos_BxTxR: jax.Array, sin_BxTxR: jax.Array
            ) -> jax.Array:
  """[x1, x2] -> [x1 c - x2 s, x2 c + x1 s], float32 (or wider) inside, x's dtype out."""
  x = x_BxTxNxDh.astype(jnp.promote_types(x_BxTxNxDh.dtype, jnp.float32))
  x1, x2 = jnp.split(x, 2, axis=-1)
  c, s = cos_BxTxR[:, :, None, :], sin_BxTxR[:, :, None, :]
  out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
  return out.astype(x_BxTxNxDh.dtype)


@jax.custom_vjp
def apply_rope(x_BxTxNxDh: jax.Array, cos_BxTxR: jax.Array,
               sin_BxTxR: jax.Array) -> jax.Array:
  """Half-split rotary embedding: [x1, x2] -> [x1 c - x2 s, x2 c + x1 s].

  A rotation by +angle per pair; its transpose is the rotation by -angle, so the backward
  pass is one more rotation of dy (one fused pass; autodiff's split/concat transposes took
  two). The tables come from integer positions and get no gradient.
  """
  return _rotate(x_BxTxNxDh, cos_BxTxR, sin_BxTxR)


def _rope_fwd(x, cos, sin):
  return _rotate(x, cos, sin), (cos, sin)


def _rope_bwd(res, dy):
  cos, sin = res
  return _rotate(dy, cos, -sin), jnp.zeros_like(cos), jnp.zeros_like(sin)


apply_rope.defvjp(_rope_fwd, _rope_bwd)


def _bias(x: jax.Array, b: jax.Array) -> jax.Array:
  """x + b, with b broadcast over x's leading dimensions."""
  b = b.astype(x.dtype)
  return x + b.reshape((1,) * (x.ndim - b.ndim) + b.shape)


def decode_attention(q_Bx1xHxDh: jax.Array, k_BxKxSxDh: jax.Array,
                     v_BxKxSxDh: jax.Array, mask_Bx1x1xS: jax.Array
                     ) -> jax.Array:
  """Softmax attention of one query per row over a [B, K, S, Dh] cache.

  With G = H / K query heads per key/value head (GQA),

    s[b, k, g, s] = q[b, k, g] . k[b, k, s] / sqrt(Dh)  (masked: -inf)
    e = exp(s - max_s s)
    out[b, k, g] = (sum_s e[b, k, g, s] v[b, k, s]) / sum_s e[b, k, g, s]

  Both passes read the cache in its stored layout: the output as a dot
  batched over (b, k) that contracts S, the scores as one that contracts the
  minor axis Dh (on CPU a float32 product and a reduction over Dh instead,
  which took ~23% less time than XLA CPU's batched dot in a scratch timing at
  B=16, S=192, K=2, G=4, Dh=64). The softmax is normalised after the output
  dot, on [B, K, G, Dh] instead of [B, K, G, S]. Against the [B, S, K, Dh]
  cache of earlier versions, `benchmarks/sampler_bench.py --preset=small`
  went from 2.54 to 2.32-2.36 s per call (2 CPU cores). Same result as
  `jax.nn.dot_product_attention` (on the cache moved to [B, S, K, Dh]) up to
  float32 summation order; a row with no visible key gives NaN, as there.
  The dots take the cache's dtype (q and the weights e cast to it) and sum
  in float32, so the cache is never copied to another dtype.

  Returns:
    [B, 1, H, Dh] in the dtype of q.
  """
  b, _, h, dh = q_Bx1xHxDh.shape
  k, s = k_BxKxSxDh.shape[1], k_BxKxSxDh.shape[2]
  q_BxKxGxDh = q_Bx1xHxDh.reshape(b, k, h // k, dh)
  if platform.target() == "cpu":
    scores_BxKxGxS = jnp.sum(
        q_BxKxGxDh.astype(jnp.float32)[:, :, :, None, :]
        * k_BxKxSxDh.astype(jnp.float32)[:, :, None, :, :], axis=-1)
  else:
    scores_BxKxGxS = jnp.einsum(
        "bkgd,bksd->bkgs", q_BxKxGxDh.astype(k_BxKxSxDh.dtype), k_BxKxSxDh,
        preferred_element_type=jnp.float32)
  scores_BxKxGxS = scores_BxKxGxS * (1.0 / math.sqrt(dh))
  ok_Bx1x1xS = mask_Bx1x1xS.reshape(b, 1, 1, s)
  scores_BxKxGxS = jnp.where(ok_Bx1x1xS, scores_BxKxGxS, -jnp.inf)
  e_BxKxGxS = jnp.exp(scores_BxKxGxS
                      - jnp.max(scores_BxKxGxS, axis=-1, keepdims=True))
  out_BxKxGxDh = jnp.einsum(
      "bkgs,bksd->bkgd", e_BxKxGxS.astype(v_BxKxSxDh.dtype), v_BxKxSxDh,
      preferred_element_type=jnp.float32)
  out_BxKxGxDh = out_BxKxGxDh / jnp.sum(e_BxKxGxS, axis=-1)[..., None]
  return out_BxKxGxDh.reshape(b, 1, h, dh).astype(q_Bx1xHxDh.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optional qkv bias and qk-norm."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, h, k, dh, pd = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                       cfg.head_dim, cfg.param_dtype)
    self.cfg = cfg
    self.q = param(rngs, (d, h, dh), ("embed", "heads", "head_dim"), pd)
    self.k = param(rngs, (d, k, dh), ("embed", "kv_heads", "head_dim"), pd)
    self.v = param(rngs, (d, k, dh), ("embed", "kv_heads", "head_dim"), pd)
    self.o = param(rngs, (h, dh, d), ("heads", "head_dim", "embed"), pd)
    lora.add(self, "q", rngs, (d,), ("embed",), (h, dh), ("heads", "head_dim"))
    lora.add(self, "k", rngs, (d,), ("embed",), (k, dh), ("kv_heads", "head_dim"))
    lora.add(self, "v", rngs, (d,), ("embed",), (k, dh), ("kv_heads", "head_dim"))
    lora.add(self, "o", rngs, (h, dh), ("heads", "head_dim"), (d,), ("embed",))
    if cfg.qkv_bias:
      self.q_bias = param(None, (h, dh), ("heads", "head_dim"), pd, "zeros")
      self.k_bias = param(None, (k, dh), ("kv_heads", "head_dim"), pd, "zeros")
      self.v_bias = param(None, (k, dh), ("kv_heads", "head_dim"), pd, "zeros")
    if cfg.o_bias:
      self.o_bias = param(None, (d,), ("embed",), pd, "zeros")
    if cfg.qk_norm:
      self.q_norm = RMSNorm(dh, cfg.rms_norm_eps, ("head_dim",), pd)
      self.k_norm = RMSNorm(dh, cfg.rms_norm_eps, ("head_dim",), pd)

  def __call__(self, x_BxTxD: jax.Array, cos: jax.Array, sin: jax.Array,
               mask_Bx1xTxS: jax.Array, kv: dict[str, jax.Array] | None,
               cache_index: jax.Array | int, causal: bool = False,
               segment_ids: jax.Array | None = None,
               paged: dict[str, Any] | None = None
               ) -> tuple[jax.Array, Any]:
    """y [B, T, D] and the updated kv cache entry (or None).

    `paged` (the rollout engine's decode step, T = 1, B = decode slots): `kv` is then this
    layer's page pool [N, Ps, 2K, Dh] and paged = {"table": [B, M], "pos": [B] (where this
    token is written), "lens": [B] (tokens visible after the write; 0: idle slot),
    "pages_per_block": int, "kernel": "jax" | "tpu", "slot_group": slots per attention
    call (0: as the kernel needs; `paged_attention.attend`), and for "tpu" on a mesh "mesh" and
    "head_axis", the mesh axis the heads are split over}; see `models.paged_attention`. The
    updated pool comes back in place of the cache entry. The mask argument is unused. With
    "batch_axes" (decode replicas, needs "mesh") slots and pool pages are split over those
    mesh axes and each shard's table holds its own pages' local ids
    (`paged_attention.replica_step`).

    `causal=True` promises a call from slot 0 whose keys are its queries'
    slots (S = T, every key after its query hidden; no cache, or a prefill
    at slot 0 into a cache of T slots): both paths then skip those keys
    (`attention.causal_dense_attention`, `attention.causal_blocked_attention`).
    `transformer.Transformer` sets it for such calls. A cache-free such call (a train
    pass) runs jax's splash kernel instead where `cfg.attention_kernel` selects it
    (`splash_attention.choose`: "auto" = on TPU; `attention.splash_causal_attention`).

    `mask_Bx1xTxS` is either the dense boolean mask of
    `transformer.attention_mask`, or a [B, S] key mask: then the blocked
    path runs, with query i at slot cache_index + i seeing keys j <= that
    slot (see `attention.blocked_attention`).

    `segment_ids` (None, or int32 [B, S] for a cache-free call of packed
    rows, 0 = padding): a query sees only keys of its own segment, in every
    path (`attention` module docstring says what each path then skips).
    """
    if segment_ids is not None and kv is not None:
      raise ValueError("segment_ids are for cache-free calls (packed train rows).")
    cfg, dt = self.cfg, self.cfg.dtype
    q = lora.project(self, "q", x_BxTxD, 1, dt)
    k = lora.project(self, "k", x_BxTxD, 1, dt)
    v = lora.project(self, "v", x_BxTxD, 1, dt)
    if cfg.qkv_bias:
      q = _bias(q, self.q_bias[...])
      k = _bias(k, self.k_bias[...])
      v = _bias(v, self.v_bias[...])
    # Names for a selective remat's policy (`transformer.SAVED`); no-ops otherwise.
    q, k, v = checkpoint_name(q, "q"), checkpoint_name(k, "k"), checkpoint_name(v, "v")
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if paged is not None and paged.get("batch_axes"):
      # Decode replicas: each (data, fsdp) shard writes and attends over its own slots
      # and its own part of the pool, with no communication.
      out, pages = paged_attention.replica_step(
          q[:, 0], kv, paged_attention.combine(k[:, 0], v[:, 0]), paged["table"],
          paged["pos"], paged["lens"], mesh=paged["mesh"], batch_axes=paged["batch_axes"],
          head_axis=paged.get("head_axis"), kernel=paged.get("kernel", "jax"),
          pages_per_block=paged.get("pages_per_block", 8),
          slot_group=paged.get("slot_group", 0))
      y = lora.project(self, "o", out[:, None].astype(dt), 2, dt)
      return (_bias(y, self.o_bias[...]) if cfg.o_bias else y), pages
    if paged is not None:
      pages = paged_attention.write_tokens(kv, paged_attention.combine(k[:, 0], v[:, 0]),
                                           paged["table"], paged["pos"])
      out = paged_attention.attend(
          q[:, 0], pages, paged["lens"], paged["table"], kernel=paged.get("kernel", "jax"),
          pages_per_block=paged.get("pages_per_block", 8),
          slot_group=paged.get("slot_group", 0), mesh=paged.get("mesh"),
          head_axis=paged.get("head_axis"))[:, None]
      y = lora.project(self, "o", out.astype(dt), 2, dt)
      return (_bias(y, self.o_bias[...]) if cfg.o_bias else y), pages
    if kv is not None:
      # The cache is [B, K, S, Dh]: this step's keys/values go in at slot
      # cache_index as [B, K, T, Dh].
      idx = jnp.asarray(cache_index, jnp.int32)
      zero = jnp.zeros((), jnp.int32)
      start = (zero, zero, idx, zero)
      k_all = jax.lax.dynamic_update_slice(
          kv["k"], jnp.swapaxes(k, 1, 2).astype(kv["k"].dtype), start)
      v_all = jax.lax.dynamic_update_slice(
          kv["v"], jnp.swapaxes(v, 1, 2).astype(kv["v"].dtype), start)
      kv = {"k": k_all, "v": v_all}
      if q.shape[1] == 1:
        # One decode step: attend over the cache as stored. A [B, S] key
        # mask gets the causal rule here (slots <= cache_index).
        mask = mask_Bx1xTxS
        if mask.ndim == 2:
          mask = mask.astype(bool) & (jnp.arange(mask.shape[1]) <= idx)[None]
        out = decode_attention(q, k_all, v_all,
                               mask.reshape(mask.shape[0], 1, 1, -1))
        y = lora.project(self, "o", out, 2, dt)
        return (_bias(y, self.o_bias[...]) if cfg.o_bias else y), kv
      # A prefill (T > 1): the attention kernels take [B, S, K, Dh].
      k = jnp.swapaxes(k_all, 1, 2).astype(dt)
      v = jnp.swapaxes(v_all, 1, 2).astype(dt)
    out = self.attend(q, k, v, mask_Bx1xTxS, cache_index, causal and kv is None,
                      causal, segment_ids)
    y = lora.project(self, "o", out, 2, dt)
    if cfg.o_bias:
      y = _bias(y, self.o_bias[...])
    return checkpoint_name(y, "o"), kv

  def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
             cache_index: jax.Array | int = 0, cache_free: bool = True, causal: bool = True,
             seg: jax.Array | None = None) -> jax.Array:
    """Multi-token attention of q [B, T, H, Dh] over k, v [B, S, K, Dh]: [B, T, H, Dh].

    A cache-free causal call (a train pass) runs jax's splash kernel where
    `cfg.attention_kernel` selects it (laid out over the activation mesh, if any); else the
    pure-JAX path the mask and `causal` call for (`__call__` says which). Also called per
    shard by `models.sequence_parallel` (this shard's heads, every position).
    """
    cfg = self.cfg
    splash = cache_free and causal and q.shape[1] > 1 and cfg.attention_kernel != "jax"
    if splash:  # a train pass's self-attention: jax's splash kernel where it runs (TPU)
      rules = shd.activation_mesh()
      splash = splash_attention.choose(
          cfg.attention_kernel, q.shape[2], k.shape[2], cfg.head_dim, q.dtype,
          q.shape[0], q.shape[1], cfg.attention_block, rules) == "tpu"
    if splash:
      return attention.splash_causal_attention(q, k, v, mask, seg, cfg.attention_block,
                                               rules)
    if mask.ndim == 2 and causal:
      return attention.causal_blocked_attention(q, k, v, mask, cfg.attention_block, seg)
    if mask.ndim == 2:
      return attention.blocked_attention(q, k, v, mask, cache_index, cfg.attention_block,
                                         seg)
    if causal:
      return attention.causal_dense_attention(q, k, v, mask, seg)
    return attention.dense_attention(q, k, v, mask, seg)


class MLP(nnx.Module):
  """SwiGLU: down(silu(x W_gate) * (x W_up))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
    self.cfg = cfg
    self.gate = param(rngs, (d, f), ("embed", "mlp"), pd)
    self.up = param(rngs, (d, f), ("embed", "mlp"), pd)
    self.down = param(rngs, (f, d), ("mlp", "embed"), pd)
    lora.add(self, "gate", rngs, (d,), ("embed",), (f,), ("mlp",))
    lora.add(self, "up", rngs, (d,), ("embed",), (f,), ("mlp",))
    lora.add(self, "down", rngs, (f,), ("mlp",), (d,), ("embed",))
    if cfg.mlp_bias:
      self.gate_bias = param(None, (f,), ("mlp",), pd, "zeros")
      self.up_bias = param(None, (f,), ("mlp",), pd, "zeros")
      self.down_bias = param(None, (d,), ("embed",), pd, "zeros")

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    dt = self.cfg.dtype
    g = lora.project(self, "gate", x_BxTxD, 1, dt)
    u = lora.project(self, "up", x_BxTxD, 1, dt)
    if self.cfg.mlp_bias:
      g, u = _bias(g, self.gate_bias[...]), _bias(u, self.up_bias[...])
    g = checkpoint_name(shd.constrain(g, ("batch", None, "mlp")), "gate")
    u = checkpoint_name(shd.constrain(u, ("batch", None, "mlp")), "up")
    y = lora.project(self, "down", jax.nn.silu(g) * u, 1, dt)
    if self.cfg.mlp_bias:
      y = _bias(y, self.down_bias[...])
    return y


class Block(nnx.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ("embed",),
                             cfg.param_dtype)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ("embed",),
                            cfg.param_dtype)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, cos, sin, mask, kv, cache_index, causal=False,
               segment_ids=None, paged=None):
    y, kv = self.attn(self.attn_norm(x), cos, sin, mask, kv, cache_index,
                      causal, segment_ids, paged=paged)
    x = shd.constrain(x + y, _ROWS)
    x = shd.constrain(x + self.mlp(self.mlp_norm(x)), _ROWS)
    return x, kv
