"""benchmarks/quiet.py --peaks: this machine's matmul and copy peaks, the figures to quote
beside a run's time (docs/speed.md), and sampler_bench's roofline built on them."""

import json
import os
import subprocess
import sys

from benchmarks import quiet
from benchmarks import sampler_bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_peaks_command_prints_and_writes_them(tmp_path):
  path = tmp_path / "peaks.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0"}
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "quiet.py"), "--peaks",
                        "--reps=2", f"--json={path}"], env=env, check=True,
                       capture_output=True, text=True, timeout=300).stdout
  assert "GFLOP/s float32 matmul" in out and "GB/s copy" in out
  assert "GFLOP/s bfloat16 matmul" in out
  data = json.loads(path.read_text())
  got = data["results"]
  # Any machine this runs on: more than 1 GFLOP/s and 0.5 GB/s, less than 1e15 FLOP/s.
  assert 1e9 < got["flops_peak"] < 1e15 and 5e8 < got["bw_peak"] < 1e14, got
  assert 1e8 < got["bf16_flops_peak"] < 1e16, got
  assert isinstance(data["machine"]["cpu_flags"], list) and data["machine"]["cpu"]


def test_roofline_is_the_max_of_compute_and_bytes():
  """The small preset's bound moves with each peak where that peak binds, and never below
  either the compute or the weight-bytes floor alone."""
  p = sampler_bench.PRESETS["small"]
  base = sampler_bench.roofline_seconds(p, 2e11, 2e10)
  assert sampler_bench.roofline_seconds(p, 1e11, 2e10) > base   # slower matmul: slower bound
  assert sampler_bench.roofline_seconds(p, 2e11, 1e10) > base   # slower copy: slower bound
  assert sampler_bench.roofline_seconds(p, 1e30, 1e30) < base * 1e-6
  assert quiet.describe_peaks(2e11, 2e10) == "200 GFLOP/s float32 matmul, 20.0 GB/s copy"
  assert quiet.describe_peaks(2e11, 2e10, 4e11).endswith(
      "400 GFLOP/s bfloat16 matmul (float32 accumulate)")


# Two logical CPUs of a /proc/cpuinfo (trimmed; real field names and spacing).
_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
physical id\t: 0
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
bogomips\t: 5199.99

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
physical id\t: 0
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
"""


def test_parse_cpuinfo_reads_model_flags_and_counts():
  got = quiet.parse_cpuinfo(_CPUINFO)
  assert got == {"model": "AMD EPYC 9B14",
                 "flags": ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"],
                 "logical_cpus": 2, "sockets": 1}
  amx = _CPUINFO.replace("model name\t: AMD EPYC 9B14", "model name\t: Intel(R) Xeon(R)")
  amx = amx.replace("avx512_vnni", "avx512_vnni amx_tile amx_bf16 amx_int8")
  assert quiet.parse_cpuinfo(amx)["flags"][-3:] == ["amx_tile", "amx_bf16", "amx_int8"]
  assert quiet.parse_cpuinfo("") == {"model": "", "flags": [], "logical_cpus": 0,
                                     "sockets": None}


def test_machine_facts_name_the_cpu_from_cpuinfo(monkeypatch):
  monkeypatch.setattr(quiet, "cpu_info", lambda: quiet.parse_cpuinfo(_CPUINFO))
  facts = quiet.machine_facts()
  assert facts["cpu"] == "AMD EPYC 9B14" and "avx512_bf16" in facts["cpu_flags"]
  monkeypatch.setattr(quiet, "cpu_info", dict)  # no /proc/cpuinfo: platform's name
  assert quiet.machine_facts()["cpu"] and quiet.machine_facts()["cpu_flags"] == []
