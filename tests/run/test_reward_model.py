"""The reward-model stage and the critic's three starts (policy, reward_model, path)."""

import json
import os
import subprocess
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import losses
from vapo_jax.models import Transformer, tiny_config
from vapo_jax.run import control as run_control
from vapo_jax.run import trainer as trainer_lib
from tiny_trainer import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

P = 4


def test_last_token_value_is_the_whole_response_state():
  """critic(...)[P + l − 1] of a padded row = the critic's last output on the bare sequence."""
  policy = Transformer(tiny_config(), rngs=nnx.Rngs(0))
  critic = critic_lib.Critic.from_policy(policy, head_scale=1.0)
  rng = np.random.RandomState(0)
  tokens = rng.randint(1, 40, (3, P + 5)).astype(np.int32)
  mask = np.ones((3, P + 5), np.int32)
  mask[1, :2] = 0       # a short prompt (left padding)
  mask[0, P + 3:] = 0   # responses of 3, 5 and 1 tokens (right padding)
  mask[2, P + 1:] = 0
  lengths = mask[:, P:].sum(1)
  got = np.asarray(critic_lib.last_token_values(critic, jnp.asarray(tokens), jnp.asarray(mask),
                                                P, jnp.asarray(lengths)))
  for b in range(3):
    real = tokens[b][mask[b] > 0][None]
    want = critic(jnp.asarray(real), jnp.ones_like(jnp.asarray(real)))[0, -1]
    np.testing.assert_allclose(got[b], want, rtol=1e-5, atol=1e-6)
  assert np.abs(got).max() > 0  # a non-zero head: the test can tell positions apart


def test_outcome_loss_by_hand():
  out = losses.outcome_loss(jnp.array([0.5, 0.25, 3.0, 1.0]), jnp.array([1.0, 0.0, 0.0, 1.0]),
                            jnp.array([True, True, False, True]))
  np.testing.assert_allclose(out.total, 0.5 * (0.25 + 0.0625 + 0.0))
  assert float(out.count) == 3.0
  g = jax.grad(lambda p: losses.outcome_loss(p, jnp.array([1.0, 0.0]),
                                             jnp.array([1.0, 1.0])).value)(jnp.array([0.5, 2.0]))
  np.testing.assert_allclose(g, [(0.5 - 1) / 2, 2.0 / 2])  # (r̂ − r) / count


def test_critic_start_settings_and_stage_order():
  c = config_lib.default_config_dict()
  c.sft.update(enabled=True, steps=1)
  c.model.critic_start = "reward_model"
  cfg = config_lib.from_config_dict(c)
  assert run_control.stages_of(cfg) == ["sft", "reward_model", "value_pretrain", "rl", "done"]
  for preset in ("ppo", "no_value_pretrain"):
    c = config_lib.apply_preset(config_lib.default_config_dict(), preset)
    cfg = config_lib.from_config_dict(c)
    assert cfg.model.critic_start == "reward_model"
    assert run_control.stages_of(cfg) == ["reward_model", "rl", "done"]
  c = config_lib.default_config_dict()
  c.model.critic_start = "path"
  with pytest.raises(config_lib.ConfigError, match="model.critic_path is set"):
    config_lib.from_config_dict(c)
  c.model.critic_start, c.model.critic_path = "policy", "/some/critic"
  with pytest.raises(config_lib.ConfigError, match="model.critic_start"):
    config_lib.from_config_dict(c)
  c.model.critic_start = "value_model"
  with pytest.raises(config_lib.ConfigError, match='"policy", "reward_model" or "path"'):
    config_lib.from_config_dict(c)


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def rm_config(**overrides):
  base = {"model.critic_start": "reward_model", "reward_model.steps": 2,
          "value_pretrain.enabled": False, "rl.steps": 0, "checkpoint.every": 1,
          "checkpoint.keep": 5, "checkpoint.async_save": False, "metrics.plot": False,
          "metrics.tensorboard": False, "eval.num_examples": 4, "eval.samples_per_problem": 1,
          "eval.batch_prompts": 4, "rl.prompts_per_step": 4, "rl.responses_per_prompt": 4,
          "reward.fn": "trainer_plugins:problem_parity", "mesh.fsdp": 1}
  return tiny(**{**base, **overrides})


def test_reward_model_stage_starts_the_critic_and_resumes(tmp_path):
  workdir = str(tmp_path / "run")
  cfg = rm_config()
  t = trainer_lib.Trainer(cfg, workdir, progress=False)
  try:
    summary = t.run()
    critic = leaves(t.state.train_state("critic").params)
    policy = leaves(t.state.policy_params)
  finally:
    t.close()
  rm = summary["reward_model"]
  assert rm["rm_loss"] > 0 and rm["rm_grad_norm"] > 0
  records = [json.loads(x) for x in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records if r["stage"] == "reward_model"] == [1, 2]
  # The critic is the trained RM: the HF directory the stage wrote holds the same weights,
  # its head is no longer zero and its backbone moved away from the policy's.
  saved, _ = critic_lib.Critic.from_pretrained(os.path.join(workdir, "reward_model"))
  for a, b in zip(critic, leaves(nnx.state(saved, nnx.Param))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  head = np.asarray(saved.score[...])
  assert np.abs(head).max() > 0
  backbone = leaves(nnx.state(saved.backbone, nnx.Param))
  assert max(float(np.abs(a - b).max()) for a, b in zip(backbone, policy)) > 0

  # Resumed after RM step 1: the second step comes out as in the run that never stopped.
  t = trainer_lib.Trainer(cfg, workdir, progress=False)
  try:
    assert t.resume(1) == 1 and t.ctl.stage == "reward_model" and t.ctl.step == 1
    again = t.reward_model()
  finally:
    t.close()
  np.testing.assert_allclose(again["rm_loss"], rm["rm_loss"], rtol=1e-5)

  # A critic_start="path" run from that directory starts from the same weights; a "policy"
  # run starts from the policy's weights and a zero head.
  path = tiny(**{"model.critic_start": "path",
                 "model.critic_path": os.path.join(workdir, "reward_model"), "mesh.fsdp": 1})
  plain = tiny(**{"mesh.fsdp": 1})
  for c, check in ((path, "rm"), (plain, "policy")):
    t = trainer_lib.Trainer(c, progress=False)
    try:
      got = t.setup("critic").params
      if check == "rm":
        for a, b in zip(leaves(got), critic):
          np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
      else:
        assert np.all(np.asarray(got["score"][...]) == 0)
        for a, b in zip(leaves(got["backbone"]), leaves(t.state.policy_params)):
          np.testing.assert_array_equal(a, b)
    finally:
      t.close()


def test_ppo_preset_runs_the_reward_model_stage_end_to_end(tmp_path):
  cmd = [sys.executable, "-m", "vapo_jax.main", "--config=configs/tiny.py:ppo",
         f"--workdir={tmp_path}", "--noprogress", "--config.sft.steps=2",
         "--config.reward_model.steps=2", "--config.rl.steps=1",
         "--config.rl.prompts_per_step=8", "--config.eval.num_examples=8",
         "--config.eval.batch_prompts=8", "--config.data.num_train=64",
         "--config.data.num_eval=8", "--config.metrics.plot=False"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "XLA_FLAGS": ""})
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads(out.stdout[out.stdout.index("{"):])
  assert "reward_model" in summary and "value_pretrain" not in summary
  stages = [json.loads(x)["stage"] for x in open(tmp_path / "metrics.jsonl")]
  assert stages.count("sft") == 2 and stages.count("reward_model") == 2
  assert stages.count("rl") == 1
  assert os.path.isfile(tmp_path / "reward_model" / "config.json")
