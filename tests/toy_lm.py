"""A one-layer attention LM with the Transformer's call contract, for tests.

`ToyLM(tokens_BxT, positions_BxT, kv_mask_BxS, *, cache=None, cache_index=0)` ->
(hidden_BxTxD, cache); `logits(hidden)`; `init_cache(batch, max_len)`. Real
single-head attention over a cache, so prefill/decode/masking bugs change its
outputs.
"""

import jax
import jax.numpy as jnp
from flax import nnx


class ToyLM(nnx.Module):

  def __init__(self, vocab: int, dim: int, max_pos: int, rngs: nnx.Rngs,
               scale: float = 1.0):
    init = jax.nn.initializers.normal(scale)
    self.embed = nnx.Param(init(rngs.params(), (vocab, dim)))
    self.pos = nnx.Param(init(rngs.params(), (max_pos, dim)))
    self.wq = nnx.Param(init(rngs.params(), (dim, dim)))
    self.out = nnx.Param(init(rngs.params(), (dim, vocab)) * 3.0)
    self.dim = dim

  def __call__(self, tokens_BxT, positions_BxT, kv_mask_BxS, *, cache=None,
               cache_index=0):
    x_BxTxD = self.embed[...][tokens_BxT] + self.pos[...][positions_BxT]
    t = tokens_BxT.shape[1]
    if cache is None:
      k_BxSxD, cache_index = x_BxTxD, 0
    else:
      new_BxTxD = x_BxTxD.astype(cache["k"].dtype)
      k_BxSxD = jax.lax.dynamic_update_slice(cache["k"], new_BxTxD,
                                             (0, cache_index, 0))
      cache = {"k": k_BxSxD}
    s = k_BxSxD.shape[1]
    q_BxTxD = x_BxTxD @ self.wq[...]
    scores_BxTxS = jnp.einsum("btd,bsd->bts", q_BxTxD, k_BxSxD)
    scores_BxTxS = scores_BxTxS / jnp.sqrt(self.dim)
    query_slot_T = cache_index + jnp.arange(t)
    causal_TxS = jnp.arange(s)[None, :] <= query_slot_T[:, None]
    ok_BxTxS = causal_TxS[None] & (kv_mask_BxS[:, None, :] > 0)
    att_BxTxS = jax.nn.softmax(
        jnp.where(ok_BxTxS, scores_BxTxS, -1e30), axis=-1)
    return x_BxTxD + jnp.einsum("bts,bsd->btd", att_BxTxS, k_BxSxD), cache

  def logits(self, hidden):
    return hidden @ self.out[...]


def init_cache(batch: int, max_len: int, dim: int, dtype=jnp.float32):
  return {"k": jnp.zeros((batch, max_len, dim), dtype)}


def teacher_forced_logprobs(model, tokens_BxL, mask_BxL, prompt_len,
                            temperature=1.0, vocab_size=None):
  """`policy.response_logprobs` for the toy: log softmax(z/T) of each token."""
  mask = mask_BxL.astype(jnp.int32)
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  hidden, _ = model(tokens_BxL, positions, mask)
  logits = model.logits(hidden).astype(jnp.float32)
  if vocab_size is not None:
    logits = jnp.where(
        jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  pred = logp[:, prompt_len - 1:-1]
  return jnp.take_along_axis(pred, tokens_BxL[:, prompt_len:, None],
                             axis=-1)[..., 0]
