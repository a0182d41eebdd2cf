"""Step 3 of an RL step: scores → rewards → advantages and critic targets.

    rollout (lengths, response mask) + scores_B + values_BxR = V(s_t) (critic)
      → rewards_BxR: the score on each response's last real token, 0 elsewhere
      → an estimator, chosen by name (`rl.advantage_estimator`, the ESTIMATORS table):
        "gae"    `gae.decoupled_gae` with the critic's values — advantages with λ_policy (per
                 response, length-adaptive 1 − 1/(α·l) or a constant), returns with
                 λ_critic (VAPO: 1, Monte Carlo); coupled GAE uses λ_policy for both
        "group"  group-relative advantages (GRPO / DAPO), one per response, no critic
      → optional whitening over the batch's real tokens, and statistics for the log

Pure jax functions of arrays and a frozen :class:`AdvantageConfig` (built from the run's
config by `run.forwards`, the only place its values come from); `rl.experience` jits them.
A new estimator is one function with `gae_estimate`'s signature and one row of ESTIMATORS.
"""

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from vapo_jax import gae as gae_lib
from vapo_jax import losses


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """The advantage settings, built from config.rl in one place (`run.forwards.advantage_config`;
  the defaults are the config's, `config.RLSection`)."""
  estimator: str        # a key of ESTIMATORS
  gamma: float
  decoupled: bool
  lam_critic: float
  length_adaptive: bool
  alpha: float
  lam_policy: float
  group_std_norm: bool
  whiten: bool
  gae_impl: str
  # The return scale (rl.reward_scale, rl.reward_shift): r' = reward_scale · r + reward_shift
  # before any estimator sees the rewards (rewards {0, 1} -> ±1: 2, −1).
  reward_scale: float
  reward_shift: float


class Advantages(NamedTuple):
  """What step 3 hands to the update: [B, R] arrays, and scalar statistics for the log."""
  advantages_BxR: jax.Array
  returns_BxR: jax.Array    # the critic's targets (zeros without a critic)
  lam_policy_B: jax.Array
  metrics: dict             # adv/*, lam_policy/*, and the estimator's own (gae:
                            # value/explained_variance, value/mean, value/s0_mean,
                            # value/s0_minus_return)


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


class Estimate(NamedTuple):
  """What an estimator returns: [B, R] advantages and critic targets, and its own metrics."""
  advantages_BxR: jax.Array
  returns_BxR: jax.Array    # the critic's targets (zeros for an estimator without a critic)
  metrics: dict


def gae_estimate(ac: AdvantageConfig, scores_B, lengths_B, mask_BxR, values_BxR, group_ids_B,
                 lam_policy_B) -> Estimate:
  """Decoupled GAE with the critic's values (VAPO eq. 1-2): λ_policy for the advantages,
  λ_critic (coupled: λ_policy) for the critic's targets."""
  del group_ids_B
  rewards = place_rewards(scores_B, lengths_B, mask_BxR.shape[1])
  adv, ret, _ = gae_lib.decoupled_gae(rewards, values_BxR, mask_BxR, gamma=ac.gamma,
                                      lam_policy=lam_policy_B,
                                      lam_critic=ac.lam_critic if ac.decoupled else lam_policy_B,
                                      impl=ac.gae_impl)
  return Estimate(adv, ret, {
      "value/explained_variance": losses.explained_variance(values_BxR, ret, mask_BxR),
      "value/mean": losses.masked_mean(values_BxR, mask_BxR),
      # The critic's start-of-response bias: mean V(s₀) − reward; a group's mean reward is
      # an unbiased V*(s₀), so this is the bias of V(s₀) up to sampling noise (issue 29, M3).
      "value/s0_mean": jnp.mean(values_BxR[:, 0]),
      "value/s0_minus_return": jnp.mean(values_BxR[:, 0] - scores_B)})


def group_estimate(ac: AdvantageConfig, scores_B, lengths_B, mask_BxR, values_BxR,
                   group_ids_B, lam_policy_B) -> Estimate:
  """GRPO's group-relative advantage of each response on all its tokens; no critic."""
  del lengths_B, values_BxR, lam_policy_B
  per_response = group_relative_advantages(scores_B, group_ids=group_ids_B,
                                           normalize_std=ac.group_std_norm)
  return Estimate(per_response[:, None] * mask_BxR, jnp.zeros_like(mask_BxR), {})


@dataclasses.dataclass(frozen=True)
class Estimator:
  """One advantage estimator: fn(ac, scores_B, lengths_B, mask_BxR (float32), values_BxR
  (None without a critic), group_ids_B, lam_policy_B) -> Estimate."""
  fn: Callable[..., Estimate]
  critic: bool  # it reads V(s_t): the run trains a critic (and may pretrain it)


# rl.advantage_estimator -> its estimator (config.validate checks the name against it).
ESTIMATORS: dict[str, Estimator] = {
    "gae": Estimator(gae_estimate, critic=True),
    "group": Estimator(group_estimate, critic=False),
}


def compute_advantages(ac: AdvantageConfig, scores_B: jax.Array, lengths_B: jax.Array,
                       mask_BxR: jax.Array, values_BxR: jax.Array | None,
                       group_ids_B: jax.Array) -> Advantages:
  """Advantages, critic targets and their statistics for one rollout batch.

  Args:
    ac: the advantage settings (`ac.estimator` names the row of ESTIMATORS).
    scores_B: per-response reward (mapped to ac.reward_scale · r + ac.reward_shift).
    lengths_B: number of real response tokens.
    mask_BxR: response mask.
    values_BxR: V(s_t) from the critic (ignored, may be None, without a critic).
    group_ids_B: the prompt each response answers (`Rollout.group_ids_B`): the groups of
      group-relative advantages.
  """
  mask = mask_BxR.astype(jnp.float32)
  lam_p = policy_lambda(ac, lengths_B)
  if ac.reward_scale != 1.0 or ac.reward_shift != 0.0:
    scores_B = ac.reward_scale * scores_B.astype(jnp.float32) + ac.reward_shift
  adv, ret, metrics = ESTIMATORS[ac.estimator].fn(ac, scores_B, lengths_B, mask, values_BxR,
                                                  group_ids_B, lam_p)
  metrics = dict(metrics)
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


# ---------------------------------------------------------------- group-relative baselines


def group_relative_advantages(scores: jax.Array, group_size: int | None = None, *,
                              group_ids: jax.Array | None = None, normalize_std: bool = True,
                              eps: float = 1e-6, ddof: int = 1) -> jax.Array:
  """GRPO's advantage: each response's score minus its group's mean, over the group's std.

  A_i = (r_i − mean_g(r)) / (std_g(r) + ε), or r_i − mean_g(r) with ``normalize_std=False``
  (Dr. GRPO). Groups are given by ``group_size`` (rows ``g·n … g·n + n − 1`` answer prompt g)
  or by ``group_ids`` (row b answers prompt ``group_ids[b]``, any order, any group sizes).

  Args:
    scores: ``[B]`` per-response scores, B = P·n.
    group_size: n, responses per prompt (contiguous groups).
    group_ids: ``[B]`` int, the group of each row in ``[0, B)`` (instead of group_size).
    normalize_std: divide by the group's standard deviation.
    eps: added to the std.
    ddof: delta degrees of freedom of the std (1: the sample std, as in GRPO).

  Returns:
    float32 ``[B]`` advantages (broadcast them over the response's tokens).
  """
  scores = jnp.asarray(scores, jnp.float32)
  if group_ids is not None:
    return _group_relative_by_id(scores, jnp.asarray(group_ids, jnp.int32), normalize_std,
                                 eps, ddof)
  if scores.ndim != 1 or scores.shape[0] % group_size:
    raise ValueError(f"scores must be [P*n] with n={group_size}, got shape {scores.shape}")
  grouped = scores.reshape(-1, group_size)
  centred = grouped - jnp.mean(grouped, axis=-1, keepdims=True)
  if normalize_std:
    if group_size - ddof <= 0:
      raise ValueError(f"group_size {group_size} too small for ddof={ddof}")
    std = jnp.sqrt(jnp.sum(jnp.square(centred), -1, keepdims=True) / (group_size - ddof))
    centred = centred / (std + eps)
  return jax.lax.stop_gradient(centred.reshape(-1))


def _group_relative_by_id(scores: jax.Array, ids: jax.Array, normalize_std: bool, eps: float,
                          ddof: int) -> jax.Array:
  b = scores.shape[0]
  total = lambda x: jax.ops.segment_sum(x, ids, num_segments=b)[ids]  # noqa: E731
  count = total(jnp.ones_like(scores))
  centred = scores - total(scores) / count
  if normalize_std:
    std = jnp.sqrt(total(jnp.square(centred)) / jnp.maximum(count - ddof, 1.0))
    centred = centred / (std + eps)
  return jax.lax.stop_gradient(centred)
