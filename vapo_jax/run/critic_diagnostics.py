"""Is the critic learning? Diagnostics of its values on a rollout batch (numpy, float64).

All of them read values V(s_t) the critic produced *before* it trained on the batch (the
experience's value pass), in units of the returns, against the batch's targets R_t, over the
real tokens (mask 1, a prefix of each row: token t < l of a response of length l), every one
computed over the whole batch given, never averaged over parts of it:

  held-out EV       1 − Var[R − V] / Var[R] over the real tokens of the last k fresh batches
                    pooled (`ev_sums` per batch, `pooled_ev` of their sums); k = 1 is
                    `losses.explained_variance` of the batch
  prompt ranking    Spearman ρ over the prompts of a group-sampled batch between V(s_0), the
                    value at the prompt's last token (its response's first column, the same
                    state for every response of a group: their mean), and the group's mean
                    score, its empirical pass rate with 0/1 rewards (`prompt_spearman`)
  EV by half        token-level EV on each response's first half (t < l/2: before the final
                    answer is written, in short responses) and second half (t ≥ l/2: the
                    answer is there), and at its last token, where V is an outcome model's
                    score (`half_evs`)
  within-group EV   1 − Var[(R − R̄_g) − (V − V̄_g)] / Var[R − R̄_g]: the part of the return
                    that GRPO's group mean cannot explain, explained by V; 0 for any critic
                    constant within each group (`within_group_ev`, `group_ev_bootstrap`)
  EV by position    EV in bins of t/l (`position_evs`); V*'s EV rises along the response
  outcome model     V at the last token against correct: AUROC, Brier score, reliability
                    (`last_token_auroc`, `brier`, `reliability`); mean V along t/l of correct
                    and of wrong responses (`outcome_curves`)
  bias              mean V − mean R (`bias`): a lag EV does not see

A constant critic scores EV 0 everywhere (EV ignores bias) and AUROC 0.5. In RL every batch is
fresh too: the step's value/explained_variance is held out already. Rows b answer prompt b // n
(`sampler.types.Rollout.group_ids_B`). `metrics` gathers them as `critic/*` records
(metrics.critic_diagnostics); `heldout_report` adds the within-group EV's interval.
"""

from __future__ import annotations

import numpy as np


def ev_sums(values_BxR, returns_BxR, mask_BxR) -> np.ndarray:
  """[n, Σr, Σr², Σd, Σd²] over the real tokens (d = r − v): what `pooled_ev` pools."""
  m = np.asarray(mask_BxR, np.float64) > 0
  r = np.asarray(returns_BxR, np.float64)[m]
  d = r - np.asarray(values_BxR, np.float64)[m]
  return np.array([r.size, r.sum(), (r * r).sum(), d.sum(), (d * d).sum()])


def pooled_ev(sums) -> float:
  """1 − Var[R − V] / Var[R] over the tokens of every batch whose `ev_sums` are given (0
  when the returns have no variance, like `losses.explained_variance`)."""
  n, s1, s2, d1, d2 = np.sum(np.asarray(sums, np.float64).reshape(-1, 5), axis=0)
  if n <= 0:
    return 0.0
  var_r = s2 / n - (s1 / n) ** 2
  var_d = d2 / n - (d1 / n) ** 2
  return float(1.0 - var_d / var_r) if var_r > 1e-12 else 0.0


def ranks(x) -> np.ndarray:
  """Ranks 0..n−1 of x, ties sharing their mean rank."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="stable")
  r = np.empty(len(x))
  r[order] = np.arange(len(x), dtype=np.float64)
  for v in np.unique(x):
    tie = x == v
    r[tie] = r[tie].mean()
  return r


def spearman(x, y) -> float:
  """Spearman's ρ (Pearson's of the ranks); NaN when either side is constant."""
  rx, ry = ranks(x), ranks(y)
  rx, ry = rx - rx.mean(), ry - ry.mean()
  den = np.sqrt((rx * rx).sum() * (ry * ry).sum())
  return float((rx * ry).sum() / den) if den > 0 else float("nan")


def prompt_spearman(values_BxR, scores_B, group_size: int) -> float:
  """ρ over prompts of the mean V(s_0) of each group against its mean score (NaN with
  fewer than 2 prompts or a constant side)."""
  v0 = np.asarray(values_BxR, np.float64)[:, 0].reshape(-1, group_size).mean(1)
  rate = np.asarray(scores_B, np.float64).reshape(-1, group_size).mean(1)
  return spearman(v0, rate) if len(v0) > 1 else float("nan")


def half_evs(values_BxR, returns_BxR, mask_BxR) -> dict[str, float]:
  """Token-level EV on the first (t < l/2) and second (t ≥ l/2) half of each response, and
  at its last token (t = l − 1)."""
  m = np.asarray(mask_BxR, np.float64)
  lengths = m.sum(1, keepdims=True)
  t = np.arange(m.shape[1], dtype=np.float64)[None, :]
  first = m * (t < lengths / 2)
  last = m * (t == lengths - 1)
  return {name: pooled_ev(ev_sums(values_BxR, returns_BxR, part))
          for name, part in (("ev_first_half", first), ("ev_second_half", m - first),
                             ("ev_last_token", last))}



def _real(x_BxR, m_BxR) -> np.ndarray:
  """x as float64 with 0 on the padding (whatever is there: NaN and inf too)."""
  return np.where(m_BxR, np.asarray(x_BxR, np.float64), 0.0)


def group_ev_sums(values_BxR, returns_BxR, mask_BxR, group_size: int) -> np.ndarray:
  """[G, 3]: per group g (rows g·n .. g·n + n − 1) over its real tokens, [N_g, Σ (R − R̄_g)²,
  Σ ((R − R̄_g) − (V − V̄_g))²], R̄_g and V̄_g its token-weighted means: what
  `within_group_ev` pools and `group_ev_bootstrap` resamples."""
  m = np.asarray(mask_BxR, np.float64) > 0
  b, n = m.shape[0], group_size
  if n < 1 or b % n:
    raise ValueError(f"{b} rows do not split into groups of {n}")
  m_GxT = m.reshape(b // n, -1)
  r_GxT = _real(returns_BxR, m).reshape(b // n, -1)
  v_GxT = _real(values_BxR, m).reshape(b // n, -1)
  count_G = m_GxT.sum(1).astype(np.float64)
  per = np.maximum(count_G, 1.0)
  cr_GxT = np.where(m_GxT, r_GxT - (r_GxT.sum(1) / per)[:, None], 0.0)
  cd_GxT = cr_GxT - np.where(m_GxT, v_GxT - (v_GxT.sum(1) / per)[:, None], 0.0)
  return np.stack([count_G, (cr_GxT * cr_GxT).sum(1), (cd_GxT * cd_GxT).sum(1)], axis=1)


def _group_ev(sums_Gx3, weights_KxG=None):
  """1 − Σ_g SSd_g / Σ_g SSr_g of summed `group_ev_sums` (each group counted by weights_KxG,
  one row per resample: [K]); 0 where Var[R − R̄_g] = Σ SSr / N ≤ 1e-12."""
  tot = (sums_Gx3.sum(0) if weights_KxG is None
         else np.asarray(weights_KxG, np.float64) @ sums_Gx3)
  n, ssr, ssd = tot[..., 0], tot[..., 1], tot[..., 2]
  ok = ssr > 1e-12 * np.maximum(n, 1.0)
  return np.where(ok, 1.0 - ssd / np.where(ok, ssr, 1.0), 0.0)


def within_group_ev(values_BxR, returns_BxR, mask_BxR, group_size: int) -> float:
  """1 − Var[(R − R̄_g) − (V − V̄_g)] / Var[R − R̄_g] over the real tokens of the batch.

  R̄_g, V̄_g: token-weighted means over the real tokens of the responses of the token's group
  (rows b answer prompt b // n); variances over all real tokens pooled, tokens weighted
  equally (the centred terms have mean 0, so this is 1 − Σ_g SSd_g / Σ_g SSr_g). A constant
  critic, and any critic constant within each group (a perfect prompt-level V), scores 0;
  V = R scores 1; 0 (not NaN) when Var[R − R̄_g] ≤ 1e-12."""
  return float(_group_ev(group_ev_sums(values_BxR, returns_BxR, mask_BxR, group_size)))


def group_ev_bootstrap(values_BxR, returns_BxR, mask_BxR, group_size: int, n_boot: int = 1000,
                       seed: int = 0) -> tuple[float, float]:
  """95% percentile interval (2.5%, 97.5%) of `within_group_ev` over n_boot resamples of the
  batch's G groups, whole groups drawn with replacement (G of them, a multinomial count per
  group; numpy's default_rng(seed))."""
  sums_Gx3 = group_ev_sums(values_BxR, returns_BxR, mask_BxR, group_size)
  g = len(sums_Gx3)
  counts_KxG = np.random.default_rng(seed).multinomial(g, np.full(g, 1.0 / g), size=n_boot)
  lo, hi = np.percentile(_group_ev(sums_Gx3, counts_KxG), [2.5, 97.5])
  return float(lo), float(hi)


def position_bins(mask_BxR, bins: int = 10) -> np.ndarray:
  """[B, R] int: floor(bins · t / l) for the real token t of a response of length l (t < l,
  so 0 .. bins − 1: deciles of t/l with bins = 10), −1 on the padding."""
  m = np.asarray(mask_BxR, np.float64) > 0
  l_Bx1 = np.maximum(m.sum(1, keepdims=True), 1)
  t_1xR = np.arange(m.shape[1])[None, :]
  return np.where(m, (bins * t_1xR) // l_Bx1, -1)


def position_evs(values_BxR, returns_BxR, mask_BxR, bins: int = 10) -> list[float]:
  """[bins]: `pooled_ev` over the real tokens of bin k = floor(bins · t / l) of t/l, k < bins;
  NaN for a bin with no token (responses shorter than bins leave some empty), 0 for one
  whose returns have no variance."""
  pos = position_bins(mask_BxR, bins)
  return [pooled_ev(ev_sums(values_BxR, returns_BxR, pos == k)) if (pos == k).any()
          else float("nan") for k in range(bins)]


def _correct(scores_B, correct_B=None) -> np.ndarray:
  """correct_B as bool, or scores_B > 0.5 (a 0/1 reward's pass) when not given."""
  if correct_B is None:
    return np.asarray(scores_B, np.float64) > 0.5
  return np.asarray(correct_B, bool)


def last_mask(mask_BxR) -> np.ndarray:
  """[B, R] 1 at each response's last real token t = l − 1, else 0."""
  m = np.asarray(mask_BxR, np.float64)
  t = np.arange(m.shape[1], dtype=np.float64)[None, :]
  return m * (t == m.sum(1, keepdims=True) - 1)


def last_values(values_BxR, mask_BxR) -> tuple[np.ndarray, np.ndarray]:
  """([B] V at each response's last real token t = l − 1 (0 where l = 0), [B] l > 0)."""
  m = np.asarray(mask_BxR, np.float64) > 0
  l_B = m.sum(1)
  v = np.asarray(values_BxR, np.float64)[np.arange(len(l_B)), np.maximum(l_B - 1, 0)]
  return np.where(l_B > 0, v, 0.0), l_B > 0


def last_token_auroc(values_BxR, mask_BxR, correct_B) -> float:
  """P(V_last of a correct response > V_last of a wrong one), ties counted half: the
  Mann-Whitney U / (n₊ n₋) over responses with l > 0, from mid-ranks:
  (Σ_correct rank − n₊(n₊ − 1)/2) / (n₊ n₋), ranks 0-based. A constant V gives 0.5, V = R
  with 0/1 rewards 1; NaN when either class is empty."""
  v_B, has_B = last_values(values_BxR, mask_BxR)
  c_B = np.asarray(correct_B, bool)[has_B]
  n_pos, n_neg = int(c_B.sum()), int((~c_B).sum())
  if not n_pos or not n_neg:
    return float("nan")
  rank_B = ranks(v_B[has_B])
  return float((rank_B[c_B].sum() - n_pos * (n_pos - 1) / 2) / (n_pos * n_neg))


def brier(values_BxR, mask_BxR, correct_B) -> float:
  """mean over responses with l > 0 of (V_last − correct)², correct ∈ {0, 1}: a probability's
  score, for 0/1 rewards (in other return units it is a distance all the same); NaN with no
  response."""
  v_B, has_B = last_values(values_BxR, mask_BxR)
  e_B = v_B[has_B] - np.asarray(correct_B, np.float64)[has_B]
  return float((e_B * e_B).mean()) if has_B.any() else float("nan")


def reliability(values_BxR, mask_BxR, correct_B, bins: int = 5) -> list[tuple]:
  """[bins] of (mean V, fraction correct, count) over the responses (l > 0) whose V_last,
  clipped to [0, 1], falls in the equal-width bin k = min(floor(bins · V), bins − 1); the
  means over the clipped V; (NaN, NaN, 0) for an empty bin. Calibrated: mean V ≈ fraction."""
  v_B, has_B = last_values(values_BxR, mask_BxR)
  v_B = np.clip(v_B[has_B], 0.0, 1.0)
  c_B = np.asarray(correct_B, np.float64)[has_B]
  k_B = np.minimum(np.floor(bins * v_B).astype(int), bins - 1)
  out = []
  for k in range(bins):
    sel = k_B == k
    n = int(sel.sum())
    out.append((float(v_B[sel].mean()), float(c_B[sel].mean()), n) if n
               else (float("nan"), float("nan"), 0))
  return out


def outcome_curves(values_BxR, mask_BxR, correct_B, bins: int = 10):
  """([bins], [bins]): mean V over the real tokens of bin floor(bins · t / l) of the correct
  responses, and of the wrong ones (tokens weighted equally); NaN where a bin is empty. A
  critic that reads the answer splits them where it is written."""
  pos = position_bins(mask_BxR, bins)
  v = np.asarray(values_BxR, np.float64)
  c_Bx1 = np.asarray(correct_B, bool)[:, None]
  curves = []
  for side in (c_Bx1, ~c_Bx1):
    curve = []
    for k in range(bins):
      sel = (pos == k) & side
      curve.append(float(v[sel].mean()) if sel.any() else float("nan"))
    curves.append(curve)
  return curves[0], curves[1]


def bias(values_BxR, returns_BxR, mask_BxR) -> float:
  """mean V − mean R over the real tokens, tokens weighted equally (NaN with none): the lag EV
  does not see."""
  m = np.asarray(mask_BxR, np.float64) > 0
  if not m.any():
    return float("nan")
  return float((np.asarray(values_BxR, np.float64)[m] - np.asarray(returns_BxR, np.float64)[m]
                ).mean())


def metrics(values_BxR, returns_BxR, mask_BxR, scores_B, group_size: int,
            correct_B=None) -> dict[str, float]:
  """The batch's critic/* diagnostics, all over the whole batch (held-out EV pooling over
  batches is the caller's: `ev_sums`); correct_B defaults to scores_B > 0.5.

  critic/ev_first_half, ev_second_half, ev_last_token   `half_evs`
  critic/pooled_ev                                      1 − Var[R − V] / Var[R]
  critic/ev_pos_d0 .. d{bins−1}                         `position_evs` (NaN: empty bin)
  critic/auroc_last, brier_last                         `last_token_auroc`, `brier`
  critic/bias                                           `bias`
  critic/v_correct_d*, v_wrong_d*                       `outcome_curves` (NaN: empty)
  critic/prompt_value_spearman, group_ev                with group_size > 1 only
  critic/group_ev_last                                  `within_group_ev` at each response's
                                                        last token only (one V per response:
                                                        free of V's drift along t)
  """
  out = {f"critic/{k}": v for k, v in half_evs(values_BxR, returns_BxR, mask_BxR).items()}
  if group_size > 1:
    out["critic/prompt_value_spearman"] = prompt_spearman(values_BxR, scores_B, group_size)
    out["critic/group_ev"] = within_group_ev(values_BxR, returns_BxR, mask_BxR, group_size)
    out["critic/group_ev_last"] = within_group_ev(values_BxR, returns_BxR, last_mask(mask_BxR),
                                                  group_size)
  out["critic/pooled_ev"] = pooled_ev(ev_sums(values_BxR, returns_BxR, mask_BxR))
  for k, ev in enumerate(position_evs(values_BxR, returns_BxR, mask_BxR)):
    out[f"critic/ev_pos_d{k}"] = ev
  correct = _correct(scores_B, correct_B)
  out["critic/auroc_last"] = last_token_auroc(values_BxR, mask_BxR, correct)
  out["critic/brier_last"] = brier(values_BxR, mask_BxR, correct)
  out["critic/bias"] = bias(values_BxR, returns_BxR, mask_BxR)
  for name, curve in zip(("correct", "wrong"), outcome_curves(values_BxR, mask_BxR, correct)):
    out.update({f"critic/v_{name}_d{k}": v for k, v in enumerate(curve)})
  return out


def heldout_report(values_BxR, returns_BxR, mask_BxR, scores_B, group_size: int,
                   correct=None, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
  """`metrics` of fresh held-out rollouts (correct: its correct_B), with group_size > 1 also
  critic/group_ev_lo and critic/group_ev_hi, the 95% interval of `group_ev_bootstrap` (n_boot
  group resamples): a critic that helps GRPO's group baseline has it above 0; and the same
  at the last token (critic/group_ev_last_lo, _hi)."""
  out = metrics(values_BxR, returns_BxR, mask_BxR, scores_B, group_size, correct)
  if group_size > 1:
    out["critic/group_ev_lo"], out["critic/group_ev_hi"] = group_ev_bootstrap(
        values_BxR, returns_BxR, mask_BxR, group_size, n_boot, seed)
    out["critic/group_ev_last_lo"], out["critic/group_ev_last_hi"] = group_ev_bootstrap(
        values_BxR, returns_BxR, last_mask(mask_BxR), group_size, n_boot, seed)
  return out
