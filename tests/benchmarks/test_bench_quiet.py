"""benchmarks/quiet.py: loaded/quiet marking, interleaving order, ratio maths (runs no
benchmark)."""

import json
import math
import os
import subprocess
import sys
import time

import pytest

from benchmarks import quiet


# The end-to-end runs below check that each script runs and writes its figures, not the
# figures: no idle wait for the load to settle at the end (benchmarks/quiet.py).
_SMOKE_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0"}

def fake_load(values):
  it = iter(values)
  return lambda: next(it)


def run_load(values, samples_between=0, cpu=None, settle_s=0.0):
  """A Load fed with `values` (start, samples, end...) and optional (busy, own, t) ticks."""
  ticks = iter(cpu) if cpu else None
  load = quiet.Load(fake_load(values), interval_s=None, settle_s=settle_s,
                    cpu_fn=(lambda: next(ticks)) if ticks else (lambda: None),
                    sleep=lambda s: None)
  with load:
    for _ in range(samples_between):
      load.sample()
  return load


def test_quiet_when_every_sample_at_most_the_limit():
  load = run_load([0.2, 1.0, 0.5, 0.5], samples_between=1)
  assert load.quiet and (load.start, load.end, load.peak) == (0.2, 0.5, 1.0)
  assert load.tag("x 1.0 s") == "x 1.0 s"
  assert quiet.LOADED not in load.verdict()
  assert load.to_json()["quiet"] is True


@pytest.mark.parametrize("values", [[1.3, 0.2, 0.2], [0.2, 1.01, 1.01], [0.1, 4.0, 0.1, 0.1]])
def test_loaded_at_start_end_or_during_without_cpu_accounting(values):
  load = run_load(values, samples_between=len(values) - 3)
  assert not load.quiet
  assert load.tag("x 1.0 s") == f"x 1.0 s   [{quiet.LOADED}]"
  assert quiet.LOADED in load.verdict()
  j = load.to_json()
  assert j["quiet"] is False and j["verdict"] == quiet.LOADED
  assert j["load_1min"]["max"] == max(values)


def test_own_threads_lifting_the_load_do_not_count_other_processes_do():
  # (machine busy s, own s, wall s): 10 s of wall, we use 19.8 core-s of the 20 busy.
  ours_only = [(0, 0, 0), (10, 9.9, 5), (20, 19.8, 10)]
  load = run_load([0.3, 1.9, 1.9, 0.4], samples_between=1, cpu=ours_only)
  assert load.quiet, load.verdict()
  assert load.foreign_mean == pytest.approx(0.02) and load.peak == 1.9
  assert "0.02 cores on average" in load.verdict()
  # Another process takes one core for the second half: 0.5 on average, 1.0 at most.
  other = [(0, 0, 0), (10, 9.9, 5), (20, 14.9, 10)]
  load = run_load([0.3, 1.9, 1.9, 0.4], samples_between=1, cpu=other)
  assert not load.quiet
  assert load.foreign_mean == pytest.approx(0.51) and load.peak_foreign == pytest.approx(1.0)
  assert load.to_json()["other_processes_cores"]["max"] == pytest.approx(1.0)
  # A short burst above twice the limit in one interval is enough to mark the run.
  burst = [(0, 0, 0), (10, 7.0, 5), (20, 17.0, 10)]
  load = run_load([0.3, 1.9, 1.9, 0.4], samples_between=1, cpu=burst)
  assert load.foreign_mean == pytest.approx(0.3) and not load.quiet


def test_a_few_ms_interval_is_merged_not_read_as_many_cores():
  # One 10 ms tick of another process within 1 ms of wall clock (a sample taken right after
  # the previous one) read as 10 cores before: it merges into the next interval instead.
  cpu = [(0, 0, 0), (10, 9.9, 5), (10.01, 9.9, 5.001), (20, 19.8, 10)]
  load = run_load([0.3, 0.9, 0.9, 0.9, 0.4], samples_between=2, cpu=cpu)
  assert load.quiet, load.verdict()
  assert load.peak_foreign == pytest.approx(0.02, abs=0.01)
  assert load.foreign_mean == pytest.approx(0.02)


def test_end_waits_for_the_load_to_settle():
  cpu = [(0, 0, 0), (10, 10, 5)]
  # Load from our own threads decays while we wait idle: quiet, and the wait is reported.
  load = run_load([0.5, 1.8, 1.6, 1.3, 0.9], cpu=cpu, settle_s=10)
  assert load.quiet and load.end == 0.9 and load.settled_s == 2.0
  assert "after 2 s idle" in load.verdict()
  # It never falls back within the wait: something else is running.
  load = run_load([0.5, 1.8] + [1.7] * 20, cpu=[(0, 0, 0), (10, 10, 5)], settle_s=5)
  assert not load.quiet and load.end == 1.7 and load.settled_s == 5.0


def test_background_sampler_records_samples():
  values = iter([0.1] + [7.0] * 1000)
  load = quiet.Load(lambda: next(values, 0.1), interval_s=0.001, cpu_fn=lambda: None,
                    settle_s=0)
  with load:
    while len(load.samples) < 3:
      pass
  assert load.peak == 7.0 and not load.quiet


def test_cpu_seconds_reads_this_machine():
  got = quiet.cpu_seconds()
  if got is None:
    pytest.skip("no /proc/stat")
  busy, own, t = got
  assert busy > 0 and own > 0 and t > 0
  x = 0
  for i in range(2_000_000):
    x += i
  busy2, own2, _ = quiet.cpu_seconds()
  assert own2 > own and busy2 >= busy


def test_interleave_alternates_order_and_samples_load():
  calls = []
  sides = [(name, lambda name=name: calls.append(name)) for name in ("ours", "peer", "rlax")]
  load = quiet.Load(fake_load([0.0] * 10), interval_s=None, cpu_fn=lambda: None, settle_s=0)
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
  load = run_load([2.0, 0.1, 0.1])
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
  load = run_load([3.0, 0.1, 0.1])
  quiet.print_header(quiet.machine_facts(), load)
  out = capsys.readouterr().out
  assert "load average (1 min) at start: 3.00" in out and quiet.LOADED in out


def test_own_cpu_counts_live_worker_processes():
  """A benchmark's worker processes (a checker pool) are its own CPU, not another process's:
  while a child burns CPU, this process's CPU seconds grow with it."""
  child = subprocess.Popen([sys.executable, "-c",
                            "import time\nt = time.time()\nwhile time.time() - t < 30: pass"])
  try:
    time.sleep(0.3)
    _, own0, _ = quiet.cpu_seconds()
    t0 = time.monotonic()  # on a loaded machine the child gets its 0.5 s of CPU later
    while True:
      time.sleep(0.3)
      _, own1, _ = quiet.cpu_seconds()
      if own1 - own0 > 0.5 or time.monotonic() - t0 > 20:
        break
    assert child.poll() is None, "the child ended before the second sample"
  finally:
    child.kill()
    child.wait()
  assert own1 - own0 > 0.5, (own0, own1)
  assert quiet.descendants_ticks(root=1 << 30) == 0  # no such process: no descendants


def test_rl_step_bench_runs(tmp_path):
  """benchmarks/rl_step_bench.py end to end on a small tiny config (it once broke on a
  renamed Trainer attribute with nothing to notice)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "rl.json"
  res = subprocess.run(
      [sys.executable, os.path.join(root, "benchmarks", "rl_step_bench.py"), "--steps", "2",
       "--json", str(out)], cwd=root, capture_output=True, text=True, timeout=600,
      env=_SMOKE_ENV)
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
  got = json.loads(out.read_text())
  assert got["results"]["step_s"] > 0 and got["results"]["median_warm"]["rollout"] > 0, got


def test_decode_split_runs(tmp_path):
  """benchmarks/decode_split.py end to end on a small model: it runs and writes the split."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "split.json"
  res = subprocess.run(
      [sys.executable, os.path.join(root, "benchmarks", "decode_split.py"), "--vocab", "512",
       "--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4",
       "--kv_heads", "2", "--rows", "4", "--n", "2", "--prompt", "8", "--new", "8",
       "--rounds", "1", "--json", str(out)], cwd=root, capture_output=True, text=True,
      timeout=600, env=_SMOKE_ENV)
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
  ms = json.loads(out.read_text())["results"]["per_step_ms"]
  # step, head and rest are differences of single timings (one round of a 2-layer model):
  # on a loaded machine any can come out <= 0, so only the direct timing must be positive.
  assert set(ms) == {"step", "head", "layer_matmuls", "rest"}, ms
  assert ms["layer_matmuls"] > 0 and all(math.isfinite(v) for v in ms.values()), ms


def test_ab_bench_runs_and_loads_each_checkout(tmp_path):
  """benchmarks/ab_bench.py with this checkout on both sides: same first loss, both timed."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "ab.json"
  res = subprocess.run(
      [sys.executable, os.path.join(root, "benchmarks", "ab_bench.py"), f"--old={root}",
       f"--new={root}", "--layers", "1", "--hidden", "64", "--intermediate", "128",
       "--heads", "4", "--kv_heads", "2", "--vocab", "256", "--batch", "2", "--seq", "32",
       "--rounds", "2", "--steps", "1", "--json", str(out)], cwd=root, capture_output=True,
      text=True, timeout=600, env=_SMOKE_ENV)
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
  got = json.loads(out.read_text())["results"]
  assert got["first_loss"]["old"] == got["first_loss"]["new"], got
  assert len(got["ratios"]["new/old"]["per_round"]) == 2 and all(
      t > 0 for t in got["seconds"]["old"] + got["seconds"]["new"]), got
  bad = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "ab_bench.py"),
                        f"--old={tmp_path}", f"--new={root}"], cwd=root, capture_output=True,
                       text=True, timeout=600, env=_SMOKE_ENV)
  assert bad.returncode != 0 and "not a vapo_jax checkout" in bad.stderr, bad.stderr[-2000:]
