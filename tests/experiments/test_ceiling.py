"""experiments.real_model.ceiling: the probe's statistics on cases with known answers, the
features as the value head's input, and the command end to end on the tiny config."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.real_model import ceiling
import tiny_trainer
from vapo_jax.run import trainer as trainer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
L2S = (0.1, 1.0, 10.0, 100.0, 1000.0)


def _pairs(s, c, same=None):
  """Brute force: the mean over (correct i, wrong j) pairs of [s_i > s_j] + ½[s_i = s_j]."""
  out = [1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0
         for i in range(len(s)) for j in range(len(s))
         if c[i] and not c[j] and (same is None or same[i] == same[j])]
  return np.mean(out)


def test_auroc_against_a_brute_force_pairwise_count():
  rng = np.random.default_rng(0)
  s = np.round(rng.normal(size=60), 1)          # ties on purpose
  c = rng.random(60) < 0.35
  assert ceiling.auroc(s, c) == pytest.approx(_pairs(s, c), abs=1e-12)
  # Weights are multiplicities: integer weights equal repeating the responses.
  w = rng.integers(0, 3, 60)
  assert ceiling.auroc(s, c, w) == pytest.approx(
      _pairs(np.repeat(s, w), np.repeat(c, w)), abs=1e-12)
  # Several weight rows at once, as the bootstrap passes them.
  both = ceiling.auroc(s, c, np.stack([np.ones(60), w]))
  assert both[0] == pytest.approx(_pairs(s, c)) and both[1] == pytest.approx(ceiling.auroc(s, c, w))
  # Within blocks (folds): only pairs of the same block.
  blocks = rng.integers(0, 3, 60)
  assert ceiling.auroc(s, c, blocks_N=blocks) == pytest.approx(_pairs(s, c, blocks), abs=1e-12)
  assert math.isnan(ceiling.auroc(s, np.zeros(60, bool)))
  assert ceiling.auroc(np.ones(60), c) == 0.5


def test_within_group_auroc_counts_only_pairs_of_the_same_prompt():
  rng = np.random.default_rng(1)
  groups = np.repeat(np.arange(12), 5)
  s, c = np.round(rng.normal(size=60), 1), rng.random(60) < 0.4
  assert ceiling.within_group_auroc(s, c, groups) == pytest.approx(_pairs(s, c, groups),
                                                                   abs=1e-12)
  # A score constant within each prompt knows nothing a group mean does not: 0.5 exactly,
  # however well it ranks the prompts.
  per_prompt = np.repeat(rng.normal(size=12), 5)
  assert ceiling.within_group_auroc(per_prompt, c, groups) == 0.5
  assert math.isnan(ceiling.within_group_auroc(s, np.ones(60, bool), groups))


def test_within_group_ev_against_a_direct_computation():
  rng = np.random.default_rng(2)
  groups = np.repeat(np.arange(10), 4)
  c = rng.random(40) < 0.5
  p = rng.random(40)
  y = c.astype(float)
  cy = np.concatenate([y[g * 4:(g + 1) * 4] - y[g * 4:(g + 1) * 4].mean() for g in range(10)])
  cp = np.concatenate([p[g * 4:(g + 1) * 4] - p[g * 4:(g + 1) * 4].mean() for g in range(10)])
  want = 1 - np.sum((cy - cp) ** 2) / np.sum(cy ** 2)
  assert ceiling.within_group_ev(p, c, groups) == pytest.approx(want, abs=1e-12)
  # Constant within each prompt: 0 however well it ranks the prompts; the outcome itself: 1;
  # shuffled group labels give the same figure (groups by id, not by position).
  assert ceiling.within_group_ev(np.repeat(rng.random(10), 4), c, groups) == pytest.approx(0)
  assert ceiling.within_group_ev(y, c, groups) == pytest.approx(1)
  perm = rng.permutation(40)
  assert ceiling.within_group_ev(p[perm], c[perm], groups[perm]) == pytest.approx(want)
  boot = ceiling.group_bootstrap(p, c, groups, num_samples=200)
  assert boot["within_group_ev"]["estimate"] == pytest.approx(want)
  assert boot["within_group_ev"]["lo"] <= want <= boot["within_group_ev"]["hi"]


def test_group_folds_never_split_a_prompt_and_spread_the_pass_rates():
  rng = np.random.default_rng(2)
  groups = rng.permutation(np.repeat(np.arange(40), 6))
  correct = rng.random(groups.size) < np.repeat(np.linspace(0, 1, 40), 6)[np.argsort(
      np.argsort(groups))]
  fold = ceiling.group_folds(groups, correct, 5, seed=0)
  for g in np.unique(groups):
    assert np.unique(fold[groups == g]).size == 1
  sizes = [np.unique(groups[fold == f]).size for f in range(5)]
  assert sizes == [8] * 5
  rates = [correct[fold == f].mean() for f in range(5)]
  assert max(rates) - min(rates) < 0.25
  assert np.array_equal(fold, ceiling.group_folds(groups, correct, 5, seed=0))
  with pytest.raises(ValueError):
    ceiling.group_folds(groups, correct, 41, seed=0)


def test_fit_logistic_reaches_the_penalised_optimum():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(200, 6))
  y = rng.random(200) < 1 / (1 + np.exp(-(x @ np.arange(6) * 0.3 - 0.5)))
  for l2 in (0.1, 10.0):
    th = ceiling.fit_logistic(x, y, l2)
    p = ceiling.predict(th, x)
    grad_w = x.T @ (p - y) + l2 * th[:-1]
    assert np.abs(grad_w).max() < 1e-6 and abs(np.sum(p - y)) < 1e-6


def test_the_probe_separates_separable_features_out_of_fold():
  rng = np.random.default_rng(4)
  groups = np.repeat(np.arange(30), 8)
  x = rng.normal(size=(240, 10))
  correct = x[:, 0] + 0.5 * x[:, 1] > 0.3
  fig, oof = ceiling.probe_report(x, correct, groups, 5, L2S, seed=0, num_samples=200)
  assert fig["auroc"]["estimate"] > 0.97 and fig["within_group_auroc"]["estimate"] > 0.97
  assert fig["auroc"]["lo"] <= fig["auroc"]["estimate"] <= fig["auroc"]["hi"]
  assert fig["brier"]["estimate"] < 0.5 * fig["brier_constant"]
  assert len(fig["l2_chosen"]) == 5 and set(fig["l2_chosen"]) <= set(L2S)
  assert oof.shape == (240,) and np.all((oof > 0) & (oof < 1))


def test_the_probe_on_random_features_is_at_chance():
  rng = np.random.default_rng(5)
  groups = np.repeat(np.arange(50), 8)
  x = rng.normal(size=(400, 20))
  correct = rng.random(400) < 0.3
  fig, _ = ceiling.probe_report(x, correct, groups, 5, L2S, seed=0, num_samples=300)
  for key in ("auroc", "within_group_auroc"):
    assert fig[key]["lo"] < 0.5 < fig[key]["hi"], (key, fig[key])
    assert abs(fig[key]["estimate"] - 0.5) < 0.08
  # Features shared by a prompt's responses (s_0): within a prompt every pair ties.
  shared = np.repeat(rng.normal(size=(50, 20)), 8, axis=0)
  fig, _ = ceiling.probe_report(shared, correct, groups, 5, L2S, seed=0, num_samples=100)
  assert fig["within_group_auroc"]["estimate"] == 0.5


def test_state_columns_and_the_mc_picks():
  # l = 8 after P = 5: t = 0, 2, 4, 6 and 8 -> columns 4, 6, 8, 10, 12.
  assert ceiling.state_columns([8, 1], 5).tolist() == [[4, 6, 8, 10, 12], [4, 4, 4, 4, 5]]
  correct = np.array([1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], bool)
  groups = np.repeat(np.arange(6), 2)
  picks = ceiling.pick_mc(correct, groups, 4, seed=0)
  assert len(picks) == 4 and correct[picks].sum() == 2
  assert np.unique(groups[picks]).size == 4
  assert ceiling.pick_mc(correct, groups, 3, seed=1) == ceiling.pick_mc(correct, groups, 3, 1)


@pytest.fixture(scope="module")
def trainer():
  """The tiny trainer with its critic set up and a random value head (a zero head would make
  V = h·w trivially 0)."""
  t = trainer_lib.Trainer(tiny_trainer.tiny(), progress=False)
  t.setup("critic")
  learner = t.state.learners["critic"]
  model = nnx.merge(learner.graphdef, learner.state.params)
  model.score[...] = jax.random.normal(jax.random.key(7), model.score[...].shape)
  learner.state = dataclasses.replace(learner.state, params=nnx.split(model)[1])
  yield t
  t.close()


def test_the_features_dotted_with_the_head_are_the_critics_values(trainer):
  t = trainer
  learner = t.state.learners["critic"]
  batch, _ = t.parts.experience.sample_and_score(t.state.policy_params,
                                                 t.parts.train_examples[:8], jax.random.key(0))
  p, r = batch.prompt_len, batch.response_mask_BxR.shape[1]
  tokens, mask, resp = jax.device_get((batch.tokens_BxL, batch.mask_BxL,
                                       batch.response_mask_BxR))
  cols = np.tile(np.arange(p - 1, p - 1 + r, dtype=np.int32), (tokens.shape[0], 1))
  h = ceiling.features(ceiling.hidden_fn(learner.graphdef), learner.state.params, tokens, mask,
                       cols, rows=8)
  w = np.asarray(nnx.merge(learner.graphdef, learner.state.params).score[...], np.float64)
  values = np.asarray(jax.device_get(t.critic_values(learner.state.params, batch.tokens_BxL,
                                                     batch.mask_BxL, prompt_len=p)))
  assert np.abs(values).max() > 1e-3
  np.testing.assert_allclose((h @ w) * resp, values, atol=1e-5, rtol=1e-4)


def test_measure_with_a_critic_scores_it_beside_the_probe(trainer):
  res = ceiling.measure(trainer, responses=16, folds=2, mc_responses=2, mc_continuations=2,
                        seed=0, l2s=(1.0, 100.0), num_samples=50, log=lambda *a, **k: None)
  assert res["rollouts"]["responses"] == 16 and res["rollouts"]["prompts"] == 8
  assert res["critic"] == "trained" and set(res["critic_at_states"]) == {"0", "0.25", "0.5",
                                                                         "0.75"}
  mc = res["mc"]
  assert mc["values_from"] == "critic" and len(mc["picks"]) == 2
  for row in mc["by_fraction"].values():
    assert {"probe", "critic"} <= set(row) and 0 <= row["mc_mean"] <= 1
  for pick in mc["picks"]:
    assert pick["t"][0] == 0 and all(v in (0.0, 0.5, 1.0) for v in pick["mc"])


def test_the_command_writes_its_json_on_the_tiny_config(tmp_path):
  out = str(tmp_path / "ceiling.json")
  cmd = [sys.executable, "-m", "experiments.real_model.ceiling",
         f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}", "--config.sft.enabled=False",
         "--config.rl.prompts_per_step=4", "--config.rl.responses_per_prompt=4",
         "--config.sampling.max_new_tokens=8", "--config.data.num_train=64",
         "--config.data.num_eval=16", "--config.model.num_layers=1",
         "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.model.num_heads=2", "--config.model.num_kv_heads=1",
         "--config.model.head_dim=16", "--config.eval.batch_prompts=8",
         "--config.reward.fn=trainer_plugins:even_digits",
         "--responses=32", "--folds=2", "--mc_responses=2", "--mc_continuations=2",
         "--l2=1,100", "--bootstrap=50", f"--out={out}"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
         "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out, encoding="utf-8") as f:
    res = json.load(f)
  assert {"command", "commit", "cpu", "device", "settings", "rollouts", "probe", "baselines",
          "critic", "mc", "time_s"} <= set(res)
  assert res["critic"] == "none" and res["mc"]["values_from"] == "probe"
  assert list(res["probe"]) == ["0", "0.25", "0.5", "0.75", "last"]
  assert res["rollouts"]["responses"] == 32
  for fig in res["probe"].values():
    assert 0 <= fig["auroc"]["estimate"] <= 1 and len(fig["l2_chosen"]) == 2
  assert res["probe"]["0"]["within_group_auroc"]["estimate"] == 0.5   # s_0 is shared
  assert set(res["mc"]["by_fraction"]) == {"0", "0.25", "0.5", "0.75"}
  assert "| s_l (last token) |" in done.stdout
  assert os.path.exists(str(tmp_path / "ceiling.md"))
  rec = np.load(str(tmp_path / "ceiling.npz"))
  assert rec["correct"].shape == (32,) and set(rec) >= {"groups", "lengths", "oof_last"}
  # The records reproduce the JSON's figure.
  assert ceiling.within_group_ev(rec["oof_last"], rec["correct"], rec["groups"]) == (
      pytest.approx(res["probe"]["last"]["within_group_ev"]["estimate"], nan_ok=True))
