"""Step 3 of an RL step: scores → rewards → advantages and critic targets.

    rollout (lengths, response mask) + scores_B + values_BxR = V(s_t) (critic)
      → rewards_BxR: the score on each response's last real token, 0 elsewhere
      → with a critic:    `gae.decoupled_gae` — advantages with λ_policy (per response,
                          length-adaptive 1 − 1/(α·l) or a constant), returns with λ_critic
                          (VAPO: 1, Monte Carlo); coupled GAE uses λ_policy for both
      → without a critic: group-relative advantages (GRPO / DAPO), one per response

Pure jax functions of arrays and a frozen :class:`AdvantageConfig` (built from the run's
config by `run.parts`, the only place its values come from); `rl.experience` jits them.
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from vapo_jax import gae as gae_lib
from vapo_jax import losses


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """The advantage settings (their defaults are the config's: `config.RLConfig`)."""
  use_critic: bool
  gamma: float
  decoupled: bool
  lam_critic: float
  length_adaptive: bool
  alpha: float
  lam_policy: float
  group_std_norm: bool
  whiten: bool
  gae_impl: str


class Advantages(NamedTuple):
  """What step 3 hands to the update: [B, R] arrays, and scalar statistics for the log."""
  advantages_BxR: jax.Array
  returns_BxR: jax.Array    # the critic's targets (zeros without a critic)
  lam_policy_B: jax.Array
  metrics: dict             # adv/*, lam_policy/*, value/explained_variance, value/mean,
                            # value/s0_mean, value/s0_minus_return


def place_rewards(scores_B: jax.Array, lengths_B: jax.Array, num_columns: int) -> jax.Array:
  """[B, R] rewards: ``scores[b]`` at column ``lengths[b] − 1``, 0 elsewhere (and for l = 0)."""
  cols = jnp.arange(num_columns, dtype=jnp.int32)[None, :]
  last = (lengths_B.astype(jnp.int32) - 1)[:, None]
  return jnp.where(cols == last, scores_B.astype(jnp.float32)[:, None], 0.0)


def policy_lambda(ac: AdvantageConfig, lengths_B: jax.Array) -> jax.Array:
  """λ_policy per response: 1 − 1/(α·l) clipped to [0, 1], or the constant λ."""
  if ac.length_adaptive:
    return gae_lib.length_adaptive_lambda(lengths_B, ac.alpha)
  return jnp.full(lengths_B.shape, ac.lam_policy, jnp.float32)


def compute_advantages(ac: AdvantageConfig, scores_B: jax.Array, lengths_B: jax.Array,
                       mask_BxR: jax.Array, values_BxR: jax.Array | None,
                       group_ids_B: jax.Array) -> Advantages:
  """Advantages, critic targets and their statistics for one rollout batch.

  Args:
    ac: the advantage settings.
    scores_B: per-response reward.
    lengths_B: number of real response tokens.
    mask_BxR: response mask.
    values_BxR: V(s_t) from the critic (ignored, may be None, without a critic).
    group_ids_B: the prompt each response answers (`Rollout.group_ids_B`): the groups of
      group-relative advantages.
  """
  mask = mask_BxR.astype(jnp.float32)
  r = mask.shape[1]
  lam_p = policy_lambda(ac, lengths_B)
  metrics = {}
  if ac.use_critic:
    rewards = place_rewards(scores_B, lengths_B, r)
    adv, ret, _ = gae_lib.decoupled_gae(rewards, values_BxR, mask, gamma=ac.gamma,
                                        lam_policy=lam_p,
                                        lam_critic=ac.lam_critic if ac.decoupled else lam_p,
                                        impl=ac.gae_impl)
    metrics["value/explained_variance"] = losses.explained_variance(values_BxR, ret, mask)
    metrics["value/mean"] = losses.masked_mean(values_BxR, mask)
    # The critic's start-of-response bias: mean V(s₀) − reward; a group's mean reward is an
    # unbiased V*(s₀), so this is the bias of V(s₀) up to sampling noise (issue 29, M3).
    metrics["value/s0_mean"] = jnp.mean(values_BxR[:, 0])
    metrics["value/s0_minus_return"] = jnp.mean(values_BxR[:, 0] - scores_B)
  else:
    per_response = losses.group_relative_advantages(scores_B, group_ids=group_ids_B,
                                                    normalize_std=ac.group_std_norm)
    adv = per_response[:, None] * mask
    ret = jnp.zeros_like(mask)
  if ac.whiten:
    adv = losses.masked_whiten(adv, mask)
  mean = losses.masked_mean(adv, mask)
  metrics.update({
      "adv/mean": mean,
      "adv/std": jnp.sqrt(losses.masked_mean(jnp.square(adv - mean), mask)),
      "adv/max": jnp.max(jnp.where(mask > 0, adv, -jnp.inf)),
      "adv/min": jnp.min(jnp.where(mask > 0, adv, jnp.inf)),
      "lam_policy/mean": jnp.mean(lam_p),
      "lam_policy/min": jnp.min(lam_p),
      "lam_policy/max": jnp.max(lam_p),
  })
  return Advantages(adv, ret, lam_p, metrics)
