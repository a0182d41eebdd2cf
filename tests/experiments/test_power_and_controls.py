"""Issue 45's readings of committed results: the paired Δ, its t half-width and the minimum
detectable effect (experiments/ablation/power.py), and M1's precondition put beside a zero and
a constant head (experiments/value_mechanisms/cog_criteria.py, m1_controls.py), by hand."""

import json
import math

import pytest

from experiments.ablation import power
from experiments.value_mechanisms import cog_criteria
from experiments.value_mechanisms import m1_controls


def run(row, seed, avg, step10):
  return {"kind": "run", "state": "finished", "row": row, "seed": seed, "avg": avg,
          "curve": [[0, 0.3], [10, step10], [40, avg]]}


def test_paired_deltas_half_width_and_mde_by_hand():
  records = [run("vapo", s, 0.5, 0.4) for s in range(3)]
  records += [run("ppo", 0, 0.4, 0.3), run("ppo", 1, 0.5, 0.35), run("ppo", 2, 0.45, 0.2)]
  (row,) = power.summary(records)
  assert row["deltas"] == pytest.approx({0: -10.0, 1: 0.0, 2: -5.0})
  assert row["mean"] == pytest.approx(-5.0) and row["sd"] == pytest.approx(5.0)
  # ± = t_{0.975, 2} · sd/√3 = 4.3027 · 5/√3
  assert row["half"] == pytest.approx(4.302653 * 5 / math.sqrt(3), rel=1e-5)
  assert row["negative"] == 2
  approx, exact = row["mde"][3]
  assert approx == pytest.approx((4.302653 + 1.060660) * 5 / math.sqrt(3), rel=1e-5)
  assert approx < exact < 1.1 * approx  # the normal-quantile shortcut is a little optimistic
  # n = 6 from the same sd: (2.5706 + 0.9195) · 5/√6
  assert row["mde"][6][0] == pytest.approx(3.49013 * 5 / math.sqrt(6), rel=1e-4)
  (at10,) = power.summary(records, step=10)
  assert at10["deltas"] == pytest.approx({0: -10.0, 1: -5.0, 2: -20.0})
  with pytest.raises(ValueError):
    power.summary(records + [run("ppo", 0, 0.4, 0.3)])


def fifths(*pairs):
  return [{"fifth": k, "cuts": 3, "bias": b, "vstar_mean": v, "value_mean": v + b}
          for k, (b, v) in enumerate(pairs)]


def test_the_precondition_is_kept_only_if_it_separates_the_rm_from_the_controls(tmp_path):
  # V̂* falls over the response: the zero head's bias (−V̂*) rises late and passes.
  vstar = (0.45, 0.4, 0.4, 0.38, 0.3)
  vb = {"mean_return": 0.44, "prompts": 48, "critics": ["zero_head", "reward_model"],
        "m2": {}, "m3": [],
        "m1": {"zero_head": fifths(*[(-v, v) for v in vstar]),
               "reward_model": fifths(*[(0.03 - v, v) for v in vstar])}}
  got = cog_criteria._m1_discriminates(vb)  # pylint: disable=protected-access
  assert got["verdict"] == "does not discriminate: precondition dropped", got
  assert "zero_head: bias by fifth -0.450" in got["evidence"]
  # The constant head derived from the zero head's rows: 0.44 − V̂* (−0.010 first: passes).
  assert "constant_head: bias by fifth -0.010, +0.040, +0.040, +0.060, +0.140 (passes)" \
      in got["evidence"]
  # A V̂* that rises late: the controls' biases fall late and fail; an RM that learns the
  # late values passes alone, so the precondition separates it.
  vstar = (0.3, 0.35, 0.4, 0.45, 0.5)
  vb["m1"] = {"zero_head": fifths(*[(-v, v) for v in vstar]),
              "reward_model": fifths(*[(b - v, v) for b, v in zip((0.0, 0.2, 0.3, 0.4, 0.5),
                                                                  vstar)])}
  vb["mean_return"] = 0.2
  assert cog_criteria._m1_discriminates(vb)["verdict"] == "discriminates"  # pylint: disable=protected-access
  rows = {r["criterion"].split(":")[0]: r for r in cog_criteria.mechanism_verdicts(vb)}
  assert rows["control"]["verdict"] == "discriminates"
  # A suite without the RM: not run. The summary prints every row and the verdict.
  assert cog_criteria._m1_discriminates(  # pylint: disable=protected-access
      {"m1": {"zero_head": vb["m1"]["zero_head"]}, "mean_return": 0.2})["verdict"] == "not run"
  path = tmp_path / "value_bias.json"
  path.write_text(json.dumps(vb))
  text = "\n".join(m1_controls.suite_lines(str(path)))
  assert "| constant_head |" in text and "Verdict: discriminates." in text
