"""Launch scripts: valid bash, and dry runs that print the commands they would run."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("tpu_pod.sh", "slurm_gpu.sh", "local_multiprocess.sh")


def _run(script, *args, **env):
  return subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args],
                        capture_output=True, text=True, timeout=60,
                        env={**os.environ, "DRY_RUN": "1", "USER": "ci", **env})


@pytest.mark.parametrize("script", SCRIPTS)
def test_bash_syntax(script):
  out = subprocess.run(["bash", "-n", os.path.join(ROOT, "launch", script)],
                       capture_output=True, text=True, timeout=30)
  assert out.returncode == 0, out.stderr


def test_tpu_pod_dry_run_prints_every_stage():
  out = _run("tpu_pod.sh", "all", "--", "--config.rl.steps=3", ACCEL="v5p-256",
             TPU_NAME="pod1", ZONE="us-east5-a")
  assert out.returncode == 0, out.stderr
  lines = [l for l in out.stdout.splitlines() if l.startswith("+ ")]
  assert "tpu-vm create pod1 --zone=us-east5-a --accelerator-type=v5p-256" in lines[0]
  assert "--version=v2-alpha-tpuv5" in lines[0]
  assert any("tpu-vm scp" in l and "--worker=all" in l for l in lines)
  run = [l for l in lines if "vapo_jax.main" in l]
  assert len(run) == 1 and "--worker=all" in run[0] and "rl.steps=3" in run[0]
  assert "tail" in lines[-1] and "--worker=0" in lines[-1]
  delete = _run("tpu_pod.sh", "delete", TPU_NAME="pod1")
  assert "tpu-vm delete pod1" in delete.stdout
  assert _run("tpu_pod.sh", "create", ACCEL="v5litepod-16").stdout.count("tpuv5-lite") == 1


def test_tpu_pod_without_a_stage_prints_help():
  out = _run("tpu_pod.sh")
  assert out.returncode == 2 and "ACCEL" in out.stdout and "DRY_RUN" in out.stdout


def test_slurm_dry_run_prints_the_batch_script():
  out = _run("slurm_gpu.sh", "--config.rl.steps=3", NODES="4", GPUS_PER_NODE="8")
  assert out.returncode == 0, out.stderr
  assert "#SBATCH --nodes=4" in out.stdout and "#SBATCH --gpus-per-node=8" in out.stdout
  assert "srun python3 -m vapo_jax.main" in out.stdout and "rl.steps=3" in out.stdout


def test_local_multiprocess_dry_run(tmp_path):
  out = _run("local_multiprocess.sh", NPROC="3", DEVICES="2", PORT="12345",
             WORKDIR=str(tmp_path))
  assert out.returncode == 0, out.stderr
  lines = [l for l in out.stdout.splitlines() if l.startswith("+ ")]
  assert len(lines) == 3
  for i, line in enumerate(lines):
    assert f"JAX_PROCESS_ID={i}" in line and "JAX_NUM_PROCESSES=3" in line
    assert "JAX_COORDINATOR_ADDRESS=127.0.0.1:12345" in line
