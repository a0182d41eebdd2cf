"""One RL batch as data: rollout + scores → rewards → values → advantages and targets.

    rollout (tokens, masks, lengths) + scores_B
      → rewards_BxR: the score on each response's last real token, 0 elsewhere
      → old_logp_BxR (policy, teacher-forced), values_BxR = V(s_t) (critic)
      → with a critic:    decoupled GAE — advantages with λ_policy (per response, length-
                          adaptive 1 − 1/(α·l) or a constant), returns with λ_critic
                          (VAPO: 1, Monte Carlo); coupled GAE uses λ_policy for both
      → without a critic: group-relative advantages (GRPO / DAPO), one per response

Pure jax functions of arrays and a frozen :class:`AdvantageConfig`; the trainer jits them.
"""

import dataclasses

import jax
import jax.numpy as jnp

from vapo_jax import gae as gae_lib
from vapo_jax import losses


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  use_critic: bool = True
  gamma: float = 1.0
  decoupled: bool = True
  lam_critic: float = 1.0
  length_adaptive: bool = True
  alpha: float = 0.05
  lam_policy: float = 0.95
  group_size: int = 1
  group_std_norm: bool = True
  whiten: bool = False
  gae_impl: str = "blocked"


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
                       mask_BxR: jax.Array, values_BxR: jax.Array | None) -> dict:
  """Advantages, critic targets and their statistics for one rollout batch.

  Args:
    ac: the advantage settings.
    scores_B: per-response reward.
    lengths_B: number of real response tokens.
    mask_BxR: response mask.
    values_BxR: V(s_t) from the critic (ignored, may be None, without a critic).

  Returns:
    dict with ``advantages_BxR``, ``returns_BxR`` (zeros without a critic), ``lam_policy_B``
    and scalar statistics (``adv/*``, ``lam_policy/*``, ``value/explained_variance``).
  """
  mask = mask_BxR.astype(jnp.float32)
  b, r = mask.shape
  lam_p = policy_lambda(ac, lengths_B)
  out = {}
  if ac.use_critic:
    rewards = place_rewards(scores_B, lengths_B, r)
    adv, _ = gae_lib.gae(rewards, values_BxR, mask, gamma=ac.gamma, lam=lam_p,
                         impl=ac.gae_impl)
    lam_c = ac.lam_critic if ac.decoupled else lam_p
    _, ret = gae_lib.gae(rewards, values_BxR, mask, gamma=ac.gamma, lam=lam_c,
                         impl=ac.gae_impl)
    out["value/explained_variance"] = losses.explained_variance(values_BxR, ret, mask)
    out["value/mean"] = losses.masked_mean(values_BxR, mask)
  else:
    per_response = losses.group_relative_advantages(scores_B, ac.group_size,
                                                    normalize_std=ac.group_std_norm)
    adv = per_response[:, None] * mask
    ret = jnp.zeros_like(mask)
  if ac.whiten:
    adv = losses.masked_whiten(adv, mask)
  out.update({
      "advantages_BxR": adv,
      "returns_BxR": ret,
      "lam_policy_B": lam_p,
      "adv/mean": losses.masked_mean(adv, mask),
      "adv/std": jnp.sqrt(losses.masked_mean(jnp.square(adv - losses.masked_mean(adv, mask)),
                                             mask)),
      "adv/max": jnp.max(jnp.where(mask > 0, adv, -jnp.inf)),
      "adv/min": jnp.min(jnp.where(mask > 0, adv, jnp.inf)),
      "lam_policy/mean": jnp.mean(lam_p),
      "lam_policy/min": jnp.min(lam_p),
      "lam_policy/max": jnp.max(lam_p),
  })
  return out


def advantage_config(cfg) -> AdvantageConfig:
  """The AdvantageConfig of a run's `config.Config`."""
  rl = cfg.rl
  return AdvantageConfig(
      use_critic=rl.use_critic, gamma=rl.gamma, decoupled=rl.decoupled_gae,
      lam_critic=rl.lam_critic, length_adaptive=rl.length_adaptive, alpha=rl.alpha,
      lam_policy=rl.lam_policy, group_size=cfg.responses_per_prompt,
      group_std_norm=rl.group_std_norm, whiten=rl.whiten_advantages, gae_impl=rl.gae_impl)
