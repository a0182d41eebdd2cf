"""experiments/real_model/rg_probe.py: the per-arm probe table from an evaluation's records."""

import json

import numpy as np
import pytest

from experiments.real_model import rg_probe
from experiments.real_model import variance_share
from vapo_jax.data import reasoning_gym as rg
from vapo_jax.run import eval_records


def test_the_table_of_an_evaluations_records(tmp_path):
  spec = rg.RGSpec(arms=tuple(rg.parse_arms("chain_sum_l2,leg_counting_l2")),
                   weights=(1.0, 1.0), drop_shortcuts=False)
  examples = rg.examples(16, "test", 0, spec)
  rng = np.random.default_rng(0)
  correct = rng.random((16, 4)) < np.linspace(0.0, 1.0, 16)[:, None]  # graded problems
  path = tmp_path / "rl_step_0.jsonl"
  eval_records.write(str(path), eval_records.build(
      examples, correct, np.full((16, 4), 30), np.zeros((16, 4), bool),
      correct[:, 0], np.full(16, 30)))
  rows = rg_probe.from_records(str(path), per_arm=8, k=4)
  assert list(rows) == ["chain_sum_l2", "leg_counting_l2", "pooled"]
  arm = np.array([rg.arm_of(e) for e in examples])
  for name in ("chain_sum_l2", "leg_counting_l2"):
    c = correct[arm == name]
    assert rows[name]["problems"] == 8
    assert rows[name]["avg@4"] == pytest.approx(c.mean())
    assert rows[name]["pass@4"] == pytest.approx(c.any(1).mean())
    assert rows[name]["share"] == pytest.approx(variance_share.between_share(c)["share"])
    assert rows[name]["greedy"] == pytest.approx(c[:, 0].mean())
    answers = [e.answer for e in np.array(examples, object)[arm == name]]
    assert rows[name]["const_frac"] == pytest.approx(
        max(answers.count(a) for a in answers) / 8)
    # Shortcuts on the signed numbers (reasoning-gym's own entries, regenerated).
    hit = [bool(rg.shortcut_hits(rg.parse_arm(name)[1].task, rg.entry_of(e.uid)[1]))
           for e in np.array(examples, object)[arm == name]]
    assert rows[name]["any_shortcut_frac"] == pytest.approx(np.mean(hit))
  assert rows["pooled"]["avg@4"] == pytest.approx(correct.mean())
  table = rg_probe.markdown(rows, 4)
  assert table.count("\n") == 2 + 3 and "| pooled | 16 |" in table
  json.dumps(rows)  # the --out file


def test_by_arm_keeps_the_configs_arms_and_picks_some():
  """--arms probes a subset without changing which problems each arm holds."""
  import types  # pylint: disable=import-outside-toplevel
  exs = [types.SimpleNamespace(uid=f"rg:{a}:7:{i}") for i in range(5) for a in ("x", "y", "z")]
  every = rg_probe.by_arm(exs, 3)
  assert list(every) == ["x", "y", "z"] and all(len(v) == 3 for v in every.values())
  some = rg_probe.by_arm(exs, 3, "z, x")
  assert list(some) == ["x", "z"] and some["z"] == every["z"]
  with pytest.raises(ValueError, match="--arms"):
    rg_probe.by_arm(exs, 3, "w")
