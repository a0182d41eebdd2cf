"""Can this backbone tell its right answers from its wrong ones at all? A ceiling for any
token-level critic, measured apart from critic training (real-model review 2026-12-07, §2
items 6-7).

  python -m experiments.real_model.ceiling --config=configs/smollm2_135m.py \\
      [--workdir=<a run: its newest checkpoint's policy, and critic if it holds one>] \\
      [--responses=2048 --folds=5 --mc_responses=20 --mc_continuations=8 --seed=0] \\
      --out=experiments/real_model/results/ceiling.json   # + ceiling.md, the tables

Rollouts: ⌈--responses / B⌉ batches of the run's shape (rl.prompts_per_step prompts ×
rl.responses_per_prompt responses, B rows) of the policy (the config's start, or the workdir's
checkpoint; SFT is not run here) on TRAINING prompts (a seeded permutation of the training
split, batch k its prompts [k n, (k + 1) n), wrapping) with keys fold_in(key(seed),
ROLLOUT_STREAM + k), sampled and scored as `Trainer.experience` samples them for the same key
(`Experience.sample_and_score`: the same rollout without the old-log-prob pass; a trained
critic's values come from its own pass, `critic_stage.bound_values`); correct =
scores_B ≥ eval.correct_threshold. A response of l tokens (its stop token included) after a
prompt left-padded to P columns has states s_t (everything before response token t), read by
the value head at column P + t − 1 (`critic.response_values`).

(a) The probe. Features: the final-norm hidden states h ∈ R^D of the FROZEN critic backbone
(`networks.build_critic` from the policy: what value pretraining starts from), at s_t for
t = ⌊f·l⌋, f ∈ FRACTIONS (f = 0: the prompt's last token, s_0), and at s_l (the response's
last token: the whole response read). V = h·w (+ b) is exactly what the value head computes,
so a linear probe on h bounds what the critic's head could learn from this backbone unchanged.
Per position an L2-regularised logistic regression (numpy, Newton's method, `fit_logistic`)
on standardised features, in K-fold cross-validation (--folds) with folds of whole PROMPTS
(`group_folds`: every response of a problem in one fold, stratified by the problems' pass
rates), the L2 strength chosen per outer fold by an inner group K'-fold CV (K' = max(2,
K − 1)) on the outer training set's log loss, from the grid --l2. Out-of-fold (OOF)
probabilities p̂ give:
  AUROC               P(p̂ of a correct response > p̂ of a wrong one), ties ½, over the pairs
                      within each fold (`auroc`: each fold's fit has its own intercept, and
                      pooled across folds a probe without signal scores below 0.5; the pooled
                      figure is in the JSON as auroc_pooled)
  within-group AUROC  the same over pairs of a correct and a wrong response OF THE SAME PROMPT
                      only (`within_group_auroc`): what no prompt-level value (GRPO's group
                      mean) can know; 0.5 for any score constant within each prompt
  Brier               mean (p̂ − correct)²; beside it the constant's (the training folds' rate)
each with a 95% percentile bootstrap interval resampling prompts (`group_bootstrap`; the OOF
predictions are fixed, so it covers which prompts were drawn, not the refit). Baselines: the
constant (AUROC 0.5), response length only (the probe on [l, log(1 + l)]), and the probe on
s_0 (prompt-level: its within-group AUROC is 0.5 by construction, every response of a prompt
sharing s_0). AUROC ≈ 0.5 at s_l would say no token-level critic on this backbone can separate
right from wrong; clearly above, that a critic's failure is optimisation and data. With a
trained critic in the workdir, its own V(s_t) at the same states is scored beside the probe
(critic_at_states: AUROC, within-group AUROC, Brier of V mapped to a probability as below).

(b) Monte-Carlo values. --mc_responses responses (seeded, from distinct prompts, half correct
where there are enough), each cut at t = ⌊f·l⌋, f ∈ FRACTIONS: --mc_continuations samples of
the policy from prompt + the response's first t tokens (a sampler with data.max_prompt_tokens
raised by sampling.max_new_tokens; each continuation cut at R − t tokens, the budget the
response had), scored as the text of r[:t] + continuation. V̂ = mean correct, ν = its sample
variance / M (`value_bias_stats.mc_value`). Beside each: the critic's V(s_t) when the workdir's
checkpoint holds a critic (mapped to a probability, (V − rl.reward_shift) / rl.reward_scale),
and always the probe's OOF p̂ at the same state. Per f: mean |V − V̂|, bias, Pearson r, and EV
against V̂ with the MC noise removed (`value_bias_stats.explained_variance`).

Writes --out (JSON: everything, with the command, commit and CPU), a markdown table beside
it (.md), printed too, and the per-response records (.npz: prompt, correct, length, and the
probe's OOF p̂ at each position, `oof_<position>`) from which every probe figure can be
recomputed. Single process only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

from experiments.real_model import variance_share
from experiments.value_mechanisms import value_bias_stats as mc_stats

FLAGS = flags.FLAGS

FRACTIONS = (0.0, 0.25, 0.5, 0.75)   # t / l of the probed states (and of the MC prefixes)
LAST = "last"                        # the state s_l after the whole response
ROLLOUT_STREAM = 2_000_003           # fold_in index of the probe batches' keys (no run's)
MC_STREAM = 3_000_017                # fold_in index of the continuations' keys
L2_GRID = "0.1,1,10,100,1000,10000"


def define_flags() -> None:
  """The command's flags, defined only when it runs (importing the module defines none)."""
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  config_flags.DEFINE_config_file("config", None, "Experiment config file.")
  flags.DEFINE_string("workdir", "", "A run whose newest checkpoint's policy (and critic) to "
                      "use (read only); empty: the config's starting policy.")
  flags.DEFINE_integer("responses", 2048, "Responses to probe (at least; whole batches).")
  flags.DEFINE_integer("folds", 5, "Outer cross-validation folds (by prompt).")
  flags.DEFINE_integer("mc_responses", 20, "Responses whose prefixes get MC values.")
  flags.DEFINE_integer("mc_continuations", 8, "Continuations per prefix (>= 2).")
  flags.DEFINE_integer("seed", 0, "Keys, folds, picks and bootstrap.")
  flags.DEFINE_string("l2", L2_GRID, "The L2 strengths (on the summed log loss) to choose from.")
  flags.DEFINE_integer("bootstrap", 2000, "Bootstrap resamples of prompts.")
  flags.DEFINE_string("out", "", "JSON file for the figures (a .md table is written beside).")


def position_names() -> list[str]:
  return [f"{f:g}" for f in FRACTIONS] + [LAST]


# ------------------------------------------------------------------------- states, features


def state_steps(lengths_B, fractions=FRACTIONS) -> np.ndarray:
  """[B, K + 1] int: t = ⌊f·l⌋ for each f, then t = l (the state after the whole response)."""
  l = np.asarray(lengths_B, np.int64)
  steps = [np.floor(f * l).astype(np.int64) for f in fractions]
  return np.stack(steps + [l], axis=1)


def state_columns(lengths_B, prompt_len: int, fractions=FRACTIONS) -> np.ndarray:
  """[B, K + 1] int32 columns P + t − 1 of the rows [prompt | response] where the value head
  reads V(s_t) (`state_steps`); t = 0 is the prompt's last column P − 1."""
  return (prompt_len - 1 + state_steps(lengths_B, fractions)).astype(np.int32)


def hidden_fn(graphdef):
  """jit (critic params, tokens_BxL, mask_BxL, cols_BxK) -> float32 [B, K, D]: the critic
  backbone's final-norm hidden states h[b, cols[b, k]] (what `Critic.head` reads: V = h·w)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import transformer  # pylint: disable=import-outside-toplevel

  def fn(params, tokens, mask, cols):
    critic = nnx.merge(graphdef, params)
    mask = mask.astype(jnp.int32)
    hidden, _ = critic.backbone(tokens, transformer.positions_from_mask(mask), mask)
    return jnp.take_along_axis(hidden, cols[:, :, None], axis=1).astype(jnp.float32)

  return jax.jit(fn)


def features(fn, params, tokens_BxL, mask_BxL, cols_BxK, rows: int) -> np.ndarray:
  """`hidden_fn`'s output over the rows in chunks of `rows` (one compiled shape), float64."""
  import jax  # pylint: disable=import-outside-toplevel
  b = tokens_BxL.shape[0]
  if b % rows:
    raise ValueError(f"{b} rows do not split into chunks of {rows}")
  out = [jax.device_get(fn(params, tokens_BxL[i:i + rows], mask_BxL[i:i + rows],
                           cols_BxK[i:i + rows])) for i in range(0, b, rows)]
  return np.concatenate(out).astype(np.float64)


# -------------------------------------------------------------------------------- metrics


def auroc_sums(scores_N, correct_N, weights=None) -> tuple:
  """(U, n₊n₋) with response weights w_i (e.g. bootstrap counts; [N], or [S, N] for S
  resamples at once):
    U = Σ_{i ∈ +} Σ_{j ∈ −} w_i w_j ([s_i > s_j] + ½[s_i = s_j]),   n₊n₋ = Σ_+ w · Σ_− w,
  U computed over the distinct scores u as Σ_u W₊(u) (W₋(< u) + ½ W₋(u))."""
  s = np.asarray(scores_N, np.float64)
  c = np.asarray(correct_N, bool)
  w = np.ones(s.shape, np.float64) if weights is None else np.asarray(weights, np.float64)
  if s.size == 0:
    return np.zeros(w.shape[:-1]), np.zeros(w.shape[:-1])
  uniq, inv = np.unique(s, return_inverse=True)
  order = np.argsort(inv, kind="stable")
  starts = np.searchsorted(inv[order], np.arange(uniq.size))
  pos = np.add.reduceat((w * c)[..., order], starts, axis=-1)
  neg = np.add.reduceat((w * ~c)[..., order], starts, axis=-1)
  below = np.cumsum(neg, axis=-1) - neg
  return np.sum(pos * (below + 0.5 * neg), axis=-1), pos.sum(-1) * neg.sum(-1)


def _ratio(u, d):
  u, d = np.asarray(u, np.float64), np.asarray(d, np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    out = np.where(d > 0, u / np.where(d > 0, d, 1.0), np.nan)
  return float(out) if out.ndim == 0 else out


def auroc(scores_N, correct_N, weights=None, blocks_N=None):
  """P(score of a correct response > score of a wrong one), ties ½: U / n₊n₋ (`auroc_sums`),
  NaN when a class is empty. With blocks (e.g. the CV folds) only pairs within a block count:
  Σ_k U_k / Σ_k n₊n₋(k). Out-of-fold scores of different folds come from different fits, whose
  intercepts follow the training folds' pass rates, so pooled across folds a probe with no
  signal scores below 0.5 (a fold with more correct responses trains on fewer); within folds
  the intercept cancels."""
  if blocks_N is None:
    return _ratio(*auroc_sums(scores_N, correct_N, weights))
  s, c, b = np.asarray(scores_N), np.asarray(correct_N, bool), np.asarray(blocks_N)
  w = np.ones(s.shape, np.float64) if weights is None else np.asarray(weights, np.float64)
  sums = [auroc_sums(s[b == k], c[b == k], w[..., b == k]) for k in np.unique(b)]
  return _ratio(sum(u for u, _ in sums), sum(d for _, d in sums))


def group_pairs(scores_N, correct_N, groups_N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(group ids G, U_G, pairs_G): per prompt g, U_g = Σ_{i ∈ g+} Σ_{j ∈ g−} ([s_i > s_j] +
  ½[s_i = s_j]) and pairs_g = n₊(g)·n₋(g), its correct-wrong pairs."""
  s = np.asarray(scores_N, np.float64)
  c = np.asarray(correct_N, bool)
  ids, inv = np.unique(np.asarray(groups_N), return_inverse=True)
  u, pairs = np.zeros(ids.size), np.zeros(ids.size)
  for g in range(ids.size):
    sel = inv == g
    a, b = s[sel & c], s[sel & ~c]
    pairs[g] = a.size * b.size
    if pairs[g]:
      u[g] = (a[:, None] > b[None]).sum() + 0.5 * (a[:, None] == b[None]).sum()
  return ids, u, pairs


def within_group_auroc(scores_N, correct_N, groups_N) -> float:
  """Σ_g U_g / Σ_g n₊(g) n₋(g) (`group_pairs`): the AUROC over correct-wrong pairs of the same
  prompt, each pair weighted equally; NaN with no prompt of mixed outcome."""
  _, u, pairs = group_pairs(scores_N, correct_N, groups_N)
  return float(u.sum() / pairs.sum()) if pairs.sum() else math.nan


def group_ev_sums(p_N, correct_N, groups_N) -> np.ndarray:
  """[G, 2]: per prompt g, [Σ (y − ȳ_g)², Σ ((y − ȳ_g) − (p − p̄_g))²] over its responses."""
  p = np.asarray(p_N, np.float64)
  y = np.asarray(correct_N, np.float64)
  _, inv = np.unique(np.asarray(groups_N), return_inverse=True)
  n = np.bincount(inv).astype(np.float64)
  cy = y - (np.bincount(inv, weights=y) / n)[inv]
  cd = cy - (p - (np.bincount(inv, weights=p) / n)[inv])
  return np.stack([np.bincount(inv, weights=cy * cy), np.bincount(inv, weights=cd * cd)], 1)


def within_group_ev(p_N, correct_N, groups_N) -> float:
  """1 − Σ_g Σ_i ((y − ȳ_g) − (p − p̄_g))² / Σ_g Σ_i (y − ȳ_g)²: the critic's bar
  (`critic_diagnostics.within_group_ev`) on one score per response; 0 for any score constant
  within each prompt, 1 for p = y; NaN with no prompt of mixed outcome."""
  ssr, ssd = group_ev_sums(p_N, correct_N, groups_N).sum(0)
  return float(1.0 - ssd / ssr) if ssr > 0 else math.nan


def brier(p_N, correct_N) -> float:
  """mean (p − correct)², correct ∈ {0, 1}."""
  e = np.asarray(p_N, np.float64) - np.asarray(correct_N, np.float64)
  return float(np.mean(e * e))


def log_loss(p_N, correct_N) -> float:
  """−mean(y log p + (1 − y) log(1 − p)), p clipped to [1e-12, 1 − 1e-12]."""
  p = np.clip(np.asarray(p_N, np.float64), 1e-12, 1 - 1e-12)
  y = np.asarray(correct_N, np.float64)
  return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def _interval(estimate: float, reps) -> dict:
  reps = np.asarray(reps, np.float64)
  reps = reps[np.isfinite(reps)]
  lo, hi = (np.quantile(reps, [0.025, 0.975]) if reps.size else (math.nan, math.nan))
  return {"estimate": estimate, "lo": float(lo), "hi": float(hi)}


def group_bootstrap(p_N, correct_N, groups_N, num_samples: int = 2000, seed: int = 0,
                    folds_N=None) -> dict:
  """The AUROC (pairs within a fold when folds are given: `auroc`), the pooled AUROC, the
  within-group AUROC, the within-group EV (`within_group_ev`, its sums resampled as the
  AUROC's) and the Brier score of fixed predictions p, with 95% percentile intervals
  over `num_samples` resamples of the G prompts with replacement (counts c_g ~
  Multinomial(G, 1/G); response i weighs c_{g(i)}): AUROC* = `auroc`(p, y, c_g(i)),
  within* = Σ c_g U_g / Σ c_g pairs_g, Brier* = Σ c_g SE_g / Σ c_g n_g. A resample with an
  empty class is dropped from that figure's quantiles."""
  p = np.asarray(p_N, np.float64)
  y = np.asarray(correct_N, bool)
  ids, inv = np.unique(np.asarray(groups_N), return_inverse=True)
  rng = np.random.default_rng(seed)
  counts = rng.multinomial(ids.size, np.full(ids.size, 1.0 / ids.size), size=num_samples)
  counts = counts.astype(np.float64)
  w = counts[:, inv]
  _, u, pairs = group_pairs(p, y, groups_N)
  se = np.bincount(inv, weights=(p - y) ** 2, minlength=ids.size)
  ev = group_ev_sums(p, y, groups_N)
  n = np.bincount(inv, minlength=ids.size).astype(np.float64)
  out = {"auroc": _interval(auroc(p, y, blocks_N=folds_N), auroc(p, y, w, folds_N)),
         "auroc_pooled": _interval(auroc(p, y), auroc(p, y, w)),
         "within_group_auroc": _interval(within_group_auroc(p, y, groups_N),
                                         _ratio(counts @ u, counts @ pairs)),
         "within_group_ev": _interval(within_group_ev(p, y, groups_N),
                                      1.0 - _ratio(counts @ ev[:, 1], counts @ ev[:, 0])),
         "brier": _interval(brier(p, y), (counts @ se) / (counts @ n)),
         "log_loss": log_loss(p, y)}
  return out


# ---------------------------------------------------------------------------------- probe


def _sigmoid(z):
  return np.exp(-np.logaddexp(0.0, -z))


def fit_logistic(x_NxD, y_N, l2: float, theta=None, tol: float = 1e-10,
                 max_iter: int = 100) -> np.ndarray:
  """θ = (w, b) minimising the L2-regularised logistic loss
    L(θ) = Σ_i [log(1 + e^{z_i}) − y_i z_i] + (l2/2)·|w|² + (ε/2)·b²,   z = X w + b,
  (ε = 1e-8 keeps b finite on one-class data) by Newton's method: H Δ = ∇L with
  ∇L = Aᵀ(σ(z) − y) + Λθ, H = Aᵀ diag(σ(1 − σ)) A + Λ (A = [X, 1], Λ = diag(l2, …, l2, ε)),
  θ ← θ − s Δ with s halved until the Armijo condition holds; stops after a full step once the
  Newton decrement ∇Lᵀ Δ / 2 ≤ tol · max(1, L). `theta` warm-starts it. Returns [D + 1], b
  last."""
  x = np.asarray(x_NxD, np.float64)
  y = np.asarray(y_N, np.float64)
  a = np.hstack([x, np.ones((x.shape[0], 1))])
  pen = np.full(a.shape[1], float(l2))
  pen[-1] = 1e-8
  th = np.zeros(a.shape[1]) if theta is None else np.array(theta, np.float64)

  def objective(t):
    z = a @ t
    return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(pen * t * t))

  f = objective(th)
  for _ in range(max_iter):
    p = _sigmoid(a @ th)
    g = a.T @ (p - y) + pen * th
    h = (a * (p * (1 - p))[:, None]).T @ a + np.diag(pen)
    step = np.linalg.solve(h, g)
    dec = float(g @ step)
    if dec / 2 <= tol * max(1.0, f):   # converged: the last full step, quadratically close
      th = th - step
      break
    s = 1.0
    while True:
      new = th - s * step
      fn = objective(new)
      if fn <= f - 1e-4 * s * dec or s < 1e-10:
        break
      s /= 2
    th, f = new, fn
  return th


def predict(theta, x_NxD) -> np.ndarray:
  return _sigmoid(np.asarray(x_NxD, np.float64) @ theta[:-1] + theta[-1])


def standardiser(x_NxD) -> tuple[np.ndarray, np.ndarray]:
  """(mean, sd) per feature of the rows given (sd 1 where a feature is constant)."""
  x = np.asarray(x_NxD, np.float64)
  sd = x.std(axis=0)
  return x.mean(axis=0), np.where(sd > 1e-12, sd, 1.0)


def group_folds(groups_N, correct_N, k: int, seed: int) -> np.ndarray:
  """The fold (0..k−1) of each response: whole prompts per fold. The prompts are sorted by
  their pass rate (ties in a seeded random order) and dealt in blocks of k, each block in a
  seeded random order of the folds, so every fold gets prompts of every difficulty."""
  ids, inv = np.unique(np.asarray(groups_N), return_inverse=True)
  if ids.size < k:
    raise ValueError(f"{ids.size} prompts cannot fill {k} folds")
  rate = (np.bincount(inv, weights=np.asarray(correct_N, np.float64), minlength=ids.size)
          / np.bincount(inv, minlength=ids.size))
  rng = np.random.default_rng(seed)
  order = np.lexsort((rng.permutation(ids.size), rate))
  deal = np.concatenate([rng.permutation(k) for _ in range(-(-ids.size // k))])[:ids.size]
  fold_of = np.empty(ids.size, np.int64)
  fold_of[order] = deal
  return fold_of[inv]


def _path(x_tr, y_tr, x_te, l2s) -> dict[float, np.ndarray]:
  """Test predictions of the probe fitted on standardised (x_tr) for each L2 strength,
  from the strongest down, each fit warm-started from the last."""
  mu, sd = standardiser(x_tr)
  a, b = (x_tr - mu) / sd, (x_te - mu) / sd
  out, theta = {}, None
  for l2 in sorted(l2s, reverse=True):
    theta = fit_logistic(a, y_tr, l2, theta)
    out[l2] = predict(theta, b)
  return out


def cross_validate(x_NxD, correct_N, groups_N, folds: int, l2s, seed: int) -> dict:
  """Nested group cross-validation of the probe (module doc): {"oof": OOF p̂ with the L2
  chosen per outer fold by the inner CV's log loss, "oof_by_l2": {l2: OOF p̂ at that fixed
  L2}, "l2_chosen": [per outer fold], "folds": the fold of each response}."""
  x = np.asarray(x_NxD, np.float64)
  y = np.asarray(correct_N, np.float64)
  g = np.asarray(groups_N)
  fold = group_folds(g, y, folds, seed)
  inner_k = max(2, folds - 1)
  l2s = sorted(float(v) for v in l2s)
  oof, by_l2, chosen = np.zeros(y.size), {v: np.zeros(y.size) for v in l2s}, []
  for f in range(folds):
    tr, te = fold != f, fold == f
    inner = group_folds(g[tr], y[tr], inner_k, seed + 1 + f)
    loss = {v: 0.0 for v in l2s}
    for j in range(inner_k):
      itr, ite = inner != j, inner == j
      for v, p in _path(x[tr][itr], y[tr][itr], x[tr][ite], l2s).items():
        loss[v] += log_loss(p, y[tr][ite]) * ite.sum()
    best = min(l2s, key=lambda v: (loss[v], -v))   # ties: the stronger penalty
    chosen.append(best)
    for v, p in _path(x[tr], y[tr], x[te], l2s).items():
      by_l2[v][te] = p
    oof[te] = by_l2[best][te]
  return {"oof": oof, "oof_by_l2": by_l2, "l2_chosen": chosen, "folds": fold}


def constant_oof(correct_N, fold_N) -> np.ndarray:
  """The constant predictor out of fold: each fold gets the other folds' pass rate."""
  y = np.asarray(correct_N, np.float64)
  out = np.zeros(y.size)
  for f in np.unique(fold_N):
    out[fold_N == f] = y[fold_N != f].mean()
  return out


def probe_report(x_NxD, correct_N, groups_N, folds: int, l2s, seed: int,
                 num_samples: int) -> tuple[dict, np.ndarray]:
  """(figures, OOF p̂) of one position's probe: `group_bootstrap` of the nested OOF p̂, the
  chosen L2 per fold, the AUROC at each fixed L2 (picking the best of these is optimistic),
  and the constant's Brier on the same folds."""
  cv = cross_validate(x_NxD, correct_N, groups_N, folds, l2s, seed)
  out = group_bootstrap(cv["oof"], correct_N, groups_N, num_samples, seed, cv["folds"])
  out["l2_chosen"] = cv["l2_chosen"]
  out["auroc_by_l2"] = {f"{v:g}": auroc(p, correct_N, blocks_N=cv["folds"])
                       for v, p in cv["oof_by_l2"].items()}
  out["brier_constant"] = brier(constant_oof(correct_N, cv["folds"]), correct_N)
  return out, cv["oof"]


# ------------------------------------------------------------------------------ rollouts


@dataclasses.dataclass
class Rollouts:
  """The probe's responses on the host: per response its prompt's example index (the group),
  real prompt tokens, response tokens, correctness, features [N, K + 1, D], and the trained
  critic's V(s_t) at the probed states (None without one)."""
  groups: np.ndarray
  prompts: list
  responses: list
  scores: np.ndarray
  correct: np.ndarray
  lengths: np.ndarray
  truncated: np.ndarray
  feats: np.ndarray
  batch_means: list
  critic_v: np.ndarray | None
  max_new_tokens: int


def draw(t, n_responses: int, seed: int, log=print) -> Rollouts:
  """The probe's rollouts and features (module doc)."""
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax import distributed  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import critic_stage  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import networks  # pylint: disable=import-outside-toplevel
  cfg, p, s = t.cfg, t.parts, t.state
  n, k = cfg.rl.rollout_prompts, cfg.rl.group_size
  batches = -(-n_responses // (n * k))
  train = p.train_examples
  perm = np.random.default_rng(seed).permutation(len(train))
  graphdef, params = networks.build_critic(cfg, p.graphdef, s.policy_params, p.mesh, p.rules)
  fn = hidden_fn(graphdef)
  micro = cfg.rl.micro_batch_size
  rows = micro if micro and (n * k) % micro == 0 else n * k   # the feature pass's chunk
  has_critic = "critic" in s.learners
  eos = set(p.text.eos_ids)
  out = {x: [] for x in ("groups", "prompts", "responses", "scores", "lengths", "truncated",
                         "feats", "critic_v")}
  means = []
  for b in range(batches):
    idx = [int(perm[(b * n + j) % len(train)]) for j in range(n)]
    key = jax.random.fold_in(jax.random.key(seed), ROLLOUT_STREAM + b)
    batch, _ = p.experience.sample_and_score(s.policy_params, [train[i] for i in idx], key)
    pl = batch.prompt_len
    tokens, mask, resp, scores = distributed.to_host(
        (batch.tokens_BxL, batch.mask_BxL, batch.response_mask_BxR, batch.scores_B))
    r = resp.shape[1]
    lengths = resp.sum(1).astype(np.int64)
    cols = state_columns(lengths, pl)
    out["feats"].append(features(fn, params, tokens, mask, cols, rows))
    for i in range(tokens.shape[0]):
      l = int(lengths[i])
      out["prompts"].append(tokens[i, :pl][mask[i, :pl] > 0].tolist())
      out["responses"].append(tokens[i, pl:pl + l].tolist())
      out["truncated"].append(l == r and int(tokens[i, pl + l - 1]) not in eos)
    out["groups"].append(np.repeat(idx, k))
    out["scores"].append(np.asarray(scores, np.float64))
    out["lengths"].append(lengths)
    if has_critic:   # V(s_t) [B, R] as `Trainer.experience` computes it
      values = distributed.to_host(critic_stage.bound_values(
          t.critic_values, s.learners["critic"].state.params,
          t.return_stats() if cfg.rl.value_norm != "none" else None, batch.tokens_BxL,
          batch.mask_BxL, pl))
      steps = np.minimum(state_steps(lengths)[:, :len(FRACTIONS)], r - 1)
      out["critic_v"].append(np.take_along_axis(np.asarray(values, np.float64), steps, 1))
    means.append(float(np.mean(scores >= cfg.eval.correct_threshold)))
    log(f"batch {b + 1}/{batches}: {means[-1]:.3f} correct", flush=True)
  scores = np.concatenate(out["scores"])
  return Rollouts(
      groups=np.concatenate(out["groups"]), prompts=out["prompts"],
      responses=out["responses"], scores=scores,
      correct=scores >= cfg.eval.correct_threshold, lengths=np.concatenate(out["lengths"]),
      truncated=np.asarray(out["truncated"]), feats=np.concatenate(out["feats"]),
      batch_means=means,
      critic_v=np.concatenate(out["critic_v"]) if has_critic else None,
      max_new_tokens=int(r))


def rollout_summary(ro: Rollouts, group_size: int) -> dict:
  """Counts, pass rate, lengths, and the between-prompt share of the 0/1 reward's variance
  (`variance_share.between_share` over the batches' groups: a prompt-level value's EV
  ceiling on this distribution)."""
  _, u, pairs = group_pairs(np.zeros(ro.correct.size), ro.correct, ro.groups)
  share = (variance_share.between_share(ro.correct.reshape(-1, group_size))["share"]
           if group_size > 1 else math.nan)
  return {"responses": int(ro.correct.size), "prompts": int(np.unique(ro.groups).size),
          "correct_rate": float(ro.correct.mean()), "batch_correct_rate": ro.batch_means,
          "length_mean": float(ro.lengths.mean()), "truncated_frac": float(ro.truncated.mean()),
          "feature_dim": int(ro.feats.shape[-1]),
          "mixed_prompts": int((pairs > 0).sum()), "within_pairs": int(pairs.sum()),
          "between_prompt_share": share}


# --------------------------------------------------------------------------- Monte Carlo


def pick_mc(correct_N, groups_N, n: int, seed: int) -> list[int]:
  """`n` response indices, seeded: ⌊n/2⌋ correct ones where there are enough (else all the
  correct ones), the rest wrong, each from a prompt not picked yet while there are such."""
  c = np.asarray(correct_N, bool)
  g = np.asarray(groups_N)
  n = min(n, c.size)
  quota = {True: min(n // 2, int(c.sum()))}
  quota[False] = min(n - quota[True], int((~c).sum()))
  quota[True] = n - quota[False]
  order = np.random.default_rng(seed).permutation(c.size)
  picked, used = [], set()
  for distinct in (True, False):
    for i in order:
      i = int(i)
      if quota[bool(c[i])] and i not in picked and not (distinct and g[i] in used):
        picked.append(i)
        used.add(g[i])
        quota[bool(c[i])] -= 1
  return sorted(picked)


def compare(values, mc, noise) -> dict:
  """A value estimate against MC values at the same states: mean |V − V̂|, bias mean(V − V̂),
  Pearson r (NaN when either is constant), EV with the MC noise ν removed."""
  v, m = np.asarray(values, np.float64), np.asarray(mc, np.float64)
  r = (float(np.corrcoef(v, m)[0, 1]) if v.size > 1 and v.std() > 0 and m.std() > 0
       else math.nan)
  return {"mean_abs_error": float(np.mean(np.abs(v - m))), "bias": float(np.mean(v - m)),
          "pearson": r, "ev_noise_removed": mc_stats.explained_variance(v, m, noise),
          "mean": float(v.mean())}


def monte_carlo(t, ro: Rollouts, probe_oof: dict, n_responses: int, m: int, seed: int,
                log=print) -> dict:
  """Part (b) of the module doc."""
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import reward as reward_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import sampling  # pylint: disable=import-outside-toplevel
  cfg, p = t.cfg, t.parts
  picks = pick_mc(ro.correct, ro.groups, n_responses, seed)
  steps = state_steps(ro.lengths[picks])[:, :len(FRACTIONS)]
  prefixes = [(i, int(steps[j, f])) for j, i in enumerate(picks) for f in range(len(FRACTIONS))]
  r_cap = ro.max_new_tokens
  long = dataclasses.replace(cfg, data=dataclasses.replace(
      cfg.data, max_prompt_tokens=cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens))
  per_call = max(1, min(cfg.eval.batch_prompts, len(prefixes)))   # the static sampler's rows
  chunk = len(prefixes) if sampling.uses_engine(cfg) else per_call  # the engine: one call
  sampler = sampling.build_sampler(long, p.graphdef, p.model_cfg, p.decode_mesh,
                                   p.decode_rules, p.text, n=m, rows=per_call * m)
  examples = {ex_i: p.train_examples[ex_i] for ex_i in set(ro.groups[picks].tolist())}
  correct = []
  for c0 in range(0, len(prefixes), chunk):
    part = prefixes[c0:c0 + chunk]
    real = len(part)
    part = part + [part[-1]] * (chunk - real)   # one compiled shape
    key = jax.random.fold_in(jax.random.key(seed), MC_STREAM + c0)
    out = rollout_lib.sample(sampler, t.state.policy_params,
                             lambda q, part=part: ro.prompts[part[q][0]]
                             + ro.responses[part[q][0]][:part[q][1]], len(part), key)
    rows, conts = reward_lib.local_responses(out)
    texts, probs, answers = [], [], []
    for row, cont in zip(rows, conts):
      i, ts = part[int(row) // m]
      texts.append(p.text.decode(ro.responses[i][:ts] + cont[:r_cap - ts]))
      ex = examples[int(ro.groups[i])]
      probs.append(ex.problem)
      answers.append(ex.answer)
    scores = np.asarray(p.scorer.score_batch(probs, texts, answers).rewards, np.float64)
    by_row = np.zeros(len(part) * m, bool)
    by_row[np.asarray(rows, np.int64)] = scores >= cfg.eval.correct_threshold
    correct.append(by_row[:real * m])
    log(f"MC: prefixes {c0 + real}/{len(prefixes)}", flush=True)
  sampler.clear_cache()
  correct = np.concatenate(correct).reshape(len(prefixes), m)
  est = [mc_stats.mc_value(row) for row in correct]
  mc = np.array([e[0] for e in est]).reshape(len(picks), len(FRACTIONS))
  nu = np.array([e[1] for e in est]).reshape(len(picks), len(FRACTIONS))
  rl = cfg.rl
  critic = (None if ro.critic_v is None
            else (ro.critic_v[picks] - rl.reward_shift) / rl.reward_scale)
  by_fraction = {}
  for f, name in enumerate(position_names()[:len(FRACTIONS)]):
    row = {"prefixes": len(picks), "mc_mean": float(mc[:, f].mean()),
           "mc_noise_var_mean": float(nu[:, f].mean()),
           "outcome_mean": float(ro.correct[picks].mean()),
           "probe": compare(probe_oof[name][picks], mc[:, f], nu[:, f])}
    if critic is not None:
      row["critic"] = compare(critic[:, f], mc[:, f], nu[:, f])
    by_fraction[name] = row
  return {"values_from": "critic" if critic is not None else "probe",
          "continuations": m, "by_fraction": by_fraction,
          "picks": [{"index": i, "prompt": int(ro.groups[i]), "correct": bool(ro.correct[i]),
                     "length": int(ro.lengths[i]), "t": steps[j].tolist(),
                     "mc": mc[j].tolist(), "noise_var": nu[j].tolist(),
                     "probe": [float(probe_oof[name][i])
                               for name in position_names()[:len(FRACTIONS)]],
                     **({"critic": critic[j].tolist()} if critic is not None else {})}
                    for j, i in enumerate(picks)]}


# ---------------------------------------------------------------------------------- run


def measure(t, *, responses: int, folds: int, mc_responses: int, mc_continuations: int,
            seed: int, l2s=(0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0), num_samples: int = 2000,
            log=print) -> dict:
  """Parts (a) and (b) on a built trainer `t` (its policy, and its critic if set up)."""
  if mc_continuations < 2:
    raise ValueError("--mc_continuations must be >= 2")
  times = {}
  t0 = time.perf_counter()
  ro = draw(t, responses, seed, log)
  times["rollouts_and_features"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  probe, oof = {}, {}
  for k, name in enumerate(position_names()):
    probe[name], oof[name] = probe_report(ro.feats[:, k], ro.correct, ro.groups, folds, l2s,
                                          seed, num_samples)
    probe[name]["t_over_l"] = FRACTIONS[k] if k < len(FRACTIONS) else 1.0
    log(f"probe at {name}: AUROC {probe[name]['auroc']['estimate']:.3f}", flush=True)
  length_x = np.stack([ro.lengths, np.log1p(ro.lengths)], axis=1).astype(np.float64)
  length, _ = probe_report(length_x, ro.correct, ro.groups, folds, l2s, seed, num_samples)
  rate = float(ro.correct.mean())
  constant = {"auroc": 0.5, "within_group_auroc": 0.5, "within_group_ev": 0.0,
              "brier": probe[LAST]["brier_constant"], "brier_in_sample": rate * (1 - rate)}
  critic = None
  if ro.critic_v is not None:   # the trained critic's own V at the probed states, as p̂
    rl = t.cfg.rl
    v = (ro.critic_v - rl.reward_shift) / rl.reward_scale
    critic = {name: group_bootstrap(v[:, k], ro.correct, ro.groups, num_samples, seed)
              for k, name in enumerate(position_names()[:len(FRACTIONS)])}
  times["probe"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  mc = (monte_carlo(t, ro, oof, mc_responses, mc_continuations, seed, log)
        if mc_responses > 0 else None)
  times["monte_carlo"] = time.perf_counter() - t0
  return {"settings": {"responses": responses, "folds": folds, "inner_folds": max(2, folds - 1),
                       "l2": sorted(float(v) for v in l2s), "bootstrap": num_samples,
                       "mc_responses": mc_responses, "mc_continuations": mc_continuations,
                       "seed": seed, "fractions": list(FRACTIONS)},
          "rollouts": rollout_summary(ro, t.cfg.rl.group_size),
          "probe": probe, "baselines": {"constant": constant, "length": length,
                                        "s0_probe": position_names()[0]},
          "critic": "trained" if critic is not None else "none", "critic_at_states": critic,
          "mc": mc, "time_s": times,
          "records": {"groups": ro.groups, "correct": ro.correct, "lengths": ro.lengths,
                      **{f"oof_{name}": p for name, p in oof.items()}}}


def _fmt(x: dict) -> str:
  return f"{x['estimate']:.3f} [{x['lo']:.3f}, {x['hi']:.3f}]"


def table(res: dict) -> str:
  """The markdown the command prints and writes beside its JSON."""
  r = res["rollouts"]
  lines = [f"{r['responses']} responses on {r['prompts']} training prompts, "
           f"{r['correct_rate']:.3f} correct ({r['mixed_prompts']} prompts of mixed outcome, "
           f"{r['within_pairs']} within-prompt pairs); between-prompt share "
           f"{r['between_prompt_share']:.3f}; {res['settings']['folds']}-fold CV by prompt, "
           "95% intervals resampling prompts.", "",
           "| probe on | AUROC | within-prompt AUROC | within-prompt EV | Brier (constant's) "
           "| L2 chosen |", "|---|---|---|---|---|---|"]
  c = res["baselines"]["constant"]
  lines.append(f"| constant | 0.5 | 0.5 | 0 | {c['brier']:.4f} | — |")
  length = res["baselines"]["length"]
  lines.append(f"| length only | {_fmt(length['auroc'])} | {_fmt(length['within_group_auroc'])} "
               f"| {_fmt(length['within_group_ev'])} | {length['brier']['estimate']:.4f} "
               f"({length['brier_constant']:.4f}) | "
               f"{', '.join(f'{v:g}' for v in length['l2_chosen'])} |")
  for name, x in res["probe"].items():
    label = {"0": "s_0 (prompt)", LAST: "s_l (last token)"}.get(name, f"s_t, t/l = {name}")
    lines.append(f"| {label} | {_fmt(x['auroc'])} | {_fmt(x['within_group_auroc'])} | "
                 f"{_fmt(x['within_group_ev'])} | {x['brier']['estimate']:.4f} "
                 f"({x['brier_constant']:.4f}) | "
                 f"{', '.join(f'{v:g}' for v in x['l2_chosen'])} |")
  for name, x in (res.get("critic_at_states") or {}).items():
    lines.append(f"| trained critic V(s_t), t/l = {name} | {_fmt(x['auroc'])} | "
                 f"{_fmt(x['within_group_auroc'])} | {_fmt(x['within_group_ev'])} | "
                 f"{x['brier']['estimate']:.4f} | — |")
  mc = res.get("mc")
  if mc:
    critic = mc["values_from"] == "critic"
    lines += ["", f"Monte-Carlo values: {len(mc['picks'])} responses, {mc['continuations']} "
              "continuations per prefix; V beside them: "
              + ("the workdir's critic and the probe's OOF p̂." if critic
                 else "the probe's OOF p̂ (no trained critic)."), "",
              "| t/l | prefixes | mean V̂ (MC) | mean ν | probe: mean abs err, r |"
              + (" critic: mean abs err, r |" if critic else ""),
              "|---|---|---|---|---|" + ("---|" if critic else "")]
    for name, x in mc["by_fraction"].items():
      cells = [name, str(x["prefixes"]), f"{x['mc_mean']:.3f}", f"{x['mc_noise_var_mean']:.4f}",
               f"{x['probe']['mean_abs_error']:.3f}, {x['probe']['pearson']:+.2f}"]
      if critic:
        cells.append(f"{x['critic']['mean_abs_error']:.3f}, {x['critic']['pearson']:+.2f}")
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def provenance() -> dict:
  """The commit (with "+dirty" when the tree differs), the CPU (`lscpu` Model name), the
  JAX device."""
  def run(*cmd):
    try:
      return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
      return ""
  commit = run("git", "rev-parse", "HEAD").strip()
  if commit and run("git", "status", "--porcelain", "--untracked-files=no").strip():
    commit += "+dirty"
  cpu = next((line.split(":", 1)[1].strip() for line in run("lscpu").splitlines()
              if line.startswith("Model name")), "")
  import jax  # pylint: disable=import-outside-toplevel
  return {"commit": commit, "cpu": cpu, "device": str(jax.devices()[0].device_kind)}


def main(_):
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  cfg = config_lib.from_command_line(FLAGS.config)
  workdir = FLAGS.workdir or None
  t = trainer_lib.Trainer(cfg, workdir, progress=False, read_only=bool(workdir))
  try:
    step = None
    if workdir:
      step = t.resume()
      if step is None:
        raise app.UsageError(f"{workdir}: no checkpoint to restore")
    res = measure(t, responses=FLAGS.responses, folds=FLAGS.folds,
                  mc_responses=FLAGS.mc_responses, mc_continuations=FLAGS.mc_continuations,
                  seed=FLAGS.seed, l2s=[float(v) for v in FLAGS.l2.split(",")],
                  num_samples=FLAGS.bootstrap)
  finally:
    t.close()
  records = res.pop("records")
  res = {"command": "python -m experiments.real_model.ceiling " + " ".join(sys.argv[1:]),
         **provenance(), "workdir": workdir or "", "checkpoint_step": step, **res}
  text = table(res)
  print(text, flush=True)
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w", encoding="utf-8") as f:
      json.dump(res, f, indent=1)
    with open(os.path.splitext(FLAGS.out)[0] + ".md", "w", encoding="utf-8") as f:
      f.write(text)
    np.savez_compressed(os.path.splitext(FLAGS.out)[0] + ".npz", **records)


if __name__ == "__main__":
  define_flags()
  app.run(main)
