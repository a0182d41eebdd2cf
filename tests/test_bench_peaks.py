"""benchmarks/quiet.py --peaks: this machine's matmul and copy peaks, the figures to quote
beside a run's time (docs/speed.md), and sampler_bench's roofline built on them."""

import json
import os
import subprocess
import sys

from benchmarks import quiet
from benchmarks import sampler_bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_peaks_command_prints_and_writes_them(tmp_path):
  path = tmp_path / "peaks.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0"}
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "quiet.py"), "--peaks",
                        "--reps=2", f"--json={path}"], env=env, check=True,
                       capture_output=True, text=True, timeout=300).stdout
  assert "GFLOP/s float32 matmul" in out and "GB/s copy" in out
  got = json.loads(path.read_text())["results"]
  # Any machine this runs on: more than 1 GFLOP/s and 0.5 GB/s, less than 1e15 FLOP/s.
  assert 1e9 < got["flops_peak"] < 1e15 and 5e8 < got["bw_peak"] < 1e14, got


def test_roofline_is_the_max_of_compute_and_bytes():
  """The small preset's bound moves with each peak where that peak binds, and never below
  either the compute or the weight-bytes floor alone."""
  p = sampler_bench.PRESETS["small"]
  base = sampler_bench.roofline_seconds(p, 2e11, 2e10)
  assert sampler_bench.roofline_seconds(p, 1e11, 2e10) > base   # slower matmul: slower bound
  assert sampler_bench.roofline_seconds(p, 2e11, 1e10) > base   # slower copy: slower bound
  assert sampler_bench.roofline_seconds(p, 1e30, 1e30) < base * 1e-6
  assert quiet.describe_peaks(2e11, 2e10) == "200 GFLOP/s float32 matmul, 20.0 GB/s copy"
