"""Per-token log-probabilities and entropies of responses under the policy.

A batch row is `concat(prompt left-padded to P, response right-padded)`, of
length L = P + R. The response token at column P + t is predicted by the
hidden state at column P + t - 1, so with z = logits / temperature:

  logp[:, t]    = log softmax(z[:, P + t - 1])[tokens[:, P + t]]
  entropy[:, t] = -sum_v p_v log p_v  at the same position,  t in [0, R).

Only the R hidden states at columns P-1 .. L-2 go through the vocab
projection, in chunks of `chunk` positions under `jax.checkpoint`, so neither
the forward nor the backward pass holds a float32 [B, R, V] array (Qwen's V is
152k): peak extra memory is about B * chunk * V floats.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from vapo_jax.models.matmul import matmul
from vapo_jax.sharding import activation_mesh, constrain, logical_to_spec
from vapo_jax.models.transformer import Transformer, positions_from_mask


def chunked_logprobs(hidden_BxRxD: jax.Array, targets_BxR: jax.Array,
                     head_DxV: jax.Array, *, temperature: float = 1.0,
                     chunk: int = 128, dtype=None,
                     vocab_size: int | None = None, count=None, remat: bool = True
                     ) -> tuple[jax.Array, jax.Array]:
  """log p(target) and entropy from hidden states, chunked over R.

  Rows of the head at or above `vocab_size` (an embedding padded past the
  tokenizer) get probability 0, as in the sampler: the distribution is over real
  tokens only, so teacher-forced log-probs equal the behaviour log-probs.

  Args:
    hidden_BxRxD: hidden states that predict `targets_BxR`.
    targets_BxR: int token ids.
    head_DxV: the LM head.
    temperature: logits are divided by it.
    chunk: positions per vocab-projection chunk.
    dtype: matmul input dtype (default: hidden's); accumulation is float32.
    vocab_size: number of real tokens (None: every row of the head is real).
    count: (traced) positions r < count are computed; the chunks past it are skipped
      (`lax.cond`, forward and backward) and give 0. None: all R.
    remat: recompute each chunk's logits in the backward pass (`jax.checkpoint`) rather
      than keep them: peak memory B * chunk * V floats instead of B * R * V.

  Returns:
    (logp_BxR, entropy_BxR), float32.
  """
  b, r, d = hidden_BxRxD.shape
  dtype = hidden_BxRxD.dtype if dtype is None else dtype
  c = max(1, min(chunk, r))
  n = -(-r // c)
  pad = n * c - r
  h = jnp.pad(hidden_BxRxD, ((0, 0), (0, pad), (0, 0)))
  y = jnp.pad(targets_BxR, ((0, 0), (0, pad)))
  h_NxBxCxD = h.reshape(b, n, c, d).swapaxes(0, 1)
  y_NxBxC = y.reshape(b, n, c).swapaxes(0, 1)
  # Gathered over the batch axes once, before the chunk loop: inside an activation-sharding
  # context an FSDP-sharded head (D over fsdp) would otherwise be all-gathered in every
  # chunk, forward and backward (XLA does not hoist it: `hlo_stats.invariant_gathers`).
  w = constrain(head_DxV.astype(dtype), (None, "vocab"))
  v = head_DxV.shape[1]
  if vocab_size is not None and vocab_size >= v:
    vocab_size = None
  active = None if count is None else (jnp.asarray(count, jnp.int32) + c - 1) // c
  loop = functools.partial(_chunk_loop, temperature=temperature, dtype=dtype,
                           vocab_size=vocab_size, remat=remat)
  ctx = activation_mesh()
  if ctx is None:
    logp, ent = loop(h_NxBxCxD, y_NxBxC, w, active)
  else:
    # Per shard, under shard_map: the loop's head gradient then sums locally over the
    # chunks and is reduced over the batch axes once, after the loop (shard_map's transpose
    # of the replicated head). Left to the partitioner, it was all-reduced in every chunk of
    # the backward (with the chunk skip's cond in the loop, 168 all-reduces of the whole
    # head per qwen32b micro-batch on v5p).
    mesh, rules = ctx
    b_ax, v_ax = logical_to_spec(("batch", "vocab"), rules, mesh, (b, v))
    spec = P(None, b_ax, None)
    loop = jax.shard_map(
        functools.partial(loop, vocab_axes=_axes(v_ax), batch_axes=_axes(b_ax)), mesh=mesh,
        in_specs=(P(None, b_ax, None, None), spec, P(None, v_ax),
                  None if active is None else P()),
        out_specs=(spec, spec))
    logp, ent = loop(h_NxBxCxD, y_NxBxC, w, active)
  logp = logp.swapaxes(0, 1).reshape(b, n * c)[:, :r]
  ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :r]
  return logp, ent


def _axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry as a tuple of mesh axis names."""
  return () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))


def _varying(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """x marked as varying over the manual mesh `axes` (its gradient is summed over them)."""
  return jax.lax.pcast(x, axes, to="varying")


def _chunk_loop(h_NxBxCxD, y_NxBxC, w_DxV, active, *, temperature, dtype, vocab_size,
                remat, vocab_axes=(), batch_axes=()):
  """`chunked_logprobs`' scan over N chunks: (logp, entropy) [N, B, C] float32.

  w_DxV holds this shard's vocab columns when `vocab_axes` (mesh axes) split them: the
  log-sum-exp, the target's logit and the entropy's sum are then reduced over those axes
  (z = h w / T, lse = m + log psum(sum exp(z - m)) with m = pmax(max z), logp = z_y - lse,
  entropy = lse - psum(sum p z)). active: None, or the (traced) number of chunks to compute.
  """
  def psum(x):
    return jax.lax.psum(x, vocab_axes) if vocab_axes else x

  v = w_DxV.shape[1]
  offset = jax.lax.axis_index(vocab_axes) * v if vocab_axes else 0
  cols = offset + jnp.arange(v)
  real_V = None if vocab_size is None else cols < vocab_size
  inv_t = 1.0 / temperature

  def one(h_BxCxD, y_BxC):
    z = matmul(h_BxCxD.astype(dtype), w_DxV, 1, jnp.float32) * inv_t
    if real_V is not None:
      # A finite floor, not -inf: exp gives exactly 0 and p * z stays 0 in the
      # backward pass (0 * -inf would be NaN).
      z = jnp.where(real_V, z, -1e30)
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1))   # d lse / dz is softmax(z), any shift
    if vocab_axes:
      m = jax.lax.pmax(m, vocab_axes)
    lse = m + jnp.log(psum(jnp.sum(jnp.exp(z - m[..., None]), axis=-1)))
    y_local = y_BxC.astype(jnp.int32) - offset
    here = (y_local >= 0) & (y_local < v)
    z_y = jnp.take_along_axis(z, jnp.clip(y_local, 0, v - 1)[..., None], axis=-1)[..., 0]
    z_y = psum(jnp.where(here, z_y, 0.0))
    p = jnp.exp(z - lse[..., None])
    ent = lse - psum(jnp.sum(p * z, axis=-1))
    return z_y - lse, ent

  if active is None:
    chunk_fn = lambda i, h_c, y_c: one(h_c, y_c)  # noqa: E731
  else:
    def chunk_fn(i, h_c, y_c):
      zero = y_c.astype(jnp.float32) * 0.0    # y_c's sharding (under shard_map, its axes)
      return jax.lax.cond(i < active, one, lambda h_, y_: (zero, zero), h_c, y_c)
  # The checkpoint around the whole chunk, the cond inside it: the backward keeps only the
  # chunk's inputs (a checkpoint inside the cond kept the logits: +95 GB per v5p chip).
  if remat:
    chunk_fn = jax.checkpoint(chunk_fn)

  def body(carry, xs):
    return carry, chunk_fn(*xs)

  # Under shard_map, both marked as varying before the loop, so that their gradients sum
  # over the other operand's shards once, after it (the transposes of these casts): the
  # hidden states' over the vocab shards, the head's over the batch shards.
  if vocab_axes:
    h_NxBxCxD = _varying(h_NxBxCxD, vocab_axes)
  if batch_axes:
    w_DxV = _varying(w_DxV, batch_axes)
  n = h_NxBxCxD.shape[0]
  _, (logp, ent) = jax.lax.scan(body, None, (jnp.arange(n), h_NxBxCxD, y_NxBxC))
  return logp, ent


def response_logprobs(model: Transformer, tokens_BxL: jax.Array,
                      mask_BxL: jax.Array, prompt_len: int, *,
                      temperature: float = 1.0, chunk: int = 128
                      ) -> tuple[jax.Array, jax.Array]:
  """Log-probs and entropies of the response tokens, float32 [B, R].

  Args:
    model: the policy transformer.
    tokens_BxL: prompt (left-padded to `prompt_len`) + response (right-padded).
    mask_BxL: 1 for real tokens (prompt and response), 0 for padding.
    prompt_len: P, a static int >= 1.
    temperature: sampling temperature the logits are divided by.
    chunk: positions per vocab-projection chunk.

  Returns:
    (logp_BxR, entropy_BxR) with R = L - P; entries at padded response
    positions are 0.
  """
  if prompt_len < 1:
    raise ValueError(f"prompt_len must be >= 1, got {prompt_len}.")
  mask_BxL = mask_BxL.astype(jnp.int32)
  hidden, _ = model(tokens_BxL, positions_from_mask(mask_BxL), mask_BxL)
  h = hidden[:, prompt_len - 1:-1]
  logp, ent = chunked_logprobs(h, tokens_BxL[:, prompt_len:],
                               model.head_weight(), temperature=temperature,
                               chunk=chunk, dtype=model.cfg.dtype,
                               vocab_size=model.real_vocab_size)
  resp = mask_BxL[:, prompt_len:].astype(jnp.float32)
  return logp * resp, ent * resp


def token_logprobs(model: Transformer, tokens_BxL: jax.Array,
                   mask_BxL: jax.Array, *, chunk: int = 128
                   ) -> jax.Array:
  """Next-token log-probs of a whole sequence, float32 [B, L-1] (for SFT/NLL).

  `out[:, t] = log p(tokens[:, t+1] | tokens[:, :t+1])`, 0 where token t+1 is
  padding.
  """
  logp, _ = response_logprobs(model, tokens_BxL, mask_BxL, 1, chunk=chunk)
  return logp


# ----------------------------------------------------------------------------- packed rows


def packed_logprobs(model: Transformer, tokens_NxT: jax.Array, positions_NxT: jax.Array,
                    segment_ids_NxT: jax.Array, *, temperature: float = 1.0,
                    chunk: int = 128, head_NxT: jax.Array | None = None, shards: int = 1
                    ) -> tuple[jax.Array, jax.Array]:
  """Next-token log-probs and entropies at the slots of packed rows, float32 [N, T].

  out[r, j] = log softmax(z[r, j])[tokens[r, j + 1]] (and the entropy of that softmax):
  the prediction of slot j's hidden state for the next slot. Across a segment's end (and
  at j = T - 1) the value is meaningless; `packing.unpack` reads only the slots that
  predict a response token of the same segment. Rows come from `packing.gather` with
  restarting positions and segment ids (`packing.pack_indices`).

  head_NxT (the plan's "head" table, `packing.pack_indices`): the LM head runs only at the
  slots it lists, compacted per shard (the N rows are `shards` blocks; a block's slots are
  read as one flat run), in chunks up to the block with the most (a traced count): the
  head's work follows the response tokens, not the slots. Every other slot gives 0. None:
  the head at every slot.
  """
  seg = segment_ids_NxT.astype(jnp.int32)
  hidden, _ = model(tokens_NxT, positions_NxT.astype(jnp.int32), (seg > 0).astype(jnp.int32),
                    segment_ids_BxT=seg)
  targets = jnp.concatenate([tokens_NxT[:, 1:], jnp.zeros_like(tokens_NxT[:, :1])], axis=1)
  kw = dict(temperature=temperature, chunk=chunk, dtype=model.cfg.dtype,
            vocab_size=model.real_vocab_size)
  if head_NxT is None:
    return chunked_logprobs(hidden, targets, model.head_weight(), **kw)
  n, t, d = hidden.shape
  idx = head_NxT.reshape(shards, n // shards * t).astype(jnp.int32)   # [S, rT]
  ok = idx >= 0
  at = jnp.maximum(idx, 0)
  h = jnp.take_along_axis(hidden.reshape(shards, -1, d), at[..., None], axis=1)
  y = jnp.take_along_axis(targets.reshape(shards, -1), at, axis=1)
  count = jnp.max(jnp.sum(ok, axis=1))
  logit_bytes = (n // shards) * t * head_bytes_per_position(model)
  logp_c, ent_c = chunked_logprobs(h, y, model.head_weight(), count=count,
                                   remat=logit_bytes > HEAD_KEEP_BYTES, **kw)
  lanes = jnp.arange(shards)[:, None]

  def back(x_c):
    """Compacted [S, rT] back to the slots [N, T] (0 on the others)."""
    x = jnp.zeros(idx.shape, jnp.float32).at[lanes, at].add(jnp.where(ok, x_c, 0.0))
    return x.reshape(n, t)

  return back(logp_c), back(ent_c)


# Below this many bytes of logits per micro-batch and shard the head keeps its logits for
# the backward pass instead of recomputing them (one head matmul fewer per update).
HEAD_KEEP_BYTES = 512 * 2**20


def head_bytes_per_position(model: Transformer) -> int:
  """Bytes the head's backward keeps per position when not rematerialised: the float32
  logits and probabilities over the vocabulary."""
  return 2 * 4 * model.head_weight().shape[-1]
