"""benchmarks/quiet.py: loaded/quiet marking, interleaving order, ratio maths (runs no
benchmark)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import quiet  # noqa: E402  pylint: disable=wrong-import-position


def fake_load(values):
  it = iter(values)
  return lambda: next(it)


def run_load(values, samples_between=0):
  load = quiet.Load(fake_load(values), interval_s=None)
  with load:
    for _ in range(samples_between):
      load.sample()
  return load


def test_quiet_when_every_sample_at_most_the_limit():
  load = run_load([0.2, 1.0, 0.5], samples_between=1)
  assert load.quiet and (load.start, load.end, load.peak) == (0.2, 0.5, 1.0)
  assert load.tag("x 1.0 s") == "x 1.0 s"
  assert quiet.LOADED not in load.verdict()
  assert load.to_json()["quiet"] is True


@pytest.mark.parametrize("values", [[1.3, 0.2], [0.2, 1.01], [0.1, 4.0, 0.1]])
def test_loaded_at_start_end_or_during(values):
  load = run_load(values, samples_between=len(values) - 2)
  assert not load.quiet
  assert load.tag("x 1.0 s") == f"x 1.0 s   [{quiet.LOADED}]"
  assert quiet.LOADED in load.verdict()
  j = load.to_json()
  assert j["quiet"] is False and j["verdict"] == quiet.LOADED
  assert j["load_1min"]["max"] == max(values)


def test_background_sampler_takes_the_max():
  values = iter([0.1] + [7.0] * 1000)
  load = quiet.Load(lambda: next(values, 0.1), interval_s=0.001)
  with load:
    while len(load.samples) < 3:
      pass
  assert load.peak == 7.0 and not load.quiet


def test_interleave_alternates_order_and_samples_load():
  calls = []
  sides = [(name, lambda name=name: calls.append(name)) for name in ("ours", "peer", "rlax")]
  load = quiet.Load(fake_load([0.0] * 10), interval_s=None)
  rounds_seen = []
  with load:
    r = quiet.interleave(sides, 3, load=load, each_round=rounds_seen.append)
  want = ["ours", "peer", "rlax", "rlax", "peer", "ours", "ours", "peer", "rlax"]
  assert calls == r.order == want
  assert rounds_seen == [0, 1, 2]
  assert len(load.samples) == 1 + 3 + 1  # start, one per round, end
  assert r.n == 3
  r = quiet.interleave(sides, 2, alternate=False)
  assert r.order == ["ours", "peer", "rlax"] * 2


def test_interleave_times_each_call_or_takes_the_returned_seconds():
  ticks = iter(range(100))

  def clock():
    return float(next(ticks))

  r = quiet.interleave([("a", lambda: None), ("b", lambda: 0.25)], 2, clock=clock)
  assert r.times["a"] == [1.0, 1.0]  # each call spans one clock tick
  assert r.times["b"] == [0.25, 0.25]


def test_ratio_maths():
  r = quiet.Rounds({"ours": [1.0, 2.0, 1.0], "peer": [3.0, 2.0, 5.0]}, [])
  assert r.ratios("ours", "peer") == [3.0, 1.0, 5.0]  # peer time / our time
  assert r.ratio("ours", "peer") == 3.0  # median of the per-round ratios
  assert r.median("ours") == 1.0 and r.median("peer") == 3.0
  text = r.describe_ratio("ours", "peer")
  assert "3.00x" in text and "3.00, 1.00, 5.00" in text and "3 round(s)" in text
  j = r.to_json([("ours", "peer")])
  assert j["ratios"]["ours/peer"] == {"per_round": [3.0, 1.0, 5.0], "median": 3.0}
  assert j["median_s"] == {"ours": 1.0, "peer": 3.0}


def test_write_json(tmp_path, capsys):
  load = run_load([2.0, 0.1])
  path = tmp_path / "out.json"
  quiet.write_json(str(path), load, quiet.machine_facts(["not-a-real-package-xyz"]),
                   {"tokens_per_s": 12.5})
  got = json.loads(path.read_text(encoding="utf-8"))
  assert got["quiet"] is False and got["verdict"] == quiet.LOADED
  assert got["results"] == {"tokens_per_s": 12.5}
  assert got["machine"]["versions"]["not-a-real-package-xyz"] == "not installed"
  assert "jax" in got["machine"]["versions"] and got["machine"]["cores"] == os.cpu_count()
  assert quiet.LOADED in capsys.readouterr().out
  quiet.write_json(None, load, {}, {})  # no path: nothing written, no error


def test_header_marks_a_loaded_start(capsys):
  load = run_load([3.0, 0.1])
  quiet.print_header(quiet.machine_facts(), load)
  out = capsys.readouterr().out
  assert "load average (1 min) at start: 3.00" in out and quiet.LOADED in out
