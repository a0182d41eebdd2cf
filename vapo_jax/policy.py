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

import jax
import jax.numpy as jnp

from vapo_jax.models.matmul import matmul
from vapo_jax.sharding import constrain
from vapo_jax.models.transformer import Transformer, positions_from_mask


def chunked_logprobs(hidden_BxRxD: jax.Array, targets_BxR: jax.Array,
                     head_DxV: jax.Array, *, temperature: float = 1.0,
                     chunk: int = 128, dtype=None,
                     vocab_size: int | None = None
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
  inv_t = 1.0 / temperature
  v = head_DxV.shape[1]
  real_V = None if vocab_size is None or vocab_size >= v else (
      jnp.arange(v) < vocab_size)

  @jax.checkpoint
  def one(h_BxCxD, y_BxC):
    z = matmul(h_BxCxD.astype(dtype), w, 1, jnp.float32) * inv_t
    if real_V is not None:
      # A finite floor, not -inf: exp gives exactly 0 and p * z stays 0 in the
      # backward pass (0 * -inf would be NaN).
      z = jnp.where(real_V, z, -1e30)
    lse = jax.nn.logsumexp(z, axis=-1)
    z_y = jnp.take_along_axis(z, y_BxC[..., None].astype(jnp.int32),
                              axis=-1)[..., 0]
    p = jnp.exp(z - lse[..., None])
    ent = lse - jnp.sum(p * z, axis=-1)
    return z_y - lse, ent

  def body(carry, xs):
    return carry, one(*xs)

  _, (logp, ent) = jax.lax.scan(body, None, (h_NxBxCxD, y_NxBxC))
  logp = logp.swapaxes(0, 1).reshape(b, n * c)[:, :r]
  ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :r]
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
                    chunk: int = 128) -> tuple[jax.Array, jax.Array]:
  """Next-token log-probs and entropies at every slot of packed rows, float32 [N, T].

  out[r, j] = log softmax(z[r, j])[tokens[r, j + 1]] (and the entropy of that softmax):
  the prediction of slot j's hidden state for the next slot. Across a segment's end (and
  at j = T - 1) the value is meaningless; `packing.unpack` reads only the slots that
  predict a response token of the same segment. Rows come from `packing.gather` with
  restarting positions and segment ids (`packing.pack_indices`).
  """
  seg = segment_ids_NxT.astype(jnp.int32)
  hidden, _ = model(tokens_NxT, positions_NxT.astype(jnp.int32), (seg > 0).astype(jnp.int32),
                    segment_ids_BxT=seg)
  targets = jnp.concatenate([tokens_NxT[:, 1:], jnp.zeros_like(tokens_NxT[:, :1])], axis=1)
  return chunked_logprobs(hidden, targets, model.head_weight(), temperature=temperature,
                          chunk=chunk, dtype=model.cfg.dtype, vocab_size=model.real_vocab_size)

