"""benchmarks/step_record.py: the RL-step benches' summary math (compile rounds counted, the
ratio of means), JAX compile events per round and the packed-shape recorder (runs no
benchmark; needs no trl)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import step_record as sr


def _run(step, rollout=1.0, forward=0.5, reward=0.1, updates=2.0, compiles=0):
  return {"rollout": rollout, "forward": forward, "reward": reward, "updates": updates,
          "step": step, "jax_compile": {"backend_compiles": compiles}}


def test_summary_counts_every_round_mean_and_median():
  # A round that compiled (20 s) stays in: mean 8, median 4 (a median would hide it).
  runs = [_run(4.0), _run(20.0, updates=18.0, compiles=3), _run(3.0), _run(5.0), _run(8.0)]
  s = sr.summarize(runs)
  assert s["step"] == {"mean": 8.0, "median": 5.0, "min": 3.0, "max": 20.0, "n": 5}
  assert s["updates"]["mean"] == pytest.approx(5.2) and s["updates"]["median"] == 2.0
  # other = step - (rollout + forward + reward + updates), per round, then its mean
  others = [r["step"] - 3.6 for r in runs]
  others[1] = 20.0 - 19.6
  assert s["other"]["mean"] == pytest.approx(np.mean(others))
  assert sr.summarize([]) == {}
  assert sr.stats([])["mean"] is None


def test_headline_is_the_ratio_of_means_not_a_median_of_ratios():
  ours = [_run(10.0), _run(30.0, compiles=2), _run(10.0)]
  trl = [_run(20.0), _run(20.0), _run(20.0)]
  c = sr.comparison(ours, trl)
  assert c["rounds"] == 3
  assert c["ratio_of_means"] == pytest.approx(20.0 / (50.0 / 3))   # 1.2x
  assert c["ratio_per_round"] == pytest.approx([2.0, 2 / 3, 2.0])
  assert c["median_of_ratios"] == pytest.approx(2.0)                # what a median would say
  assert c["steady"]["rounds"] == 2 and c["steady"]["ratio_of_means"] == pytest.approx(1.0)
  assert c["without_our_compiles"]["round_indices"] == [0, 2]
  assert c["without_our_compiles"]["ratio_of_means"] == pytest.approx(2.0)
  # Uneven sides: only the common rounds; no rounds at all: no ratio.
  assert sr.comparison(ours, trl[:2])["rounds"] == 2
  assert sr.ratio_of_means([], []) is None
  assert sr.quiet_rounds([0, None, 2, 0]) == [0, 3]


def test_mean_median_lines_show_both_and_shares():
  lines = sr.mean_median_lines("x", sr.summarize([_run(4.0), _run(6.0)]))
  assert lines[0] == "x: step mean 5.000 s, median 5.000 s (2 rounds, compiles counted)"
  assert any(ln.strip().startswith("rollout") and "20.0%" in ln for ln in lines)
  assert any(ln.strip().startswith("other") for ln in lines)


def test_compile_events_count_each_round_and_name_the_program():
  ev = sr.CompileEvents(listed_s=0.0).start()
  try:
    ev.take()
    f = jax.jit(lambda x: jnp.sin(x) * 2.0 + 1.0)
    f(jnp.ones((3, 5))).block_until_ready()
    first = ev.take()
    f(jnp.ones((3, 5))).block_until_ready()   # same shape: nothing compiles
    second = ev.take()
    f(jnp.ones((4, 5))).block_until_ready()   # a new shape compiles again
    third = ev.take()
  finally:
    ev.stop()
  assert first["backend_compiles"] >= 1 and first["compile_s"] > 0
  assert first["backend_compile_s"] > 0 and first["trace_s"] >= 0
  assert any(name for name, _ in first["largest"])
  assert second["backend_compiles"] == 0 and second["compile_s"] == 0
  assert third["backend_compiles"] >= 1
  assert "r1: " in sr.describe_compiles([first, second])
  # Stopped: no more events are counted.
  jax.jit(lambda x: x + 3.0)(jnp.ones((2,))).block_until_ready()
  assert ev.take()["backend_compiles"] == 0


class _Plan:
  def __init__(self, n, k, t, eff):
    self.shape, self.efficiency = (n, k, t), eff


class _FakePacked:
  """The three methods PackedShapes patches, with the real signatures' leading args."""

  def __init__(self, shape):
    self.shape = shape

  def plan(self, mask, prompt_len, seq_len, mesh, axes):
    return {"src": np.zeros(self.shape[:2])}, _Plan(*self.shape, 0.75)

  def step(self, name, compiled, mesh, axes):
    def run(state, batch):
      self.plan(None, 0, 0, None, ())
      return state, {}, False
    run.compiled = compiled
    return run

  def forward(self, name, fn, mesh, axes, rules=None, static=()):
    def run(params, tokens, mask, *, prompt_len):
      self.plan(None, 0, 0, None, ())
      return 1.0
    run.last_efficiency = None
    return run


def test_packed_shapes_record_each_pass_and_restore(monkeypatch):
  from vapo_jax.rl import layout
  monkeypatch.setattr(layout, "Packed", _FakePacked)
  book = sr.PackedShapes()
  assert book.install()
  fwd = _FakePacked((4, 1, 192)).forward("policy_logprobs", None, None, ())
  step = _FakePacked((7, 2, 192)).step("policy", "prog", None, ())
  assert step.compiled == "prog"                  # attributes read through
  fwd.last_efficiency = 0.5                       # and are written through
  assert fwd._inner.last_efficiency == 0.5
  fwd(None, None, None, prompt_len=3)
  step(None, None)
  calls = book.take()
  assert [c["pass"] for c in calls] == ["policy_logprobs", "policy"]
  assert calls[1]["shape"] == [7, 2, 192] and calls[1]["efficiency"] == 0.75
  assert calls[1]["arrays"] == {"src": [7, 2]}
  assert sr.shapes_by_pass(calls) == {"policy_logprobs": [[4, 1, 192]],
                                      "policy": [[7, 2, 192]]}
  assert book.take() == []
  book.uninstall()
  assert layout.Packed.plan is _FakePacked.__dict__["plan"]


def test_packed_shapes_decline_a_layout_without_the_methods(monkeypatch):
  from vapo_jax.rl import layout
  monkeypatch.setattr(layout, "Packed", types.SimpleNamespace())
  assert not sr.PackedShapes().install()


def test_step_results_schema_and_lines():
  """The JSON of a comparison: warm-up kept apart, every timed round, summaries, comparison;
  the printed lines name the headline, the steady state, compiles, lengths and shapes."""
  def ours(step, compiles):
    return {**_run(step, compiles=compiles), "generated_lengths": [3, 5],
            "jax_compile": {"backend_compiles": compiles, "compile_s": 2.0 * compiles},
            "packed": [{"pass": "policy", "phase": "update", "shape": [7, 2, 192]},
                       {"pass": "logprobs", "phase": "alone", "shape": [4, 1, 192]}]}
  o = [ours(30.0, 9), ours(10.0, 0), ours(14.0, 2)]
  t = [{**_run(20.0), "generated_lengths": [4, 4]} for _ in range(4)]
  res = sr.step_results(o, t)
  assert res["rounds_timed"] == 2
  assert res["ours"]["warmup"]["step"] == 30.0 and len(res["ours"]["per_round"]) == 2
  assert res["ours"]["summary"]["step"]["mean"] == 12.0
  assert res["comparison"]["ratio_of_means"] == pytest.approx(20.0 / 12.0)
  assert res["comparison"]["without_our_compiles"]["round_indices"] == [0]
  text = "\n".join(sr.step_lines(res, skip_phase="alone"))
  assert "TRL's mean / ours: 1.67x" in text and "steady state" in text
  assert "r1: 0 (0.0 s), r2: 2 (4.0 s); warm-up: 9 (18.0 s)" in text
  assert "r1: 8 / 8" in text
  assert "policy [[7, 2, 192]]" in text and "logprobs" not in text
  assert sr.step_results(o[:1], t[:1])["comparison"] is None
  assert "no timed round" in sr.step_lines(sr.step_results(o[:1], t[:1]))[0]
