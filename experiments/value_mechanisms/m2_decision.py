"""M2 where decisions are made: which λ gives token advantages the policy gradient can use.

The first M2 (`value_bias_stats.lambda_table`) cut each response at the first token of every
step, a token the SFT policy emits with p ≈ 1: there the true advantage is ≈ 0 and ∇log π ≈ 0,
so its MSE scored advantage noise where no decision is made and rewarded shrinking Â toward 0
(issue 45). This estimator changes both the cuts and the score.

Cuts (`decision_cuts`): position 0 (the response's first token: guess or chain) and the token
after each token in `after` (for chain_or_guess "=" and "{": a step's result digit and the
boxed answer), the tokens where a sampled policy can be wrong. At cut c the true advantage of
the emitted token is A*(c) = V*(s_{c+1}) − V*(s_c), measured as V̂*(c + 1) − V̂*(c) from Monte
Carlo continuations (the reward where c + 1 = l).

Score: advantages are whitened per batch before the loss, so Â's scale carries no
information; what the gradient uses is Â's direction across tokens. Per length bucket, over
the pooled cuts of its responses:
    corr(λ)  = Pearson correlation of Â^λ_c with V̂*(c + 1) − V̂*(c),
    sign(λ)  = share of cuts with |V̂*(c + 1) − V̂*(c)| > 0.1 where sign Â^λ_c = sign A*.
MC noise: V̂* = V* + ε with ε independent of the sampled response (fresh continuations), so
cov(Â, ε) = 0 and corr(Â, A* + ε) = corr(Â, A*) · √(1 − ν̄/Var(V̂*(c+1) − V̂*(c))), the same
factor for every λ: the argmax is unbiased by the noise, and `corr_noise_removed` divides the
factor out (ν̄ = mean of ν(c) + ν(c + 1)).
Interval: the bucket's responses are resampled with replacement (cuts stay with their
response: they share its critic errors), B times; the argmax λ of each draw gives a
percentile interval [2.5%, 97.5%].

Closed form (tests/experiments/test_m2_decision.py): V* a random walk with independent steps A*_t of
variance σ_A², a critic V = V* + b with independent errors of variance σ_b², r = σ_b²/σ_A², many
tokens after the cut. Then Â^λ_c = A*_c + Σ_{j≥1} λ^j A*_{c+j} − b_c + (1 − λ) Σ_{k≥1} λ^{k−1}
b_{c+k}, so
    corr(λ)² = 1 / (1/(1 − λ²) + 2r/(1 + λ)),  maximal at λ* = (1 + 2r − √(1 + 4r)) / (2r),
0 for a perfect critic (r = 0), 0.382 at r = 1, 0.610 at r = 4.
"""

from typing import Callable, Sequence

import numpy as np

from experiments.value_mechanisms import value_bias_stats as stats

SIGN_MIN = 0.1  # |A*| above which a cut enters the sign accuracy
GRID = tuple(np.round(np.linspace(0, 1, 21), 3)) + (0.975, 0.99)


def decision_cuts(response: Sequence[int], after_ids: Sequence[int]) -> list[int]:
  """0 and every position following a token in `after_ids`, below the length."""
  l, after = len(response), set(after_ids)
  return [0] + [i + 1 for i, t in enumerate(response[:-1]) if t in after and i + 1 < l]


def closed_form_lambda(r: float) -> float:
  """λ* maximising corr(Â^λ, A*) for the random-walk case above (r = σ_b²/σ_A²)."""
  if r <= 0:
    return 0.0
  return float((1 + 2 * r - np.sqrt(1 + 4 * r)) / (2 * r))


def closed_form_corr(lam: float, r: float) -> float:
  """corr(Â^λ, A*) for the random-walk case above."""
  return float(1.0 / np.sqrt(1.0 / (1.0 - lam ** 2) + 2.0 * r / (1.0 + lam)))


def _sums(responses: Sequence[dict], lam_of: Callable[[int], float]) -> np.ndarray:
  """Per response [n, Σa, Σa², Σay, Σy, Σy², n_sign, n_agree]: a = Â^λ at its cuts, y =
  V̂*(c + 1) − V̂*(c); n_sign counts cuts with |y| > SIGN_MIN, n_agree those where sign a =
  sign y."""
  out = np.zeros((len(responses), 8))
  for i, r in enumerate(responses):
    adv, cuts = stats._advantages(r["values_T"], r["reward"], r["cuts"],  # pylint: disable=protected-access
                                  lam_of(len(r["values_T"])))
    a = adv[cuts]
    y = np.asarray(r["vnext"], np.float64) - np.asarray(r["vstar"], np.float64)
    sig = np.abs(y) > SIGN_MIN
    out[i] = [a.size, a.sum(), (a * a).sum(), (a * y).sum(), y.sum(), (y * y).sum(),
              sig.sum(), (sig & (np.sign(a) == np.sign(y))).sum()]
  return out


def _scores(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(corr, sign accuracy) from summed columns s[..., 8] (NaN where undefined)."""
  n, sa, saa, say, sy, syy, ns, na = np.moveaxis(s, -1, 0)
  with np.errstate(invalid="ignore", divide="ignore"):
    cov = say / n - (sa / n) * (sy / n)
    va, vy = saa / n - (sa / n) ** 2, syy / n - (sy / n) ** 2
    ok = (va > 1e-12 * np.maximum(1.0, saa / n)) & (vy > 0)
    corr = np.where(ok, cov / np.sqrt(np.abs(va * vy)), np.nan)
    sign = np.where(ns > 0, na / ns, np.nan)
  return corr, sign


def _argmax(curves: np.ndarray, grid: np.ndarray) -> np.ndarray:
  """The grid λ of each row's largest finite score (NaN where none is finite)."""
  filled = np.where(np.isfinite(curves), curves, -np.inf)
  best = grid[np.argmax(filled, axis=-1)]
  return np.where(np.isfinite(curves).any(-1), best, np.nan)


def lambda_scores(responses: Sequence[dict], settings: dict, buckets: Sequence[tuple],
                  grid: Sequence[float] = GRID, n_boot: int = 1000, seed: int = 0) -> dict:
  """M2 at decision cuts, per bucket: each setting's corr and sign accuracy, both curves
  over the λ grid, their argmax and its bootstrap interval.

  Args:
    responses: dicts with values_T (the critic's V(s_t) at every response token), reward,
      cuts (`decision_cuts`), vstar / vnext (V̂* at c and c + 1), noise / noise_next (ν).
    settings: name -> ("fixed", λ) or ("adaptive", α), as `value_bias.LAMBDAS`.
    buckets: (name, lo, hi): responses of lo <= length <= hi.
    grid: the constant λs searched.
    n_boot: bootstrap draws over responses (0: no interval).
    seed: the bootstrap's numpy seed.
  """
  grid_a = np.asarray(grid, np.float64)

  def lam_of(setting, length):
    kind, x = setting
    return float(x) if kind == "fixed" else stats.length_adaptive_lambda(length, x)

  table = {}
  for name, lo, hi in buckets:
    mine = [r for r in responses if lo <= len(r["values_T"]) <= hi]
    row = {"responses": len(mine), "cuts": int(sum(len(r["cuts"]) for r in mine))}
    table[name] = row
    if len(mine) < 2:
      continue
    row["mean_length"] = float(np.mean([len(r["values_T"]) for r in mine]))
    y = np.concatenate([np.subtract(r["vnext"], r["vstar"]) for r in mine])
    nu = np.concatenate([np.add(r["noise"], r["noise_next"]) for r in mine])
    factor = 1.0 - nu.mean() / y.var() if y.var() > 0 else float("nan")
    row["noise_factor"] = float(np.sqrt(factor)) if factor > 0 else float("nan")
    row["sign_cuts"] = int((np.abs(y) > SIGN_MIN).sum())
    row["settings"] = {}
    for s, st in settings.items():
      corr, sign = _scores(_sums(mine, lambda n, st=st: lam_of(st, n)).sum(0))
      row["settings"][s] = {"corr": float(corr), "sign_acc": float(sign)}
    per = np.stack([_sums(mine, lambda n, g=g: float(g)) for g in grid_a], 1)  # [N, G, 8]
    corr, sign = _scores(per.sum(0))
    row["corr_by_lambda"] = dict(zip(map(float, grid_a), map(float, corr)))
    row["sign_by_lambda"] = dict(zip(map(float, grid_a), map(float, sign)))
    row["best_lambda_corr"] = float(_argmax(corr, grid_a))
    row["best_lambda_sign"] = float(_argmax(sign, grid_a))
    row["best_corr"] = float(np.nanmax(corr)) if np.isfinite(corr).any() else float("nan")
    row["best_corr_noise_removed"] = row["best_corr"] / row["noise_factor"]
    if n_boot:
      rng = np.random.default_rng(seed)
      counts = rng.multinomial(len(mine), np.full(len(mine), 1.0 / len(mine)), size=n_boot)
      boot = np.einsum("bn,ngk->bgk", counts.astype(np.float64), per)
      bc, bs = _scores(boot)
      for key, curves in (("corr", bc), ("sign", bs)):
        best = _argmax(curves, grid_a)
        best = best[np.isfinite(best)]
        row[f"best_lambda_{key}_ci"] = ([float(np.percentile(best, 2.5)),
                                         float(np.percentile(best, 97.5))]
                                        if best.size else [float("nan")] * 2)
  return table


def markdown_lines(table_by_critic: dict, settings: Sequence[str]) -> list[str]:
  """The M2-decision tables: per critic, per bucket, corr (sign accuracy) per setting and the
  argmax λ with its bootstrap interval."""
  lines = ["", "## M2 at decision cuts (the first token, each result digit after `=`, the "
           "boxed answer): corr(Â, A*) (sign accuracy where |A*| > 0.1) per setting, and the "
           "best constant λ with its 95% bootstrap interval over responses", ""]
  for name, table in table_by_critic.items():
    lines += [f"**{name}**", "", "| bucket (tokens) | responses / cuts | " + " | ".join(settings)
              + " | best λ by corr [95%] | best λ by sign [95%] |",
              "|---|---|" + "---|" * (len(settings) + 2)]
    for bucket, row in table.items():
      if "settings" not in row:
        lines.append(f"| {bucket} | {row['responses']} / {row['cuts']} |"
                     + " — |" * (len(settings) + 2))
        continue
      cells = [f"{row['settings'][s]['corr']:.3f} ({row['settings'][s]['sign_acc']:.2f})"
               for s in settings]
      ci = {k: row.get(f"best_lambda_{k}_ci", [float("nan")] * 2) for k in ("corr", "sign")}
      lines.append(f"| {bucket} | {row['responses']} / {row['cuts']} | " + " | ".join(cells)
                   + f" | {row['best_lambda_corr']:.2f} [{ci['corr'][0]:.2f}, "
                   f"{ci['corr'][1]:.2f}] | {row['best_lambda_sign']:.2f} "
                   f"[{ci['sign'][0]:.2f}, {ci['sign'][1]:.2f}] |")
    lines.append("")
  return lines
