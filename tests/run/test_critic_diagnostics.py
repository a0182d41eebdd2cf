"""The critic's diagnostics (run/critic_diagnostics.py): hand-worked small batches, brute-force
references, and synthetic critics of known quality (a constant, a prompt-level critic, an
oracle, a noisy oracle, one right only at the last token) that tell a working critic from a
constant. Padding carries garbage (NaN, inf, huge) that no figure may read."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.run import critic_diagnostics as diag

NAN = float("nan")


def _garbage(x_BxR, mask_BxR, seed=0):
  """x on the real tokens; NaN, ±inf or 1e9 on the padding."""
  junk = np.random.default_rng(seed).choice([np.nan, np.inf, -np.inf, 1e9], size=x_BxR.shape)
  return np.where(mask_BxR > 0, x_BxR, junk)


def _batch(groups, n, r=30, seed=0, min_len=3):
  """A group-sampled batch with 0/1 rewards: prompt g has pass rate p_g ~ U(0, 1); row b's
  score ~ Bernoulli(p_{b // n}), its λ = 1 return the score at every real token. Returns
  (returns_BxR with garbage padding, mask_BxR, scores_B, p_B)."""
  rng = np.random.default_rng(seed)
  p_B = np.repeat(rng.uniform(size=groups), n)
  scores_B = (rng.uniform(size=groups * n) < p_B).astype(np.float64)
  lengths_B = rng.integers(min_len, r + 1, groups * n)
  mask = (np.arange(r)[None, :] < lengths_B[:, None]).astype(np.float64)
  return _garbage(scores_B[:, None] * mask, mask, seed), mask, scores_B, p_B


def _hand():
  """4 responses, 2 prompts (n = 2), up to 2 tokens:

    row  l  R        V          group
    0    2  [1, 1]   [.5, 1]    0       score 1
    1    1  [0]      [.5]       0       score 0
    2    1  [1]      [1]        1       score 1
    3    2  [0, 0]   [0, .5]    1       score 0
  """
  mask = np.array([[1, 1], [1, 0], [1, 0], [1, 1]], np.float64)
  ret = _garbage(np.array([[1, 1], [0, 0], [1, 0], [0, 0]], np.float64), mask)
  val = _garbage(np.array([[.5, 1], [.5, 0], [1, 0], [0, .5]], np.float64), mask, seed=1)
  return val, ret, mask, np.array([1.0, 0.0, 1.0, 0.0])


def _brute_group_ev(val, ret, mask, n):
  """Within-group EV by lists of tokens, group by group."""
  cr, cd = [], []
  for g in range(len(mask) // n):
    rows = range(g * n, (g + 1) * n)
    rs = [ret[b, t] for b in rows for t in range(mask.shape[1]) if mask[b, t]]
    vs = [val[b, t] for b in rows for t in range(mask.shape[1]) if mask[b, t]]
    rbar, vbar = np.mean(rs), np.mean(vs)
    cr += [x - rbar for x in rs]
    cd += [(x - rbar) - (y - vbar) for x, y in zip(rs, vs)]
  return 1 - np.var(cd) / np.var(cr)


def _real_ev(val, ret, mask):
  m = mask > 0
  return 1 - np.var(ret[m] - val[m]) / np.var(ret[m])


# ------------------------------------------------------------------------- by hand


def test_hand_worked_batch():
  val, ret, mask, scores = _hand()
  # Group 0's tokens: R = 1, 1, 0 (R̄ = 2/3), V = .5, 1, .5 (V̄ = 2/3):
  #   R − R̄ = 1/3, 1/3, −2/3 (SSr = 2/3); V − V̄ = −1/6, 1/3, −1/6;
  #   (R − R̄) − (V − V̄) = 1/2, 0, −1/2 (SSd = 1/2).
  # Group 1's: R = 1, 0, 0 (R̄ = 1/3), V = 1, 0, .5 (V̄ = 1/2):
  #   R − R̄ = 2/3, −1/3, −1/3 (SSr = 2/3); V − V̄ = 1/2, −1/2, 0; difference 1/6, 1/6, −1/3
  #   (SSd = 1/6).
  # group EV = 1 − (1/2 + 1/6) / (2/3 + 2/3) = 1/2.
  np.testing.assert_allclose(diag.group_ev_sums(val, ret, mask, 2),
                             [[3, 2 / 3, 1 / 2], [3, 2 / 3, 1 / 6]], atol=1e-12)
  assert diag.within_group_ev(val, ret, mask, 2) == pytest.approx(0.5, abs=1e-12)
  # Pooled: R = 1, 1, 0, 1, 0, 0 (Var 1/4); d = R − V = .5, 0, −.5, 0, 0, −.5 (mean −1/12,
  # E[d²] = 1/8, Var = 1/8 − 1/144 = 17/144): EV = 1 − 17/36 = 19/36. Bias = −mean d = 1/12.
  # Deciles of t/l: l = 2 puts t = 0, 1 in bins 0, 5; l = 1 puts t = 0 in bin 0.
  # Bin 0: (R, V) = (1, .5), (0, .5), (1, 1), (0, 0): Var R = 1/4, d = .5, −.5, 0, 0 (Var 1/8):
  #   EV 1/2. Bin 5: (1, 1), (0, .5): Var R = 1/4, d = 0, −.5 (Var 1/16): EV 3/4.
  # Last tokens: V = 1, .5, 1, .5 against correct 1, 0, 1, 0: AUROC 1, Brier (.25 + .25)/4.
  # Outcome curves: correct rows 0, 2 have V .5 and 1 in bin 0 (mean .75) and 1 in bin 5;
  # wrong rows 1, 3 have .5, 0 in bin 0 (.25) and .5 in bin 5.
  out = diag.metrics(val, ret, mask, scores, 2)
  want = {"critic/group_ev": 0.5, "critic/pooled_ev": 19 / 36, "critic/bias": 1 / 12,
          "critic/auroc_last": 1.0, "critic/brier_last": 0.125,
          "critic/ev_pos_d0": 0.5, "critic/ev_pos_d5": 0.75,
          "critic/v_correct_d0": 0.75, "critic/v_correct_d5": 1.0,
          "critic/v_wrong_d0": 0.25, "critic/v_wrong_d5": 0.5}
  for k, v in want.items():
    assert out[k] == pytest.approx(v, abs=1e-12), k
  for k in (1, 2, 3, 4, 6, 7, 8, 9):  # no token falls there: NaN, not 0
    assert math.isnan(out[f"critic/ev_pos_d{k}"]) and math.isnan(out[f"critic/v_wrong_d{k}"])
  # In thirds, l = 2 puts t = 1 in bin floor(3/2) = 1: [1/2, 3/4, empty].
  np.testing.assert_allclose(diag.position_evs(val, ret, mask, bins=3), [0.5, 0.75, NAN])
  # Bootstrap over the 2 groups: {0, 0} gives 1 − (1/2)/(2/3) = 1/4, {1, 1} 3/4, {0, 1} 1/2;
  # each extreme has chance 1/4 > 2.5%, so the interval is [1/4, 3/4].
  assert diag.group_ev_bootstrap(val, ret, mask, 2) == pytest.approx((0.25, 0.75))


def test_last_token_figures_by_hand():
  # One token each: V_last = .9, .25, .65, .65, .1 against correct 1, 0, 1, 0, 0.
  # AUROC: .9 beats the three wrong (3); the correct .65 beats .25 and .1 (2) and ties the
  # wrong .65 (1/2): 5.5 / 6. Brier: (.01 + .0625 + .1225 + .4225 + .01) / 5 = .1255.
  val = np.array([[.9], [.25], [.65], [.65], [.1]])
  mask = np.ones_like(val)
  correct = np.array([1, 0, 1, 0, 0], bool)
  assert diag.last_token_auroc(val, mask, correct) == pytest.approx(5.5 / 6)
  assert diag.brier(val, mask, correct) == pytest.approx(0.1255)
  # Fifths of [0, 1]: .1 → 0, .25 → 1, .65 → 3 (twice, one correct), .9 → 4; bin 2 empty.
  table = diag.reliability(val, mask, correct, bins=5)
  want = [(.1, 0, 1), (.25, 0, 1), (NAN, NAN, 0), (.65, .5, 2), (.9, 1, 1)]
  np.testing.assert_allclose(np.array(table, np.float64), np.array(want, np.float64))
  # Clipped to [0, 1]: −3 counts in bin 0 as 0, 7 in the last bin as 1.
  clipped = diag.reliability(np.array([[-3.0], [7.0]]), np.ones((2, 1)), [False, True], bins=2)
  assert clipped == [(0.0, 0.0, 1), (1.0, 1.0, 1)]
  # One class only: no AUROC.
  assert math.isnan(diag.last_token_auroc(val, mask, np.ones(5, bool)))


def test_auroc_against_a_brute_force_pairwise_count():
  rng = np.random.default_rng(3)
  b, r = 60, 12
  lengths = rng.integers(0, r + 1, b)            # some empty responses: left out
  mask = (np.arange(r)[None, :] < lengths[:, None]).astype(np.float64)
  val = _garbage(np.round(rng.normal(size=(b, r)), 1), mask)   # rounded: many ties
  correct = rng.uniform(size=b) < 0.4
  last = [(val[i, lengths[i] - 1], correct[i]) for i in range(b) if lengths[i] > 0]
  pos = [v for v, c in last if c]
  neg = [v for v, c in last if not c]
  pairs = [1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg)]
  assert diag.last_token_auroc(val, mask, correct) == pytest.approx(np.mean(pairs), abs=1e-12)
  assert diag.brier(val, mask, correct) == pytest.approx(
      np.mean([(v - c) ** 2 for v, c in last]), abs=1e-12)


# ------------------------------------------------------------------ synthetic critics


def test_a_constant_critic_scores_zero_everywhere():
  ret, mask, scores, _ = _batch(40, 4)
  val = _garbage(np.full(mask.shape, 0.3), mask)
  out = diag.heldout_report(val, ret, mask, scores, 4)
  for k in ["critic/group_ev", "critic/pooled_ev", "critic/ev_first_half",
            "critic/ev_second_half", "critic/ev_last_token",
            *(f"critic/ev_pos_d{k}" for k in range(10))]:
    assert out[k] == pytest.approx(0.0, abs=1e-9), k
  assert out["critic/auroc_last"] == 0.5                        # every pair a tie
  assert out["critic/group_ev_lo"] == pytest.approx(0.0, abs=1e-9)
  assert out["critic/group_ev_hi"] == pytest.approx(0.0, abs=1e-9)   # [0, 0] holds 0
  m = mask > 0
  assert out["critic/bias"] == pytest.approx(0.3 - ret[m].mean())
  assert out["critic/brier_last"] == pytest.approx(np.mean((0.3 - scores) ** 2))
  for k in range(10):  # no split between correct and wrong
    assert out[f"critic/v_correct_d{k}"] == pytest.approx(0.3)
    assert out[f"critic/v_wrong_d{k}"] == pytest.approx(0.3)


def test_a_prompt_level_critic_explains_the_batch_but_not_the_groups():
  """V = the prompt's true pass rate at every token: the best V(s_0), constant in a group."""
  ret, mask, scores, p_B = _batch(60, 4, seed=1)
  val = _garbage(p_B[:, None] * np.ones_like(mask), mask, seed=5)
  out = diag.metrics(val, ret, mask, scores, 4)
  assert out["critic/pooled_ev"] > 0.2                          # between-prompt variance
  assert out["critic/group_ev"] == pytest.approx(0.0, abs=1e-12)
  assert out["critic/prompt_value_spearman"] > 0.5
  lo, hi = diag.group_ev_bootstrap(val, ret, mask, 4)
  assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.0, abs=1e-12)


def test_an_oracle_scores_one():
  ret, mask, scores, _ = _batch(40, 4, seed=2)
  val = _garbage(np.where(mask > 0, ret, 0.0), mask, seed=6)    # V = R, its own garbage
  out = diag.heldout_report(val, ret, mask, scores, 4)
  for k in ("critic/group_ev", "critic/pooled_ev", "critic/auroc_last", "critic/group_ev_lo",
            "critic/group_ev_hi", "critic/ev_pos_d0", "critic/ev_pos_d9"):
    assert out[k] == pytest.approx(1.0, abs=1e-12), k
  assert out["critic/brier_last"] == 0.0 and out["critic/bias"] == pytest.approx(0.0)
  for k in range(10):
    assert out[f"critic/v_correct_d{k}"] == 1.0 and out[f"critic/v_wrong_d{k}"] == 0.0
  assert out["critic/group_ev_lo"] > 0                          # the interval excludes 0


def test_a_noisy_oracle_loses_its_noise_share():
  """V = R + ε, ε ~ N(0, σ²) per token: (R − R̄_g) − (V − V̄_g) = −(ε − ε̄_g), so the group EV
  is 1 − σ²(1 − 1/N_g) / Var[R − R̄_g] ≈ 1 − σ² / Var[R − R̄_g] with N_g ≈ 70 tokens."""
  sigma = 0.2
  ret, mask, scores, _ = _batch(300, 4, r=30, seed=4, min_len=10)
  noise = np.random.default_rng(7).normal(scale=sigma, size=mask.shape)
  val = _garbage(np.where(mask > 0, ret, 0.0) + noise, mask)
  sums = diag.group_ev_sums(val, ret, mask, 4)
  var_within = sums[:, 1].sum() / sums[:, 0].sum()              # Var[R − R̄_g], ≈ E[p(1 − p)]
  got = diag.within_group_ev(val, ret, mask, 4)
  assert got == pytest.approx(1 - sigma ** 2 / var_within, abs=0.02)
  assert got == pytest.approx(_brute_group_ev(val, ret, mask, 4), abs=1e-12)
  lo, hi = diag.group_ev_bootstrap(val, ret, mask, 4, n_boot=500, seed=1)
  assert 0 < lo < got < hi < 1                                  # holds the point, not 0


def test_a_critic_right_only_at_the_last_token():
  """V = R at t = l − 1, 0.4 before. With l ∈ {5, 10}, the last decile's tokens are the last
  tokens of l = 10 rows (bin floor(10·9/10) = 9) and bins 0–7 hold no last token; bin 8 holds
  t = 8 of l = 10 and the last token t = 4 of l = 5."""
  rng = np.random.default_rng(8)
  b, r = 64, 12
  lengths = rng.choice([5, 10], b)
  mask = (np.arange(r)[None, :] < lengths[:, None]).astype(np.float64)
  scores = (rng.uniform(size=b) < 0.5).astype(np.float64)
  ret = _garbage(scores[:, None] * mask, mask)
  last = np.arange(r)[None, :] == lengths[:, None] - 1
  val = _garbage(np.where(last, scores[:, None], 0.4), mask, seed=2)
  evs = diag.position_evs(val, ret, mask)
  assert evs[9] == pytest.approx(1.0, abs=1e-12)
  np.testing.assert_allclose(evs[:8], 0.0, atol=1e-9)
  assert 0.2 < evs[8] < 0.9
  out = diag.metrics(val, ret, mask, scores, 2)
  assert out["critic/ev_last_token"] == pytest.approx(1.0, abs=1e-12)
  assert out["critic/auroc_last"] == 1.0
  # Token-pooled, the last token is 1 of l: the whole-response figures barely see it.
  assert abs(out["critic/group_ev"]) < 0.15 and abs(out["critic/pooled_ev"]) < 0.3
  assert out["critic/v_correct_d9"] == 1.0 and out["critic/v_wrong_d9"] == 0.0
  assert out["critic/v_correct_d0"] == pytest.approx(0.4)
  assert out["critic/v_wrong_d0"] == pytest.approx(0.4)


# -------------------------------------------------------- the whole batch, the padding


def test_the_whole_batch_not_an_average_of_its_parts():
  """Each half's returns are explained only by its level (V a constant per half: EV 0 in each
  half); the batch's EV sees the level too. `metrics` is the whole batch's formula."""
  mask = np.ones((4, 2))
  ret = np.array([[0.0, 0.0], [1.0, 1.0], [10.0, 10.0], [11.0, 11.0]])
  val = np.array([[0.5, 0.5], [0.5, 0.5], [10.5, 10.5], [10.5, 10.5]])
  halves = [diag.pooled_ev(diag.ev_sums(val[s], ret[s], mask[s])) for s in (slice(0, 2),
                                                                            slice(2, 4))]
  assert halves == [0.0, 0.0]
  # R = 0, 1, 10, 11 (twice each): mean 5.5, Var = (30.25 + 20.25 + 20.25 + 30.25) / 4 = 25.25;
  # d = R − V = ±.5, Var = .25: EV = 1 − .25 / 25.25 = 100/101.
  whole = diag.pooled_ev(diag.ev_sums(val, ret, mask))
  assert whole == pytest.approx(100 / 101) and whole != np.mean(halves)
  # A larger random batch: every figure of `metrics` is the whole batch's.
  ret, mask, scores, p_B = _batch(16, 4, seed=9)
  val = _garbage(np.where(mask > 0, ret, 0) + np.random.default_rng(1).normal(size=mask.shape)
                 + p_B[:, None], mask)
  out = diag.metrics(val, ret, mask, scores, 4)
  assert out["critic/pooled_ev"] == pytest.approx(_real_ev(val, ret, mask), abs=1e-12)
  assert out["critic/group_ev"] == pytest.approx(_brute_group_ev(val, ret, mask, 4), abs=1e-12)
  part = [diag.within_group_ev(val[s], ret[s], mask[s], 4) for s in (slice(0, 32),
                                                                     slice(32, 64))]
  assert out["critic/group_ev"] != pytest.approx(np.mean(part), abs=1e-6)
  m = mask > 0
  assert out["critic/bias"] == pytest.approx((val[m] - ret[m]).mean(), abs=1e-12)
  pos = diag.position_bins(mask)
  for k in range(10):
    sel = m & (pos == k)
    assert out[f"critic/ev_pos_d{k}"] == pytest.approx(
        1 - np.var(ret[sel] - val[sel]) / np.var(ret[sel]), abs=1e-12)


def test_position_bins_are_floor_of_deciles():
  mask = (np.arange(12)[None, :] < np.array([[3], [10], [12], [0]])).astype(np.float64)
  pos = diag.position_bins(mask)
  assert pos[0, :4].tolist() == [0, 3, 6, -1]                   # floor(10·t / 3)
  assert pos[1, :11].tolist() == list(range(10)) + [-1]
  assert pos[2].tolist() == [0, 0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9]  # floor(10·t / 12)
  assert (pos[3] == -1).all()


def test_padding_is_never_read():
  """The same batch with zeros and with NaN/inf on the padding: the same figures."""
  ret, mask, scores, p_B = _batch(10, 4, seed=11)
  clean_r = np.where(mask > 0, ret, 0.0)
  clean_v = clean_r * 0.5 + p_B[:, None] * 0.3 + 0.01 * np.arange(mask.shape[1])[None, :]
  a = diag.heldout_report(clean_v * mask, clean_r, mask, scores, 4, n_boot=200)
  b = diag.heldout_report(_garbage(clean_v, mask, 3), _garbage(clean_r, mask, 4), mask, scores,
                          4, n_boot=200)
  assert a.keys() == b.keys()
  for k in a:
    assert a[k] == pytest.approx(b[k], abs=1e-12, nan_ok=True), k
  assert all(math.isfinite(v) for v in a.values())              # l ≥ 3: no empty bin
  np.testing.assert_allclose(diag.reliability(clean_v * mask, mask, scores > 0.5),
                             diag.reliability(_garbage(clean_v, mask), mask, scores > 0.5))


def test_keys_types_and_correct_default():
  val, ret, mask, scores = _hand()
  out = diag.metrics(val, ret, mask, scores, 2)                 # the old positional call
  pos = [f"critic/ev_pos_d{k}" for k in range(10)]
  curves = [f"critic/v_{s}_d{k}" for s in ("correct", "wrong") for k in range(10)]
  assert set(out) == {"critic/ev_first_half", "critic/ev_second_half", "critic/ev_last_token",
                      "critic/prompt_value_spearman", "critic/group_ev", "critic/pooled_ev",
                      "critic/group_ev_last", "critic/auroc_last", "critic/brier_last",
                      "critic/bias", *pos, *curves}
  assert all(type(v) is float for v in out.values())
  assert set(diag.metrics(val, ret, mask, scores, 1)) == set(out) - {
      "critic/prompt_value_spearman", "critic/group_ev", "critic/group_ev_last"}
  report = diag.heldout_report(val, ret, mask, scores, 2)
  assert set(report) == set(out) | {"critic/group_ev_lo", "critic/group_ev_hi",
                                    "critic/group_ev_last_lo", "critic/group_ev_last_hi"}
  assert "critic/group_ev_lo" not in diag.heldout_report(val, ret, mask, scores, 1)
  assert diag.heldout_report(val, ret, mask, scores, 2, correct=scores < 0.5,
                             n_boot=10)["critic/auroc_last"] == 0.0
  # correct_B given overrides scores > 0.5: flipped labels flip the AUROC.
  flipped = diag.metrics(val, ret, mask, scores, 2, correct_B=scores < 0.5)
  assert flipped["critic/auroc_last"] == 0.0
  assert flipped["critic/v_correct_d0"] == out["critic/v_wrong_d0"]
  with pytest.raises(ValueError, match="groups of 3"):
    diag.within_group_ev(val, ret, mask, 3)


def test_jax_inputs_under_strict_rank_promotion():
  """Device arrays (float32) convert to float64 host arrays; nothing broadcasts ranks."""
  ret, mask, scores, p_B = _batch(8, 4, seed=12)
  val = np.where(mask > 0, ret, 0.0) * 0.7 + p_B[:, None] * 0.2
  ret = np.where(mask > 0, ret, 0.0)
  f32 = [np.asarray(x, np.float32).astype(np.float64) for x in (val, ret, mask, scores)]
  want = diag.heldout_report(*f32, 4, n_boot=100)
  with jax.numpy_rank_promotion("raise"):
    got = diag.heldout_report(*(jnp.asarray(x, jnp.float32) for x in (val, ret, mask, scores)),
                              4, n_boot=100)
  for k in want:
    assert got[k] == pytest.approx(want[k], abs=1e-12, nan_ok=True), k


def test_group_ev_at_the_last_token_is_free_of_drift_along_t():
  """A critic that drifts along t the same way in every response but is an oracle at the last
  token: the token-level within-group EV pays for the drift, the last-token one is 1."""
  rng = np.random.default_rng(3)
  b, r, n = 32, 12, 4
  lengths = rng.integers(4, r + 1, size=b)
  mask = (np.arange(r)[None, :] < lengths[:, None]).astype(np.float64)
  outcome = rng.integers(0, 2, size=b).astype(np.float64)
  returns = np.repeat(outcome[:, None], r, axis=1) * mask
  t = np.arange(r, dtype=np.float64)[None, :]
  values = np.where(t == lengths[:, None] - 1, outcome[:, None], 0.05 * t) * mask
  m = diag.metrics(values, returns, mask, outcome, n)
  assert m["critic/group_ev_last"] == pytest.approx(1.0)
  assert m["critic/group_ev"] < m["critic/group_ev_last"]
  rep = diag.heldout_report(values, returns, mask, outcome, n, n_boot=200)
  assert rep["critic/group_ev_last_lo"] == pytest.approx(1.0)
  const = diag.metrics(np.full_like(values, 0.3), returns, mask, outcome, n)
  assert const["critic/group_ev_last"] == 0.0
