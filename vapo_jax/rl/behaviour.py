"""The gap between the sampler's policy and the trained one, and two optional corrections.

The rollout engine samples with a decode copy of the weights (bfloat16 where the model
computes in it, its own attention kernels), so its behaviour log-probs log π_b(y_t) differ from
the recomputed old log-probs log π_old(y_t) of the train programs. With r_t = π_old / π_b:

  mean |Δ log p|   = Σ_t m_t |log π_old − log π_b| / Σ_t m_t
  k3 KL(π_b ‖ π_old) ≈ Σ_t m_t (r_t − 1 − log r_t) / Σ_t m_t        (≥ 0 per token)
  ratio outside [lo, hi] = Σ_t m_t [r_t ∉ [lo, hi]] / Σ_t m_t

Corrections (off by default), a per-token weight w_t on the policy loss:
  truncated importance sampling ("tis"): w_t = min(r_t, C)
  masked ("mask"):                        w_t = [lo ≤ r_t ≤ hi]
Both are 1 where the two policies agree (r_t = 1), so they are no-ops without a gap.

Without a recomputed π_old (rl.old_logprobs "exact" / "behaviour", `update_weights`) the
update takes them per mini-batch from its own forward, r_t = sg(π_θ) / π_b: with "exact"
π_θ = π_old and the weights are the ones above; with "behaviour" the surrogate's ratio is
π_θ / π_b already, so "tis" scales it by w_t = min(1, C / r_t) (its weight r_t w_t =
min(r_t, C), the truncated ratio) and "mask" is as above.

Shapes: [B, R] response-aligned, float32; m is the response mask.
"""

import dataclasses

import jax
import jax.numpy as jnp

CORRECTIONS = ("none", "tis", "mask")


@dataclasses.dataclass(frozen=True)
class Correction:
  """Which correction, with its parameters: rl.behaviour_correction, rl.behaviour_cap,
  rl.behaviour_band (built by `config.RLSection.correction`; the defaults are the config's).

  Attributes:
    mode: "none" (w = 1), "tis" (w = min(r, cap)) or "mask" (w = [band[0] ≤ r ≤ band[1]]).
    cap: C of truncated importance sampling (> 0).
    band: (lo, hi) of the masked correction, lo < 1 < hi.
  """
  mode: str
  cap: float
  band: tuple[float, float]


def log_ratio(old_logp_BxR, behaviour_logp_BxR, mask_BxR):
  """log r_t = log π_old − log π_b on real tokens, 0 elsewhere (float32 [B, R])."""
  m = mask_BxR.astype(jnp.float32)
  return (old_logp_BxR.astype(jnp.float32) - behaviour_logp_BxR.astype(jnp.float32)) * m


def gap_metrics(old_logp_BxR, behaviour_logp_BxR, mask_BxR, band: tuple[float, float]
                ) -> dict:
  """`rollout/logp_gap_abs`, `rollout/logp_gap_k3`, `rollout/ratio_outside_frac` (device
  scalars) over the real response tokens; "outside" is outside `band` (rl.behaviour_band,
  `Correction.band`), the one the masked correction keeps."""
  m = mask_BxR.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  lr = log_ratio(old_logp_BxR, behaviour_logp_BxR, m)
  r = jnp.exp(lr)
  outside = ((r < band[0]) | (r > band[1])).astype(jnp.float32)
  return {
      "rollout/logp_gap_abs": jnp.sum(jnp.abs(lr) * m) / n,
      "rollout/logp_gap_k3": jnp.sum((r - 1.0 - lr) * m) / n,
      "rollout/ratio_outside_frac": jnp.sum(outside * m) / n,
  }


def correction_weights(old_logp_BxR, behaviour_logp_BxR, mask_BxR, correction: Correction):
  """Per-token weights w_t of the policy loss (float32 [B, R]; 0 on padding):
  `correction.mode` "none" w = 1, "tis" w = min(r, cap), "mask" w = [lo ≤ r ≤ hi]."""
  mode = correction.mode
  if mode not in CORRECTIONS:
    raise ValueError(f"correction mode must be one of {CORRECTIONS}, got {mode!r}")
  m = mask_BxR.astype(jnp.float32)
  if mode == "none":
    return m
  r = jnp.exp(log_ratio(old_logp_BxR, behaviour_logp_BxR, m))
  if mode == "tis":
    return jnp.minimum(r, correction.cap) * m
  lo, hi = correction.band
  return ((r >= lo) & (r <= hi)).astype(jnp.float32) * m


def update_weights(current_logp_BxR, behaviour_logp_BxR, mask_BxR, correction: Correction, *,
                   anchor: str):
  """The correction's weights taken inside the update, from r_t = sg(π_θ) / π_b (float32
  [B, R]; 0 on padding; no gradient).

  anchor: the ratio's denominator, "current" (rl.old_logprobs="exact": sg(π_θ) = π_old, so
    `correction_weights` as they are) or "behaviour" (the ratio is π_θ / π_b: "tis" gives
    w = min(1, cap / r), "mask" the band as in `correction_weights`).
  """
  if anchor not in ("current", "behaviour"):
    raise ValueError(f"anchor must be 'current' or 'behaviour', got {anchor!r}")
  current = jax.lax.stop_gradient(current_logp_BxR)
  if anchor == "current" or correction.mode != "tis":
    return correction_weights(current, behaviour_logp_BxR, mask_BxR, correction)
  m = mask_BxR.astype(jnp.float32)
  lr = log_ratio(current, behaviour_logp_BxR, m)
  return jnp.minimum(1.0, correction.cap * jnp.exp(-lr)) * m
