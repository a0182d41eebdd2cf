"""experiments.real_model.critic_fit: the registered lever rule (docs/real_model.md, "The
third run") and the reasoning-gym levers' rule (issue 63) on hand-built figures; the fresh
figures against `run.critic_diagnostics` on the same values, pooled over every batch; the
command run as a user runs it on the tiny config, from scratch and from a run's checkpoint
(--workdir) on reasoning-gym problems."""

import json
import math
import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

import config_files
from experiments.real_model import critic_fit
from vapo_jax.data import reasoning_gym as rg
from vapo_jax.run import checkpoint as run_checkpoint
from vapo_jax.run import critic_diagnostics as diag

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lever(ev, settings, fixed_last=0.5):
  return {"overrides": {f"s{i}": i for i in range(settings)},
          "fixed": {"loss_over_constant_by_step": [1.2, fixed_last]},
          "fresh": {"fresh_ev": ev}}


def test_the_highest_held_out_ev_wins_when_nothing_is_near_it():
  r = {"_rollouts": {}, "baseline": _lever(-0.05, 0), "a": _lever(0.30, 2),
       "b": _lever(0.10, 1)}
  assert critic_fit.choose(r)[0] == "a"


def test_a_lever_within_the_margin_with_fewer_settings_is_preferred():
  r = {"baseline": _lever(-0.05, 0), "all": _lever(0.30, 5), "reuse": _lever(0.285, 2),
       "bias": _lever(0.27, 2), "norm": _lever(0.281, 1)}
  pick, why = critic_fit.choose(r)
  assert pick == "norm"             # fewest settings within 0.02 of 0.30
  assert "all (+0.3000, 5 settings)" in why and "bias" not in why   # 0.27 is not near


def test_equal_settings_within_the_margin_go_to_the_higher_ev():
  r = {"baseline": _lever(-0.05, 0), "x": _lever(-0.004, 2), "y": _lever(0.0001, 2)}
  assert critic_fit.choose(r)[0] == "y"


def test_the_baseline_counts_as_the_lever_with_no_settings():
  r = {"baseline": _lever(0.29, 0), "a": _lever(0.30, 2)}
  assert critic_fit.choose(r)[0] == "baseline"


def test_the_baseline_is_kept_when_no_lever_beats_a_constant_on_the_fixed_batch():
  r = {"baseline": _lever(-0.05, 0, 1.1), "a": _lever(0.30, 2, 1.0), "b": _lever(0.1, 1, 3.0)}
  pick, why = critic_fit.choose(r)
  assert pick == "baseline" and "constant" in why
  r["b"]["fixed"]["loss_over_constant_by_step"][-1] = 0.99
  assert critic_fit.choose(r)[0] == "a"


def test_no_lever_is_an_error():
  with pytest.raises(ValueError):
    critic_fit.choose({"_rollouts": {}})


def test_the_committed_figures_give_the_committed_choice():
  """The JSON in the tree and the config's choice (configs/smollm2_135m.py) agree: once every
  lever is measured, the config carries the picked lever's settings and α sized to lengths."""
  path = os.path.join(ROOT, "experiments", "real_model", "results", "critic-levers-2026-12-05",
                      "critic_levers.json")
  with open(path, encoding="utf-8") as f:
    results = json.load(f)
  names = [k for k in results if not k.startswith("_")]
  assert "baseline" in names and len(names) >= 5
  pick, _ = critic_fit.choose(results)
  assert pick in names
  cfg = config_files.load_config_file("smollm2_135m.py")
  if set(critic_fit.levers(cfg)) <= set(names):
    for dotted, value in results[pick]["overrides"].items():
      node = cfg
      for part in dotted.split("."):
        node = node[part]
      assert node == pytest.approx(value) if isinstance(value, float) else node == value, dotted
    assert cfg.rl.alpha == 0


def test_the_command_measures_levers_and_resumes_on_the_tiny_config(tmp_path):
  """Two levers on the tiny config (1 layer, a parity reward), then a rerun that skips both."""
  out = str(tmp_path / "levers.json")
  cmd = [sys.executable, "-m", "experiments.real_model.critic_fit",
         f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}", "--config.sft.enabled=False",
         "--config.rl.prompts_per_step=4", "--config.rl.responses_per_prompt=4",
         "--config.sampling.max_new_tokens=16", "--config.data.num_train=64",
         "--config.data.num_eval=16", "--config.model.num_layers=1",
         "--config.reward.fn=trainer_plugins:even_digits", "--train_batches=2",
         "--fresh_batches=1", "--fixed_steps=2", "--levers=baseline,rewards_pm1", f"--out={out}"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
         "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out, encoding="utf-8") as f:
    results = json.load(f)
  assert set(results) == {"_rollouts", "baseline", "rewards_pm1"}
  for name in ("baseline", "rewards_pm1"):
    fixed, fresh = results[name]["fixed"], results[name]["fresh"]
    assert len(fixed["loss_over_constant_by_step"]) == 2
    assert len(fresh["heldout_ev_by_step"]) == 2
    assert all(abs(v) < 1e3 for v in fixed["loss_over_constant_by_step"])
  assert results["rewards_pm1"]["overrides"] == {"rl.reward_scale": 2.0, "rl.reward_shift": -1.0}
  assert os.path.exists(os.path.splitext(out)[0] + ".md")
  again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "baseline: done before, skipped" in again.stdout
  assert "rewards_pm1: done before, skipped" in again.stdout


# ------------------------------------------------------------- the reasoning-gym levers
def _rg(lo, settings, ev=0.3, auroc=0.8):
  return {"overrides": {f"s{i}": i for i in range(settings)},
          "fresh": {"fresh_ev": ev, "critic/group_ev_lo": lo, "critic/auroc_last": auroc}}


def test_the_highest_lower_bound_of_within_group_ev_wins():
  r = {"_rollouts": {}, "rg_baseline": _rg(-0.10, 0), "a": _rg(0.05, 2), "b": _rg(-0.02, 1),
       "c": _rg(float("nan"), 0)}   # no interval (no groups): never picked
  pick, why = critic_fit.choose_rg(r)
  assert pick == "a" and "bar met" in why


def test_a_tie_within_0_01_goes_to_fewer_settings_and_the_bar_is_read_on_the_pick():
  r = {"rg_baseline": _rg(0.042, 0, ev=0.15), "two": _rg(0.05, 2), "one": _rg(0.045, 1),
       "far": _rg(0.039, 0)}
  pick, why = critic_fit.choose_rg(r)
  assert pick == "rg_baseline"          # 0.042 >= 0.05 - 0.01, no setting changed
  assert "far" not in why and "pooled EV >= 0.2 fails" in why
  r["rg_baseline"]["fresh"]["critic/group_ev_lo"] = 0.0399
  assert critic_fit.choose_rg(r)[0] == "one"
  r["one"]["fresh"]["critic/group_ev_lo"] = -0.01
  pick, why = critic_fit.choose_rg(r)
  assert pick == "two" and "bar met" in why
  with pytest.raises(ValueError):
    critic_fit.choose_rg({"_rollouts": {}})


def test_the_rg_levers_are_valid_changes_of_the_rg_config():
  """Every lever of the set builds a valid config from configs/smollm2_rg.py, and each of its
  overrides changes that config; the set is the default for a reasoning-gym config, the old
  one for the word problems, and --levers can name either set's."""
  c = config_files.load_config_file("smollm2_rg.py")
  cfg = critic_fit.with_overrides(c, {})
  assert critic_fit.default_set(cfg) == "rg"
  assert critic_fit.default_set(critic_fit.with_overrides(
      config_files.load_config_file("smollm2_135m.py"), {})) == "word"
  rg_set = critic_fit.lever_sets(cfg)["rg"]
  assert {"rg_baseline", "rg_lr1e-4", "rg_lr3e-4", "rg_reuse4", "rg_lora",
          "rg_no_head_bias"} <= set(rg_set)
  assert rg_set["rg_baseline"] == {}
  assert set(critic_fit.all_levers(cfg)) == set(rg_set) | set(critic_fit.levers(cfg))
  for name, overrides in rg_set.items():
    got = critic_fit.with_overrides(c, overrides)
    for dotted, value in overrides.items():
      section, field = dotted.split(".")
      assert getattr(getattr(got, section), field) == value
      assert getattr(getattr(cfg, section), field) != value, (name, dotted)
  assert critic_fit.with_overrides(c, rg_set["rg_lora"]).full_critic is False


def test_passes_count_the_replayed_batches_and_epochs():
  c = config_files.load_config_file("smollm2_rg.py")
  cfg = critic_fit.with_overrides(c, {"value_pretrain.replay_batches": 2,
                                      "value_pretrain.epochs": 2})
  assert critic_fit.passes(cfg, 10, 0) == {"critic_train": (1 + 2 * 9) * 2, "critic_value": 10}
  cfg = critic_fit.with_overrides(c, critic_fit.RG_LEVERS["rg_reuse4"])
  assert critic_fit.passes(cfg, 10, 8) == {"critic_train": 8 * 4 + (1 + 2 + 3 + 4 * 7) * 4,
                                           "critic_value": 11}


# ------------------------------------------------------------------- the fresh figures
def _fresh(batches, groups, n, r=12, seed=0):
  """(values, returns, mask, scores) of `batches` batches of `groups` groups of n, 0/1 scores,
  a noisy critic, garbage on the padding."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(batches):
    p = np.repeat(rng.uniform(size=groups), n)
    scores = (rng.uniform(size=groups * n) < p).astype(np.float64)
    lengths = rng.integers(2, r + 1, groups * n)
    mask = (np.arange(r)[None, :] < lengths[:, None]).astype(np.float64)
    returns = scores[:, None] * mask
    values = np.clip(0.6 * returns + 0.4 * p[:, None] + rng.normal(0, 0.2, mask.shape), 0, 1)
    values = np.where(mask > 0, values, np.nan)
    out.append((values, np.where(mask > 0, returns, 1e9), mask, scores))
  return out


def test_fresh_figures_pool_every_batch_and_equal_the_diagnostics_on_the_same_values():
  batches, n = _fresh(3, 4, 4), 4
  v, r, m, s = (np.concatenate(x) for x in zip(*batches))
  got = critic_fit.figures(v, r, m, s, n, threshold=1.0, n_boot=200)
  assert got["critic/group_ev"] == pytest.approx(diag.within_group_ev(v, r, m, n))
  assert (got["critic/group_ev_lo"], got["critic/group_ev_hi"]) == pytest.approx(
      diag.group_ev_bootstrap(v, r, m, n, n_boot=200))
  assert got["critic/group_ev_lo"] <= got["critic/group_ev"] <= got["critic/group_ev_hi"]
  assert got["critic/group_ev_last"] == pytest.approx(
      diag.within_group_ev(v, r, diag.last_mask(m), n))
  assert got["critic/auroc_last"] == pytest.approx(diag.last_token_auroc(v, m, s >= 1.0))
  assert got["fresh_ev"] == pytest.approx(diag.pooled_ev(diag.ev_sums(v, r, m)))
  assert got["critic/pooled_ev"] == pytest.approx(got["fresh_ev"])
  assert got["critic/bias"] == pytest.approx(diag.bias(v, r, m))
  assert all(math.isfinite(got[k]) for k in critic_fit.BAR)
  # Pooled over the batches' tokens, not an average of per-batch figures.
  per = [critic_fit.figures(*b, n, threshold=1.0, n_boot=10)["critic/group_ev"]
         for b in batches]
  assert abs(got["critic/group_ev"] - np.mean(per)) > 1e-6


def test_fresh_rollouts_of_a_reasoning_gym_config_take_held_out_problems():
  """The fresh batches read the held-out split (reasoning-gym's own: no question of the
  training split), consecutive blocks of the prompts per step with every arm in each, and a
  key of the fresh stream per batch."""
  spec = rg.RGSpec(arms=tuple(rg.parse_arms("chain_sum_l2,leg_counting_l2")),
                   weights=(1.0, 1.0), drop_shortcuts=True)
  train, held = rg.splits(32, 16, 0, spec)
  seen = []

  def sample_and_score(params, examples, key):
    del params
    seen.append((list(examples), key))
    return "raw", {}

  cfg = types.SimpleNamespace(seed=3, rl=types.SimpleNamespace(rollout_prompts=4))
  t = types.SimpleNamespace(
      cfg=cfg, state=types.SimpleNamespace(policy_params=None),
      parts=types.SimpleNamespace(eval_examples=held, train_examples=train,
                                  experience=types.SimpleNamespace(
                                      sample_and_score=sample_and_score)))
  assert critic_fit.fresh_rollouts(t, 3) == ["raw"] * 3
  questions = {e.problem for e in train}
  for k, (examples, key) in enumerate(seen):
    assert examples == held[4 * k:4 * k + 4]
    assert not {e.problem for e in examples} & questions
    assert {rg.arm_of(e) for e in examples} == {"chain_sum_l2", "leg_counting_l2"}
    want = jax.random.fold_in(jax.random.key(3), critic_fit.FRESH_STREAM + k)
    assert np.array_equal(jax.random.key_data(key), jax.random.key_data(want))


# ------------------------------------------------------- from a run's checkpoint (--workdir)
# The tiny model (1 layer) on two reasoning-gym arms: SFT (2 steps), value pretraining (1),
# no RL; the same settings for the run and for critic_fit.
RG_RUN = {"data.source": "reasoning_gym", "data.rg_arms": "chain_sum_l2,leg_counting_l2",
          "data.max_prompt_tokens": 192, "data.num_train": 64, "data.num_eval": 16,
          "sampling.max_new_tokens": 16, "model.num_layers": 1, "sft.steps": 2,
          "sft.batch_size": 8, "value_pretrain.max_steps": 1, "value_pretrain.min_steps": 1,
          "rl.steps": 0, "rl.prompts_per_step": 4, "rl.responses_per_prompt": 4,
          "eval.num_examples": 4, "eval.samples_per_problem": 1, "eval.batch_prompts": 4,
          "metrics.tensorboard": False, "metrics.plot": False,
          "mesh.fsdp": 1}   # (one device, also in pytest's process of eight)
TINY = os.path.join(ROOT, "configs", "tiny.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
       "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}


@pytest.fixture(scope="module")
def rg_run(tmp_path_factory):
  """A finished tiny run's folder (SFT, value pretraining; its newest checkpoint holds the
  SFT'd policy and a value-pretrained critic)."""
  workdir = str(tmp_path_factory.mktemp("rg_run"))
  cmd = [sys.executable, "-m", "vapo_jax.main", f"--config={TINY}", "--noprogress",
         *[f"--config.{k}={v}" for k, v in RG_RUN.items()], f"--workdir={workdir}"]
  done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return workdir


def test_workdir_restores_the_runs_policy_and_builds_a_fresh_critic_from_it(rg_run):
  cfg = critic_fit.with_overrides(config_files.load_config_file("tiny.py"), RG_RUN)
  t, source = critic_fit.start(cfg, rg_run)
  try:
    steps = t.ckpt.steps()
    assert source == {"workdir": rg_run, "checkpoint_step": steps[-1],
                      "checkpoint_stage": "rl", "checkpoint_stage_step": 0}
    policy = t.state.policy_params
    saved, _ = run_checkpoint.initial_policy(rg_run, t.parts.policy_params)
    restored = jax.tree.leaves(policy)
    for a, b in zip(restored, jax.tree.leaves(saved)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # SFT moved it: not the config's initial policy.
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(restored, jax.tree.leaves(t.parts.policy_params)))
    train, fresh = critic_fit.draw(t, 1, 2)
  finally:
    t.close()
  lt = critic_fit.lever_trainer(cfg, policy)
  try:
    critic = [np.asarray(x) for x in jax.tree.leaves(lt.state.learners["critic"].state.params)]
    for a in map(np.asarray, restored):   # the backbone is the restored policy's (copied)
      assert any(c.shape == a.shape and np.array_equal(c, a) for c in critic)
    # The fresh figures are the diagnostics of the critic's own values, both batches pooled.
    got = critic_fit.fresh_figures(lt, fresh, n_boot=50)
    batches = [critic_fit.annotate(lt, raw) for raw in fresh]
    v, r, m = (np.concatenate(x) for x in zip(*(critic_fit.host(b) for b in batches)))
    s = np.concatenate([np.asarray(b.scores_B, np.float64) for b in batches])
    n = cfg.rl.group_size
    assert v.shape[0] == 2 * 16 and n == 4
    assert got["critic/group_ev"] == pytest.approx(diag.within_group_ev(v, r, m, n))
    assert (got["critic/group_ev_lo"], got["critic/group_ev_hi"]) == pytest.approx(
        diag.group_ev_bootstrap(v, r, m, n, n_boot=50))
    assert got["critic/group_ev_last"] == pytest.approx(
        diag.within_group_ev(v, r, diag.last_mask(m), n))
    assert got["critic/auroc_last"] == pytest.approx(
        diag.last_token_auroc(v, m, s >= cfg.eval.correct_threshold), nan_ok=True)
    assert got["fresh_ev"] == pytest.approx(diag.pooled_ev(diag.ev_sums(v, r, m)))
    assert got["critic/bias"] == pytest.approx(diag.bias(v, r, m))
    assert len(train) == 1
  finally:
    lt.close()


def test_the_command_runs_a_new_lever_from_a_runs_checkpoint(rg_run, tmp_path):
  out = str(tmp_path / "levers.json")
  cmd = [sys.executable, "-m", "experiments.real_model.critic_fit", f"--config={TINY}",
         *[f"--config.{k}={v}" for k, v in RG_RUN.items()], f"--workdir={rg_run}",
         "--train_batches=2", "--fresh_batches=2", "--fixed_steps=0", "--fresh_every_step",
         "--bootstrap=100", "--levers=rg_reuse4", f"--out={out}"]
  done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "rg_reuse4: 12 critic training passes over a batch" in done.stdout
  with open(out, encoding="utf-8") as f:
    results = json.load(f)
  assert set(results) == {"_rollouts", "rg_reuse4"}
  rollouts = results["_rollouts"]
  assert rollouts["workdir"] == rg_run and rollouts["checkpoint_stage"] == "rl"
  assert rollouts["responses_per_batch"] == 16
  lever = results["rg_reuse4"]
  assert lever["overrides"] == critic_fit.RG_LEVERS["rg_reuse4"] and "fixed" not in lever
  fresh = lever["fresh"]
  for key in ("fresh_ev", "critic/group_ev", "critic/group_ev_lo", "critic/group_ev_hi",
              "critic/group_ev_last", "critic/auroc_last", "critic/bias"):
    assert key in fresh, key
  assert fresh["critic/group_ev_lo"] <= fresh["critic/group_ev_hi"]
  assert len(fresh["heldout_ev_by_step"]) == len(fresh["heldout_group_ev_by_step"]) == 2
  assert len(fresh["fresh_by_step"]) == 2
  assert fresh["fresh_by_step"][-1]["critic/group_ev"] == fresh["critic/group_ev"]
  with open(os.path.splitext(out)[0] + ".md", encoding="utf-8") as f:
    text = f.read()
  assert "within-group EV [lo, hi]" in text and "| rg_reuse4 |" in text
  # Another checkpoint's figures are not mixed in.
  results["_rollouts"]["checkpoint_step"] = -1
  with open(out, "w", encoding="utf-8") as f:
    json.dump(results, f)
  again = subprocess.run([*cmd[:-2], "--levers=rg_baseline", f"--out={out}"], cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=600)
  assert again.returncode != 0 and "checkpoint_step=-1" in again.stderr
