"""The critic's levers (issue 53, item 2), each a config switch: a head bias and the head's own
learning rate, full fine-tuning beside LoRA, the return scale (rewards mapped, targets
standardised and un-standardised for GAE), value pretraining over reused rollouts with a
held-out stop rule, auto-sized α, and the critic's diagnostics."""

import dataclasses
import warnings

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import losses
from vapo_jax import sharding as shd
from vapo_jax.models import lora, transformer
from vapo_jax.models.config import LORA_TARGETS, tiny_config
from vapo_jax.rl import advantages
from vapo_jax.rl import train_state
from vapo_jax.run import critic_diagnostics as diag
from vapo_jax.run import critic_stage
from vapo_jax.run import learners
from vapo_jax.run import metrics as metrics_lib
from vapo_jax.run import forwards
from vapo_jax.run import trainer as trainer_lib

import tiny_trainer


def tiny(**overrides):
  """test_trainer's tiny config; dotted overrides may go two sections deep (model.lora.*)."""
  flat = {k: v for k, v in overrides.items() if k.count(".") == 1}
  cfg = tiny_trainer.tiny(**flat)
  if len(flat) == len(overrides):
    return cfg
  c = config_lib.default_config_dict()
  c.update(config_lib.to_dict(cfg))
  for dotted, value in overrides.items():
    *path, name = dotted.split(".")
    node = c
    for p in path:
      node = node[p]
    node[name] = value
  return config_lib.from_config_dict(c)


def lora_critic(head_bias=True):
  """(graphdef, params) of a tiny LoRA critic with a random head."""
  cfg = tiny_config(vocab_size=40, lora_rank=2, lora_alpha=4.0, lora_targets=LORA_TARGETS)
  mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  base = transformer.Transformer(lora.base_config(cfg), rngs=nnx.Rngs(0))
  policy = lora.attach(base, cfg, mesh, seed=1)
  critic = critic_lib.critic_type(head_bias).from_policy(policy, head_scale=1.0)
  graphdef, params = nnx.split(critic)
  on_mesh = NamedSharding(mesh, PartitionSpec())
  return graphdef, jax.tree.map(lambda x: jax.device_put(x, on_mesh), params)


def one_update(cfg, params):
  """params after one optimizer update of the critic's AdamW with all-ones gradients."""
  tx = learners.optimizer(cfg, "critic")
  state = train_state.init_state(params, tx)
  grads = jax.tree.map(jnp.ones_like, train_state.trainable(params))
  state, _, skipped = train_state.apply_update(tx, state, grads, jnp.float32(1.0))
  assert float(skipped) == 0
  return state.params


def leaf(params, *path):
  for p in path:
    params = params[p]
  return np.asarray(params[...] if hasattr(params, "__getitem__") and not isinstance(
      params, (dict, nnx.State)) else params)


# ------------------------------------------------------------------- a. head bias and lr


def test_head_bias_is_a_trainable_parameter_and_round_trips_hf(tmp_path):
  graphdef, params = lora_critic()
  trainable, frozen = lora.split_trainable(params)
  assert "score_bias" in trainable and "score" in trainable and frozen is not None
  critic = nnx.merge(graphdef, params)
  critic.score_bias[...] = jnp.float32(0.25)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 40, (2, 7)), jnp.int32)
  mask = jnp.ones((2, 7), jnp.float32)
  with_b = critic(tokens, mask)
  hidden = critic.backbone(tokens, transformer.positions_from_mask(mask.astype(jnp.int32)),
                           mask.astype(jnp.int32))[0]
  np.testing.assert_allclose(np.asarray(with_b), np.einsum(
      "btd,d->bt", np.asarray(hidden, np.float64), np.asarray(critic.score[...])) + 0.25,
      atol=1e-5)
  # A critic of standardised targets saved in units of the returns: V = σ·v + μ.
  stats = critic_lib.ReturnStats(weight=0.5, mean=0.2, sq=0.5 * (0.4 ** 2 + 0.4 ** 2))
  folded = critic_lib.in_return_units(critic, stats)
  np.testing.assert_allclose(np.asarray(folded(tokens, mask)),
                             0.4 * np.asarray(with_b) + 0.4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(critic(tokens, mask)), np.asarray(with_b))
  critic_lib.save_pretrained(critic, str(tmp_path / "c"))
  back, _ = critic_lib.CriticWithBias.from_pretrained(str(tmp_path / "c"))
  assert float(back.score_bias[...]) == pytest.approx(0.25)
  np.testing.assert_allclose(np.asarray(back(tokens, mask)), np.asarray(with_b), atol=1e-5)


def test_head_lr_zero_freezes_the_head_while_lora_moves():
  graphdef, params = lora_critic()
  cfg = tiny(**{"optim.critic_lr": 1e-2, "optim.critic_head_lr": 0.0})
  new = one_update(cfg, params)
  old_t, new_t = lora.split_trainable(params)[0], lora.split_trainable(new)[0]
  for name in ("score", "score_bias"):
    np.testing.assert_array_equal(np.asarray(new_t[name][...]), np.asarray(old_t[name][...]))
  moved = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
           zip(jax.tree.leaves(old_t["backbone"]), jax.tree.leaves(new_t["backbone"]))]
  assert moved and all(moved)  # every adapter moved


def test_head_lr_applies_to_the_head_only():
  graphdef, params = lora_critic()
  del graphdef
  cfg = tiny(**{"optim.critic_lr": 0.0, "optim.critic_head_lr": 1e-2,
                "optim.weight_decay": 0.0})
  new = one_update(cfg, params)
  old_t, new_t = lora.split_trainable(params)[0], lora.split_trainable(new)[0]
  for a, b in zip(jax.tree.leaves(old_t["backbone"]), jax.tree.leaves(new_t["backbone"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Adam's first step moves each head entry by ≈ lr (sign of the gradient, here +1).
  np.testing.assert_allclose(np.asarray(old_t["score"][...]) - np.asarray(new_t["score"][...]),
                             1e-2, rtol=1e-4)
  assert float(old_t["score_bias"][...]) - float(new_t["score_bias"][...]) == pytest.approx(
      1e-2, rel=1e-4)


def test_default_is_one_adamw_as_before():
  cfg = tiny()
  assert learners.value_head_lr(cfg) is None
  _, params = lora_critic(head_bias=False)
  tx = learners.optimizer(cfg, "critic")
  ref = train_state.make_optimizer(cfg.optim.critic_lr, warmup_steps=cfg.optim.warmup_steps,
                                   weight_decay=cfg.optim.weight_decay,
                                   b1=cfg.optim.b1, b2=cfg.optim.b2, eps=cfg.optim.eps,
                                   grad_clip=cfg.optim.grad_clip)
  p = train_state.trainable(params)
  assert (jax.tree.structure(jax.eval_shape(tx.init, p))
          == jax.tree.structure(jax.eval_shape(ref.init, p)))


# ------------------------------------------------------------------------- b. return scale


def gae_reference(rewards, values, mask, lam):
  """Float64 GAE, γ = 1, one response at a time."""
  adv = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    last = 0.0
    n = int(mask[b].sum())
    for t in reversed(range(n)):
      v_next = values[b, t + 1] if t + 1 < n else 0.0
      delta = rewards[b, t] + v_next - values[b, t]
      last = delta + lam[b] * last
      adv[b, t] = last
  return adv


def test_standardised_values_are_unstandardised_for_gae_float64():
  rng = np.random.default_rng(0)
  b, r = 6, 9
  lengths = np.array([9, 5, 1, 7, 3, 8])
  mask = (np.arange(r)[None] < lengths[:, None]).astype(np.float32)
  scores = rng.integers(0, 2, b).astype(np.float32)
  stats = critic_lib.ReturnStats()
  for _ in range(3):  # some batches' statistics
    stats = critic_lib.update_stats(stats, rng.normal(0.3, 0.5, (b, r)), mask, 0.9)
  mu, sigma = stats.scale()
  raw = rng.normal(size=(b, r)).astype(np.float32) * mask  # the critic's outputs v

  def values_fn(params, tokens, m, *, prompt_len):
    del params, tokens, m, prompt_len
    return jnp.asarray(raw)

  p = 4
  tokens = jnp.zeros((b, p + r), jnp.int32)
  mask_l = jnp.concatenate([jnp.ones((b, p)), jnp.asarray(mask)], axis=1)
  values = critic_stage.bound_values(values_fn, None, stats, tokens, mask_l, p)
  v64 = (sigma * raw.astype(np.float64) + mu) * mask
  np.testing.assert_allclose(np.asarray(values), v64, atol=1e-5)
  ac = forwards.advantage_config(tiny(**{"rl.whiten_advantages": False}))
  out = advantages.compute_advantages(ac, jnp.asarray(scores), jnp.asarray(lengths),
                                      jnp.asarray(mask), values, jnp.arange(b) // 2)
  rewards = np.zeros((b, r))
  rewards[np.arange(b), lengths - 1] = scores
  lam = np.clip(1 - 1 / (ac.alpha * lengths), 0, 1)
  np.testing.assert_allclose(np.asarray(out.advantages_BxR),
                             gae_reference(rewards, v64, mask, lam) * mask, atol=1e-5)
  # Round trip: the critic's outputs back from V, and targets into the critic's units.
  np.testing.assert_allclose(np.asarray(critic_lib.standardise(values, mask, stats)), raw,
                             atol=1e-5)
  ret = np.asarray(out.returns_BxR, np.float64)
  np.testing.assert_allclose(np.asarray(critic_lib.unstandardise(
      critic_lib.standardise(ret, mask, stats), mask, stats)), ret * mask, atol=1e-5)


def test_return_stats_are_bias_corrected_emas():
  rng = np.random.default_rng(1)
  mask = np.ones((4, 5), np.float32)
  mask[0, 3:] = 0
  batches = [rng.normal(k, 1 + k, (4, 5)) for k in range(3)]
  stats = critic_lib.ReturnStats()
  assert stats.scale() == (0.0, 1.0)
  d = 0.7
  for x in batches:
    stats = critic_lib.update_stats(stats, x, mask, d)
  means = [float((x * mask).sum() / mask.sum()) for x in batches]
  sqs = [float((x * x * mask).sum() / mask.sum()) for x in batches]
  w = [(1 - d) * d ** (2 - k) for k in range(3)]
  mu = np.dot(w, means) / sum(w)
  sigma = np.sqrt(np.dot(w, sqs) / sum(w) - mu ** 2)
  np.testing.assert_allclose(stats.scale(), (mu, sigma), rtol=1e-5)


def test_reward_scale_maps_rewards_to_pm1():
  ac = forwards.advantage_config(tiny(**{"rl.reward_scale": 2.0, "rl.reward_shift": -1.0}))
  plain = dataclasses.replace(ac, reward_scale=1.0, reward_shift=0.0)
  scores = jnp.asarray([0.0, 1.0, 1.0, 0.0])
  lengths = jnp.asarray([3, 2, 4, 1])
  mask = (jnp.arange(4)[None] < lengths[:, None]).astype(jnp.float32)
  values = jnp.zeros((4, 4))
  a = advantages.compute_advantages(ac, scores, lengths, mask, values, jnp.arange(4) // 2)
  b = advantages.compute_advantages(plain, 2 * scores - 1, lengths, mask, values,
                                    jnp.arange(4) // 2)
  np.testing.assert_array_equal(np.asarray(a.returns_BxR), np.asarray(b.returns_BxR))
  assert set(np.unique(np.asarray(a.returns_BxR)[np.asarray(mask) > 0])) == {-1.0, 1.0}


# ---------------------------------------------------------------------------- e. α sizing


def test_alpha_auto_and_explicit_and_the_short_horizon_warning():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    cfg = tiny(**{"rl.alpha": 0.0, "sampling.max_new_tokens": 48})
  assert cfg.alpha == pytest.approx(32 / 48)
  assert forwards.advantage_config(cfg).alpha == pytest.approx(32 / 48)
  assert config_lib.auto_alpha(20480) == 0.05  # the paper's α at its lengths
  assert tiny(**{"rl.alpha": 0.3}).alpha == 0.3
  with pytest.warns(UserWarning, match="rl.alpha=0.05"):
    tiny(**{"rl.alpha": 0.05, "sampling.max_new_tokens": 128})
  with pytest.raises(config_lib.ConfigError, match="rl.alpha"):
    tiny(**{"rl.alpha": -1.0})


def test_new_switches_are_checked():
  for bad in ({"rl.value_norm": "batch"}, {"value_pretrain.replay_batches": 0},
              {"value_pretrain.epochs": -1}, {"optim.critic_head_lr": -0.5},
              {"value_pretrain.replay_batches": 2, "rl.value_clip": 0.2},
              {"rl.value_norm_decay": 1.0}, {"value_pretrain.heldout_batches": 0}):
    with pytest.raises(config_lib.ConfigError, match=list(bad)[0]):
      tiny(**bad)


# --------------------------------------------------------------------------- f. diagnostics


def test_diagnostics_against_references():
  from scipy import stats as sps  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(2)
  b, r = 8, 10
  lengths = rng.integers(1, r + 1, b)
  mask = (np.arange(r)[None] < lengths[:, None]).astype(np.float32)
  ret = rng.normal(size=(b, r)) * mask
  val = rng.normal(size=(b, r)) * mask
  np.testing.assert_allclose(diag.pooled_ev(diag.ev_sums(val, ret, mask)),
                             float(losses.explained_variance(val, ret, mask)), atol=1e-5)
  halves = np.concatenate([diag.ev_sums(val[:4], ret[:4], mask[:4]),
                           diag.ev_sums(val[4:], ret[4:], mask[4:])])
  assert diag.pooled_ev(halves) == pytest.approx(diag.pooled_ev(diag.ev_sums(val, ret, mask)))
  scores = rng.integers(0, 2, b).astype(float)
  v0 = val[:, 0].reshape(-1, 2).mean(1)
  rho = sps.spearmanr(v0, scores.reshape(-1, 2).mean(1)).statistic
  assert diag.prompt_spearman(val, scores, 2) == pytest.approx(rho)
  out = diag.half_evs(val, ret, mask)
  first = mask * (np.arange(r)[None] < lengths[:, None] / 2)
  m1 = first > 0
  d = (ret - val)[m1]
  assert out["ev_first_half"] == pytest.approx(1 - d.var() / ret[m1].var())


# --------------------------------------------- c, d, f: value pretraining in a tiny run


def run_value_pretraining(monkeypatch, **overrides):
  cfg = tiny(**{"value_pretrain.max_steps": 3, "value_pretrain.min_steps": 3, **overrides})
  t = trainer_lib.Trainer(cfg, progress=False)
  seen = []  # per step: (the batch updated on, its loop)
  update = t.update

  def recording(batch, **kw):
    seen.append((jax.device_get(batch.tokens_BxL), kw.get("loop")))
    return update(batch, **kw)

  monkeypatch.setattr(t, "update", recording)
  rows = []
  experience = t.experience

  def drawing(examples, **kw):
    batch, em = experience(examples, **kw)
    rows.append((jax.device_get(batch.tokens_BxL), jax.device_get(batch.old_values_BxR),
                 jax.device_get(batch.returns_BxR), jax.device_get(batch.response_mask_BxR),
                 em))
    return batch, em

  monkeypatch.setattr(t, "experience", drawing)
  records = []
  write = t.state.log.write
  monkeypatch.setattr(t.state.log, "write",
                      lambda stage, step, m: (records.append(dict(m)), write(stage, step, m)))
  try:
    t.value_pretrain()
    return t, cfg, seen, rows, records
  finally:
    t.close()


def test_value_pretraining_reuses_rollouts_and_stops_on_heldout_ev(monkeypatch):
  t, cfg, seen, rows, records = run_value_pretraining(
      monkeypatch, **{"value_pretrain.replay_batches": 2, "value_pretrain.epochs": 3,
                      "value_pretrain.heldout_batches": 2, "metrics.critic_diagnostics": True,
                      "rl.value_norm": "running", "model.critic_head_bias": True,
                      "optim.critic_head_lr": 1e-3})
  assert len(rows) == len(seen) == 3  # three fresh batches, three updates
  b = rows[0][0].shape[0]
  for i, (tokens, loop) in enumerate(seen):
    fresh = [rows[k][0] for k in range(max(0, i - 1), i + 1)]
    np.testing.assert_array_equal(tokens, np.concatenate(fresh))  # the last two batches
    assert loop.epochs == 3 and loop.num_minibatches == cfg.rl.num_minibatches * len(fresh)
    assert loop.minibatch_rows == b // cfg.rl.num_minibatches
  # Held-out EV: each batch scored by the critic before any update had seen it, pooled
  # over the last two fresh batches.
  for i in range(3):
    sums = [diag.ev_sums(rows[k][1], rows[k][2], rows[k][3]) for k in range(max(0, i - 1), i + 1)]
    assert records[i]["critic/heldout_ev"] == pytest.approx(diag.pooled_ev(sums), abs=1e-9)
    for k in range(i):  # no earlier update trained on batch i
      assert not any((seen[k][0] == row).all(1).any() for row in rows[i][0])
  for k in ("critic/ev_first_half", "critic/ev_second_half", "critic/ev_last_token",
            "critic/prompt_value_spearman"):
    assert k in records[-1]
  stats = t.return_stats()
  assert stats.weight > 0 and not any("critic" in k for k in t.state.summary)  # its own record


def test_full_critic_trains_base_weights_and_lora_critic_does_not(monkeypatch):
  base = {"model.lora.rank": 2, "model.lora.alpha": 4.0, "value_pretrain.max_steps": 1,
          "value_pretrain.min_steps": 1}
  for full in (True, False):
    cfg = tiny(**base, **{"model.critic_lora": not full})
    t = trainer_lib.Trainer(cfg, progress=False)
    try:
      t.setup("critic")
      before = jax.device_get(t.state.train_state("critic").params)
      assert lora.has_adapters(before) != full
      t.value_pretrain()
      after = jax.device_get(t.state.train_state("critic").params)
      # Every block's q projection, stacked on a leading layer axis (models/stacked.py).
      q0 = np.asarray(before["backbone"]["blocks"]["attn"]["q"][...])
      q1 = np.asarray(after["backbone"]["blocks"]["attn"]["q"][...])
      assert (not np.array_equal(q0, q1)) == full
      # The policy keeps its adapters either way.
      assert lora.has_adapters(t.state.policy_params)
    finally:
      t.close()


def test_pretrain_loop_defaults_are_the_runs_own():
  cfg = tiny()
  assert critic_stage.pretrain_loop(cfg, 1) == learners.ppo_loop(cfg)


def test_return_statistics_survive_a_resume(tmp_path):
  cfg = tiny(**{"rl.value_norm": "running", "value_pretrain.max_steps": 2,
                "value_pretrain.min_steps": 2, "rl.steps": 1, "checkpoint.every": 1,
                "checkpoint.async_save": False, "metrics.tensorboard": False,
                "metrics.plot": False})
  t = trainer_lib.Trainer(cfg, str(tmp_path), progress=False)
  try:
    t.run()
    stats = t.return_stats()
  finally:
    t.close()
  assert stats.weight == pytest.approx(1 - cfg.rl.value_norm_decay ** 3)  # 2 VP + 1 RL batch
  again = trainer_lib.Trainer(cfg, str(tmp_path), progress=False)
  try:
    again.resume()
    assert again.return_stats() == stats
  finally:
    again.close()


def test_main_runs_end_to_end_with_every_lever_on(tmp_path):
  """`python -m vapo_jax.main --config=configs/tiny.py` with the critic's switches on."""
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, "-m", "vapo_jax.main", "--config=configs/tiny.py",
         f"--workdir={tmp_path}", "--noprogress", "--config.sft.steps=4",
         "--config.value_pretrain.max_steps=2", "--config.value_pretrain.min_steps=1",
         "--config.rl.steps=1", "--config.eval.num_examples=16",
         "--config.data.num_train=128", "--config.data.num_eval=16",
         "--config.metrics.tensorboard=False", "--config.metrics.plot=False",
         "--config.model.critic_head_bias=True", "--config.optim.critic_head_lr=1e-4",
         "--config.rl.value_norm=running", "--config.rl.reward_scale=2.0",
         "--config.rl.reward_shift=-1.0", "--config.value_pretrain.replay_batches=2",
         "--config.value_pretrain.epochs=2", "--config.value_pretrain.heldout_batches=2",
         "--config.rl.alpha=0", "--config.metrics.critic_diagnostics=True",
         "--config.metrics.critic_heldout_batches=1"]
  out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "XLA_FLAGS": ""})
  assert out.returncode == 0, out.stderr[-3000:]
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  vp = [r for r in records if r["stage"] == "value_pretrain"]
  rl = [r for r in records if r["stage"] == "rl"]
  assert len(vp) == 2 and len(rl) == 1
  assert all("critic/heldout_ev" in r and "critic/ev_second_half" in r for r in vp)
  assert "critic/ev_first_half" in rl[0]
  for k in ("critic/group_ev", "critic/auroc_last", "critic/ev_pos_d9", "critic/bias"):
    assert k in vp[-1] and k in rl[0]
  # The critic on fresh held-out rollouts at each evaluation (before and after RL), with the
  # within-group EV's interval over groups.
  evals = [r for r in records if r["stage"] == "eval"]
  assert len(evals) == 2
  for r in evals:
    assert r["critic_heldout/group_ev_lo"] <= r["critic_heldout/group_ev"] <= r[
        "critic_heldout/group_ev_hi"] or r["critic_heldout/group_ev"] == 0.0
  # The summary `main` prints holds no PRNG key words or iterator states of the critic's.
  summary = json.loads(out.stdout[out.stdout.index("{"):])
  assert not any("critic" in k for k in summary)
  assert os.path.exists(tmp_path / "critic" / "config.json")


def test_critic_state_round_trips_and_reads_old_checkpoints():
  """The critic's typed record survives the checkpoint meta's JSON; a checkpoint saved when
  it lived in the summary (before 2026-12-07) gives the same record, and leaves the summary."""
  import json  # pylint: disable=import-outside-toplevel
  from vapo_jax import critic as critic_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint  # pylint: disable=import-outside-toplevel
  cs = critic_stage.CriticState(
      return_stats=critic_lib.ReturnStats(0.19, 0.05, 0.07),
      draws=[critic_stage.Draw({"epoch": 1, "pos": 6}, (3, 4))],
      heldout=[np.array([10.0, 1.0, 1.0, 0.5, 0.4])])
  back = critic_stage.CriticState.from_meta(json.loads(json.dumps(cs.to_meta())))
  assert back.return_stats == cs.return_stats and back.draws == cs.draws
  np.testing.assert_array_equal(back.heldout[0], cs.heldout[0])
  summary = {"data": {}, "critic_return_stats": [0.19, 0.05, 0.07],
             "critic_replay": {"draws": [{"iterator": {"epoch": 1, "pos": 6}, "key": [3, 4]}],
                               "heldout": [[10.0, 1.0, 1.0, 0.5, 0.4]]}}
  old = critic_stage.CriticState.from_meta(checkpoint._legacy_critic(summary))  # pylint: disable=protected-access
  assert old.return_stats == cs.return_stats and old.draws == cs.draws
  assert summary == {"data": {}}
  assert critic_stage.CriticState.from_meta(None) == critic_stage.CriticState()


def test_resumed_value_pretraining_with_replay_equals_uninterrupted(tmp_path):
  """A stage stopped after step 2 of 3 and resumed draws its replayed batch again and keeps
  its held-out sums: the same critic and records as a run that never stopped."""
  from vapo_jax.run import control  # pylint: disable=import-outside-toplevel
  cfg = tiny(**{"value_pretrain.max_steps": 3, "value_pretrain.min_steps": 3,
                "value_pretrain.replay_batches": 2, "value_pretrain.heldout_batches": 2,
                "value_pretrain.epochs": 2, "rl.value_norm": "running",
                "checkpoint.every": 1, "checkpoint.async_save": False,
                "metrics.tensorboard": False, "metrics.plot": False})

  def run(workdir, stop_at=None):
    t = trainer_lib.Trainer(cfg, str(workdir), progress=False)
    try:
      t.resume()
      if stop_at is not None:
        t.ctl.stop_requested = lambda: t.ctl.step >= stop_at
      try:
        t.value_pretrain()
      except control.Preempted:
        return None
      return (jax.device_get(t.state.train_state("critic").params), t.return_stats(),
              metrics_lib.read_jsonl(str(workdir / "metrics.jsonl")))
    finally:
      t.close()

  whole = run(tmp_path / "a")
  assert run(tmp_path / "b", stop_at=2) is None
  resumed = run(tmp_path / "b")
  for x, y in zip(jax.tree.leaves(whole[0]), jax.tree.leaves(resumed[0])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert whole[1] == resumed[1]
  # (as benchmarks/preset_fingerprint: timings, and what each process compiled)
  timing = ("time/", "_per_s", "wall_s", "_seconds", "compile/", "mem/")
  strip = lambda r: {k: v for k, v in r.items()  # noqa: E731
                     if k != "time" and not any(t in k for t in timing)}
  assert [strip(r) for r in whole[2]] == [strip(r) for r in resumed[2]]


def test_the_heldout_readout_changes_no_trained_number():
  """The critic's readout on fresh held-out rollouts (metrics.critic_heldout_batches) draws
  from its own keys and trains nothing: with it on, evaluations between RL steps included,
  the run's weights and training records are those of the run without it."""
  def run(batches):
    cfg = tiny(**{"rl.steps": 2, "eval.every": 1, "metrics.critic_diagnostics": True,
                  "metrics.critic_heldout_batches": batches})
    t = trainer_lib.Trainer(cfg, progress=False)
    try:
      t.value_pretrain()
      t.evaluate(rl_step=0)
      history = t.rl()["history"]
      return (jax.device_get(t.state.train_state("policy").params),
              jax.device_get(t.state.train_state("critic").params), history)
    finally:
      t.close()

  plain, read = run(0), run(2)
  for a, b in zip(jax.tree.leaves(plain[:2]), jax.tree.leaves(read[:2])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  timing = ("time/", "_per_s", "wall_s", "_seconds", "compile/", "mem/", "eval/")
  keep = lambda r: {k: v for k, v in r.items()  # noqa: E731
                    if not any(t in k for t in timing)}
  np.testing.assert_equal([keep(r) for r in plain[2]], [keep(r) for r in read[2]])  # NaN = NaN
  assert "eval/critic_heldout/group_ev" in read[2][0]
  assert not any(k.startswith("eval/critic_heldout") for k in plain[2][0])
