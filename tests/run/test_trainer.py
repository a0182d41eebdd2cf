"""The trainer: exact micro-batching, one RL step on 8 devices = 1 device, an end-to-end run."""

import functools
import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from vapo_jax.rl import batch as batch_lib
from vapo_jax.run import trainer as trainer_lib

import wandb_files
from tiny_trainer import assert_trees_close, run_rl_step, tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_one_rl_step_on_8_devices_equals_one_device():
  one = run_rl_step(tiny(**{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1}))
  eight = run_rl_step(tiny(**{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}))
  # The step did something: rewards were mixed and the parameters moved.
  assert 0 < one[2]["reward/mean"] < 1
  assert one[2]["policy_grad_norm"] > 0 and one[2]["critic_grad_norm"] > 0
  assert one[2]["reward/mean"] == eight[2]["reward/mean"]
  assert_trees_close(one[0], eight[0], atol=2e-5)
  assert_trees_close(one[1], eight[1], atol=2e-5)
  for k in ("policy_loss", "value_loss", "entropy", "adv/mean"):
    np.testing.assert_allclose(one[2][k], eight[2][k], rtol=1e-4, atol=1e-6)


def layout_base(packing):
  """The train-layout tests' config: the engine, and 4 kv heads, which 2 or 4 tensor shards
  split whole (the engine then decodes from replicas)."""
  return {"rl.packing": packing, "sampling.engine": "continuous", "sampling.slots": 8,
          "model.num_heads": 4, "model.num_kv_heads": 4}


@functools.lru_cache(maxsize=None)
def one_device(packing):
  """The train-layout tests' single-device run (shared: it is the same for each layout)."""
  return run_rl_step(tiny(**layout_base(packing),
                          **{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1}))


def assert_equals_one_device(one, eight):
  """(policy params, critic params, last RL record) of a layout equal those of one device."""
  assert 0 < one[2]["reward/mean"] < 1 and one[2]["policy_grad_norm"] > 0
  assert one[2]["reward/mean"] == eight[2]["reward/mean"]
  assert_trees_close(one[0], eight[0], atol=2e-5)
  assert_trees_close(one[1], eight[1], atol=2e-5)
  for k in ("policy_loss", "value_loss", "entropy", "adv/mean"):
    np.testing.assert_allclose(one[2][k], eight[2][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("packing", [True, False])
def test_fsdp_train_layout_on_8_devices_equals_one_device(packing):
  """mesh.train_layout="fsdp": the learners' parameters, optimizer states and passes are FSDP
  over all 8 devices (no weight dimension over `tensor` alone, rows over data x fsdp x
  tensor) while the engine decodes from its 4 tensor-parallel replicas of mesh.rules; the
  step is the one of a single device."""
  one = one_device(packing)
  cfg = tiny(**layout_base(packing), **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2,
                                        "mesh.train_layout": "fsdp"})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    assert t.parts.batch_axes == ("data", "fsdp", "tensor")
    assert t.parts.mesh is t.parts.decode_mesh  # mesh.train_tensor=0: one mesh
    t.value_pretrain()
    history = t.rl()["history"]
    policy = t.state.train_state("policy")
    specs = {str(v.sharding.spec) for v in jax.tree.leaves(policy.params)}
    specs |= {str(v.sharding.spec) for v in jax.tree.leaves(policy.opt_state)
              if hasattr(v, "sharding") and v.ndim}
    assert any("('fsdp', 'tensor')" in s for s in specs), specs   # embed over fsdp x tensor
    assert not any("'tensor')" in s and "'fsdp'" not in s for s in specs), specs
    eight = (jax.device_get(policy.params),
             jax.device_get(t.state.train_state("critic").params), history[-1])
    engine = t.parts.samplers.rollout
    assert engine.batch_axes == ("data", "fsdp") and engine.ecfg.replicas == 4
  finally:
    t.close()
  assert_equals_one_device(one, eight)


@pytest.mark.parametrize("packing", [True, False])
def test_train_tensor_mesh_on_8_devices_equals_one_device(packing):
  """mesh.train_tensor=2 on a (1, 2, 4) mesh: the learners live and run on a second mesh
  over the same 8 devices, (1, 4, 2), while the engine decodes from the 2 tensor-parallel
  replicas of the (1, 2, 4) one; the rollout moves across once per step, and value
  pretraining + one RL step are those of a single device."""
  one = one_device(packing)
  cfg = tiny(**layout_base(packing), **{"mesh.data": 1, "mesh.fsdp": 2, "mesh.tensor": 4,
                                        "mesh.train_tensor": 2})
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    p = t.parts
    assert dict(p.decode_mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    assert dict(p.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert list(p.mesh.devices.flat) == list(p.decode_mesh.devices.flat)
    t.value_pretrain()
    history = t.rl()["history"]
    policy, critic = t.state.train_state("policy"), t.state.train_state("critic")
    for leaf in jax.tree.leaves((policy.params, critic.params)):
      assert dict(leaf.sharding.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    specs = {str(v.sharding.spec) for v in jax.tree.leaves(policy.params)}
    assert any("'tensor'" in s for s in specs), specs  # tensor-parallel over 2, not FSDP only
    eight = (jax.device_get(policy.params), jax.device_get(critic.params), history[-1])
    engine = p.samplers.rollout
    assert engine.mesh is p.decode_mesh and engine.ecfg.replicas == 2
    # The rollout batch the passes read moved to the train mesh (rows over its 4 fsdp).
    batch, _ = t.experience(next(t.state.prompts))
    rows = batch_lib.batch_sharding(p.mesh, p.batch_axes)
    for leaf in jax.tree.leaves(batch):
      assert leaf.sharding.is_equivalent_to(rows, leaf.ndim), leaf.sharding
  finally:
    t.close()
  assert_equals_one_device(one, eight)


@pytest.mark.parametrize("packing", [False, True])
def test_micro_batches_do_not_change_the_update(packing):
  # Padded: micro-batches of rows. Packed: rl.micro_batch_size sets the token budget, so the
  # plans differ (K = 1 vs 4 micro-batches per mini-batch) and the sums run in another
  # order; Adam's first step turns a float-noise difference of a near-zero gradient into up
  # to a few 1e-6 (as on 8 devices vs 1 below). Padded: 1.8e-6 on jax 0.12 once a sharding
  # constraint before the final norm changed the fusion, so 5e-6 there.
  whole = run_rl_step(tiny(**{"rl.micro_batch_size": 0, "rl.packing": packing}))
  micro = run_rl_step(tiny(**{"rl.micro_batch_size": 2, "rl.packing": packing}))
  atol = 2e-5 if packing else 5e-6
  assert_trees_close(whole[0], micro[0], atol=atol)
  assert_trees_close(whole[1], micro[1], atol=atol)
  np.testing.assert_allclose(whole[2]["policy_loss"], micro[2]["policy_loss"], rtol=1e-5)
  if packing:
    assert whole[2]["policy_grad_norm"] == pytest.approx(micro[2]["policy_grad_norm"], rel=1e-5)


def test_packing_row_steps_run_shorter_rows_and_the_same_update(capsys):
  """rl.packing_row_steps in the trainer: its plan runs rows of 32 of P + R = 40 (the plan's
  row length in the metrics; the pass announced its 4 programs, one per row length), with
  fewer computed tokens, and the update is the one-length plan's to float noise (another
  summation order, as above)."""
  one = run_rl_step(tiny(**{"rl.packing": True}))
  capsys.readouterr()
  steps = run_rl_step(tiny(**{"rl.packing": True, "rl.packing_row_steps": 4}))
  printed = capsys.readouterr().out
  assert "[compile] policy: 4 programs" in printed, printed
  assert steps[2]["perf/policy_row_len"] == 32
  assert steps[2]["perf/policy_token_efficiency"] > one[2]["perf/policy_token_efficiency"]
  assert_trees_close(one[0], steps[0], atol=2e-5)
  assert_trees_close(one[1], steps[1], atol=2e-5)
  np.testing.assert_allclose(one[2]["policy_loss"], steps[2]["policy_loss"], rtol=1e-5)


def test_positive_nll_switch():
  with_nll = run_rl_step(tiny(**{"rl.nll_coef": 0.5}))[2]
  without = run_rl_step(tiny(**{"rl.nll_coef": 0.0}))[2]
  assert with_nll["nll_loss"] > 0
  np.testing.assert_allclose(without["policy_loss"], without["pg_loss"], rtol=1e-6)
  assert abs(with_nll["policy_loss"] - with_nll["pg_loss"] - 0.5 * with_nll["nll_loss"]) < 1e-4


@pytest.mark.floor
def test_main_runs_end_to_end(tmp_path):
  cmd = [sys.executable, "-m", "vapo_jax.main", "--config=configs/tiny.py",
         f"--workdir={tmp_path}", "--noprogress", "--config.sft.steps=8",
         "--config.value_pretrain.max_steps=1", "--config.value_pretrain.min_steps=1",
         "--config.rl.steps=2", "--config.eval.num_examples=64",
         "--config.data.num_train=256", "--config.data.num_eval=64"]
  wandb = importlib.util.find_spec("wandb") is not None  # the test extra has it
  if wandb:  # the same run also logs to W&B, offline (no account, no network)
    cmd += ["--config.metrics.wandb=True", "--config.metrics.wandb_name=e2e"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "XLA_FLAGS": "", "WANDB_MODE": "offline",
                            "WANDB_SILENT": "true"})
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads(out.stdout[out.stdout.index("{"):])
  assert {"eval_before_rl", "eval_after_rl", "sft", "value_pretrain"} <= set(summary)
  stages = [json.loads(l)["stage"] for l in open(tmp_path / "metrics.jsonl")]
  assert stages.count("rl") == 2 and stages.count("sft") == 8
  if wandb:
    run = wandb_files.offline_run(str(tmp_path))
    assert run["name"] == "e2e"
    assert [h["rl/step"] for h in run["history"] if "rl/step" in h] == [1, 2]
    assert sum("sft/step" in h for h in run["history"]) == 8


def test_bad_config_fails_before_compiling():
  out = subprocess.run([sys.executable, "-m", "vapo_jax.main", "--config=configs/tiny.py",
                        "--config.rl.eps_high=-1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode != 0
  assert "config.rl.eps_high=-1.0: must be >= 0" in out.stderr
