"""The rollout batch a sampler hands to the trainer, helpers around it, and what a sampler is.

Pure jax + numpy; no model. Shapes: B = rows = prompts * n, P = padded prompt
length (a bucket), R = max_new_tokens (static), L = P + R.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax.sampler import ops


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rollout:
  """Group-sampled responses. Row b answers prompt `group_ids_B[b] = b // n`.

  Attributes:
    prompt_BxP: int32 prompt tokens, left-padded with pad_id (each prompt
      repeated n times).
    prompt_mask_BxP: float32, 1 on real prompt tokens.
    response_BxR: int32 response tokens, right-padded with pad_id.
    response_mask_BxR: float32, 1 on real response tokens INCLUDING the stop
      token when one was generated; equals `arange(R) < lengths_B`.
    lengths_B: int32 number of real response tokens (1..R).
    truncated_B: bool, the response reached max_new_tokens without a stop token.
    logp_BxR: float32 behaviour log-probs of the sampled tokens under the
      temperature-scaled FULL distribution over the real vocabulary,
      `log softmax(z_t / T)[y_t]` (before top-k / top-p); equal to
      `policy.response_logprobs(..., temperature=T)` on the same tokens. 0 where
      the response mask is 0.
    group_ids_B: int32 index of the prompt (in the order given to the sampler).
  """

  prompt_BxP: jax.Array
  prompt_mask_BxP: jax.Array
  response_BxR: jax.Array
  response_mask_BxR: jax.Array
  lengths_B: jax.Array
  truncated_B: jax.Array
  logp_BxR: jax.Array
  group_ids_B: jax.Array

  @property
  def prompt_len(self) -> int:
    """P, the static padded prompt length (`prompt_len` of the policy)."""
    return self.prompt_BxP.shape[1]


def rollout_tokens(rollout: Rollout) -> tuple[jax.Array, jax.Array]:
  """Teacher-forcing inputs: tokens_BxL = [prompt | response], mask_BxL.

  `policy.response_logprobs(model, tokens_BxL, mask_BxL, rollout.prompt_len,
  temperature=T)` then scores exactly the sampled response tokens.
  """
  tokens_BxL = jnp.concatenate([rollout.prompt_BxP, rollout.response_BxR],
                               axis=1)
  mask_BxL = jnp.concatenate([
      rollout.prompt_mask_BxP.astype(jnp.float32),
      rollout.response_mask_BxR.astype(jnp.float32)
  ], axis=1)
  return tokens_BxL, mask_BxL


def left_pad(prompts: Sequence[Sequence[int]], length: int,
             pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token lists to `length`: (tokens_BxP int32, mask_BxP float32).

  Raises:
    ValueError: an empty prompt, or one longer than `length` (by index).
  """
  tokens_BxP = np.full((len(prompts), length), pad_id, np.int32)
  mask_BxP = np.zeros((len(prompts), length), np.float32)
  for i, p in enumerate(prompts):
    if len(p) == 0:
      raise ValueError(
          f"prompt {i} is empty; every prompt needs at least one token")
    if len(p) > length:
      raise ValueError(
          f"prompt {i} has {len(p)} tokens, more than the padded length "
          f"{length}")
    tokens_BxP[i, length - len(p):] = np.asarray(p, np.int32)
    mask_BxP[i, length - len(p):] = 1.0
  return tokens_BxP, mask_BxP


def response_lists(rollout: Rollout) -> list[list[int]]:
  """The real response tokens of each row as Python lists (host side)."""
  response_BxR = np.asarray(jax.device_get(rollout.response_BxR))
  lengths_B = np.asarray(jax.device_get(rollout.lengths_B))
  return [
      response_BxR[b, :lengths_B[b]].tolist()
      for b in range(response_BxR.shape[0])
  ]


@runtime_checkable
class RolloutSampler(Protocol):
  """What the trainer (`rl.rollout`, `rl.experience`) and the evaluation (`run.evaluation`)
  call on a sampler: `run.sampling.Samplers` holds three of them.

  Two implementations: the rollout engine (`continuous.Engine`, sampling.engine="continuous",
  the default) and the static sampler (`static.Sampler`, sampling.engine="static": the
  tests' oracle and the benchmarks' comparison).

  Attributes:
    cfg: its sampling settings (n_per_prompt responses per prompt, max_prompt_len, pad_id,
      the prompt buckets).
    mesh: the mesh its rows are split over (None: one device), over `batch_axes`.
    continuous: True for the engine: one call takes all of a step's prompts (its slots
      bound the memory) and left-pads them to `prompt_len=`, and its `last_stats` are the
      rollout metrics. False for the static sampler: calls of sampling.prompts_per_call
      prompts; on a multi-process mesh each host feeds its rows of the prompts, left-padded
      to the largest bucket, through `generate_padded(params, prompt_BxP, mask_BxP, key)`.
  """

  cfg: ops.SamplingConfig
  mesh: Any
  batch_axes: tuple[str, ...]
  continuous: bool

  def __call__(self, params, prompts: Sequence[Sequence[int]], key: jax.Array) -> Rollout:
    """cfg.n_per_prompt responses to each prompt (token ids); row b answers prompt b // n."""

  def clear_cache(self) -> None:
    """Frees its KV memory (before the train steps: it is allocated again on the next call)."""
