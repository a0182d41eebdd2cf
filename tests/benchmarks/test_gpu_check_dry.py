"""benchmarks/gpu_check.sh, the first accelerator session's one prepared call, dry-run on this
CPU (GPU_CHECK_DRY=1): its wiring (the package smoke test, the machine's report, the
efficiency calibration at toy shapes and the step model at the measured HFU) runs, and
bench.json records each stage's status as it ends. The stages that the rest of the suite
already runs on the CPU (the model tests, the tiny config, the benchmarks' small shapes, the
real model beside TRL) are skipped here."""

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COVERED = ("real_model pytest pytest_default_precision tiny bench_train bench_sample "
           "bench_engine longcot")


def test_the_dry_run_passes_its_own_stages(tmp_path):
  env = {**os.environ, "GPU_CHECK_DRY": "1", "OUT": str(tmp_path),
         "GPU_CHECK_SKIP": COVERED, "GPU_CHECK_BUDGET": "560", "PYTHONPATH": ROOT}
  env.pop("JAX_PLATFORMS", None)   # the script sets it for a dry run, as a user's shell would not
  out = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  with open(tmp_path / "bench.json", encoding="utf-8") as f:
    steps = json.load(f)["steps"]
  for name in ("smoke", "env", "calibrate", "calibrate_step_model"):
    assert steps.get(name, {}).get("status") == "ok", (name, steps, out.stdout[-3000:])
  for name in COVERED.split():
    assert steps[name]["status"] == "skipped"
  with open(tmp_path / "calibrate_train.json", encoding="utf-8") as f:
    assert json.load(f)["stages"]
  text = (tmp_path / "step_model_measured.txt").read_text()
  assert "efficiency: MEASURED, not assumed: --hfu=" in text and text.count("ratio") >= 3
