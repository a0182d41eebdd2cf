"""The estimators of the value-model mechanism suite (`value_bias`), in numpy.

Ground truth is Monte Carlo: for a fixed policy π₀, a response is cut at its step boundaries
c_0 = 0 < c_1 < … < c_{K−1} (token positions; V(s_c) is the value *before* token c), and M
continuations are sampled from each prefix. Their mean reward V̂*(c) estimates V*(s_c) with
noise variance ν(c) = s²/M (s² the continuations' sample variance; for 0/1 rewards
p̂(1 − p̂)·M/(M − 1)). The end of a response has V*(end) = its own reward R (ν = 0).

M1 — value bias by fifth of the response (fifth f = ⌊5·c / l⌋ of a response of l tokens):
    bias_f = mean(V(s_c) − V̂*(c)),
    EV_f   = 1 − (Var(V − V̂*) − ν̄) / (Var(V̂*) − ν̄)      (MC noise removed)
  since V̂* = V* + ε with E[ε | c] = 0, Var(ε | c) = ν(c), ε independent of the critic.
M2 — λ's bias and MSE against the true token advantages, per length bucket, at the first
  token of every step (`token_errors`, the suite's M2):
    e_k = Â_{c_k}^λ − (V̂*(c_k + 1) − V̂*(c_k)),
  the token's GAE advantage against its true advantage A*(c_k) = V*(s_{c_k+1}) − V*(s_{c_k})
  (V̂*(l) = R at the end). This is the error the policy gradient sees: it weights each
  token's advantage on its own (Σ_t Â_t ∇log π_t). With V = V*, E[e_k] = 0 for every λ and
  e_k = 0 exactly at λ = 0; the noise removed is ν(c_k) + ν(c_k + 1).
    bias = mean(e),   MSE = mean(e²) − mean(ν(c_k) + ν(c_k + 1)).
  The step-sum variant (`step_errors`, kept as M2-step) sums a step's token advantages
  first:
    e_k = Σ_{t ∈ [c_k, c_{k+1})} Â_t^λ − (V̂*(c_{k+1}) − V̂*(c_k)),
  the step's GAE credit against its true credit, which telescopes from the token
  advantages V*(s_{t+1}) − V*(s_t). With the critic V = V*, E[e_k] = 0 for every λ (each
  token's error Σ_{j≥1} λ^j δ_{t+j} has mean 0 given s_{t+1}), and e_k = 0 exactly at λ = 0.
    bias = mean(e),   MSE = mean(e²) − mean(ν(c_k) + ν(c_{k+1}))   (MC noise removed).
  It favours λ = 0 by construction (at λ = 0 the sum telescopes to two endpoint errors; at
  λ → 1 each of the step's n_k tokens carries the same return noise, counted n_k² times), so
  it does not measure the variance the policy gradient sees; it is reported for comparison.
  The MSE-optimal λ of a bucket is the grid λ with the least MSE.
Branches — V(s₁) (after the first token) per first token against that branch's mean reward:
  the critic's calibration on the decision chain_or_guess puts at the start.
M3 — decoupled vs coupled critic: per step, V(s₀) of each critic against the group-mean
  return (the mean of a group's rewards estimates V*(s₀) without extra sampling).
"""

from typing import Sequence

import numpy as np

FIFTHS = 5


def mc_value(rewards_M: np.ndarray) -> tuple[float, float]:
  """(V̂*, ν): the mean of M continuation rewards and the variance of that mean."""
  r = np.asarray(rewards_M, np.float64)
  m = r.size
  if m < 2:
    raise ValueError("need at least 2 continuations per cut")
  return float(r.mean()), float(r.var(ddof=1) / m)


def fifth_of(positions, lengths) -> np.ndarray:
  """The fifth ⌊5·c / l⌋ (0..4) of each cut at token position c of a response of l tokens."""
  c, l = np.asarray(positions, np.float64), np.asarray(lengths, np.float64)
  if np.any(c < 0) or np.any(c >= l):
    raise ValueError("cut positions must be in [0, length)")
  return np.minimum((FIFTHS * c / l).astype(np.int64), FIFTHS - 1)


def explained_variance(values, targets, noise_var=None) -> float:
  """1 − Var(V − T) / Var(T), with the targets' mean noise variance ν̄ removed from both:
  1 − (Var(V − T) − ν̄) / (Var(T) − ν̄). NaN when Var(T) − ν̄ ≤ 0 (no signal left)."""
  v, t = np.asarray(values, np.float64), np.asarray(targets, np.float64)
  nu = 0.0 if noise_var is None else float(np.mean(noise_var))
  denom = t.var() - nu
  if v.size < 2 or denom <= 0:
    return float("nan")
  return float(1.0 - (np.var(v - t) - nu) / denom)


def oracle_ev(vstar_hat, noise_var, m: int) -> float:
  """The explained variance a perfect critic (V = V*) would reach against single-sample
  returns G at these cuts — the ceiling of value pretraining's EV stop rule:
  Var(V*) / (Var(V*) + E[Var(G | s)]), with Var(V*) = Var(V̂*) − ν̄ and E[Var(G | s)] = M·ν̄."""
  t, nu = np.asarray(vstar_hat, np.float64), float(np.mean(noise_var))
  signal = t.var() - nu
  return float(signal / (signal + m * nu)) if signal + m * nu > 0 else float("nan")


def bias_by_fifth(values, vstar, noise_var, positions, lengths) -> list[dict]:
  """M1: per fifth, {fifth, cuts, bias, ev, ev_raw, vstar_mean, value_mean}."""
  v, t, nu = (np.asarray(x, np.float64) for x in (values, vstar, noise_var))
  f = fifth_of(positions, lengths)
  out = []
  for k in range(FIFTHS):
    sel = f == k
    if not sel.any():
      out.append({"fifth": k, "cuts": 0})
      continue
    out.append({"fifth": k, "cuts": int(sel.sum()), "bias": float(np.mean(v[sel] - t[sel])),
                "ev": explained_variance(v[sel], t[sel], nu[sel]),
                "ev_raw": explained_variance(v[sel], t[sel]),
                "vstar_mean": float(t[sel].mean()), "value_mean": float(v[sel].mean())})
  return out


def branch_calibration(branches, values, rewards) -> dict:
  """Per branch (e.g. a response's first token): {samples, success, value, gap}: the mean
  reward of its samples, the critic's mean value after the branch token, and value − success
  (the pre-registered calibration is |gap| < 0.05 for every branch)."""
  b, v, r = np.asarray(branches), np.asarray(values, np.float64), np.asarray(rewards,
                                                                               np.float64)
  if not b.size == v.size == r.size:
    raise ValueError(f"need one branch, value and reward per sample: {b.size}, {v.size}, "
                     f"{r.size}")
  out = {}
  for name in sorted(set(b.tolist())):
    sel = b == name
    out[name] = {"samples": int(sel.sum()), "success": float(r[sel].mean()),
                 "value": float(v[sel].mean()), "gap": float(v[sel].mean() - r[sel].mean())}
  return out


def gae(rewards_T, values_T, lam: float, gamma: float = 1.0) -> np.ndarray:
  """Â_t = Σ_j (γλ)^j δ_{t+j}, δ_t = r_t + γV(s_{t+1}) − V(s_t), V(s_T) = 0 (float64)."""
  r, v = np.asarray(rewards_T, np.float64), np.asarray(values_T, np.float64)
  adv, running = np.zeros_like(r), 0.0
  for t in range(r.size - 1, -1, -1):
    nxt = v[t + 1] if t + 1 < r.size else 0.0
    running = r[t] + gamma * nxt - v[t] + gamma * lam * running
    adv[t] = running
  return adv


def length_adaptive_lambda(length: int, alpha: float) -> float:
  """λ = 1 − 1/(α·l), clipped to [0, 1] (VAPO's eq. 2)."""
  return float(min(1.0, max(0.0, 1.0 - 1.0 / (alpha * length))))


def _advantages(values_T, reward: float, cuts: Sequence[int], lam: float):
  """(GAE advantages of a response with its reward on the last token, the checked cuts)."""
  v = np.asarray(values_T, np.float64)
  l = v.size
  cuts = list(cuts)
  if not cuts or cuts[0] != 0 or any(b <= a for a, b in zip(cuts, cuts[1:])) or cuts[-1] >= l:
    raise ValueError(f"cuts must rise from 0 below the length {l}, got {cuts}")
  rewards = np.zeros(l)
  rewards[-1] = reward
  return gae(rewards, v, lam), cuts


def step_errors(values_T, reward: float, cuts: Sequence[int], vstar_cuts, noise_cuts,
                lam: float) -> tuple[np.ndarray, np.ndarray]:
  """M2 for one response: (e_k, ν(c_k) + ν(c_{k+1})) for each step k.

  Args:
    values_T: the critic's V(s_t) at every response token (length l).
    reward: the response's reward, placed on its last token.
    cuts: the step starts c_0 = 0 < … < c_{K−1} < l.
    vstar_cuts, noise_cuts: V̂*(c_k) and ν(c_k) at the cuts.
    lam: the policy's λ for this response.
  """
  adv, cuts = _advantages(values_T, reward, cuts, lam)
  l = adv.size
  bounds = [*cuts, l]
  vstar = [*np.asarray(vstar_cuts, np.float64), float(reward)]
  noise = [*np.asarray(noise_cuts, np.float64), 0.0]
  errors = np.array([adv[bounds[k]:bounds[k + 1]].sum() - (vstar[k + 1] - vstar[k])
                     for k in range(len(cuts))])
  return errors, np.array([noise[k] + noise[k + 1] for k in range(len(cuts))])


def token_errors(values_T, reward: float, cuts: Sequence[int], vstar_cuts, noise_cuts,
                 vnext_cuts, noise_next_cuts, lam: float) -> tuple[np.ndarray, np.ndarray]:
  """M2 for one response: (e_k, ν(c_k) + ν(c_k + 1)) at the first token of each step k.

  Args:
    values_T: the critic's V(s_t) at every response token (length l).
    reward: the response's reward, placed on its last token.
    cuts: the step starts c_0 = 0 < … < c_{K−1} < l.
    vstar_cuts, noise_cuts: V̂*(c_k) and ν(c_k).
    vnext_cuts, noise_next_cuts: V̂*(c_k + 1) and ν(c_k + 1) (the reward and 0 where
      c_k + 1 = l).
    lam: the policy's λ for this response.
  """
  adv, cuts = _advantages(values_T, reward, cuts, lam)
  now, nxt = np.asarray(vstar_cuts, np.float64), np.asarray(vnext_cuts, np.float64)
  errors = adv[cuts] - (nxt - now)
  return errors, np.asarray(noise_cuts, np.float64) + np.asarray(noise_next_cuts, np.float64)


def bias_mse(errors, noise) -> dict:
  """{bias, mse (MC noise removed), mse_raw, steps} of pooled step errors."""
  e, nu = np.asarray(errors, np.float64), np.asarray(noise, np.float64)
  return {"bias": float(e.mean()), "mse": float(np.mean(e ** 2) - nu.mean()),
          "mse_raw": float(np.mean(e ** 2)), "steps": int(e.size)}


def lambda_table(responses: Sequence[dict], settings: dict, buckets: Sequence[tuple],
                 grid: Sequence[float] = tuple(np.round(np.linspace(0, 1, 21), 3))
                 + (0.975, 0.99), estimator: str = "token") -> dict:
  """M2 over responses: per bucket, bias/MSE of each λ setting and the MSE-optimal grid λ.

  Args:
    responses: dicts with values_T, reward, cuts, vstar, noise, and for the token
      estimator vnext, noise_next (see `token_errors`, `step_errors`).
    settings: name -> ("fixed", λ) or ("adaptive", α).
    buckets: (name, lo, hi): responses of lo <= length <= hi.
    grid: the constant λs searched for each bucket's optimum.
    estimator: "token" (`token_errors`) or "step" (`step_errors`).
  """
  if estimator not in ("token", "step"):
    raise ValueError(f"estimator {estimator!r}: token or step")

  def errors(r, lam):
    if estimator == "step":
      return step_errors(r["values_T"], r["reward"], r["cuts"], r["vstar"], r["noise"], lam)
    return token_errors(r["values_T"], r["reward"], r["cuts"], r["vstar"], r["noise"],
                        r["vnext"], r["noise_next"], lam)

  def lam_of(setting, length):
    kind, x = setting
    return float(x) if kind == "fixed" else length_adaptive_lambda(length, x)

  table = {}
  for name, lo, hi in buckets:
    mine = [r for r in responses if lo <= len(r["values_T"]) <= hi]
    row = {"responses": len(mine), "mean_length": (float(np.mean([len(r["values_T"])
                                                                  for r in mine]))
                                                   if mine else None)}
    if mine:
      def pooled(lam_fn):
        parts = [errors(r, lam_fn(len(r["values_T"]))) for r in mine]
        return bias_mse(np.concatenate([p[0] for p in parts]),
                        np.concatenate([p[1] for p in parts]))
      row["settings"] = {s: pooled(lambda n, st=st: lam_of(st, n)) for s, st in
                         settings.items()}
      curve = {float(g): pooled(lambda n, g=g: float(g))["mse"] for g in grid}
      best = min(curve, key=curve.get)
      row["optimal_lambda"], row["optimal_mse"], row["mse_by_lambda"] = best, curve[best], curve
    table[name] = row
  return table
