"""The per-step length metrics: counted by hand, and logged by a tiny RL step in a form the
step model reads back (`pod.lengths`)."""

import json

import numpy as np
import pytest

from vapo_jax.rl import length_stats
from vapo_jax.pod import lengths


def test_length_metrics_by_hand():
  ell = np.array([3, 1, 8, 2])     # two calls of two rows: longest rows 3 and 8
  pr = np.array([5, 5, 2, 2])
  m = length_stats.length_metrics(ell, pr, prompt_len=6, max_new_tokens=8, rows_per_call=2)
  assert m["rollout/decode_steps_per_call_max"] == 7
  assert m["rollout/decode_steps_per_call_mean"] == (2 + 7) / 2
  # Kept tokens 14 of 2·3 + 2·8 = 22 decode slots.
  assert m["perf/rollout_token_efficiency"] == pytest.approx(14 / 22)
  # Real tokens 14 + 14 of 4 rows × (6 + 8) padded ones, in every train pass today.
  for name in length_stats.PASSES:
    assert m[f"perf/{name}_token_efficiency"] == pytest.approx(28 / 56)
  assert m["response/length_max"] == 8 and m["response/length_min"] == 1
  assert m["response/length_p50"] == np.quantile(ell, 0.5)
  assert m["response/length_hist/le_8"] == 1.0 and "response/length_hist/le_256" not in m
  packed = length_stats.length_metrics(ell, pr, prompt_len=6, max_new_tokens=8,
                                       rows_per_call=2, computed_tokens={"policy": 28})
  assert packed["perf/policy_token_efficiency"] == 1.0
  with pytest.raises(ValueError, match="same"):
    length_stats.length_metrics(ell, pr[:3], prompt_len=6, max_new_tokens=8, rows_per_call=2)


def test_a_tiny_rl_step_logs_what_the_step_model_reads(tmp_path):
  from tiny_trainer import tiny  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  cfg = tiny(**{"value_pretrain.enabled": False, "mesh.data": 1, "mesh.fsdp": 1,
                "mesh.tensor": 1})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:  # the RL step's experience half (rollout, reward, forwards): where the metrics come from
    t.setup("critic")
    t.setup("policy")
    _, row = t.experience(next(t.state.prompts))
  finally:
    t.close()
  r = cfg.sampling.max_new_tokens
  assert row["response/length_max"] <= r
  assert row["rollout/decode_steps_per_call_max"] == row["response/length_max"] - 1
  assert 0 < row["perf/rollout_token_efficiency"] <= 1
  assert 0 < row["prompt/length_max"] <= cfg.data.max_prompt_tokens
  eff = row["perf/policy_token_efficiency"]
  assert 0 < eff < 1
  path = tmp_path / "metrics.jsonl"
  path.write_text(json.dumps({k: v for k, v in row.items()
                              if isinstance(v, (int, float, str))}) + "\n")
  x = lengths.sample(str(path), 64, r)
  assert x.max() == row["response/length_max"] and x.min() == row["response/length_min"]
  p = lengths.sample(str(path), 64, cfg.data.max_prompt_tokens, prefix="prompt/length_")
  assert p.max() == row["prompt/length_max"]
