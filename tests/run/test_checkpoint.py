"""Checkpoints: a run killed by SIGTERM and resumed equals one that never stopped, bit for bit;
a damaged newest checkpoint falls back to the previous one; restoring onto another mesh."""

import glob
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from vapo_jax.run import checkpoint_store
from vapo_jax.run import metrics as metrics_lib
from vapo_jax import sharding as shd
from vapo_jax.run import trainer as trainer_lib
from checkpoint_runs import (Recorder, assert_bitwise_equal, compile_cache,  # noqa: F401 (fixture)
                             run_to_end, small)


def records(workdir):
  return [{k: v for k, v in r.items()
           if k != "time" and not k.startswith(("time/", "compile/", "mem/"))
           and "per_s" not in k and "seconds" not in k}
          for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.floor
def test_sigterm_resume_equals_uninterrupted_run_and_corrupt_newest_falls_back(
    tmp_path, monkeypatch):
  cfg = small()
  straight = Recorder(monkeypatch)
  want, (summary,) = run_to_end(cfg, str(tmp_path / "a"))
  assert summary["eval_after_rl"] and "preempted" not in summary
  want_seen = list(straight.seen)

  # Killed once in each stage: SFT, value pretraining, RL.
  kills = [("sft", 2), ("value_pretrain", 1), ("rl", 2)]
  killed = Recorder(monkeypatch, kill_at=kills)
  got, summaries = run_to_end(cfg, str(tmp_path / "b"))
  assert len(summaries) == 4 and all("preempted" in s for s in summaries[:3])
  assert killed.seen == want_seen              # the same prompts, none skipped or repeated
  assert_bitwise_equal(got, want)                  # parameters, both optimizer states, steps
  assert records(tmp_path / "b") == records(tmp_path / "a")  # metrics written once each
  for stage in ("sft", "value_pretrain", "rl", "eval"):
    assert glob.glob(str(tmp_path / "b" / "tensorboard" / stage / "events.*"))
  assert os.path.exists(tmp_path / "b" / trainer_lib.CRITIC_DIR / "config.json")

  # Damage the newest checkpoint of run a: the resume warns, moves it aside, uses the
  # previous one, and finishing from there gives the same result again.
  ckdir = tmp_path / "a" / "checkpoints"
  steps = sorted(int(s) for s in os.listdir(ckdir))
  assert steps == [6, 7, 8]                        # keep=3 (sft 3 + value 2 + rl 3 steps)
  for f in glob.glob(str(ckdir / "8" / "arrays" / "**"), recursive=True):
    if os.path.isfile(f):
      with open(f, "r+b") as fh:
        fh.write(b"\0garbage\0" * 8)
  t = trainer_lib.Trainer(cfg, str(tmp_path / "a"), progress=False)
  try:
    with pytest.warns(UserWarning, match="checkpoint 8 .* cannot be restored"):
      assert t.resume() == 7
    assert os.path.isdir(tmp_path / "a" / "checkpoints_corrupt" / "8")
    assert (t.ctl.stage, t.ctl.step, t.ctl.global_step) == ("rl", 2, 7)
  finally:
    t.close()
  again, _ = run_to_end(cfg, str(tmp_path / "a"))  # the last RL step, eval, final save
  assert_bitwise_equal(again, want)


def test_restore_onto_another_mesh_and_checksums(tmp_path):
  mesh8 = shd.make_mesh(1, 8, 1)
  mesh2 = shd.make_mesh(1, 2, 1, devices=jax.devices()[:2])
  tree = {"w": jax.device_put(jnp.arange(64.0).reshape(16, 4),
                              NamedSharding(mesh8, PartitionSpec("fsdp"))),
          "b": jnp.arange(3, dtype=jnp.bfloat16), "step": jnp.int32(7)}
  store = checkpoint_store.CheckpointStore(str(tmp_path / "ck"), keep=2, keep_best=True)
  store.save(1, {"s": tree}, {"note": "scored"}, score=0.5)
  for step in (2, 3, 4):
    store.save(step, {"s": tree}, {"note": step})
  store.wait()
  assert store.steps() == [1, 3, 4] and store.best_step() == 1  # newest 2 + the best
  like = {"s": {"w": jax.device_put(jnp.zeros((16, 4)), NamedSharding(mesh2, PartitionSpec())),
                "b": jnp.zeros(3, jnp.bfloat16), "step": jnp.int32(0)}}
  out = store.restore(4, like)["s"]
  assert out["w"].sharding == like["s"]["w"].sharding   # the new run's sharding, not the old
  assert_bitwise_equal(out, tree)
  assert checkpoint_store.checksums(tree) == checkpoint_store.checksums(out)
  flipped = dict(tree, w=tree["w"].at[3, 1].add(1e-3))
  assert checkpoint_store.checksums(flipped) != checkpoint_store.checksums(tree)
  with pytest.raises(checkpoint_store.CheckpointMismatch, match="'s' has other leaves"):
    store.restore(4, {"s": {"w": like["s"]["w"]}})
  with pytest.raises(checkpoint_store.CheckpointMismatch,
                     match=r"s\['w'\] is float32\[16,4\] there but float32\[16,2\] in this run"):
    store.restore(4, {"s": dict(like["s"], w=jnp.zeros((16, 2)))})
  with pytest.raises(checkpoint_store.CheckpointMismatch, match="has no 'x'"):
    store.restore(4, {"x": like["s"]})
  store.close()


# ------------------------------------------------- a checkpoint that does not fit the run
def rl_only(**overrides):
  """Straight to RL (no SFT, no value pretraining): two steps, the critic trained too."""
  return small(**{"sft.enabled": False, "value_pretrain.enabled": False, "rl.steps": 2,
                  **overrides})


@pytest.fixture(scope="module")
def stopped_in_rl(tmp_path_factory):
  """A run stopped by SIGTERM after RL step 1: checkpoints 0 (start of RL) and 1."""
  workdir = tmp_path_factory.mktemp("stopped_in_rl") / "run"
  with pytest.MonkeyPatch.context() as mp:
    Recorder(mp, kill_at=[("rl", 1)])
    t = trainer_lib.Trainer(rl_only(), str(workdir), progress=False)
    try:
      assert "preempted" in t.run()
      saved = jax.device_get({"policy": t.state.train_state("policy"),
                              "critic": t.state.train_state("critic"),
                              "key": jax.random.key_data(t.state.key)})
      saved["prompts"] = t.state.prompts.get_state()
    finally:
      t.close()
  return workdir, saved


def copy_of(run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(run, workdir)
  return workdir


def listing(workdir):
  return sorted(os.path.relpath(os.path.join(d, f), workdir)
                for d, _, files in os.walk(workdir) for f in files)


def test_changed_optimizer_chain_stops_with_one_line_and_keeps_checkpoints(
    stopped_in_rl, tmp_path):
  workdir = copy_of(stopped_in_rl[0], tmp_path)
  before = listing(workdir)
  t = trainer_lib.Trainer(rl_only(**{"optim.grad_clip": 0.0}), str(workdir), progress=False)
  try:
    with pytest.raises(checkpoint_store.CheckpointMismatch) as e:
      t.run()
  finally:
    t.close()
  msg = str(e.value)
  assert "\n" not in msg
  assert "checkpoint 1" in msg and "'policy'" in msg and ".opt_state" in msg  # what differs
  assert "optim.grad_clip=0.0 (was 1.0)" in msg                               # why
  assert "fresh --workdir" in msg and "checkpoint.restore=weights" in msg      # what to do
  assert not os.path.exists(tmp_path / "run" / "checkpoints_corrupt")
  assert listing(workdir) == before  # nothing moved, deleted or written


def test_weights_only_restore_continues_with_a_fresh_optimizer(stopped_in_rl, tmp_path):
  run, saved = stopped_in_rl
  workdir = copy_of(run, tmp_path)
  cfg = rl_only(**{"optim.grad_clip": 0.0, "checkpoint.restore": "weights"})
  t = trainer_lib.Trainer(cfg, str(workdir), progress=False)
  try:
    with pytest.warns(UserWarning, match="restored only the weights of checkpoint 1"):
      assert t.resume() == 1
    assert (t.ctl.stage, t.ctl.step, t.ctl.global_step) == ("rl", 1, 1)
    s = t.state
    assert_bitwise_equal(s.train_state("policy").params, saved["policy"].params)
    assert_bitwise_equal(s.train_state("critic").params, saved["critic"].params)
    assert_bitwise_equal(s.policy_params, saved["policy"].params)
    np.testing.assert_array_equal(jax.random.key_data(s.key), saved["key"])
    # Fresh AdamW: no updates, zero moments.
    for st in (s.train_state("policy"), s.train_state("critic")):
      assert int(st.step) == 0
      assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(st.opt_state))
    assert s.prompts.get_state() == saved["prompts"]
    summary = t.run()  # the remaining RL step with the new optimizer, then eval
    assert "preempted" not in summary and summary["eval_after_rl"]
    assert int(t.state.train_state("policy").step) > 0
  finally:
    t.close()
  assert not os.path.exists(tmp_path / "run" / "checkpoints_corrupt")


def test_weights_only_restore_still_refuses_other_weights(stopped_in_rl, tmp_path):
  workdir = copy_of(stopped_in_rl[0], tmp_path)
  cfg = rl_only(**{"model.intermediate_size": 32, "checkpoint.restore": "weights"})
  t = trainer_lib.Trainer(cfg, str(workdir), progress=False)
  try:
    with pytest.raises(checkpoint_store.CheckpointMismatch,
                       match=r"mlp.*float32\[1,64,32\] there but float32\[1,32,32\] in this run.*"
                             r"model.intermediate_size=32 \(was 64\)") as e:
      t.resume()
    assert "restore only the model weights" not in str(e.value)  # (that would not help)
  finally:
    t.close()
  assert not os.path.exists(tmp_path / "run" / "checkpoints_corrupt")


def test_iterator_settings_that_do_not_fit_are_a_mismatch(stopped_in_rl, tmp_path):
  workdir = copy_of(stopped_in_rl[0], tmp_path)
  before = listing(workdir)
  t = trainer_lib.Trainer(rl_only(**{"rl.prompts_per_step": 4}), str(workdir), progress=False)
  try:
    with pytest.raises(checkpoint_store.CheckpointMismatch,
                       match=r"batch_size=8 but this iterator has 4.*"
                             r"rl.prompts_per_step=4 \(was 8\)") as e:
      t.resume()
  finally:
    t.close()
  assert "\n" not in str(e.value)
  assert listing(workdir) == before


def test_flipped_value_is_caught_by_its_checksum_and_set_aside(tmp_path):
  tree = {"w": jnp.arange(12.0).reshape(3, 4), "n": jnp.arange(5, dtype=jnp.int32)}
  store = checkpoint_store.CheckpointStore(str(tmp_path / "ck"), keep=5, async_save=False)
  store.save(1, {"s": tree}, {"note": 1})
  store.save(2, {"s": tree}, {"note": 2})
  # Checkpoint 3: readable files whose one value differs from what its checksums say.
  flipped = dict(tree, w=tree["w"].at[1, 2].set(-7.0))
  arrays = ocp.args.StandardSave({"s": checkpoint_store._flat(flipped)})  # pylint: disable=protected-access
  meta = ocp.args.JsonSave(store.read_meta(2))
  store._manager.save(3, args=ocp.args.Composite(  # pylint: disable=protected-access
      **{checkpoint_store.ARRAYS: arrays, checkpoint_store.META: meta}))
  store.wait()
  like = {"s": jax.tree.map(jnp.zeros_like, tree)}
  with pytest.raises(checkpoint_store.CheckpointDamaged, match=r"\['w'\] does not match its "
                     "stored checksums"):
    store.restore(3, like)
  with pytest.warns(UserWarning, match="checkpoint 3 .* cannot be restored .*checksums"):
    step, out = store.restore_latest(lambda s, meta: (s, store.restore(s, like)))
  assert step == 2
  assert_bitwise_equal(out["s"], tree)
  assert store.steps() == [1, 2]
  assert os.path.isdir(tmp_path / "ck_corrupt" / "3")
  store.close()
