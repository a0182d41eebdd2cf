"""Is the critic learning? Diagnostics of its values on a rollout batch (numpy, float64).

All of them read values V(s_t) the critic produced *before* it trained on the batch (the
experience's value pass), in units of the returns, against the batch's targets R_t:

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

In RL every batch is fresh too: the step's value/explained_variance is held out already.
Rows b answer prompt b // n (`sampler.types.Rollout.group_ids_B`). `metrics` gathers them as
`critic/*` records (metrics.critic_diagnostics).
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


def metrics(values_BxR, returns_BxR, mask_BxR, scores_B, group_size: int) -> dict[str, float]:
  """The batch's critic/* diagnostics (held-out EV pooling is the caller's: `ev_sums`)."""
  out = {f"critic/{k}": v for k, v in half_evs(values_BxR, returns_BxR, mask_BxR).items()}
  if group_size > 1:
    out["critic/prompt_value_spearman"] = prompt_spearman(values_BxR, scores_B, group_size)
  return out
