"""Steps 1–3 of an RL step, the experience: rollout → reward → advantages, as one batch.

    P prompts ──sampler (n each)──▶ rollout                                    [rl.rollout]
      └─ policy forward (old log-probs) and critic forward (V(s_t)), dispatched before the
         host scores the responses so device and host work overlap
      ──checker──▶ scores                                                       [rl.reward]
      ──▶ advantages (λ_policy) and critic targets (λ_critic)               [rl.advantages]

The batch it returns is what the update (`rl.update`, BATCH_SPEC) takes. Value pretraining
uses the same experience with Monte Carlo targets (λ = 1) for the critic.

`examples` is the step's global list of prompts, the same on every host; each host tokenizes
and scores only the rows its devices hold, so 2 processes × 2 devices compute exactly what
1 process × 4 devices does.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from vapo_jax import distributed as dist
from vapo_jax.rl import reward as reward_lib
from vapo_jax.rl import rollout as rollout_lib
from vapo_jax.sampler import types as types_lib


@dataclasses.dataclass(frozen=True)
class Experience:
  """The parts of steps 1–3 (built by `run.parts.experience`).

  sampler: the rollout sampler (n responses per prompt).
  text: prompt_ids(problem) -> token ids, decode(ids) -> text.
  scorer: the reward checker (`rewards.RewardScorer`).
  logprobs: jitted (params, tokens_BxL, mask_BxL, *, prompt_len, temperature) ->
    (log-probs, entropies) [B, R].
  values: jitted (critic params, tokens_BxL, mask_BxL, *, prompt_len) -> V(s_t) [B, R]
    (None until the run has a critic).
  advantages, monte_carlo: jitted (scores_B, lengths_B, mask_BxR, values_BxR,
    group_ids_B) -> `rl.advantages.Advantages`, with the run's settings / with λ_critic = 1 (value
    pretraining).
  temperature: the sampling temperature the old log-probs are taken at.
  prompts_per_call: prompts per sampler call (0: all at once).
  """
  sampler: Any
  text: Any
  scorer: Any
  logprobs: Callable
  values: Callable | None
  advantages: Callable
  monte_carlo: Callable
  temperature: float
  prompts_per_call: int

  def __call__(self, policy_params, critic_params, examples, key, *,
               for_value_pretraining: bool = False) -> tuple[dict, dict]:
    """Samples, scores and annotates one rollout batch: (device batch, metrics)."""
    t0 = time.perf_counter()
    rollout = rollout_lib.sample(self.sampler, policy_params,
                                 lambda i: self.text.prompt_ids(examples[i].problem),
                                 len(examples), key, prompts_per_call=self.prompts_per_call)
    tokens, mask = types_lib.rollout_tokens(rollout)
    p = rollout.prompt_len
    jax.block_until_ready(rollout.lengths_B)
    # Free the KV cache for the train steps' activations (at 32B × 20k it is tens of GB per
    # chip); allocating it again next step costs nothing next to sampling.
    self.sampler.clear_cache()
    t1 = time.perf_counter()
    # Device work first (asynchronous), then the host scores the responses meanwhile.
    old_logp, entropy = self.logprobs(policy_params, tokens, mask, prompt_len=p,
                                      temperature=self.temperature)
    values = (self.values(critic_params, tokens, mask, prompt_len=p)
              if critic_params is not None else None)
    scored = reward_lib.score(self.scorer, rollout, self.text.decode,
                              [ex.problem for ex in examples], [ex.answer for ex in examples])
    t2 = time.perf_counter()
    fn = self.monte_carlo if for_value_pretraining else self.advantages
    adv = fn(scored.scores_B, rollout.lengths_B, rollout.response_mask_BxR, values,
             rollout.group_ids_B)
    resp_mask = rollout.response_mask_BxR
    batch = {"tokens_BxL": tokens, "mask_BxL": mask, "old_logp_BxR": old_logp,
             "advantages_BxR": adv.advantages_BxR, "returns_BxR": adv.returns_BxR,
             "old_values_BxR": values if values is not None else jnp.zeros_like(old_logp),
             "response_mask_BxR": resp_mask, "scores_B": scored.scores_B}
    lengths, truncated = dist.to_host((rollout.lengths_B, rollout.truncated_B))
    ent = jnp.sum(entropy * resp_mask) / jnp.maximum(jnp.sum(resp_mask), 1)
    metrics = {**scored.all_scores.metrics(),
               **{k: float(v) for k, v in dist.to_host({**adv.metrics, "entropy": ent}).items()}}
    metrics.update({
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": float(truncated.mean()),
        "time/rollout_s": t1 - t0,
        "time/reward_and_forward_s": t2 - t1,
        "rollout_tokens_per_s": float(lengths.sum()) / max(t1 - t0, 1e-9),
    })
    return batch, metrics
