"""The mechanism suite's estimators (experiments/value_mechanisms/value_bias_stats.py) on cases
with known answers: a synthetic policy whose true values are known in closed form, Monte Carlo
noise of known size, and the package's own GAE as a second implementation; the command and the
pre-registered criteria (cog_criteria.py)."""

import json
import os
import sys

import numpy as np
import pytest

from experiments.value_mechanisms import cog_criteria
from experiments.value_mechanisms import value_bias
from experiments.value_mechanisms import value_bias_stats as vb


def synthetic(rng, n_steps, m_tokens, q):
  """One response of a policy with known values: n steps of m tokens; the last token of
  each step is wrong with probability 1 − q, and one wrong step fails the answer. Before
  any error, V*(s_t) = q^(n − ⌊t/m⌋); after one, 0. Returns (V*_T, reward, cuts)."""
  vstar, alive = [], True
  for j in range(n_steps):
    for _ in range(m_tokens):
      vstar.append(q ** (n_steps - j) if alive else 0.0)
    alive = alive and rng.random() < q
  return np.array(vstar), float(alive), list(range(0, n_steps * m_tokens, m_tokens))


def test_mc_value_and_its_noise_by_hand():
  assert vb.mc_value([1, 0, 1, 1]) == (0.75, 0.0625)   # s² = 0.25 (ddof 1), / M = 4
  with pytest.raises(ValueError):
    vb.mc_value([1])
  rng = np.random.default_rng(0)
  p, m = 0.3, 16
  draws = [vb.mc_value(rng.random(m) < p) for _ in range(4000)]
  means, nus = np.array([d[0] for d in draws]), np.array([d[1] for d in draws])
  assert abs(nus.mean() - p * (1 - p) / m) < 3e-4  # unbiased for Var(mean) = p(1-p)/M
  assert abs(means.var() - p * (1 - p) / m) < 1.5e-3


def test_explained_variance_with_the_mc_noise_removed():
  """A perfect critic against 16-sample MC targets: the raw EV is well below 1, the
  corrected one is 1 up to sampling error; a critic with known error variance σ² gets
  1 − σ²/Var(V*)."""
  rng = np.random.default_rng(1)
  vstar = rng.uniform(0, 1, 20000)
  draws = [vb.mc_value(rng.random(16) < p) for p in vstar]
  vhat, nu = np.array([d[0] for d in draws]), np.array([d[1] for d in draws])
  raw = vb.explained_variance(vstar, vhat)
  fixed = vb.explained_variance(vstar, vhat, nu)
  # Raw: 1 − ν̄/(Var(V*) + ν̄), with Var(V*) = 1/12 and ν̄ = E[p(1 − p)]/16 = 1/96.
  assert abs(raw - (1 - (1 / 96) / (1 / 12 + 1 / 96))) < 0.01 and raw < 0.9, raw
  assert abs(fixed - 1.0) < 0.02, fixed
  sigma = 0.1
  noisy = vstar + rng.normal(0, sigma, vstar.size)
  truth = 1 - sigma ** 2 / vstar.var()
  assert abs(vb.explained_variance(noisy, vhat, nu) - truth) < 0.02
  assert np.isnan(vb.explained_variance([0.5, 0.5], [1.0, 0.0], [0.3, 0.3]))
  # A perfect critic's EV against single 0/1 returns: Var(V*) / E[V*(1 − V*)] + Var(V*)) =
  # (1/12) / (1/6 + 1/12) = 1/3 for V* uniform on [0, 1].
  assert abs(vb.oracle_ev(vhat, nu, 16) - 1 / 3) < 0.02


def test_bias_by_fifth_of_a_constant_critic_on_the_closed_form_policy():
  rng = np.random.default_rng(2)
  values, vstars, nus, pos, lens = [], [], [], [], []
  truth = np.zeros(5)
  counts = np.zeros(5)
  for _ in range(600):
    vstar, _, cuts = synthetic(rng, 10, 4, 0.9)
    for c in cuts:
      hat, nu = vb.mc_value(rng.random(16) < vstar[c])
      values.append(0.3)
      vstars.append(hat)
      nus.append(nu)
      pos.append(c)
      lens.append(vstar.size)
      f = min(5 * c // vstar.size, 4)
      truth[f] += vstar[c]
      counts[f] += 1
  rows = vb.bias_by_fifth(values, vstars, nus, pos, lens)
  assert [r["fifth"] for r in rows] == [0, 1, 2, 3, 4] and sum(r["cuts"] for r in rows) == 6000
  for r, t, n in zip(rows, truth, counts):
    assert abs(r["bias"] - (0.3 - t / n)) < 0.01, (r, t / n)
  assert vb.fifth_of([0, 39, 8], [40, 40, 40]).tolist() == [0, 4, 1]
  with pytest.raises(ValueError):
    vb.fifth_of([40], [40])


def test_branch_calibration_by_hand():
  got = vb.branch_calibration(["A", "\\", "A", "A"], [0.5, 0.2, 0.4, 0.6], [1, 0, 0, 1])
  assert got["\\"] == {"samples": 1, "success": 0.0, "value": 0.2, "gap": 0.2}
  assert got["A"]["samples"] == 3 and abs(got["A"]["gap"] - (0.5 - 2 / 3)) < 1e-12
  with pytest.raises(ValueError):
    vb.branch_calibration(["A"], [0.1, 0.2], [1])


def test_gae_agrees_with_the_package_gae():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vapo_jax import gae as gae_lib  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(3)
  r = np.zeros((1, 30))
  r[0, -1] = 1.0
  v = rng.uniform(0, 1, (1, 30))
  for lam in (0.0, 0.8, 0.95, 1.0):
    adv, _, _ = gae_lib.decoupled_gae(jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32),
                                      jnp.ones((1, 30), jnp.float32), gamma=1.0,
                                      lam_policy=jnp.full((1,), lam), lam_critic=1.0,
                                      impl="scan")
    np.testing.assert_allclose(vb.gae(r[0], v[0], lam), np.asarray(adv[0]), atol=1e-5)
  assert vb.length_adaptive_lambda(100, 0.05) == 0.8
  assert vb.length_adaptive_lambda(10, 0.05) == 0.0


def test_rl_steps_log_the_critics_start_of_response_bias():
  """Every critic step's metrics carry mean V(s₀) and mean V(s₀) − reward (M3 in RL rows)."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import advantages  # pylint: disable=import-outside-toplevel
  ac = advantages.AdvantageConfig(
      estimator="gae", gamma=1.0, decoupled=True, lam_critic=1.0, length_adaptive=True,
      alpha=0.05, lam_policy=0.95, group_std_norm=True, whiten=True, gae_impl="scan",
      reward_scale=1.0, reward_shift=0.0)
  values = jnp.asarray([[0.2, 0.5, 0.9, 0.0], [0.6, 0.1, 0.0, 0.0]], jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
  out = advantages.compute_advantages(ac, jnp.asarray([1.0, 0.0]), jnp.asarray([3, 2]),
                                      mask, values, jnp.asarray([0, 0]))
  assert abs(float(out.metrics["value/s0_mean"]) - 0.4) < 1e-6
  assert abs(float(out.metrics["value/s0_minus_return"]) - ((0.2 - 1.0) + 0.6) / 2) < 1e-6
  grpo = advantages.compute_advantages(dataclasses.replace(ac, estimator="group"),
                                       jnp.asarray([1.0, 0.0]), jnp.asarray([3, 2]), mask,
                                       None, jnp.asarray([0, 0]))
  assert "value/s0_mean" not in grpo.metrics


def test_step_errors_of_a_perfect_critic_are_zero_at_td_and_unbiased_at_any_lambda():
  rng = np.random.default_rng(4)
  pooled = {lam: [] for lam in (0.0, 0.8, 1.0)}
  for _ in range(3000):
    vstar, reward, cuts = synthetic(rng, 6, 3, 0.8)
    for lam in pooled:
      e, nu = vb.step_errors(vstar, reward, cuts, vstar[cuts], np.zeros(len(cuts)), lam)
      if lam == 0.0:
        np.testing.assert_allclose(e, 0.0, atol=1e-12)
      assert nu.tolist() == [0.0] * len(cuts)
      pooled[lam].append(e)
  for lam, es in pooled.items():
    e = np.concatenate(es)
    assert abs(e.mean()) < 3 * e.std() / np.sqrt(e.size) + 1e-12, (lam, e.mean())
  # A constant critic c with λ = 1: every token's advantage is R − c, so step k's error is
  # L_k·(R − c) − (V*(c_{k+1}) − V*(c_k)), by hand.
  vstar, reward, cuts = synthetic(np.random.default_rng(5), 4, 3, 0.7)
  e, _ = vb.step_errors(np.full(12, 0.4), reward, cuts, vstar[cuts], np.zeros(4), 1.0)
  ends = [*vstar[cuts].tolist(), reward]
  np.testing.assert_allclose(e, [3 * (reward - 0.4) - (ends[k + 1] - ends[k])
                                 for k in range(4)], atol=1e-12)
  with pytest.raises(ValueError, match="cuts"):
    vb.step_errors(np.zeros(5), 1.0, [1, 3], [0, 0], [0, 0], 0.5)


def test_token_errors_of_a_perfect_critic_are_zero_at_td_and_unbiased_at_any_lambda():
  """M2's estimator: the GAE advantage of each step's first token against V*(c + 1) − V*(c).
  A perfect critic: exactly 0 at λ = 0, mean 0 at any λ; a constant critic at λ = 1: every
  advantage is R − c, by hand; MC noise is reported for both ends."""
  rng = np.random.default_rng(7)
  pooled = {lam: [] for lam in (0.0, 0.8, 1.0)}
  for _ in range(3000):
    vstar, reward, cuts = synthetic(rng, 6, 3, 0.8)
    nxt = np.array([*vstar, reward][1:])[cuts]
    for lam in pooled:
      e, nu = vb.token_errors(vstar, reward, cuts, vstar[cuts], np.zeros(6), nxt,
                              np.zeros(6), lam)
      if lam == 0.0:
        np.testing.assert_allclose(e, 0.0, atol=1e-12)
      pooled[lam].append(e)
  for lam, es in pooled.items():
    # A response's errors share its return: its mean is the independent unit.
    e = np.array([x.mean() for x in es])
    assert abs(e.mean()) < 3 * e.std() / np.sqrt(e.size) + 1e-12, (lam, e.mean())
  # λ = 1 leaves each token's whole return: its spread grows as λ rises.
  assert np.concatenate(pooled[1.0]).std() > np.concatenate(pooled[0.8]).std() > 0
  vstar, reward, cuts = synthetic(np.random.default_rng(8), 4, 3, 0.7)
  nxt = np.array([*vstar, reward][1:])[cuts]
  e, nu = vb.token_errors(np.full(12, 0.4), reward, cuts, vstar[cuts], [0.01] * 4, nxt,
                          [0.02] * 4, 1.0)
  np.testing.assert_allclose(e, (reward - 0.4) - (nxt - vstar[cuts]), atol=1e-12)
  np.testing.assert_allclose(nu, 0.03)
  with pytest.raises(ValueError, match="cuts"):
    vb.token_errors(np.zeros(5), 1.0, [1, 3], [0, 0], [0, 0], [0, 0], [0, 0], 0.5)


def test_lambda_table_on_a_perfect_and_a_noisy_critic():
  """With V = V*, λ = 0 has zero error: the optimum of every bucket; with i.i.d. per-token
  critic noise, λ = 0's error is that noise at the step's two ends."""
  rng = np.random.default_rng(6)
  perfect, noisy = [], []
  for n in [2] * 300 + [12] * 300:
    vstar, reward, cuts = synthetic(rng, n, 4, 0.9)
    nxt = [*vstar, reward][1:]
    base = {"reward": reward, "cuts": cuts, "vstar": vstar[cuts], "noise": np.zeros(n),
            "vnext": np.array(nxt)[cuts], "noise_next": np.zeros(n)}
    perfect.append({**base, "values_T": vstar})
    noisy.append({**base, "values_T": vstar + rng.normal(0, 0.2, vstar.size)})
  settings = {"λ=0.95": ("fixed", 0.95), "α=0.05": ("adaptive", 0.05)}
  buckets = (("short", 1, 10), ("long", 11, 100))
  for estimator in ("token", "step"):
    table = vb.lambda_table(perfect, settings, buckets, estimator=estimator)
    for name in ("short", "long"):
      assert table[name]["responses"] == 300 and table[name]["optimal_lambda"] == 0.0
      assert abs(table[name]["optimal_mse"]) < 1e-20
      assert set(table[name]["settings"]) == set(settings)
    assert table["long"]["mean_length"] == 48.0
  # Per-token noise of sd σ: at λ = 0 a step's credit telescopes to V(c_{k+1}) − V(c_k), two
  # noise terms (one for the last step, whose end is the reward): MSE = σ²·(2K − 1)/K.
  table = vb.lambda_table(noisy, settings, buckets, estimator="step")
  for name, k in (("short", 2), ("long", 12)):
    td = table[name]["mse_by_lambda"][0.0]
    assert abs(td / (0.04 * (2 * k - 1) / k) - 1) < 0.1, (name, td)
  # The token estimator at λ = 0: δ_c's error is the noise at c and at c + 1: MSE = 2σ².
  table = vb.lambda_table(noisy, settings, buckets)
  for name in ("short", "long"):
    assert abs(table[name]["mse_by_lambda"][0.0] / (2 * 0.04) - 1) < 0.1, name
  with pytest.raises(ValueError, match="estimator"):
    vb.lambda_table(noisy, settings, buckets, estimator="steps")
  assert vb.lambda_table([], settings, buckets)["short"] == {"responses": 0,
                                                              "mean_length": None}


# ------------------------------------------------------------------- the command


def test_cuts_and_buckets():
  nl = 7
  assert value_bias.cuts_of([1, 2, nl, 3, nl, 4, 5], nl) == [0, 3, 5]
  assert value_bias.cuts_of([1, 2, 3], nl) == [0]
  assert value_bias.cuts_of([1, nl], nl) == [0]  # a newline as the last token starts no step
  assert value_bias.buckets_of([10, 50], "15,80") == [("1–15", 1, 15), ("16–80", 16, 80),
                                                      (">80", 81, 10 ** 9)]
  names = [b[0] for b in value_bias.buckets_of(list(range(1, 101)), "")]
  assert len(names) == 3 and names[-1].startswith(">")
  assert value_bias.buckets_of([32] * 8, "") == [("1–32", 1, 32), (">32", 33, 10 ** 9)]


def test_the_command_runs_end_to_end_on_a_tiny_budget(tmp_path):
  """`python -m experiments.value_mechanisms.value_bias --smoke` on chain_or_guess: every part
  runs (SFT in-process, MC ground truth, zero-head and value-pretrained critics, M3 on identical
  rollouts) and the tables are written. A check that the command works, not a measurement."""
  import subprocess  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "vb"
  env = {**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.value_mechanisms.value_bias",
       "--config=configs/chain_or_guess.py",
       f"--out={out}", "--smoke", "--noreward_model", "--budgets=1", "--m3_steps=1",
       "--config.sampling.max_new_tokens=24", "--config.sft.steps=2"],
      cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((out / "value_bias.json").read_text())
  assert result["critics"] == ["zero_head", "vp@1"] and result["prompts"] == 8
  assert result["cuts"] >= 8 and result["m3"][0]["same_rollouts"] is True
  # The zero head predicts exactly 0: its bias is −V̂* at every cut.
  assert all(abs(r["value_mean"]) < 1e-6 for r in result["m1"]["zero_head"] if r.get("cuts"))
  md = (out / "value_bias.md").read_text()
  branches = result["m1"]["zero_head/branches"]
  assert sum(b["samples"] for b in branches.values()) == 8 * 2  # prompts × continuations
  assert all(b["value"] == 0.0 for b in branches.values())
  assert "## M1" in md and "## M2" in md and "## M3" in md and "| zero_head |" in md
  # Issue 45: the constant-head control, the final-token values, M2 at decision cuts.
  assert result["controls"] == ["constant_head"]
  const = result["mean_return"]
  assert all(abs(r["value_mean"] - const) < 1e-9 for r in result["m1"]["constant_head"]
             if r.get("cuts"))
  assert result["final"]["zero_head"]["after_response"] == 0.0
  assert set(result["m2_decision"]) == {"zero_head", "vp@1"}
  assert result["decision_cuts"] >= 8  # at least the first token of each response
  assert "| control: constant_head" in md and "## M2 at decision cuts" in md
  assert "## M1 at the final token" in md


def test_the_preregistered_criteria_read_mechanically():

  def run(row, seed, avg, length=100.0, guess=0.1, start=0.3):
    return {"kind": "run", "row": row, "seed": seed, "state": "finished", "avg": avg,
            "curve": [[0, start], [40, avg]], "response_length": length, "guess_rate": guess}

  records = [run("vapo", s, 0.5, guess=0.05) for s in (0, 1, 2)]
  # PPO collapses in seeds 0 and 1 (guesses, below the start), not in 2; every Δ <= -20.
  records += [run("ppo", 0, 0.1, 12, 0.9), run("ppo", 1, 0.2, 30, 0.6),
              run("ppo", 2, 0.3, 100, 0.1, start=0.2)]
  records += [run("no_value_pretrain", s, a) for s, a in ((0, 0.4), (1, 0.45), (2, 0.49))]
  records += [run("no_decoupled_gae", s, a) for s, a in ((0, 0.4), (1, 0.55), (2, 0.45))]
  got = {r["row"]: r for r in cog_criteria.verdicts(records)}
  assert got["ppo"]["verdict"] == "reproduced", got["ppo"]
  assert "collapsed in 2/3" in got["ppo"]["evidence"]
  # Every Δ < 0 and the mean is -5.3 points: reproduced (<= -5).
  assert got["no_value_pretrain"]["verdict"] == "reproduced"
  assert got["no_decoupled_gae_vp"]["verdict"] == "not run"  # the row is missing
  assert got["no_decoupled_gae"]["verdict"] == "not reproduced"  # seed 1 has Δ > 0
  # no_length_adaptive is judged on the long-chain half: worse there in every seed, although
  # better overall in seed 2; "not run" on a table that never logged the half.
  records += [run("no_length_adaptive", s, a) for s, a in ((0, 0.45), (1, 0.48), (2, 0.55))]
  got = {r["row"]: r for r in cog_criteria.verdicts(records)}
  assert got["no_length_adaptive"]["verdict"] == "not run"
  for r, long in zip(records[:3] + records[-3:], (0.4, 0.3, 0.35, 0.3, 0.29, 0.34)):
    r["avg/long"] = long
  got = {r["row"]: r for r in cog_criteria.verdicts(records)}
  assert got["no_length_adaptive"]["verdict"] == "reproduced", got["no_length_adaptive"]
  assert "long-chain half Δ seed 0: -10.0" in got["no_length_adaptive"]["evidence"]
  records[-1]["avg/long"] = 0.36
  got = {r["row"]: r for r in cog_criteria.verdicts(records)}
  assert got["no_length_adaptive"]["verdict"] == "not reproduced"
  records[0]["guess_rate"] = 0.2  # VAPO's own guess rate too high in one seed
  ppo = cog_criteria.verdicts(records)[0]
  assert ppo["verdict"] == "not reproduced"
  assert "| pre-registered criterion |" in cog_criteria.markdown(cog_criteria.verdicts(records))


def test_the_mechanism_criteria_read_mechanically():

  def fifths(*biases):
    return [{"fifth": k, "cuts": 3, "bias": b} for k, b in enumerate(biases)]

  def branches(g_gap, c_gap):
    return {"\\": {"samples": 10, "success": 0.1, "value": 0.1 + g_gap, "gap": g_gap},
            "A": {"samples": 90, "success": 0.5, "value": 0.5 + c_gap, "gap": c_gap}}

  def m2(opt, adaptive_excess, fixed_excess):
    # Buckets by length; each setting's MSE = the bucket's optimum + its excess there.
    out = {}
    for i, (lam, length) in enumerate(zip(opt, (10, 40, 140))):
      settings = {"λ=0.95": {"mse": 1.0 + fixed_excess[i]}, "λ=0.8": {"mse": 1.0 + 0.5},
                  "λ=1": {"mse": 1.0 + 0.5}, "α=0.05": {"mse": 1.0 + adaptive_excess[i]}}
      out[f"b{i}"] = {"responses": 5, "mean_length": length, "optimal_lambda": lam,
                      "optimal_mse": 1.0, "settings": settings}
    out["empty"] = {"responses": 0}
    return out

  def m3(mc_lag, coupled_lag, steps=6):
    return [{"step": i, "mc/v_s0": 0.5 + mc_lag, "coupled/v_s0": 0.5 + coupled_lag,
             "mc/mean_return": 0.5, "coupled/mean_return": 0.5, "same_rollouts": True}
            for i in range(steps)]

  vb = {"critics": ["zero_head", "vp@8", "vp@32", "reward_model"],
        "m1": {"reward_model": fifths(-0.2, -0.1, 0, 0, -0.01),
               "vp@8/branches": branches(0.2, 0.0), "vp@32/branches": branches(0.01, -0.04)},
        "m2": {"vp@8": m2((0.2, 0.6, 0.9), (0.01, 0.02, 0.01), (0.3, 0.1, 0.0)),
               "vp@32": m2((0.6, 0.5, 0.9), (0.01, 0.02, 0.01), (0.3, 0.1, 0.0)),
               "reward_model": m2((0.2, 0.6, 0.9), (0.2, 0.02, 0.01), (0.1, 0.1, 0.1))},
        "m3": m3(-0.01, -0.2)}
  got = {(r["row"], r["criterion"].split(":")[0]): r for r in
         cog_criteria.mechanism_verdicts(vb)}
  assert got[("precondition", "reward_model")]["verdict"] == "reproduced"
  assert got[("precondition", "vp@8")]["verdict"] == "not reproduced"   # the guess gap 0.2
  assert got[("precondition", "vp@32")]["verdict"] == "reproduced"
  assert got[("no_decoupled_gae_vp", "M3")]["verdict"] == "reproduced"
  assert got[("no_length_adaptive", "vp@8")]["verdict"] == "reproduced"
  assert got[("no_length_adaptive", "vp@32")]["verdict"] == "not reproduced"  # 0.6 -> 0.5
  # α's worst excess 0.2 is not below λ=0.95's 0.1.
  assert got[("no_length_adaptive", "reward_model")]["verdict"] == "not reproduced"
  # A flat RM profile, an MC critic that lags too, and a missing suite.
  vb["m1"]["reward_model"] = fifths(0.01, 0.0, 0.0, 0.0, 0.0)
  vb["m3"] = m3(-0.15, -0.2)
  got = {(r["row"], r["criterion"].split(":")[0]): r["verdict"] for r in
         cog_criteria.mechanism_verdicts(vb)}
  assert got[("precondition", "reward_model")] == "not reproduced (flat)"
  assert got[("no_decoupled_gae_vp", "M3")] == "not reproduced"
  empty = cog_criteria.mechanism_verdicts({"critics": [], "m1": {}, "m2": {}, "m3": []})
  assert {r["verdict"] for r in empty} == {"not run"}
