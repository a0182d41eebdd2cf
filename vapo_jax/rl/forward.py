"""The forward passes of a rollout batch: old log-probs and values (steps 1–3 of an RL step).

They score a whole rollout before the update, with the weights that sampled it; the train
steps (`rl.update`) run the same model code inside their losses. Kept apart from the update
so that rollout-time code (`rl.experience`, `run.parts`) does not import the train steps.

Shapes: B rows, P prompt columns (left-padded), R response columns, L = P + R.
"""

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from vapo_jax import critic as critic_lib
from vapo_jax import policy as policy_lib
from vapo_jax import sharding as shd
from vapo_jax.rl import batch as batch_lib


def policy_logprobs(graphdef, params, tokens_BxL, mask_BxL, prompt_len: int, *,
                    temperature: float, vocab_chunk: int = 128):
  """Teacher-forced log-probs and entropies of the response tokens, [B, R] each."""
  model = nnx.merge(graphdef, params)
  return policy_lib.response_logprobs(model, tokens_BxL, mask_BxL, prompt_len,
                                      temperature=temperature, chunk=vocab_chunk)


def critic_values(graphdef, params, tokens_BxL, mask_BxL, prompt_len: int):
  """V(s_t) for every response token, [B, R]."""
  return critic_lib.response_values(nnx.merge(graphdef, params), tokens_BxL, mask_BxL,
                                    prompt_len)


def in_micro_batches(fn: Callable, n: int, mesh=None,
                     rules: shd.Rules = shd.DEFAULT_RULES) -> Callable:
  """fn(params, tokens_BxL, mask_BxL, **kw) -> pytree of [B, ...], run as n micro-batches.

  Micro-batch i is rows i, i + n, i + 2n, … (as in the train steps, so every batch shard
  works on every micro-batch); `lax.map` runs them one after another, so activations are
  those of B / n rows, and the outputs come back in row order. Row-wise fn: same result.
  Given the mesh, the model's activations are pinned to it (`sharding.constrain`).
  """
  fn = shd.traced_under(fn, mesh, rules)
  if n <= 1:
    return fn

  def run(params, tokens_BxL, mask_BxL, **kw):
    micro = batch_lib.micro_split((tokens_BxL, mask_BxL), n)
    out = jax.lax.map(lambda tm: fn(params, tm[0], tm[1], **kw), micro)
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape((-1,) + y.shape[2:]), out)

  return run
