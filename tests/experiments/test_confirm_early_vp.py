"""The early value-pretraining confirmation's criteria (experiments/ablation/confirm_early_vp.py)
on hand-built run logs in ablate's layout, and its t-test against closed forms and known values."""

import json
import math
import os

import pytest

from experiments.ablation import confirm_early_vp as cev

SEEDS = cev.SEEDS
STEPS = (0, 5, 10, 15, 20)


def write_run(workdir, row, seed, avg, guess=0.01, s0=-0.05, state="finished",
              layout="run"):
  """One run's metrics.jsonl: "eval" records at STEPS (avg: {step: avg@4}, or one number for
  every step), "rl" records 1..20 (value/s0_minus_return = s0 at step 1); its status file."""
  avg = avg if isinstance(avg, dict) else {s: avg for s in STEPS}
  guess = guess if isinstance(guess, dict) else {s: guess for s in STEPS}
  records = []
  for step in range(0, 21):
    if step:
      records.append({"stage": "rl", "step": step, "entropy": 0.5,
                      cev.S0: s0 if step == 1 else 0.0})
    if step in avg:
      records.append({"stage": "eval", "step": step, cev.AVG: avg[step],
                      "pass@4": 0.9, cev.GUESS: guess[step], "response_length": 90.0})
  run_dir = os.path.join(workdir, f"seed{seed}", row)
  path = (os.path.join(run_dir, "metrics.jsonl") if layout == "run"
          else os.path.join(workdir, "metrics", f"seed{seed}", f"{row}.jsonl"))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  if layout == "run":
    with open(os.path.join(run_dir, "ablate_status.json"), "w", encoding="utf-8") as f:
      json.dump({"state": state, "returncode": 0}, f)


def build(workdir, step10_deltas, vapo=0.55, no_vp_s0=-0.4, vapo_s0=-0.05):
  """vapo at `vapo` at every evaluation; no_value_pretrain at vapo + Δ at steps 5 and 10,
  vapo − 0.01 later (so its area is smaller too); guesses 1% against 12%."""
  for seed, d in zip(SEEDS, step10_deltas):
    write_run(workdir, "vapo", seed, vapo, guess=0.01, s0=vapo_s0)
    write_run(workdir, "no_value_pretrain", seed,
              {0: vapo, 5: vapo + d, 10: vapo + d, 15: vapo - 0.01, 20: vapo - 0.01},
              guess=0.12, s0=no_vp_s0)


def by_role(workdir):
  runs = cev.load_runs(str(workdir), (*cev.PAIR, cev.SECONDARY_ROW))
  out = {}
  for r in cev.verdicts(runs):
    out[r["criterion"].split(":")[0]] = r
  return out


def test_a_clear_early_deficit_meets_every_criterion(tmp_path):
  build(tmp_path, [-0.06, -0.05, -0.08, -0.04, -0.07, -0.03, -0.09, -0.05])
  got = by_role(tmp_path)
  assert got["Primary"]["verdict"] == "met", got["Primary"]
  assert "Δ < 0 in 8/8 seeds" in got["Primary"]["evidence"]
  assert got["Primary"]["mean"] == pytest.approx(-0.05875)
  assert got["S1"]["verdict"] == "met"          # 12% guesses against 1% in every seed
  assert got["S2"]["verdict"] == "met"
  assert got["S3"]["verdict"] == "not run"      # no ppo row
  assert got["Manipulation"]["verdict"] == "met"
  assert "no_value_pretrain -0.400" in got["Manipulation"]["evidence"]
  text = cev.report(str(tmp_path))
  assert "| 6 | 55.0 | 49.0 | -6.0 | 1.0 | 12.0 |" in text, text
  assert cev.main(["confirm_early_vp", str(tmp_path)]) == 0


def test_a_significant_mean_fails_on_the_six_of_eight_rule(tmp_path):
  # Five large deficits and three small gains: mean < 0 and p < 0.05, but 5/8 negative.
  deltas = [-0.15, -0.14, -0.16, -0.15, -0.13, 0.005, 0.01, 0.005]
  build(tmp_path, deltas)
  primary = by_role(tmp_path)["Primary"]
  assert primary["mean"] < 0 and primary["p"] < cev.ALPHA, primary
  assert "Δ < 0 in 5/8 seeds" in primary["evidence"]
  assert primary["verdict"] == "not met"


def test_a_deficit_that_is_not_significant_or_the_wrong_way_is_not_met(tmp_path):
  build(tmp_path, [-0.02, 0.03, -0.01, 0.02, -0.03, 0.01, -0.02, 0.02])
  assert by_role(tmp_path)["Primary"]["verdict"] == "not met"
  build(tmp_path, [0.06, 0.05, 0.08, 0.04, 0.07, 0.03, 0.09, 0.05])   # VAPO worse
  primary = by_role(tmp_path)["Primary"]
  assert primary["p"] > 0.99 and primary["verdict"] == "not met"


def test_a_missing_or_crashed_seed_means_not_run(tmp_path):
  build(tmp_path, [-0.06, -0.05, -0.08, -0.04, -0.07, -0.03, -0.09, -0.05])
  os.remove(os.path.join(tmp_path, "seed13", "no_value_pretrain", "metrics.jsonl"))
  os.remove(os.path.join(tmp_path, "seed13", "no_value_pretrain", "ablate_status.json"))
  got = by_role(tmp_path)
  assert got["Primary"]["verdict"] == "not run"
  assert "7/8 seeds (missing 13)" in got["Primary"]["evidence"]
  assert got["Manipulation"]["verdict"] == "not run"
  assert cev.main(["confirm_early_vp", str(tmp_path)]) == 0
  # A crashed run does not count even though it logged the step-10 evaluation.
  write_run(tmp_path, "no_value_pretrain", 13, 0.5, state="crashed")
  assert by_role(tmp_path)["Primary"]["verdict"] == "not run"
  write_run(tmp_path, "no_value_pretrain", 13, 0.5)
  assert by_role(tmp_path)["Primary"]["verdict"] == "met"


def test_the_manipulation_check_reads_the_step_one_bias_per_row(tmp_path):
  build(tmp_path, [-0.06] * 8, no_vp_s0=-0.15)          # the RM critic barely biased
  assert by_role(tmp_path)["Manipulation"]["verdict"] == "not met"
  build(tmp_path, [-0.06] * 8, vapo_s0=-0.15)           # VAPO's critic not calibrated
  assert by_role(tmp_path)["Manipulation"]["verdict"] == "not met"
  build(tmp_path, [-0.06] * 8, vapo_s0=0.1)             # the boundary is inside
  assert by_role(tmp_path)["Manipulation"]["verdict"] == "met"


def test_a_results_folder_and_a_resumed_run_are_read(tmp_path):
  """ablate's copies under metrics/ with the states from ablation.jsonl; a repeated step
  (a resumed run) keeps its last record; a torn last line is skipped."""
  table = []
  for seed in SEEDS:
    write_run(tmp_path, "vapo", seed, 0.55, layout="metrics")
    write_run(tmp_path, "no_value_pretrain", seed, 0.50, layout="metrics")
    table += [{"kind": "run", "row": r, "seed": seed, "state": "finished"}
              for r in ("vapo", "no_value_pretrain")]
  with open(os.path.join(tmp_path, "ablation.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in table)
  path = os.path.join(tmp_path, "metrics", "seed6", "no_value_pretrain.jsonl")
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps({"stage": "eval", "step": 10, cev.AVG: 0.4, cev.GUESS: 0.2}) + "\n")
    f.write('{"stage": "eval", "st')
  runs = cev.load_runs(str(tmp_path), cev.PAIR)
  assert runs[("no_value_pretrain", 6)]["avg"][10] == 0.4
  assert runs[("no_value_pretrain", 7)]["avg"][10] == 0.5
  assert by_role(tmp_path)["Primary"]["verdict"] == "met"
  # No state recorded anywhere: the final evaluation (step 20) marks a run finished.
  os.remove(os.path.join(tmp_path, "ablation.jsonl"))
  assert cev.load_runs(str(tmp_path), cev.PAIR)[("vapo", 6)]["state"] == "finished"


def test_the_area_is_the_trapezoid_over_steps_5_to_20():
  assert cev.auc({0: 0.0, 5: 0.4, 10: 0.5, 15: 0.6, 20: 0.7}) == pytest.approx(8.25)
  assert cev.auc({5: 0.4, 10: 0.5, 20: 0.7}) is None


def test_the_start_is_compared_with_the_committed_selection(tmp_path):
  assert cev.start_check(str(tmp_path)).startswith("not found")
  with open(cev.COMMITTED_SELECTION, encoding="utf-8") as f:
    verdict = json.load(f)
  band = os.path.join(tmp_path, "shared", "stage-sft-abcd1234", "band")
  os.makedirs(band)
  with open(os.path.join(band, "sft_band.json"), "w", encoding="utf-8") as f:
    json.dump(verdict, f)
  assert "the same start" in cev.start_check(str(tmp_path))
  verdict["candidates"][0]["metrics"]["guess_rate"] += 1e-6
  with open(os.path.join(band, "sft_band.json"), "w", encoding="utf-8") as f:
    json.dump(verdict, f)
  assert "another start" in cev.start_check(str(tmp_path))


# ------------------------------------------------------------------------------ the t-test


def test_the_incomplete_beta_on_closed_forms():
  for x in (0.0, 0.1, 0.37, 0.5, 0.9, 1.0):
    assert cev.regularized_beta(x, 1, 1) == pytest.approx(x, abs=1e-14)
    assert cev.regularized_beta(x, 3, 1) == pytest.approx(x ** 3, abs=1e-13)
    assert cev.regularized_beta(x, 1, 2.5) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-13)


def test_the_t_cdf_against_closed_forms_and_known_values():
  for t in (-7.0, -2.0, -0.3, 0.0, 0.5, 1.0, 3.0):
    assert cev.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert cev.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-12)
    u = t / math.sqrt(3)
    df3 = 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi
    assert cev.t_cdf(t, 3) == pytest.approx(df3, abs=1e-12)
  # Tables: one-sided P(T >= 2.0) at df 7 is 0.0428; the 97.5% quantiles give 0.025.
  assert 1 - cev.t_cdf(2.0, 7) == pytest.approx(0.04283, abs=5e-5)
  assert 1 - cev.t_cdf(2.365, 7) == pytest.approx(0.025, abs=5e-5)
  assert 1 - cev.t_cdf(1.895, 7) == pytest.approx(0.05, abs=5e-5)    # the 95% quantile
  assert cev.t_cdf(-1.96, 1e7) == pytest.approx(0.0249979, abs=1e-6)  # the normal limit
  assert cev.t_cdf(math.inf, 7) == 1.0 and cev.t_cdf(-math.inf, 7) == 0.0


def test_the_t_cdf_matches_scipy():
  stats = pytest.importorskip("scipy.stats")
  for df in (1, 2, 5, 7, 30, 500):
    for t in (-40.0, -6.97, -2.7, -1.0, -0.01, 0.4, 2.0, 9.0):
      assert cev.t_cdf(t, df) == pytest.approx(float(stats.t.cdf(t, df)), rel=1e-9, abs=1e-15)


def test_the_paired_test_by_hand():
  # Δ = −1, −2, −3: mean −2, sd 1, t = −2√3, df 2: p = ½ − 2√3 / (2√14) (the df-2 form).
  st = cev.paired_t([-1.0, -2.0, -3.0], "negative", cdf=cev.t_cdf)
  assert (st["n"], st["mean"], st["sd"], st["df"]) == (3, -2.0, 1.0, 2)
  assert st["t"] == pytest.approx(-2 * math.sqrt(3))
  assert st["p"] == pytest.approx(0.5 - 2 * math.sqrt(3) / (2 * math.sqrt(14)))
  assert cev.paired_t([1.0, 2.0, 3.0], "positive")["p"] == pytest.approx(st["p"])
  assert cev.paired_t([1.0, 2.0, 3.0], "negative")["p"] == pytest.approx(1 - st["p"])
  assert cev.paired_t([-0.5] * 8)["p"] == 0.0          # every Δ equal: the sign decides
  with pytest.raises(ValueError):
    cev.paired_t([-1.0])
  with pytest.raises(ValueError):
    cev.one_sided_p(1.0, 3, "less")


def test_without_scipy_the_p_value_comes_from_plain_math(tmp_path, monkeypatch):
  build(tmp_path, [-0.06, -0.05, -0.08, -0.04, -0.07, -0.03, -0.09, -0.05])
  with_scipy = by_role(tmp_path)["Primary"]["p"]
  monkeypatch.setattr(cev, "_scipy_cdf", lambda: None)
  assert by_role(tmp_path)["Primary"]["p"] == pytest.approx(with_scipy, rel=1e-9)
  assert "p-values: t_cdf" in cev.report(str(tmp_path))
  assert cev.one_sided_p(2.0, 7, "positive") == pytest.approx(0.04283, abs=5e-5)


def test_the_constants_are_the_registered_ones():
  """The script's numbers against the registration in configs/chain_or_guess.py's docstring."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "configs", "chain_or_guess.py"), encoding="utf-8") as f:
    doc = f.read().split('"""')[1]
  section = doc[doc.index("Registered 2026-12-03, before any run"):]
  assert (cev.SEEDS, cev.STEP, cev.AUC_STEPS) == (tuple(range(6, 14)), 10, (5, 10, 15, 20))
  for text in ("Seeds 6, 7, ..., 13", "at RL step 10", "p < 0.05", "≥ 6 of the 8 seeds",
               "< −0.2 for no_value_pretrain", "within ±0.1 for vapo", "`short_frac`",
               "`value/s0_minus_return`", "--config.rl.steps=20 --config.eval.every=5",
               "--rows=vapo,no_value_pretrain", "confirm_early_vp"):
    assert text in section, text
  assert (cev.ALPHA, cev.MIN_NEGATIVE, cev.NO_VP_BELOW, cev.VAPO_WITHIN) == (0.05, 6, -0.2, 0.1)
