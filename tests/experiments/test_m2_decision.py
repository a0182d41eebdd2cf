"""M2 at decision cuts (experiments/value_mechanisms/m2_decision.py) on a closed-form case where
the right λ is known: V* a Gaussian random walk, a critic V* + independent noise. The
correlation of Â^λ with A* is then 1/√(1/(1 − λ²) + 2r/(1 + λ)) (r = σ_b²/σ_A²), maximal at
λ* = (1 + 2r − √(1 + 4r))/(2r); a wrong GAE, a wrong target or a wrong score moves both."""

import numpy as np
import pytest

from experiments.value_mechanisms import m2_decision as m2

SETTINGS = {"λ=0.8": ("fixed", 0.8), "α=0.05": ("adaptive", 0.05)}
BUCKETS = [("all", 1, 10 ** 9)]


def random_walk(rng, n, length, cuts, r, noise_var=0.0):
  """n responses: V*_t a walk with N(0, 1) steps, V = V* + N(0, r), the reward V*_length on
  the last token, cuts at the first positions. With noise_var > 0, V̂* = V* + N(0, ν)."""
  out = []
  for _ in range(n):
    vstar = 0.5 + np.concatenate([[0.0], np.cumsum(rng.normal(0, 1, length))])
    values = vstar[:length] + rng.normal(0, np.sqrt(r), length)
    eps = rng.normal(0, np.sqrt(noise_var), vstar.size) if noise_var else np.zeros(vstar.size)
    est = vstar + eps
    out.append({"values_T": values, "reward": float(vstar[length]), "cuts": list(cuts),
                "vstar": est[cuts], "vnext": est[np.add(cuts, 1)],
                "noise": np.full(len(cuts), noise_var), "noise_next": np.full(len(cuts),
                                                                               noise_var)})
  return out


def test_closed_form_optimum_by_hand():
  assert m2.closed_form_lambda(0.0) == 0.0
  assert m2.closed_form_lambda(1.0) == pytest.approx((3 - np.sqrt(5)) / 2)
  assert m2.closed_form_lambda(4.0) == pytest.approx((9 - np.sqrt(17)) / 8)
  lams = np.linspace(0, 0.99, 991)
  for r in (0.25, 1.0, 4.0):  # the formula's argmax is the closed form's λ*
    best = lams[np.argmax([m2.closed_form_corr(x, r) for x in lams])]
    assert abs(best - m2.closed_form_lambda(r)) < 2e-3


@pytest.mark.parametrize("r", [0.0, 1.0, 4.0])
def test_the_best_lambda_is_the_closed_form_one(r):
  """The correlation curve matches the closed form, its argmax is λ* to the grid's 0.05, the
  bootstrap interval covers λ*, and the sign accuracy peaks nearby."""
  rng = np.random.default_rng(int(10 * r) + 1)
  responses = random_walk(rng, 600, 60, range(10), r)
  row = m2.lambda_scores(responses, SETTINGS, BUCKETS, n_boot=200)["all"]
  want = m2.closed_form_lambda(r)
  assert row["responses"] == 600 and row["cuts"] == 6000
  for lam in (0.0, 0.4, 0.8):
    assert abs(row["corr_by_lambda"][lam] - m2.closed_form_corr(lam, r)) < 0.03, (lam, row)
  assert abs(row["best_lambda_corr"] - want) <= 0.05 + 1e-9, (want, row["best_lambda_corr"])
  lo, hi = row["best_lambda_corr_ci"]
  assert lo - 1e-9 <= want <= hi + 0.05 and hi - lo <= 0.3, (want, lo, hi)
  assert abs(row["best_lambda_sign"] - want) <= 0.15, (want, row["best_lambda_sign"])
  if r == 0.0:  # a perfect critic at λ = 0: Â = A* exactly
    assert row["corr_by_lambda"][0.0] == pytest.approx(1.0)
    assert row["sign_by_lambda"][0.0] == 1.0
  # λ = 0.8 here: its corr is the curve's value at 0.8.
  assert row["settings"]["λ=0.8"]["corr"] == pytest.approx(row["corr_by_lambda"][0.8])


def test_mc_noise_attenuates_every_lambda_alike():
  """V̂* with noise ν: every λ's corr shrinks by √(1 − ν̄/Var(y)), the argmax stays, and the
  noise-corrected best corr is the noiseless one."""
  clean = m2.lambda_scores(random_walk(np.random.default_rng(5), 600, 60, range(10), 1.0),
                           SETTINGS, BUCKETS, n_boot=0)["all"]
  noisy = m2.lambda_scores(random_walk(np.random.default_rng(5), 600, 60, range(10), 1.0,
                                       noise_var=0.5), SETTINGS, BUCKETS, n_boot=0)["all"]
  # y = A* + ε_{c+1} − ε_c: Var(y) ≈ 1 + 2·0.5, so the factor is ≈ √(1/2).
  assert abs(noisy["noise_factor"] - np.sqrt(0.5)) < 0.03
  assert abs(noisy["best_lambda_corr"] - clean["best_lambda_corr"]) <= 0.1
  assert abs(noisy["best_corr_noise_removed"] - clean["best_corr"]) < 0.05
  assert noisy["best_corr"] < clean["best_corr"] - 0.1


def test_decision_cuts_and_degenerate_buckets():
  # "A:7+2=9\nB:9-3=6" as ids, "=" = 5: the cuts are 0 and each token after "=".
  assert m2.decision_cuts([1, 2, 7, 3, 2, 5, 9, 4, 1, 2, 9, 3, 3, 5, 6], [5]) == [0, 6, 14]
  assert m2.decision_cuts([1, 5], [5]) == [0]   # "=" last: no token after it
  # A zero critic at λ = 0 gives Â = 0 at every cut but the last: no correlation (NaN), and
  # the argmax ignores it; a bucket of one response is left unscored.
  rng = np.random.default_rng(0)
  responses = random_walk(rng, 50, 30, range(5), 0.0)
  for r in responses:
    r["values_T"] = np.zeros_like(r["values_T"])
  row = m2.lambda_scores(responses, SETTINGS, BUCKETS, n_boot=20)["all"]
  assert np.isnan(row["corr_by_lambda"][0.0]) and row["best_lambda_corr"] > 0
  one = m2.lambda_scores(responses[:1], SETTINGS, BUCKETS, n_boot=20)["all"]
  assert one == {"responses": 1, "cuts": 5}
  lines = m2.markdown_lines({"zero_head": {"all": row, "empty": one}}, list(SETTINGS))
  assert any(line.startswith("| all | 50 / 250 |") for line in lines)
  assert any(line.startswith("| empty | 1 / 5 |") for line in lines)
