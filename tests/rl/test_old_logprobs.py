"""rl.old_logprobs: where the PPO ratio's π_old comes from.

"exact" takes stop_gradient of the update's own log-probs and must give recompute's update
(params after one RL step, padded and packed) without the old-policy pass; "behaviour" puts
the sampler's log-probs in the ratio; unsafe settings are config errors; the step model
drops the pass it saves.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax.rl import behaviour
from vapo_jax.rl import experience as experience_lib
from vapo_jax.rl import update
from vapo_jax.run import trainer as trainer_lib

from tiny_trainer import assert_trees_close, tiny


def _shift_behaviour(monkeypatch, delta: float):
  """The sampler's log-probs log π_b + delta on real response tokens (the samples and the
  recomputed log-probs are untouched), so that what reads π_b shows it."""
  sample = experience_lib.Experience._sample

  def shifted(self, params, examples, key):
    r = sample(self, params, examples, key)
    return dataclasses.replace(r, logp_BxR=r.logp_BxR + delta * r.response_mask_BxR)

  monkeypatch.setattr(experience_lib.Experience, "_sample", shifted)


def _rl_step(cfg):
  """(policy params, metrics, calls of the experience's policy forward) of one RL step."""
  t = trainer_lib.Trainer(cfg, progress=False)
  calls = []
  forward = t.parts.experience.logprobs

  def counted(*a, **kw):
    calls.append(1)
    return forward(*a, **kw)

  t.parts.experience = dataclasses.replace(t.parts.experience, logprobs=counted)
  try:
    history = t.rl()["history"]
    return jax.device_get(t.state.train_state("policy").params), history[-1], len(calls)
  finally:
    t.close()


ONE_UPDATE = {"rl.num_minibatches": 1, "rl.micro_batch_size": 4, "rl.kl_coef": 0.05,
              "value_pretrain.enabled": False}


@pytest.mark.parametrize("packing", [False, True])
def test_exact_equals_recompute_without_the_pass(monkeypatch, packing):
  # π_b shifted by 0.3: if "exact" read the batch's (sampler's) log-probs as π_old, its
  # update would differ; its gap metrics come from the update's forward against π_b.
  _shift_behaviour(monkeypatch, 0.3)
  over = {**ONE_UPDATE, "rl.packing": packing}
  want, wm, want_calls = _rl_step(tiny(**over, **{"rl.old_logprobs": "recompute"}))
  got, gm, got_calls = _rl_step(tiny(**over, **{"rl.old_logprobs": "exact"}))
  assert (want_calls, got_calls) == (2, 1)  # old + reference vs the reference only
  assert wm["policy_grad_norm"] > 0
  # One Adam step: g / (sqrt(v) + eps) turns a float-rounding difference in a near-zero
  # gradient into up to ~1e-5 of a parameter (seen on jax 0.12, padded); a π_old read from
  # the shifted π_b would move most parameters by O(lr) = 2e-4 and the ratio metrics below.
  assert_trees_close(want, got, atol=2e-5)
  for k in ("policy_loss", "pg_loss", "kl_ref", "ratio_mean", "entropy"):
    np.testing.assert_allclose(gm[k], wm[k], rtol=1e-5, atol=1e-6)
  for k in ("rollout/logp_gap_abs", "rollout/logp_gap_k3", "rollout/ratio_outside_frac"):
    np.testing.assert_allclose(gm[k], wm[k], rtol=1e-4, atol=1e-6)
  assert gm["rollout/logp_gap_abs"] == pytest.approx(0.3, abs=1e-4)


def test_auto_is_exact_with_one_update_and_recompute_otherwise():
  assert tiny(**{"rl.num_minibatches": 1, "rl.old_logprobs": "auto"}).old_logprobs == "exact"
  assert tiny(**{"rl.old_logprobs": "auto"}).old_logprobs == "recompute"  # 2 mini-batches
  assert tiny(**{"rl.num_minibatches": 1, "rl.ppo_epochs": 2,
                 "rl.old_logprobs": "auto"}).old_logprobs == "recompute"
  assert tiny().old_logprobs == "recompute"  # the default


def test_behaviour_puts_the_samplers_logprobs_in_the_ratio(monkeypatch):
  # π_b = π_old · e^0.1 on every token: at the first update π_θ = π_old, so the ratio
  # π_θ / π_b is e^-0.1 (recompute's is 1); no old-policy pass runs.
  _shift_behaviour(monkeypatch, 0.1)
  over = {"rl.num_minibatches": 1, "value_pretrain.enabled": False}
  _, rm, rc = _rl_step(tiny(**over))
  _, bm, bc = _rl_step(tiny(**over, **{"rl.old_logprobs": "behaviour"}))
  assert (rc, bc) == (1, 0)
  assert rm["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  assert bm["ratio_mean"] == pytest.approx(np.exp(-0.1), abs=1e-4)
  assert "rollout/logp_gap_abs" in rm and "rollout/logp_gap_abs" not in bm


@pytest.mark.parametrize("over, match", [
    ({"rl.old_logprobs": "exact"}, "one optimizer step per rollout batch"),  # 2 mini-batches
    ({"rl.old_logprobs": "exact", "rl.num_minibatches": 1, "rl.ppo_epochs": 2},
     "one optimizer step per rollout batch"),
    ({"rl.old_logprobs": "behaviour", "model.dtype": "bfloat16"}, "float32 sampler"),
    ({"rl.old_logprobs": "behaviour", "sampling.decode_dtype": "bfloat16"}, "float32 sampler"),
    ({"rl.old_logprobs": "sampler"}, "one of"),
])
def test_unsafe_settings_are_config_errors(over, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    tiny(**over)


def test_behaviour_is_allowed_with_a_correction_or_float32():
  for over in ({"model.dtype": "bfloat16", "rl.behaviour_correction": "tis"},
               {"sampling.decode_dtype": "bfloat16", "rl.behaviour_correction": "mask"},
               {"sampling.decode_dtype": "float32"},
               {"model.dtype": "bfloat16", "sampling.decode_dtype": "bfloat16",
                "sampling.engine": "static", "rl.behaviour_correction": "tis"}):
    assert tiny(**over, **{"rl.old_logprobs": "behaviour"}).old_logprobs == "behaviour"


def _hp(old_logprobs, mode="none", cap=2.0):
  return update.PolicyHParams(temperature=1.0, eps_low=0.2, eps_high=0.28, dual_clip=None,
                              loss_mode="token", nll_coef=0.0, nll_threshold=1.0,
                              kl_coef=0.0, policy_loss="ppo", old_logprobs=old_logprobs,
                              correction=behaviour.Correction(mode, cap, (0.5, 2.0)))


def _case():
  # r = π_θ / π_b by hand: 1, 3, 0.25 | 1.5, then padding.
  logp = np.log(np.array([[0.5, 0.3, 0.1], [0.6, 0.2, 0.2]], np.float32))
  ratio = np.array([[1.0, 3.0, 0.25], [1.5, 1.0, 1.0]], np.float32)
  beh = logp - np.log(ratio)
  m = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
  return jnp.asarray(logp), jnp.asarray(beh), jnp.asarray(m), ratio


def test_old_policy_by_hand():
  logp, beh, m, ratio = _case()
  adv = jnp.ones_like(logp)
  tokens = jnp.sum(m)
  # recompute: the batch's log-probs as they are, nothing else.
  old, a, met = update.old_policy(_hp("recompute", "tis"), logp, beh, adv, m, tokens=tokens)
  assert old is beh and a is adv and met == {}
  # exact: π_old = π_θ; TIS w = min(r, 2) as the experience's; the gap against π_b.
  old, a, met = update.old_policy(_hp("exact", "tis"), logp, beh, adv, m, tokens=tokens)
  np.testing.assert_array_equal(np.asarray(old), np.asarray(logp))
  np.testing.assert_allclose(np.asarray(a), np.minimum(ratio, 2.0) * np.asarray(m), rtol=1e-6)
  r = ratio[np.asarray(m) > 0]
  assert float(met["rollout/logp_gap_abs"]) == pytest.approx(np.mean(np.abs(np.log(r))),
                                                              rel=1e-5)
  assert float(met["rollout/ratio_outside_frac"]) == pytest.approx(0.5)  # 3 and 0.25
  # behaviour: π_old = π_b; TIS w = min(1, 2 / r), so r·w = min(r, 2).
  old, a, met = update.old_policy(_hp("behaviour", "tis"), logp, beh, adv, m, tokens=tokens)
  assert old is beh
  np.testing.assert_allclose(np.asarray(a) * ratio, np.minimum(ratio, 2.0) * np.asarray(m),
                             rtol=1e-6)
  assert "rollout/logp_gap_abs" not in met
  old, a, met = update.old_policy(_hp("behaviour", "mask"), logp, beh, adv, m, tokens=tokens)
  np.testing.assert_array_equal(np.asarray(a), [[1, 0, 0], [1, 0, 0]])
  assert float(met["rollout/correction_weight_mean"]) == pytest.approx(0.5)


def test_update_weights_take_no_gradient():
  logp, beh, m, _ = _case()
  g = jax.grad(lambda x: jnp.sum(behaviour.update_weights(
      x, beh, m, behaviour.Correction("tis", 2.0, (0.5, 2.0)), anchor="behaviour")))(logp)
  np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_step_model_drops_the_saved_pass():
  from vapo_jax.pod import archs  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import step as step_model  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import slices  # pylint: disable=import-outside-toplevel
  resp, prompts = np.array([6, 3]), np.array([3, 5])
  names = {}
  for mode in ("recompute", "auto"):
    cfg = tiny(**{"rl.num_minibatches": 1, "rl.old_logprobs": mode})
    st = step_model.Setup.of(cfg, archs.model_config(cfg), slices.parse("v5p-8"),
                             step_model.Knobs(train="padded", rollout="static"))
    st = dataclasses.replace(st, rows=2)
    names[mode] = {p.name: p for p in step_model.train_side(st, resp, prompts)}
    floor = {p.name for p in step_model.train_side(st, resp, prompts, floor=True)}
    assert ("logprobs" in floor) == (mode == "recompute")
  assert "logprobs" in names["recompute"] and "logprobs" not in names["auto"]
  assert names["auto"]["policy_step"].flops == names["recompute"]["policy_step"].flops
