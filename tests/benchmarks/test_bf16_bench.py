"""benchmarks/bf16_bench.py: its arithmetic, and a smoke run on tiny shapes (checks that it
runs and what it writes, not its figures)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import bf16_bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_projections_of_smollm2():
  p = bf16_bench.projections(bf16_bench.SMOLLM2)
  assert p == {"q": (576, 576), "kv": (576, 384), "o": (576, 576), "gate_up": (576, 3072),
               "down": (1536, 576), "head": (576, 49152)}
  assert bf16_bench.matmul_flops(2048, p["gate_up"]) == 2.0 * 2048 * 576 * 3072


def test_speedups_and_logp_gap():
  med = {"jax float32": 2.0, "jax bfloat16": 1.0, "torch float32": 3.0, "torch bfloat16": 1.5}
  assert bf16_bench.speedups(med) == pytest.approx({
      "jax bf16 speed-up": 2.0, "torch bf16 speed-up": 2.0, "torch/jax float32": 1.5,
      "torch/jax bfloat16": 1.5})
  assert bf16_bench.speedups({"jax float32": 2.0, "jax bfloat16": 1.0})["torch/jax float32"] is None
  gap = bf16_bench.logp_gap(np.array([[-1.0, -2.0]]), np.array([[-1.5, -2.0]]))
  assert gap == pytest.approx({"max_abs": 0.5, "mean_abs": 0.25})


def test_tiny_run_writes_every_part_and_the_parity(tmp_path):
  path = tmp_path / "bf16.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0"}
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bf16_bench.py"),
                        "--tiny", "--rounds=1", "--no-peaks", f"--json={path}"], env=env,
                       check=True, capture_output=True, text=True, timeout=600).stdout
  assert "parity, bf16 forward against float32" in out
  got = json.loads(path.read_text())["results"]
  parts = got["parts"]
  assert {"forward", "decode", "head M=64", "down M=4"} <= set(parts)
  assert set(parts["forward"]["median_s"]) == {"jax float32", "jax bfloat16", "torch float32",
                                               "torch bfloat16"}
  # bf16 against float32 on the same weights: close, not equal.
  for side in ("jax", "torch"):
    assert 0 < got["parity"][side]["max_abs"] < 0.5, got["parity"]
