"""The decoder-only transformer (Qwen2/2.5, Qwen3, Llama 3), Flax NNX.

  tokens_BxT -embed-> [Block x L] -RMSNorm-> hidden_BxTxD -logits-> [B, T, V]

The L blocks' parameters are stacked [L, ...] (`models.stacked`, `cfg.scan_layers`) and a
cache-free call (the train passes) runs them under `jax.lax.scan`: with a partial remat
(`cfg.remat_layers` = N < L) one scan over the N rematerialised blocks (`remat_block`; the
last `cfg.remat_selective` of them `selective_block`, a scan of their own), then one over
the L - N others. Calls with a cache (prefill, decode) loop over the layers.

Left-padded batches are handled by the caller's positions (for a mask m:
`positions = max(cumsum(m) - 1, 0)`) and the key mask. Decoding uses a KV
cache: a tuple of L dicts {"k", "v"} of plain arrays [B, K, S, Dh] (batch is
axis 0 of every leaf, so `jax.tree.map(lambda x: jnp.repeat(x, n, 0), cache)`
expands a prompt cache for group sampling).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax import sharding as shd
from vapo_jax.models import layers
from vapo_jax.models import lora
from vapo_jax.models import sequence_parallel
from vapo_jax.models import splash_attention
from vapo_jax.models import stacked
from vapo_jax.models.config import ModelConfig
from vapo_jax.models.matmul import matmul

KVCache = tuple[dict[str, jax.Array], ...]


def positions_from_mask(mask_BxT: jax.Array) -> jax.Array:
  """Positions of a left- (or right-) padded batch: max(cumsum(m) - 1, 0)."""
  pos = jnp.cumsum(mask_BxT.astype(jnp.int32), axis=-1) - 1
  return jnp.maximum(pos, 0)


def attention_mask(kv_mask_BxS: jax.Array, t: int,
                   cache_index: jax.Array | int = 0) -> jax.Array:
  """Boolean [B, 1, T, S]: query i (absolute slot cache_index+i) sees key j
  iff j <= cache_index + i and key j is real."""
  s = kv_mask_BxS.shape[-1]
  q_abs = jnp.asarray(cache_index, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
  causal_TxS = jnp.arange(s, dtype=jnp.int32)[None, :] <= q_abs[:, None]
  return causal_TxS[None, None] & kv_mask_BxS.astype(bool)[:, None, None, :]


def _run_block(graphdef, state, x, cos, sin, mask, seg=None):
  """One cache-free decoder block as a function of its parameters. graphdef: the block's
  GraphDef, or a function (state, x, cos, sin, mask, seg) -> y that runs it (a
  `sequence_parallel.runner`)."""
  if not isinstance(graphdef, nnx.GraphDef):
    return graphdef(state, x, cos, sin, mask, seg)
  return nnx.merge(graphdef, state)(x, cos, sin, mask, None, 0, True, seg)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def remat_block(graphdef, state, x_BxTxD, cos, sin, mask, seg=None):
  """A cache-free block whose backward pass recomputes its forward.

  Only the block's inputs (parameters, x, RoPE tables, mask) are kept for the
  backward pass. Two optimization barriers order that pass layer by layer:
  the recomputation waits for the incoming dL/dy, and dL/dx leaves only
  together with the parameter gradients. Without the second, XLA deferred
  each layer's weight-gradient matmuls to the end of the backward pass and
  kept every layer's recomputed activations alive (a small TPU compile with
  a plain `jax.checkpoint` grew the same way): in a TPU compile of the 32B
  policy step, temporaries grew ~2.1 GB per layer without it and ~0.34 GB
  per layer (the saved input, gradient buffers) with it. `seg`: the packed
  rows' segment ids (or None), kept like the mask.
  """
  return _run_block(graphdef, state, x_BxTxD, cos, sin, mask, seg)


def _remat_fwd(graphdef, state, x, cos, sin, mask, seg=None):
  return _run_block(graphdef, state, x, cos, sin, mask, seg), (state, x, cos, sin,
                                                                mask, seg)


def _remat_bwd(graphdef, res, dy):
  (state, x, cos, sin, mask, seg), dy = jax.lax.optimization_barrier((res, dy))
  # With LoRA adapters only they get gradients: the frozen weights' dW matmuls
  # are not emitted (inside the barrier below they could not be pruned).
  train, frozen = lora.split_trainable(state)
  _, vjp = jax.vjp(lambda tr, x: _run_block(graphdef, lora.join(tr, frozen), x,
                                            cos, sin, mask, seg), train, x)
  # dL/dx (what the next layer down waits for) leaves together with the
  # parameter gradients, so the scheduler cannot defer this layer's
  # weight-gradient matmuls, and keep their activation inputs alive, past it.
  d_train, d_x = jax.lax.optimization_barrier(vjp(dy))
  d_state = lora.join(d_train, None if frozen is None
                      else jax.tree.map(jnp.zeros_like, frozen))
  # The RoPE tables come from integer positions: nothing upstream needs their
  # cotangent, so it is not computed (inside the barrier it could not be pruned).
  return d_state, d_x, jnp.zeros_like(cos), jnp.zeros_like(sin), None, None


remat_block.defvjp(_remat_fwd, _remat_bwd)


# The matmul outputs a selective remat keeps (`checkpoint_name`s in `layers`): per token
# H Dh + 2 K Dh (q, k, v) + D (o) + 2 F (gate, up) values; and the splash kernel's residuals
# (its output, H Dh, and H float32 log-sum-exps), so that on TPU the backward runs no
# attention forward. The attention output itself is not kept: it is the splash output
# reshaped (elementwise), and the pure-JAX paths recompute their forward anyway. (Kept too,
# it cost ~6% more per block for nothing: 172 against 153 MB in a v5p AOT compile of a
# D 1,024, F 4,096 block at 8,192 tokens.)
SAVED = ("q", "k", "v", "o", "gate", "up", splash_attention.RESIDUALS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def selective_block(graphdef, state, x_BxTxD, cos, sin, mask, seg=None):
  """A cache-free block whose backward keeps its matmul outputs (`SAVED`) and recomputes
  the rest (norms, RoPE, SiLU, biases, the attention forward).

  Its forward is `jax.vjp` of the block under `jax.checkpoint(policy=save_only_these_names(
  *SAVED))`; the residuals are that vjp's (the saved outputs, the inputs, the weights). The
  backward orders itself as `remat_block`'s, by the same two optimization barriers: the
  recomputation waits for dL/dy, and dL/dx leaves together with the parameter gradients.
  With LoRA adapters only they are differentiated (the frozen weights get zeros).
  """
  return _run_block(graphdef, state, x_BxTxD, cos, sin, mask, seg)


def _selective_fwd(graphdef, state, x, cos, sin, mask, seg=None):
  train, frozen = lora.split_trainable(state)
  policy = jax.checkpoint_policies.save_only_these_names(*SAVED)
  run = jax.checkpoint(lambda tr, x: _run_block(graphdef, lora.join(tr, frozen), x, cos,
                                                sin, mask, seg), policy=policy)
  y, vjp = jax.vjp(run, train, x)
  # frozen (the same buffers the vjp holds) only for its zero gradients' shapes
  return y, (vjp, cos, sin, frozen)


def _selective_bwd(graphdef, res, dy):
  (vjp, cos, sin, frozen), dy = jax.lax.optimization_barrier((res, dy))
  d_train, d_x = jax.lax.optimization_barrier(vjp(dy))
  d_state = lora.join(d_train, None if frozen is None
                      else jax.tree.map(jnp.zeros_like, frozen))
  return d_state, d_x, jnp.zeros_like(cos), jnp.zeros_like(sin), None, None


selective_block.defvjp(_selective_fwd, _selective_bwd)


def scan_blocks(blocks: stacked.StackedBlocks, x_BxTxD: jax.Array, cos, sin, mask, seg,
                num_remat: int, num_selective: int = 0) -> jax.Array:
  """Cache-free blocks 0..L-1 over x, as `jax.lax.scan`s over the stacked parameters.

  With N = num_remat, S = num_selective: blocks [0, N - S) run as `remat_block` (each keeps
  only its input for the backward, which recomputes it; the two optimization barriers act
  per scan step), [N - S, N) as `selective_block` (their matmul outputs kept), [N, L) as
  plain blocks (their activations saved, stacked by the scan). Equal to the per-layer loop
  of `Transformer.__call__` with `scan_layers=False`.
  """
  graphdef, state = nnx.split(blocks)
  n = len(blocks)
  num_full = num_remat - num_selective
  # ModelConfig.collective_matmul: every block per shard, sequence-parallel (or None)
  sp = sequence_parallel.runner(graphdef, state, blocks.attn.cfg, x_BxTxD.shape[1])
  if sp is not None:
    graphdef = sp

  def remat_step(x, layer):
    return remat_block(graphdef, layer, x, cos, sin, mask, seg), None

  def selective_step(x, layer):
    return selective_block(graphdef, layer, x, cos, sin, mask, seg), None

  def plain_step(x, layer):
    return _run_block(graphdef, layer, x, cos, sin, mask, seg), None

  parts = ((remat_step, 0, num_full), (selective_step, num_full, num_remat),
           (plain_step, num_remat, n))
  for step, lo, hi in parts:
    if hi <= lo:
      continue
    part = state if (lo, hi) == (0, n) else jax.tree.map(lambda a, lo=lo, hi=hi: a[lo:hi],
                                                         state)
    x_BxTxD, _ = jax.lax.scan(step, x_BxTxD, part)
  return x_BxTxD


class Transformer(nnx.Module):
  """Decoder-only transformer configured by a `ModelConfig`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               lm_head: bool = True):
    """Builds the parameters; `lm_head=False` omits an untied head (critic)."""
    self.cfg = cfg
    self.embed = layers.param(rngs, (cfg.vocab_size, cfg.hidden_size),
                              ("vocab", "embed"), cfg.param_dtype)
    if cfg.scan_layers:
      self.blocks = stacked.StackedBlocks(cfg, rngs=rngs)
    else:
      self.blocks = nnx.List([layers.Block(cfg, rngs=rngs)
                              for _ in range(cfg.num_layers)])
    self.final_norm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps,
                                     ("embed",), cfg.param_dtype)
    if lm_head and not cfg.tie_word_embeddings:
      self.lm_head = layers.param(rngs, (cfg.hidden_size, cfg.vocab_size),
                                  ("embed", "vocab"), cfg.param_dtype)

  @property
  def real_vocab_size(self) -> int:
    return self.cfg.real_vocab_size or self.cfg.vocab_size

  def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array,
               kv_mask_BxS: jax.Array, *, cache: KVCache | None = None,
               cache_index: jax.Array | int = 0,
               segment_ids_BxT: jax.Array | None = None
               ) -> tuple[jax.Array, KVCache | None]:
    """Final hidden states [B, T, D] (compute dtype) and the updated cache.

    Args:
      tokens_BxT: int32 token ids.
      positions_BxT: int32 RoPE positions.
      kv_mask_BxS: 1/True where a key slot holds a real token. Without a
        cache S = T; with a cache S is the cache length and the mask covers
        the slots written by this call.
      cache: None, or the cache from `init_cache`.
      cache_index: slot where this call's keys/values are written (int or
        traced int32 scalar, one for the whole batch); 0 without a cache.
      segment_ids_BxT: None, or int32 [B, T] for packed rows (cache-free):
        s > 0 marks the tokens of the s-th sequence of a row, 0 padding. No
        token attends to another segment; the caller restarts the positions
        per segment and passes kv_mask = segment_ids > 0 (`vapo_jax.packing`).
    """
    cfg = self.cfg
    t = tokens_BxT.shape[1]
    if cache is None and kv_mask_BxS.shape[1] != t:
      raise ValueError(f"Without a cache kv_mask must be [B, T={t}], got "
                       f"{kv_mask_BxS.shape}.")
    if cache is None and not (isinstance(cache_index, int) and cache_index == 0):
      raise ValueError(f"cache_index={cache_index!r} without a cache: a cache-free call "
                       "starts at slot 0.")
    if segment_ids_BxT is not None and (cache is not None
                                        or segment_ids_BxT.shape != tokens_BxT.shape):
      raise ValueError(f"segment_ids must be [B, T]={tokens_BxT.shape} in a cache-free "
                       f"call, got {segment_ids_BxT.shape} (cache: {cache is not None}).")
    seg = segment_ids_BxT
    x = jnp.take(self.embed[...], tokens_BxT, axis=0).astype(cfg.dtype)
    x = shd.constrain(x, ("batch", None, None))
    cos, sin = layers.rope_tables(positions_BxT,
                                   layers.rope_inv_freq(cfg))
    if cfg.blocked_attention(t, kv_mask_BxS.shape[1]):
      mask = kv_mask_BxS  # [B, S]: each block builds its own causal mask
    else:
      mask = attention_mask(kv_mask_BxS, t, cache_index)
    # Queries and keys share slots 0..T-1 (no cache, or a prefill at slot 0 into
    # a cache of T slots) and the mask hides later keys: the attention may skip
    # them (`attention.causal_dense_attention`, `causal_blocked_attention`).
    # (A cache-free call passed the checks above, so it always qualifies.)
    causal = (isinstance(cache_index, int) and cache_index == 0
              and kv_mask_BxS.shape[1] == t)
    if cache is None and cfg.scan_layers:
      x = scan_blocks(self.blocks, x, cos, sin, mask, seg, cfg.num_remat,
                      cfg.remat_selective)
      # rows over the batch axes, positions whole (after sequence-parallel blocks, whose
      # residual leaves split over `tensor` on positions, an all-gather of [rows, T, D])
      return self.final_norm(shd.constrain(x, ("batch", None, None))), None
    new_cache = []
    for i, block in enumerate(self.blocks):
      kind = cfg.remat_kind(i) if cache is None else None
      graphdef, state = nnx.split(block)
      sp = None if cache is not None else sequence_parallel.runner(graphdef, state, cfg, t)
      if kind is not None or sp is not None:
        run = {"full": remat_block, "selective": selective_block}.get(kind, _run_block)
        x = run(sp or graphdef, state, x, cos, sin, mask, seg)
        continue
      x, kv = block(x, cos, sin, mask, None if cache is None else cache[i],
                    cache_index, causal, seg)
      new_cache.append(kv)
    x = self.final_norm(shd.constrain(x, ("batch", None, None)))
    return x, (None if cache is None else tuple(new_cache))

  def decode_paged(self, tokens_S: jax.Array, pos_S: jax.Array, pages: tuple, *,
                   table_SxM: jax.Array, lens_S: jax.Array, pages_per_block: int = 8,
                   kernel: str = "jax", mesh=None, head_axis=None, batch_axes=(),
                   slot_group: int = 0) -> tuple[jax.Array, tuple]:
    """One decode step of S slots over paged KV pools (the rollout engine's path).

    Token tokens_S[s] sits at RoPE position pos_S[s] and its keys/values are written there
    in slot s's pages (`models.paged_attention`); it attends over the slot's first
    lens_S[s] tokens (pos + 1 for a live slot, 0 for an idle one, which writes nothing when
    its table row holds no page). kernel="tpu" runs jax's Pallas kernel (per shard of
    `mesh`, heads over `head_axis`). With `batch_axes` (decode replicas) slots and pool
    pages are split over those mesh axes and each slot's table row holds its replica's
    local page ids (`paged_attention.replica_step`). slot_group: slots per attention call
    (`paged_attention.in_slot_groups`; 0: as the kernel needs). Returns (final hidden
    [S, D], the L updated pools).
    """
    x = jnp.take(self.embed[...], tokens_S[:, None], axis=0).astype(self.cfg.dtype)
    cos, sin = layers.rope_tables(pos_S[:, None], layers.rope_inv_freq(self.cfg))
    paged = {"table": table_SxM, "pos": pos_S, "lens": lens_S,
             "pages_per_block": pages_per_block, "kernel": kernel, "mesh": mesh,
             "head_axis": head_axis, "batch_axes": tuple(batch_axes),
             "slot_group": slot_group}
    new = []
    for block, pool in zip(self.blocks, pages):
      x, pool = block(x, cos, sin, None, pool, 0, paged=paged)
      new.append(pool)
    return self.final_norm(x)[:, 0], tuple(new)

  def head_weight(self) -> jax.Array:
    """The LM head as [D, V] (the embedding transposed when tied)."""
    if self.cfg.tie_word_embeddings:
      return self.embed[...].T
    return self.lm_head[...]

  def logits(self, hidden_BxTxD: jax.Array) -> jax.Array:
    """float32 logits [..., V]; matmul in compute dtype, float32 accumulate."""
    dt = self.cfg.dtype
    return matmul(hidden_BxTxD.astype(dt), self.head_weight().astype(dt), 1,
                  jnp.float32)


def init_cache(cfg_or_model: ModelConfig | Transformer, batch: int,
               max_len: int, dtype: Any = None) -> KVCache:
  """Zero KV cache: L dicts {"k", "v"} of [batch, K, max_len, Dh]."""
  cfg = getattr(cfg_or_model, "cfg", cfg_or_model)
  dtype = cfg.dtype if dtype is None else dtype
  shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  return tuple({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
               for _ in range(cfg.num_layers))


def init_pages(cfg_or_model: ModelConfig | Transformer, num_pages: int, page_size: int,
               dtype: Any = None) -> tuple[jax.Array, ...]:
  """Zero paged KV pools: L arrays [num_pages, page_size, 2K, Dh] (keys even, values odd)."""
  cfg = getattr(cfg_or_model, "cfg", cfg_or_model)
  dtype = cfg.dtype if dtype is None else dtype
  shape = (num_pages, page_size, 2 * cfg.num_kv_heads, cfg.head_dim)
  return tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))


def forward_logits(model: Transformer, tokens_BxT: jax.Array,
                   mask_BxT: jax.Array) -> jax.Array:
  """Convenience full forward: float32 logits [B, T, V] of a padded batch."""
  hidden, _ = model(tokens_BxT, positions_from_mask(mask_BxT), mask_BxT)
  return model.logits(hidden)


def init_sharded(build: Callable[[nnx.Rngs], nnx.Module], mesh,
                 rules: shd.Rules = shd.DEFAULT_RULES, seed: int = 0):
  """Random init under jit, each parameter created directly in its sharding.

  Example: `init_sharded(lambda r: Transformer(cfg, rngs=r), mesh)`. Nothing
  is materialised whole on one device.
  """
  graphdef, abs_state = nnx.split(
      nnx.eval_shape(lambda: build(nnx.Rngs(seed))))
  shardings = shd.state_shardings(abs_state, mesh, rules)
  init = jax.jit(lambda: nnx.state(build(nnx.Rngs(seed))),
                 out_shardings=shardings)
  return nnx.merge(graphdef, init())
