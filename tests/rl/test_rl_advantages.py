"""rl/advantages: the group-relative estimator against float64, and the two name tables
(rl.advantage_estimator → ESTIMATORS, rl.policy_loss → losses.POLICY_LOSSES) that a new
estimator or loss plugs into without an edit anywhere else."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import losses
from vapo_jax.rl import advantages
from vapo_jax.rl import batch as batch_lib
from vapo_jax.run import trainer as trainer_lib
from tiny_trainer import tiny


def test_group_relative_advantages():
  scores = np.array([1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1], np.float32)
  adv = advantages.group_relative_advantages(scores, 4)
  for g in range(3):
    s = scores[4 * g:4 * g + 4].astype(np.float64)
    np.testing.assert_allclose(adv[4 * g:4 * g + 4], (s - s.mean()) / (s.std(ddof=1) + 1e-6),
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv[4:8], 0.0)  # an all-correct group carries no signal
  no_std = advantages.group_relative_advantages(scores, 4, normalize_std=False)
  np.testing.assert_allclose(no_std[:4], [0.5, -0.5, -0.5, 0.5])
  with pytest.raises(ValueError, match="n=5"):
    advantages.group_relative_advantages(scores, 5)
  # The same groups given by id, in any row order, give the same advantages.
  perm = np.random.default_rng(0).permutation(12)
  for normalize_std in (True, False):
    by_size = advantages.group_relative_advantages(scores, 4, normalize_std=normalize_std)
    by_id = advantages.group_relative_advantages(scores[perm], group_ids=perm // 4,
                                                 normalize_std=normalize_std)
    np.testing.assert_allclose(by_id, np.asarray(by_size)[perm], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("normalize_std, ddof", [(True, 1), (True, 0), (False, 1)])
def test_group_relative_advantages_with_unequal_groups(normalize_std, ddof):
  """Groups by id of sizes 3, 1, 4 and 2, rows interleaved; float64 reference per group."""
  scores = np.array([1, 0, 0.5, 1, 0, 0, 1, 1, 0, 1], np.float32)
  ids = np.array([0, 2, 1, 2, 0, 2, 3, 0, 3, 2])
  got = np.asarray(advantages.group_relative_advantages(scores, group_ids=ids,
                                                        normalize_std=normalize_std,
                                                        ddof=ddof, eps=1e-3))
  for g in np.unique(ids):
    s = scores[ids == g].astype(np.float64)
    want = s - s.mean()
    if normalize_std:
      want = want / (np.sqrt(np.sum(want ** 2) / max(len(s) - ddof, 1)) + 1e-3)
    np.testing.assert_allclose(got[ids == g], want, rtol=1e-5, atol=1e-6, err_msg=f"group {g}")


# ------------------------------------------------------------------- the tables, by name


def toy_estimate(ac, scores_B, lengths_B, mask_BxR, values_BxR, group_ids_B, lam_policy_B):
  """REINFORCE with a constant baseline: A = score − ½ on every real token; no critic."""
  del ac, lengths_B, values_BxR, group_ids_B, lam_policy_B
  adv = (scores_B - 0.5)[:, None] * mask_BxR
  return advantages.Estimate(adv, jnp.zeros_like(mask_BxR), {"toy/baseline": jnp.float32(0.5)})


def toy_loss(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip, mode):
  """Twice the unclipped surrogate −ρ·A (so that it differs from PPO's at ρ = 1)."""
  del eps_low, eps_high, dual_clip
  ratio = jnp.exp(jnp.where(mask > 0, logp - jax.lax.stop_gradient(old_logp), 0.0))
  return losses.PolicyLoss(losses.aggregate(-2.0 * adv * ratio, mask, mode),
                           {"tokens": jnp.sum(mask)})


def test_a_toy_estimator_and_loss_plug_in_through_the_tables_only(monkeypatch):
  monkeypatch.setitem(advantages.ESTIMATORS, "toy", advantages.Estimator(toy_estimate,
                                                                          critic=False))
  monkeypatch.setitem(losses.POLICY_LOSSES, "toy", toy_loss)
  cfg = tiny(**{"rl.advantage_estimator": "toy", "rl.policy_loss": "toy",
                "value_pretrain.enabled": False, "rl.nll_coef": 0.0,
                "rl.whiten_advantages": False, "rl.num_minibatches": 1, "mesh.fsdp": 1})
  assert not cfg.uses_critic
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    t.setup("policy")
    batch, m = t.experience(next(t.state.prompts))
    um = t.update(batch, stage="rl", step=0, policy=True)
    assert "critic" not in t.state.learners  # the estimator needs none
  finally:
    t.close()
  b = jax.device_get(batch)
  # The batch is the type the compile check lowers its programs from, field for field.
  like = batch_lib.abstract(cfg.rl.rollout_prompts * cfg.rl.group_size,
                            cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens)
  assert (jax.tree.map(lambda x: (x.shape, x.dtype), b)
          == jax.tree.map(lambda x: (x.shape, x.dtype), like))
  mask = b.response_mask_BxR
  want = (b.scores_B[:, None] - 0.5) * mask
  np.testing.assert_array_equal(b.advantages_BxR, want)
  assert m["toy/baseline"] == 0.5 and 0 < m["reward/mean"] < 1
  # One mini-batch at the weights that sampled it: ρ = 1, so L = −2·Σ A / Σ m.
  np.testing.assert_allclose(um["pg_loss"], -2 * want.sum() / mask.sum(), rtol=1e-4,
                             atol=1e-6)
  assert "clip_frac_low" not in um and um["policy_grad_norm"] > 0
