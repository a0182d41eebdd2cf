"""Faults: a NaN gradient skips its update (counted, training goes on); too many in a row stop
the run with a clear message and its checkpoints intact."""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.run import control as run_control
from vapo_jax.rl import train_state
from vapo_jax.run import trainer as trainer_lib
from checkpoint_runs import compile_cache, small  # noqa: F401 (fixture)


def poison(monkeypatch, calls):
  """Makes the advantages of the rollouts numbered in `calls` NaN (0 = first rollout)."""
  experience = trainer_lib.Trainer.experience
  count = [0]

  def patched(trainer, examples, **kw):
    batch, metrics = experience(trainer, examples, **kw)
    if count[0] in calls:
      batch = dataclasses.replace(batch, advantages_BxR=batch.advantages_BxR * jnp.nan)
    count[0] += 1
    return batch, metrics

  monkeypatch.setattr(trainer_lib.Trainer, "experience", patched)


def test_skip_keeps_state_bit_for_bit():
  """The jitted step drops a non-finite update: same params, optimizer state and step."""
  tx = train_state.make_optimizer(1e-2, warmup_steps=0, weight_decay=0.01, b1=0.9, b2=0.95,
                                  eps=1e-8, grad_clip=1.0)
  params = {"w": jnp.arange(4.0)}
  state = train_state.init_state(jax.device_put(params, jax.sharding.NamedSharding(
      jax.sharding.Mesh(jax.devices()[:1], ("d",)), jax.sharding.PartitionSpec())), tx)
  apply = jax.jit(functools.partial(train_state.apply_update, tx))
  good, norm, skipped = apply(state, {"w": jnp.ones(4)}, jnp.float32(1.0))
  assert float(skipped) == 0 and int(good.step) == 1 and float(norm) == 2.0
  for bad_grad, loss in (({"w": jnp.array([1.0, jnp.nan, 0, 0])}, 1.0),
                         ({"w": jnp.ones(4)}, jnp.inf)):
    out, norm, skipped = apply(good, bad_grad, jnp.float32(loss))
    assert float(skipped) == 1 and int(out.step) == 1
    for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(good)):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_nan_gradient_is_skipped_counted_and_training_continues(monkeypatch):
  cfg = small(**{"sft.enabled": False, "faults.max_consecutive_nonfinite": 3})
  poison(monkeypatch, calls={2})  # value pretraining uses rollouts 0, 1; RL step 1 is 2
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    t.value_pretrain()
    history = t.rl()["history"]
  finally:
    t.close()
  skipped = [h["nonfinite/skipped_updates"] for h in history]
  assert skipped == [2.0, 0.0, 0.0]                 # both mini-batch policy updates of step 1
  assert history[-1]["nonfinite/skipped_total"] == 2.0
  assert not np.isfinite(history[0]["policy_grad_norm"])
  assert int(t.state.train_state("policy").step) == 4
  assert int(t.state.train_state("critic").step) == 2 * 2 + 3 * 2
  for x in jax.tree.leaves(jax.device_get(t.state.train_state("policy"))):
    assert np.all(np.isfinite(np.asarray(x)))


def test_many_nonfinite_in_a_row_stop_with_checkpoint_intact(tmp_path, monkeypatch):
  cfg = small(**{"sft.enabled": False, "faults.max_consecutive_nonfinite": 3,
                 "checkpoint.every": 1})
  poison(monkeypatch, calls={2, 3, 4})
  t = trainer_lib.Trainer(cfg, str(tmp_path), progress=False)
  try:
    with pytest.raises(run_control.NonFiniteError, match="3 updates in a row had a NaN"):
      t.run()
  finally:
    t.close()
  # RL step 1 skipped 2 updates (saved at global step 3), step 2's first update was the 3rd.
  ckdir = os.path.join(tmp_path, "checkpoints")
  assert sorted(int(s) for s in os.listdir(ckdir)) == [1, 2, 3]
  t = trainer_lib.Trainer(cfg, str(tmp_path), progress=False)
  try:
    assert t.resume() == 3 and t.ctl.skipped_in_a_row == 2
  finally:
    t.close()
