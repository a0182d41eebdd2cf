"""Generalised advantage estimation (GAE) with VAPO's decoupled and length-adaptive λ.

Pure jax; no flax, no config objects. Arrays are batch-major with time last: `[..., T]`.

For a response with real tokens t (``mask[..., t] == 1``), GAE (Schulman et al., 2016) is

    δ_t = r_t + γ·V(next real token after t) − V(s_t)      (V = 0 after the last real token)
    A_t = Σ_{l ≥ 0} (γλ)^l · δ_{t+l}                          (the sum runs over real tokens only)
    R_t = A_t + V(s_t)

Masked positions (padding, or holes such as tool-output tokens inside a row) are *skipped*:
the recursion passes through them unchanged, and their advantages and returns are 0. Rewards
and values at masked positions are ignored.

VAPO (Yue et al., 2025, arXiv 2504.05118) uses two λ at once ("decoupled GAE", from VC-PPO,
arXiv 2503.01491): λ_critic = 1 for the value targets (Monte Carlo returns, no bootstrapping
from the biased critic), and a per-response λ_policy for the policy's advantages, chosen from
the response length l so that the effective horizon 1/(1 − λ) is α·l ("length-adaptive GAE",
VAPO eq. 1-2): λ_policy = 1 − 1/(α·l).

Everything is computed in float32 whatever the input dtype (bfloat16 rounds λ = 0.998 to 1.0
and loses small δ over 10k+ tokens) and carries no gradient.

Three implementations give the same numbers (tested); pick one with ``impl``:

* ``"scan"`` (default): the sequential recursion as one ``jax.lax.scan`` over time.
* ``"associative"``: two first-order linear recurrences solved with
  ``jax.lax.associative_scan`` (O(log T) depth; suits accelerators with long T).
* ``"blocked"``: the recursion solved in blocks of 8 tokens by small matrix products, with the
  block carries solved recursively the same way. Rows whose real tokens are not contiguous are
  first compacted (a stable sort of the mask), so holes work too. Fastest on CPU.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

IMPLEMENTATIONS = ("scan", "associative", "blocked")
_BLOCK = 8


def length_adaptive_lambda(lengths: Array, alpha: float) -> Array:
  """VAPO eq. (2): λ_policy = 1 − 1/(α·l), clipped to [0, 1].

  Args:
    lengths: number of real response tokens l, any shape (e.g. ``[B]``).
    alpha: the horizon coefficient α (VAPO uses 0.05: a response of 100 tokens gets 0.8,
      one of 1,000 gets 0.98, one of 10,000 gets 0.998).

  Returns:
    float32 array of λ_policy with the shape of ``lengths``. Lengths l ≤ 1/α (including
    empty responses) give 0.
  """
  if alpha <= 0:
    raise ValueError(f"alpha must be > 0, got {alpha}")
  l = jnp.asarray(lengths, jnp.float32)
  lam = 1.0 - 1.0 / jnp.maximum(alpha * l, 1.0)
  return jax.lax.stop_gradient(jnp.clip(lam, 0.0, 1.0))


def gae(rewards: Array, values: Array, mask: Array, *, gamma: float | Array = 1.0,
        lam: float | Array, impl: str = "scan") -> tuple[Array, Array]:
  """GAE advantages and λ-returns, skipping masked positions.

  Args:
    rewards: ``[..., T]`` per-token rewards r_t (VAPO: the verdict on the last real token).
    values: ``[..., T]`` V(s_t), the value of the state before token t is generated.
    mask: ``[..., T]``, 1 on real response tokens, 0 elsewhere (bool or float).
    gamma: discount γ (VAPO: 1.0); a scalar.
    lam: λ, a scalar or an array over the leading dims ``[...]`` (one λ per response).
    impl: ``"scan"``, ``"associative"`` or ``"blocked"`` (same results).

  Returns:
    ``(advantages, returns)``, float32 ``[..., T]``, 0 at masked positions, no gradient.
  """
  rewards, values, mask, lam, lead = _prepare(rewards, values, mask, lam)
  gamma = jnp.asarray(gamma, jnp.float32)
  if gamma.ndim:
    raise ValueError(f"gamma must be a scalar, got shape {gamma.shape}")
  if impl == "scan":
    adv = _gae_scan(rewards, values, mask, gamma, lam)
  elif impl == "associative":
    adv = _gae_associative(rewards, values, mask, gamma, lam)
  elif impl == "blocked":
    adv = _gae_blocked(rewards, values, mask, gamma, lam)
  else:
    raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
  adv = adv * mask
  ret = (adv + values) * mask
  t = rewards.shape[-1]
  return adv.reshape(lead + (t,)), ret.reshape(lead + (t,))


class DecoupledGAE(NamedTuple):
  """VAPO's two GAE quantities. All float32; advantages/returns ``[..., T]``, λ ``[...]``."""
  advantages: Array  # policy advantages, computed with λ_policy (one per response)
  returns: Array     # critic targets, computed with λ_critic (VAPO: 1, Monte Carlo)
  lam_policy: Array  # the λ_policy used for each response


def decoupled_gae(rewards: Array, values: Array, mask: Array, *, gamma: float = 1.0,
                  lam_policy: float | Array | None = None, lam_critic: float = 1.0,
                  alpha: float | None = None, impl: str = "scan") -> DecoupledGAE:
  """Decoupled GAE in one call: policy advantages and critic targets.

  advantages = gae(λ = λ_policy).advantages,  returns = gae(λ = λ_critic).returns.

  With ``lam_policy=None`` λ_policy is length-adaptive, 1 − 1/(α·l) per response with
  l = ``mask.sum(-1)`` (VAPO); pass a number to use one λ for every response (the paper's
  "without length-adaptive GAE" ablation), and ``lam_critic=lam_policy`` for coupled GAE.

  Args:
    rewards, values, mask: ``[..., T]`` as in :func:`gae`.
    gamma: discount γ.
    lam_policy: None (length-adaptive), a scalar, or ``[...]``.
    lam_critic: λ for the critic's targets (VAPO: 1.0).
    alpha: α of the length-adaptive λ (VAPO: 0.05); needed when ``lam_policy`` is None.
    impl: implementation, as in :func:`gae`.
  """
  mask = jnp.asarray(mask)
  lead = mask.shape[:-1]
  if lam_policy is None:
    if alpha is None:
      raise ValueError("a length-adaptive lam_policy needs alpha (VAPO: 0.05)")
    lam_policy = length_adaptive_lambda(jnp.sum(mask.astype(jnp.float32), axis=-1), alpha)
  lam_policy = jnp.broadcast_to(jnp.asarray(lam_policy, jnp.float32), lead)
  advantages, _ = gae(rewards, values, mask, gamma=gamma, lam=lam_policy, impl=impl)
  _, returns = gae(rewards, values, mask, gamma=gamma, lam=lam_critic, impl=impl)
  return DecoupledGAE(advantages, returns, jax.lax.stop_gradient(lam_policy))


# ----------------------------------------------------------------------------- internals
# Each implementation takes float32 [N, T] rewards/values/mask and λ [N], and returns the
# unmasked advantages [N, T] (callers multiply by the mask).


def _prepare(rewards, values, mask, lam):
  rewards = jnp.asarray(rewards)
  values = jnp.asarray(values)
  mask = jnp.asarray(mask)
  if not (rewards.shape == values.shape == mask.shape):
    raise ValueError("rewards, values and mask must have the same shape [..., T]; got "
                     f"{rewards.shape}, {values.shape}, {mask.shape}")
  if rewards.ndim < 1:
    raise ValueError("rewards, values and mask need a time axis [..., T]")
  lead, t = rewards.shape[:-1], rewards.shape[-1]
  lam = jnp.asarray(lam, jnp.float32)
  try:
    lam = jnp.broadcast_to(lam, lead)
  except ValueError:
    raise ValueError(f"lam must be a scalar or broadcast to the leading dims {lead}, "
                     f"got shape {lam.shape}") from None

  def flat(x):
    return jax.lax.stop_gradient(x.astype(jnp.float32).reshape((-1, t)))

  return (flat(rewards), flat(values), flat(mask), jax.lax.stop_gradient(lam.reshape(-1)),
          lead)


def _gae_scan(r, v, m, gamma, lam):
  """Sequential backward recursion over time (carry: next real value, next advantage)."""
  n = r.shape[0]

  def step(carry, x):
    next_value, next_adv = carry
    r_t, v_t, m_t = x
    adv = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    real = m_t > 0
    carry = (jnp.where(real, v_t, next_value), jnp.where(real, adv, next_adv))
    return carry, adv

  init = (jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.float32))
  _, adv_TxN = jax.lax.scan(step, init, (r.T, v.T, m.T), reverse=True)
  return adv_TxN.T


def _linear_recurrence_associative(a, b):
  """Solves x_t = a_t·x_{t+1} + b_t (x_T = 0) along the last axis with associative_scan."""

  def combine(later, earlier):
    # With reverse=True the scan folds from the end: `later` holds the composed map of the
    # positions after those in `earlier`; compose x ↦ a_e·(a_l·x + b_l) + b_e.
    a_l, b_l = later
    a_e, b_e = earlier
    return a_e * a_l, a_e * b_l + b_e

  _, x = jax.lax.associative_scan(combine, (a, b), reverse=True, axis=a.ndim - 1)
  return x


def _shift_left(x):
  """x[..., t+1] with 0 past the end."""
  return jnp.concatenate([x[..., 1:], jnp.zeros_like(x[..., :1])], axis=-1)


def _gae_associative(r, v, m, gamma, lam):
  # Value of the first real token at or after t: c_t = m_t·v_t + (1 − m_t)·c_{t+1}.
  first_real_value = _linear_recurrence_associative(1.0 - m, m * v)
  delta = r + gamma * _shift_left(first_real_value) - v
  # A_t = m_t·(δ_t + γλ·A_{t+1}) + (1 − m_t)·A_{t+1}.
  decay = m * (gamma * lam)[:, None] + (1.0 - m)
  return _linear_recurrence_associative(decay, m * delta)


def _discounted_suffix_sum(b, w):
  """A_t = Σ_{s ≥ t} w^{s−t}·b_s along the last axis of ``b [N, T]``, with ``w [N]``.

  Blocks of K tokens: A = A_local + w^{K−i}·X_next, where A_local is a [K, K] upper-triangular
  matrix product inside each block and X (the value at each block start) solves the same
  problem one level up with decay w^K.
  """
  n, t = b.shape
  k = min(_BLOCK, t)
  c = -(-t // k)
  b3 = jnp.pad(b, ((0, 0), (0, c * k - t))).reshape(n, c, k)
  pos = jnp.arange(k, dtype=jnp.float32)
  gap = pos[None, :] - pos[:, None]  # [i, j] = j − i
  decay = jnp.where((gap >= 0)[None], w[:, None, None] ** jnp.maximum(gap, 0.0)[None], 0.0)
  # decay[n, i, j] = w_n^(j − i) for j ≥ i, else 0: [N, K, K].
  local = jnp.einsum("ncj,nij->nci", b3, decay, precision=jax.lax.Precision.HIGHEST)
  if c > 1:
    starts = _discounted_suffix_sum(local[:, :, 0], w ** k)  # [N, C]
    next_start = _shift_left(starts)
    to_next = w[:, None] ** (k - pos)[None, :]  # [N, K]: decay from i to the next block
    local = local + to_next[:, None, :] * next_start[:, :, None]
  return local.reshape(n, c * k)[:, :t]


def _gae_contiguous(r, v, m, gamma, lam):
  """GAE for rows whose real tokens form one contiguous run (right/left padding only)."""
  delta = r + gamma * _shift_left(v * m) - v
  return _discounted_suffix_sum(m * delta, gamma * lam)


def _gae_blocked(r, v, m, gamma, lam):
  # Rows with holes: move real tokens to the front (stable, so their order is kept), solve,
  # and move the results back. Skipped entirely when every row is contiguous.
  starts = m * (1.0 - jnp.pad(m, ((0, 0), (1, 0)))[:, :-1])
  contiguous = jnp.all(jnp.sum(starts, axis=-1) <= 1.0)

  def compacted(r, v, m):
    order = jnp.argsort(m <= 0, axis=-1, stable=True)

    def take(x):
      return jnp.take_along_axis(x, order, axis=-1)

    adv_sorted = _gae_contiguous(take(r), take(v), take(m), gamma, lam)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(adv_sorted, inverse, axis=-1)

  return jax.lax.cond(contiguous, lambda r, v, m: _gae_contiguous(r, v, m, gamma, lam),
                      compacted, r, v, m)
