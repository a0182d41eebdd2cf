"""Steps 1–3 of an RL step, the experience: rollout → reward → advantages, as one batch.

    P prompts ──sampler (n each)──▶ rollout                                    [rl.rollout]
      └─ policy forward (old log-probs) and critic forward (V(s_t)), dispatched before the
         host scores the responses so device and host work overlap
      ──checker──▶ scores                                                       [rl.reward]
      ──▶ advantages (λ_policy) and critic targets (λ_critic)               [rl.advantages]

It returns the `rl.batch.RolloutBatch` the update (`rl.update`) takes. Value pretraining
uses the same experience with Monte Carlo targets (λ = 1) for the critic.

The baselines' extras (`rl.dapo`, config `rl.*`): overlong shaping adds DAPO's soft length
penalty to the scores the advantages see (the batch's `scores_B` stay the checker's, so the
positive-example NLL still picks correct answers); dynamic sampling draws rounds of prompts
until the batch holds only groups with mixed scores (at most `dynamic_rounds` extra rounds;
uniform groups that fill a short batch are masked out of every loss); with a reference
policy's parameters its log-probs join the batch as `ref_logp_BxR` (GRPO's KL penalty).

`examples` is the step's global list of prompts, the same on every host; each host tokenizes
and scores only the rows its devices hold, so 2 processes × 2 devices compute exactly what
1 process × 4 devices does.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import distributed as dist
from vapo_jax.rewards.scorer import BatchScores
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import behaviour
from vapo_jax.rl import dapo
from vapo_jax.rl import length_stats
from vapo_jax.rl import reward as reward_lib
from vapo_jax.rl import rollout as rollout_lib
from vapo_jax.sampler import types as types_lib


@dataclasses.dataclass(frozen=True)
class Experience:
  """The parts of steps 1–3 (built by `run.forwards.experience`).

  sampler: the rollout sampler (n responses per prompt; `sampler.types.RolloutSampler`).
  text: prompt_ids(problem) -> token ids, decode(ids) -> text.
  scorer: the reward checker (`rewards.RewardScorer`).
  logprobs: jitted (params, tokens_BxL, mask_BxL, *, prompt_len, temperature) ->
    (log-probs, entropies) [B, R].
  advantages, monte_carlo: jitted (scores_B, lengths_B, mask_BxR, values_BxR,
    group_ids_B) -> `rl.advantages.Advantages`, with the run's settings / with λ_critic = 1 (value
    pretraining).
  temperature: the sampling temperature the old log-probs are taken at.
  prompts_per_call: prompts per sampler call (0: all at once).
  overlong: DAPO's overlong shaping (L_max, L_cache: `rl.dapo.Overlong`), or None (off).
  dynamic_rounds: extra sampling rounds dynamic sampling may draw per step (-1: off).
  group_size: responses per prompt (the groups dynamic sampling keeps or drops).
  correction: the sampler/trainer mismatch correction (`rl.behaviour.Correction`; mode
    "none": off). Its weights w_t ≥ 0 scale the policy's
    advantages, which is the same as scaling each token's clipped-surrogate term (the PPO,
    dual-clip surrogates are positively homogeneous in A); the critic's targets and value
    pretraining are untouched.
  old_logprobs: `Config.old_logprobs` (resolved). "recompute": the old-log-prob pass runs
    here, with the gap metrics and the correction. "exact" / "behaviour": no pass; the
    batch's old_logp_BxR holds the sampler's log-probs (0 on padding) and the update takes
    π_old, the correction and ("exact") the gap metrics from its own forward
    (`rl.update.old_policy`); the entropy then comes from the update too.
  place: tree -> tree, the rollout's [B, ...] arrays moved from the sampler's mesh to the
    train passes' (config mesh.train_tensor: `run.meshes.to_train_mesh`), once per rollout
    before any pass reads it; None: they share one mesh.
  """
  sampler: types_lib.RolloutSampler
  text: Any
  scorer: Any
  logprobs: Callable
  advantages: Callable
  monte_carlo: Callable
  temperature: float
  prompts_per_call: int
  overlong: dapo.Overlong | None
  dynamic_rounds: int
  group_size: int
  correction: behaviour.Correction
  old_logprobs: str
  place: Callable | None

  def __call__(self, policy_params, examples, key, *, values: Callable | None = None,
               for_value_pretraining: bool = False, ref_params=None,
               more_examples: Callable[[], list] | None = None
               ) -> tuple[batch_lib.RolloutBatch, dict]:
    """Samples, scores and annotates one rollout batch: (device batch, metrics).

    values: the critic, (tokens_BxL, mask_BxL, prompt_len) -> V(s_t) [B, R] (jitted, its
      parameters bound: `run.forwards.values_fn`), or None without a critic.
    ref_params: the reference policy's parameters (adds `ref_logp_BxR`), or None.
    more_examples: () -> the next global list of prompts, for dynamic sampling's extra
      rounds (dynamic sampling is on when `dynamic_rounds` >= 0 and this is given; never
      for value pretraining, whose critic must see the policy's plain distribution).
    """
    t0 = time.perf_counter()
    dynamic = (self.dynamic_rounds >= 0 and more_examples is not None
               and not for_value_pretraining)
    keep_B, extra = None, {}
    if dynamic:
      rollout, scores_B, all_scores, keep_B, extra = self._draw_until_full(
          policy_params, examples, key, more_examples)
      rollout, scores_B, keep_B = self._to_train((rollout, scores_B, keep_B))
    else:
      rollout = self._to_train(self._sample(policy_params, examples, key))
    tokens, mask = types_lib.rollout_tokens(rollout)
    p = rollout.prompt_len
    jax.block_until_ready(rollout.lengths_B)
    # Free the KV cache for the train steps' activations (at 32B × 20k it is tens of GB per
    # chip); allocating it again next step costs nothing next to sampling.
    self.sampler.clear_cache()
    t1 = time.perf_counter()
    # Device work first (asynchronous), then the host scores the responses meanwhile.
    recompute = self.old_logprobs == "recompute"
    if recompute:
      old_logp, entropy = self.logprobs(policy_params, tokens, mask, prompt_len=p,
                                        temperature=self.temperature)
    else:  # the pass this saves; the update takes π_old (rl.update.old_policy)
      old_logp = jnp.where(rollout.response_mask_BxR > 0, rollout.logp_BxR, 0.0)
      entropy = None
    ref_logp = (self.logprobs(ref_params, tokens, mask, prompt_len=p,
                              temperature=self.temperature)[0]
                if ref_params is not None else None)
    values = values(tokens, mask, p) if values is not None else None
    if not dynamic:
      scored = reward_lib.score(self.scorer, rollout, self.text.decode,
                                [ex.problem for ex in examples], [ex.answer for ex in examples])
      scores_B, all_scores = scored.scores_B, scored.all_scores
    resp_mask = rollout.response_mask_BxR
    if keep_B is not None:
      resp_mask = resp_mask * keep_B[:, None]
    # The sampler's log-probs against the recomputed ones (rl/behaviour.py), every step
    # where they are recomputed ("exact": the update logs them).
    rewards_B = scores_B
    on_device = (behaviour.gap_metrics(old_logp, rollout.logp_BxR, resp_mask,
                                      self.correction.band) if recompute
                 else {})
    if self.overlong is not None:
      penalty_B = dapo.overlong_penalty(rollout.lengths_B, self.overlong.max_len,
                                        self.overlong.cache_len)
      rewards_B = scores_B + penalty_B
      on_device["reward/overlong_penalty_mean"] = jnp.mean(penalty_B)
    fn = self.monte_carlo if for_value_pretraining else self.advantages
    adv = fn(rewards_B, rollout.lengths_B, resp_mask, values, rollout.group_ids_B)
    if self.correction.mode != "none" and not for_value_pretraining and recompute:
      w = behaviour.correction_weights(old_logp, rollout.logp_BxR, resp_mask, self.correction)
      on_device["rollout/correction_weight_mean"] = (jnp.sum(w * resp_mask)
                                                     / jnp.maximum(jnp.sum(resp_mask), 1.0))
      adv = adv._replace(advantages_BxR=adv.advantages_BxR * w)
    batch = batch_lib.RolloutBatch(
        tokens_BxL=tokens, mask_BxL=mask, old_logp_BxR=old_logp,
        advantages_BxR=adv.advantages_BxR, returns_BxR=adv.returns_BxR,
        old_values_BxR=values if values is not None else jnp.zeros_like(old_logp),
        response_mask_BxR=resp_mask, scores_B=scores_B, ref_logp_BxR=ref_logp)
    lengths, truncated = dist.to_host((rollout.lengths_B, rollout.truncated_B))
    if entropy is not None:
      on_device["entropy"] = jnp.sum(entropy * resp_mask) / jnp.maximum(jnp.sum(resp_mask), 1)
    metrics = {**all_scores.metrics(), **extra, **{  # the rollout engine's own (docs/engine.md)
                   f"rollout/{k}": v for k, v in getattr(self.sampler, "last_stats", {}).items()},
               **{k: float(v) for k, v in dist.to_host({**adv.metrics, **on_device}).items()}}
    # The forwards ran asynchronously beside the host's scoring; wait for them here so the
    # split below covers them (before, ~25% of a long-CoT CPU step was counted nowhere).
    jax.block_until_ready(batch)
    t3 = time.perf_counter()
    metrics.update({
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": float(truncated.mean()),
        "time/rollout_s": t1 - t0,
        "time/reward_and_forward_s": t3 - t1,
        "rollout_tokens_per_s": float(lengths.sum()) / max(t1 - t0, 1e-9),
    })
    metrics.update(length_stats.length_metrics(  # what pod/step_model reads (--lengths)
        lengths, dist.to_host(jnp.sum(rollout.prompt_mask_BxP, axis=1)), prompt_len=p,
        max_new_tokens=resp_mask.shape[1],
        rows_per_call=(self.prompts_per_call or len(examples)) * self.group_size))
    # Real / computed tokens of the old-log-prob (and value) pass on packed rows (rl.packing).
    # The value pass plans with the same PackSpec (`run.learners.pass_spec`): the same plan.
    plan = getattr(self.logprobs, "last_plan", None)
    if plan is not None:
      metrics["perf/forward_token_efficiency"] = plan.efficiency
      for name in ("logprobs",) + (("values",) if values is not None else ()):
        metrics.update(plan.metrics(name))
    return batch, metrics

  def sample_and_score(self, policy_params, examples, key
                       ) -> tuple[batch_lib.RolloutBatch, dict]:
    """Steps 1–2 only, for the reward-model stage: (device batch of tokens_BxL, mask_BxL,
    response_mask_BxR and the checker's scores_B, reward and length metrics)."""
    rollout = self._to_train(self._sample(policy_params, examples, key))
    tokens, mask = types_lib.rollout_tokens(rollout)
    jax.block_until_ready(rollout.lengths_B)
    self.sampler.clear_cache()
    scored = reward_lib.score(self.scorer, rollout, self.text.decode,
                              [ex.problem for ex in examples], [ex.answer for ex in examples])
    lengths = dist.to_host(rollout.lengths_B)
    batch = batch_lib.RolloutBatch(tokens_BxL=tokens, mask_BxL=mask,
                                   response_mask_BxR=rollout.response_mask_BxR,
                                   scores_B=scored.scores_B)
    return batch, {**scored.all_scores.metrics(),
                   "response/length_mean": float(lengths.mean())}

  def _to_train(self, tree):
    """tree on the train passes' mesh (`place`), or as it is."""
    return tree if self.place is None else self.place(tree)

  def _sample(self, params, examples, key) -> types_lib.Rollout:
    return rollout_lib.sample(self.sampler, params,
                              lambda i: self.text.prompt_ids(examples[i].problem),
                              len(examples), key, prompts_per_call=self.prompts_per_call)

  def _draw_until_full(self, params, examples, key, more_examples):
    """DAPO's dynamic sampling: rounds of len(examples) prompts (round r > 0 with the next
    prompts and key fold_in(key, r)) until len(examples) groups with mixed scores are
    drawn or `dynamic_rounds` extra rounds are spent; returns the batch's rollout (rows of
    the groups `dapo.fill_groups` picks, regrouped 0 … G − 1), its scores, the scores of
    every response drawn, the rows' keep flags (float32 [B], 0 on uniform filler groups)
    and the dynamic/* metrics."""
    n, num_groups = self.group_size, len(examples)
    rollouts, scores, mixed, drawn = [], [], [], []
    for r in range(self.dynamic_rounds + 1):
      if r:
        examples = more_examples()
      rollout = self._sample(params, examples, jax.random.fold_in(key, r) if r else key)
      scored = reward_lib.score(self.scorer, rollout, self.text.decode,
                                [ex.problem for ex in examples], [ex.answer for ex in examples])
      rollouts.append(rollout)
      scores.append(scored.scores_B)
      drawn.append(scored.all_scores)
      mixed.append(dapo.mixed_groups(dist.to_host(scored.scores_B), n))
      if sum(int(m.sum()) for m in mixed) >= num_groups:
        break
    picks, keep = dapo.fill_groups(mixed, num_groups)
    rows = dapo.group_rows(picks, n)
    keep_rows = np.repeat(keep, n).astype(np.float32)
    mesh = self.sampler.mesh
    if mesh is None:
      idx, keep_B = jnp.asarray(rows), jnp.asarray(keep_rows)
    else:
      idx, keep_B = dist.replicated(rows, mesh), dist.replicated(keep_rows, mesh)
    rollout, scores_B = _gather_fn(rollout_lib.row_sharding(self.sampler), n)(
        rollouts, scores, idx)
    total = sum(len(m) for m in mixed)
    metrics = {"dynamic/extra_rounds": float(len(rollouts) - 1),
               "dynamic/mixed_frac": sum(int(m.sum()) for m in mixed) / total,
               "dynamic/masked_groups": float(num_groups - int(keep.sum()))}
    return rollout, scores_B, _join(drawn), keep_B, metrics


@functools.lru_cache(maxsize=None)
def _gather_fn(sharding, group_size: int):
  """jit((rollouts, scores, rows) -> (rollout, scores_B)): rows of the rounds joined in order,
  row b regrouped as group b // group_size; outputs split over rows like the sampler's."""

  def gather(rollouts, scores, rows):
    pick = lambda *x: jnp.take(jnp.concatenate(x), rows, axis=0)  # noqa: E731
    rollout = jax.tree.map(pick, *rollouts)
    groups = (jnp.arange(rows.shape[0], dtype=jnp.int32) // group_size)
    return dataclasses.replace(rollout, group_ids_B=groups), pick(*scores)

  return jax.jit(gather) if sharding is None else jax.jit(gather, out_shardings=sharding)


def _join(parts: list[BatchScores]) -> BatchScores:
  """One BatchScores of every response drawn (for the step's reward metrics)."""
  return BatchScores(rewards=np.concatenate([p.rewards for p in parts]),
                     correct=np.concatenate([p.correct for p in parts]),
                     reasons=[r for p in parts for r in p.reasons],
                     timeouts=sum(p.timeouts for p in parts),
                     errors=sum(p.errors for p in parts),
                     max_seconds=max(p.max_seconds for p in parts))
