"""Policy, value and auxiliary losses for PPO-family RL on token sequences (VAPO, DAPO, GRPO).

Pure jax. Arrays are batch-major ``[B, T]`` with a float mask (1 on real response tokens).

**Exact accumulation.** Every loss returns a :class:`LossSum` — a ``total`` and the ``count``
that normalises it — instead of a mean. The loss of a batch is ``total / count``. Because both
parts are sums, the parts of micro-batches and data-parallel shards add up exactly to those of
the whole batch, and so does the gradient: accumulate ``grad(total)`` over micro-batches and
divide by the whole batch's ``count``, which depends on the masks alone
(:func:`aggregation_count`) and can be computed before any forward pass.

Aggregation modes (``mode``), for a per-token loss ℓ_{i,t} over responses i:

* ``"token"`` (VAPO eq. 4, DAPO): Σ_i Σ_t ℓ_{i,t} / Σ_i |y_i| — every token weighs the same.
* ``"seq_mean_token_mean"`` (PPO/GRPO as usually written): (1/G) Σ_i (1/|y_i|) Σ_t ℓ_{i,t}.
* ``"seq_mean_token_sum"``: (1/G) Σ_i Σ_t ℓ_{i,t}.

G counts responses with at least one real token. "VAPO without token-level loss" is
``mode="seq_mean_token_mean"``.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

MODES = ("token", "seq_mean_token_mean", "seq_mean_token_sum")


class LossSum(NamedTuple):
  """An additive loss: the loss is ``total / count`` (0 when ``count`` is 0)."""
  total: Array
  count: Array

  @property
  def value(self) -> Array:
    return safe_divide(self.total, self.count)

  def __add__(self, other: "LossSum") -> "LossSum":  # type: ignore[override]
    return LossSum(self.total + other.total, self.count + other.count)


def safe_divide(num: Array, den: Array) -> Array:
  """num / den, and 0 where den is 0 (never NaN)."""
  den = jnp.asarray(den, jnp.float32)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def aggregation_count(mask: Array, mode: str = "token") -> Array:
  """The normaliser of ``mode`` for ``mask [B, T]``: tokens, or responses with a token."""
  mask = jnp.asarray(mask, jnp.float32)
  _check_mode(mode)
  if mode == "token":
    return jnp.sum(mask)
  return jnp.sum(jnp.any(mask > 0, axis=-1).astype(jnp.float32))


def aggregate(per_token: Array, mask: Array, mode: str = "token") -> LossSum:
  """Aggregates a per-token loss ``[B, T]`` over real tokens according to ``mode``."""
  _check_mode(mode)
  per_token = jnp.asarray(per_token, jnp.float32)
  mask = jnp.asarray(mask, jnp.float32)
  masked = per_token * mask
  if mode == "token":
    total = jnp.sum(masked)
  elif mode == "seq_mean_token_mean":
    total = jnp.sum(safe_divide(jnp.sum(masked, -1), jnp.sum(mask, -1)))
  else:
    total = jnp.sum(masked)
  return LossSum(total, aggregation_count(mask, mode))


def masked_mean(x: Array, mask: Array) -> Array:
  """Mean of ``x`` over positions where ``mask`` is 1; 0 if none."""
  mask = jnp.asarray(mask, jnp.float32)
  return safe_divide(jnp.sum(x * mask), jnp.sum(mask))


# ------------------------------------------------------------------------------- policy


class PolicyLoss(NamedTuple):
  loss: LossSum
  metrics: dict  # token-means over this call's real tokens (weigh by metrics["tokens"])


def ppo_policy_loss(logp: Array, old_logp: Array, advantages: Array, mask: Array, *,
                    eps_low: float = 0.2, eps_high: float = 0.28,
                    dual_clip: float | None = None, mode: str = "token") -> PolicyLoss:
  """PPO clipped surrogate with Clip-Higher (VAPO eq. 4; DAPO) and optional dual clip.

  ρ_t = exp(logp_t − old_logp_t),
  ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high)·A_t),
  and with dual clip c > 1 (Ye et al., 2020), for A_t < 0: ℓ_t = min(ℓ_t, −c·A_t).

  Args:
    logp: ``[B, T]`` log π_θ of the taken tokens (differentiable).
    old_logp: ``[B, T]`` log-probs under the behaviour policy (no gradient taken).
    advantages: ``[B, T]`` advantages (no gradient taken).
    mask: ``[B, T]`` 1 on real response tokens.
    eps_low, eps_high: the decoupled clipping range (VAPO/DAPO: 0.2 and 0.28; PPO: equal).
    dual_clip: c of dual-clip PPO, or None.
    mode: aggregation mode (see module docstring).

  Returns:
    ``PolicyLoss(loss, metrics)``; metrics are means over real tokens: ``clip_frac_low``
    (A < 0 and ρ < 1 − ε_low: clipped from below), ``clip_frac_high`` (A > 0 and
    ρ > 1 + ε_high), ``clip_frac_dual``, ``approx_kl`` (k3 estimator of KL(π_old‖π_θ)),
    ``ratio_mean``, ``ratio_max``, ``ratio_min``, and ``tokens``.
  """
  if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
    raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
  logp = jnp.asarray(logp, jnp.float32)
  old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
  adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  mask = jnp.asarray(mask, jnp.float32)

  log_ratio = logp - old_logp
  # Masked positions may hold anything (e.g. -inf log-probs of padding): keep them finite.
  log_ratio = jnp.where(mask > 0, log_ratio, 0.0)
  ratio = jnp.exp(log_ratio)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  per_token = jnp.maximum(unclipped, clipped)
  dual = jnp.zeros_like(per_token, dtype=bool)
  if dual_clip is not None:
    bound = -adv * dual_clip
    dual = (adv < 0) & (per_token > bound)
    per_token = jnp.where(adv < 0, jnp.minimum(per_token, bound), per_token)

  real = mask > 0
  ratio_d = jax.lax.stop_gradient(ratio)
  metrics = {
      "clip_frac_low": masked_mean(((adv < 0) & (ratio_d < 1.0 - eps_low)), mask),
      "clip_frac_high": masked_mean(((adv > 0) & (ratio_d > 1.0 + eps_high)), mask),
      "clip_frac_dual": masked_mean(dual, mask),
      "approx_kl": masked_mean(kl_k3(old_logp, jax.lax.stop_gradient(logp)), mask),
      "ratio_mean": masked_mean(ratio_d, mask),
      "ratio_max": jnp.max(jnp.where(real, ratio_d, -jnp.inf)),
      "ratio_min": jnp.min(jnp.where(real, ratio_d, jnp.inf)),
      "tokens": jnp.sum(mask),
  }
  return PolicyLoss(aggregate(per_token, mask, mode), metrics)


# rl.policy_loss -> the policy-gradient loss, fn(logp, old_logp, advantages, mask, *,
# eps_low, eps_high, dual_clip, mode) -> PolicyLoss (the policy step adds μ·NLL and β·KL).
# A new loss is one function with that signature and one row here.
POLICY_LOSSES: dict[str, Callable[..., PolicyLoss]] = {"ppo": ppo_policy_loss}


def positive_nll(logp: Array, mask: Array, scores: Array, *,
                 threshold: float = 1.0) -> LossSum:
  """Positive-example language-modelling loss (VAPO eq. 3).

  L_NLL = −(1 / Σ_{y_i ∈ 𝒯} |y_i|) Σ_{y_i ∈ 𝒯} Σ_t log π_θ(y_{i,t} | s_{i,t}),
  where 𝒯 = responses whose score is ≥ ``threshold`` (the correct ones). Token-level over
  correct responses only; ``LossSum(0, 0)`` — a loss of 0, not NaN — when none is correct.

  Args:
    logp: ``[..., T]`` log π_θ of the response tokens (any leading dims, e.g. ``[B, T]``,
      ``[B, G, T]`` or a single ``[T]``).
    mask: ``[..., T]`` real-token mask.
    scores: ``[...]`` per-response reward (or correctness): ``logp``'s shape without T.
    threshold: a response counts as correct when ``score >= threshold``.
  """
  scores = jnp.asarray(scores, jnp.float32)
  if scores.shape != jnp.shape(logp)[:-1]:
    raise ValueError(f"scores {scores.shape} must be logp's shape {jnp.shape(logp)} "
                     "without its last (token) axis")
  correct = (scores >= threshold).astype(jnp.float32)
  weight = jnp.asarray(mask, jnp.float32) * correct[..., None]
  logp = jnp.where(weight > 0, jnp.asarray(logp, jnp.float32), 0.0)
  return LossSum(-jnp.sum(logp * weight), jnp.sum(weight))


# -------------------------------------------------------------------------------- value


class ValueLoss(NamedTuple):
  loss: LossSum
  metrics: dict


def value_loss(values: Array, returns: Array, mask: Array, *,
               old_values: Array | None = None, clip_eps: float | None = None,
               mode: str = "token") -> ValueLoss:
  """Squared error of the critic to its targets: ℓ_t = ½·(V_t − R_t)².

  With ``clip_eps`` (PPO's value clipping), V^clip = V_old + clip(V − V_old, −ε, ε) and
  ℓ_t = ½·max((V − R)², (V^clip − R)²). VAPO trains on the λ_critic = 1 returns.

  Args:
    values: ``[B, T]`` predicted V(s_t) (differentiable).
    returns: ``[B, T]`` targets R_t (no gradient taken).
    mask: ``[B, T]`` real-token mask.
    old_values: ``[B, T]`` values at rollout time; needed with ``clip_eps``.
    clip_eps: clipping range, or None for no clipping.
    mode: aggregation mode.
  """
  values = jnp.asarray(values, jnp.float32)
  returns = jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32))
  mask = jnp.asarray(mask, jnp.float32)
  per_token = 0.5 * jnp.square(values - returns)
  clip_frac = jnp.zeros((), jnp.float32)
  if clip_eps is not None:
    if old_values is None:
      raise ValueError("value clipping (clip_eps) needs old_values")
    old = jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32))
    v_clip = old + jnp.clip(values - old, -clip_eps, clip_eps)
    clipped = 0.5 * jnp.square(v_clip - returns)
    clip_frac = masked_mean(clipped > per_token, mask)
    per_token = jnp.maximum(per_token, clipped)
  per_token = jnp.where(mask > 0, per_token, 0.0)
  metrics = {"value_clip_frac": clip_frac, "tokens": jnp.sum(mask)}
  return ValueLoss(aggregate(per_token, mask, mode), metrics)


def outcome_loss(pred: Array, scores: Array, valid: Array) -> LossSum:
  """An outcome reward model's loss: Σ_b ½·(r̂_b − r_b)² over valid responses, count = their
  number (shapes ``[B]``).

  Squared error, not BCE: the model this trains starts the critic, whose values must be on
  the reward's own scale (V ≈ expected score, as the value loss ½(V − R)² trains it), and
  the checker's scores need not be 0/1 (partial credit, or a shaped reward). BCE would give
  logits — another scale — and needs targets in [0, 1].
  """
  valid = jnp.asarray(valid, jnp.float32)
  err = jnp.asarray(pred, jnp.float32) - jax.lax.stop_gradient(jnp.asarray(scores, jnp.float32))
  return LossSum(jnp.sum(0.5 * jnp.square(err) * valid), jnp.sum(valid))


def explained_variance(values: Array, returns: Array, mask: Array) -> Array:
  """1 − Var[R − V] / Var[R] over real tokens (1 is perfect, ≤ 0 is no better than a mean).

  Returns 0 when the returns have no variance.
  """
  mask = jnp.asarray(mask, jnp.float32)
  values = jnp.asarray(values, jnp.float32)
  returns = jnp.asarray(returns, jnp.float32)

  def var(x):
    mean = masked_mean(x, mask)
    return masked_mean(jnp.square(x - mean), mask)

  var_r = var(returns)
  return jnp.where(var_r > 0, 1.0 - safe_divide(var(returns - values), var_r), 0.0)


# ---------------------------------------------------------------------- entropy and KL


def entropy_from_logits(logits: Array) -> Array:
  """H = logsumexp(z) − Σ_v softmax(z)_v·z_v over the last axis, float32: ``[..., V] → [...]``."""
  logits = jnp.asarray(logits, jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  p = jnp.exp(logits - lse[..., None])
  # Where p underflows to 0 the product is 0 even if the logit is -inf (masked vocab rows).
  return lse - jnp.sum(jnp.where(p > 0, p * logits, 0.0), axis=-1)


def kl_k1(logp: Array, ref_logp: Array) -> Array:
  """k1 = log π(x) − log π_ref(x) for x ~ π: unbiased for KL(π‖π_ref), high variance."""
  return jnp.asarray(logp, jnp.float32) - jnp.asarray(ref_logp, jnp.float32)


def kl_k2(logp: Array, ref_logp: Array) -> Array:
  """k2 = ½·(log π(x) − log π_ref(x))²: biased, low variance."""
  return 0.5 * jnp.square(kl_k1(logp, ref_logp))


def kl_k3(logp: Array, ref_logp: Array) -> Array:
  """k3 = r − 1 − log r with r = π_ref(x)/π(x), x ~ π: unbiased for KL(π‖π_ref), ≥ 0."""
  log_r = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
  return jnp.expm1(log_r) - log_r


def kl_penalty(logp: Array, ref_logp: Array, mask: Array, *, mode: str = "token",
               log_ratio_clip: float = 20.0) -> LossSum:
  """GRPO's per-token KL penalty to the frozen reference policy, k3 estimator.

  With d_t = log π_ref(y_t|s_t) − log π_θ(y_t|s_t) (``ref_logp − logp``, clipped to
  ±``log_ratio_clip`` so exp cannot overflow),

      k3_t = exp(d_t) − d_t − 1   (≥ 0; unbiased for KL(π_θ‖π_ref) when y ~ π_θ),
      ∂k3_t/∂logp_t = 1 − exp(d_t)   (inside the clip range),

  aggregated over real tokens like the policy loss (``mode``: GRPO's 1/G Σ_i 1/|o_i| Σ_t is
  ``"seq_mean_token_mean"``). The policy loss adds β·total/count (GRPO eq. 3 maximises the
  surrogate − β·D_KL; GRPO's β = 0.04).

  Args:
    logp: ``[B, T]`` log π_θ of the taken tokens (differentiable).
    ref_logp: ``[B, T]`` log π_ref of the same tokens (no gradient taken).
    mask: ``[B, T]`` 1 on real response tokens (masked positions may hold anything).
    mode: aggregation mode (see module docstring).
    log_ratio_clip: |d_t| bound.
  """
  mask = jnp.asarray(mask, jnp.float32)
  ref = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
  real = mask > 0
  logp = jnp.where(real, jnp.asarray(logp, jnp.float32), 0.0)
  d = jnp.clip(jnp.where(real, ref, 0.0) - logp, -log_ratio_clip, log_ratio_clip)
  return aggregate(jnp.expm1(d) - d, mask, mode)


def masked_whiten(x: Array, mask: Array, *, shift_mean: bool = True, eps: float = 1e-8) -> Array:
  """(x − mean) / std over real tokens (PPO's advantage normalisation); 0 at masked positions."""
  mask = jnp.asarray(mask, jnp.float32)
  x = jnp.asarray(x, jnp.float32)
  mean = masked_mean(x, mask)
  var = masked_mean(jnp.square(x - mean), mask)
  out = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return out * mask


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"loss aggregation mode must be one of {MODES}, got {mode!r}")

