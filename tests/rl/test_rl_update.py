"""The jitted train steps against independent references (issue #19).

The trainer's own `policy_step` / `critic_step` (the functions `run.learners` compiles) run on a
tiny model and a hand-made mini-batch: varied prompt and response lengths (one response is
empty), correct and wrong responses, advantages of both signs, ratios well outside the clip
range. Their reported losses and metrics are checked against float64 formulas written here from
VAPO eqs. (3)–(5), on the model's per-token log-probs computed separately from the full logits
(`forward_logits` + log-softmax), not through `policy.response_logprobs`. Their gradients are
read off the parameters after one plain SGD step with lr = 1 (no clipping, no decay), and
compared with the chain rule: the float64 `jax.grad` of the reference loss with respect to the
log-probs (or values), pulled back through the model with `jax.vjp`.
"""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.models import Transformer, forward_logits, init_sharded, tiny_config
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import layout as layout_lib
from vapo_jax.rl import train_state
from vapo_jax.rl import update
from vapo_jax.run import learners

MODEL = tiny_config(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
P, R = 4, 6
PROMPT_LENS = np.array([4, 2, 3, 4, 1, 4, 2, 3])
RESP_LENS = np.array([6, 1, 3, 0, 5, 2, 6, 4])         # row 3: an empty response
SCORES = np.array([1.0, 0.0, 1.0, 1.0, 0.99, 1.0, 0.0, 1.0], np.float32)  # 0.99: not correct
SGD = optax.sgd(1.0)  # params_after = params_before - grad, exactly what the step computed


def one_device_mesh():
  return shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def policy_model(mesh):
  return init_sharded(lambda r: Transformer(MODEL, rngs=r), mesh, seed=3)


def critic_model(mesh):
  def build(r):
    c = critic_lib.Critic(MODEL, rngs=r)
    c.score[...] = jax.random.normal(jax.random.key(5), c.score.shape) * 0.5
    return c
  return init_sharded(build, mesh, seed=4)


def masks():
  cols = np.arange(P + R)[None]
  prompt = (cols >= P - PROMPT_LENS[:, None]) & (cols < P)
  resp = (cols >= P) & (cols < P + RESP_LENS[:, None])
  return (prompt | resp).astype(np.float32), resp[:, P:].astype(np.float32)


def ref_logp_entropy(model, tokens, mask, temperature):
  """[B, R] log π(y_t | s_t) and entropies from the full logits at column P + t − 1 (float32)."""
  z = forward_logits(model, jnp.asarray(tokens), jnp.asarray(mask, jnp.int32))[:, P - 1:-1]
  logq = jax.nn.log_softmax(z / temperature, axis=-1)
  logp = jnp.take_along_axis(logq, jnp.asarray(tokens)[:, P:, None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logq) * logq, axis=-1)
  return logp, entropy


def policy_batch(model, seed=0, temperature=1.0):
  rng = np.random.default_rng(seed)
  mask, resp = masks()
  tokens = (rng.integers(1, MODEL.vocab_size, mask.shape) * mask).astype(np.int32)
  logp, _ = ref_logp_entropy(model, tokens, mask, temperature)
  old = (np.asarray(logp) + rng.normal(scale=0.5, size=resp.shape)) * resp
  adv = rng.normal(size=resp.shape) * resp
  return {"tokens_BxL": tokens, "mask_BxL": mask, "old_logp_BxR": old.astype(np.float32),
          "advantages_BxR": adv.astype(np.float32), "response_mask_BxR": resp,
          "scores_B": SCORES,
          "returns_BxR": (rng.normal(size=resp.shape) * resp).astype(np.float32),
          "old_values_BxR": np.zeros_like(resp),
          # A frozen reference policy's log-probs (GRPO's KL term), near the current ones.
          "ref_logp_BxR": ((np.asarray(logp) + rng.normal(scale=0.3, size=resp.shape))
                           * resp).astype(np.float32)}


# ------------------------------------------------------------------- float64 references


def ref_policy_loss(logp, batch, hp):
  """(L, (L_PPO, L_NLL)) of VAPO eq. (5), written from the paper, float64."""
  old = jnp.asarray(batch["old_logp_BxR"], jnp.float64)
  adv = jnp.asarray(batch["advantages_BxR"], jnp.float64)
  m = jnp.asarray(batch["response_mask_BxR"], jnp.float64)
  ratio = jnp.exp(jnp.where(m > 0, logp - old, 0.0))
  surrogate = jnp.minimum(ratio * adv,
                          jnp.clip(ratio, 1 - hp.eps_low, 1 + hp.eps_high) * adv)
  per_token = -surrogate
  if hp.dual_clip:
    per_token = jnp.where(adv < 0, jnp.minimum(per_token, -hp.dual_clip * adv), per_token)
  lengths = m.sum(axis=1)
  nonempty = lengths > 0

  def aggregate(per_token):
    per_token = per_token * m
    if hp.loss_mode == "token":        # Σ over every valid token of the batch / their number
      return per_token.sum() / m.sum()
    if hp.loss_mode == "seq_mean_token_mean":  # mean over responses of each one's token mean
      return jnp.sum(jnp.where(nonempty, per_token.sum(1) / jnp.maximum(lengths, 1), 0.0)
                     ) / nonempty.sum()
    return per_token.sum() / nonempty.sum()  # "seq_mean_token_sum": mean of response sums

  pg = aggregate(per_token)
  correct = (jnp.asarray(batch["scores_B"], jnp.float64) >= hp.nll_threshold)[:, None] * m
  nll = -jnp.sum(logp * correct) / correct.sum()  # eq. (3): tokens of correct responses only
  total = pg + hp.nll_coef * nll
  if hp.kl_coef:  # GRPO: β · KL(π_θ‖π_ref), k3 estimator on the sampled tokens
    d = jnp.asarray(batch["ref_logp_BxR"], jnp.float64) - logp
    total = total + hp.kl_coef * aggregate(jnp.exp(d) - d - 1.0)
  return total, (pg, nll)


def ref_value_loss(values, batch, value_clip):
  """½(V − R)² (PPO-clipped with value_clip), token-level over the batch, float64."""
  ret = jnp.asarray(batch["returns_BxR"], jnp.float64)
  m = jnp.asarray(batch["response_mask_BxR"], jnp.float64)
  per_token = 0.5 * (values - ret) ** 2
  if value_clip:
    old = jnp.asarray(batch["old_values_BxR"], jnp.float64)
    clipped = old + jnp.clip(values - old, -value_clip, value_clip)
    per_token = jnp.maximum(per_token, 0.5 * (clipped - ret) ** 2)
  return jnp.sum(per_token * m) / m.sum()


def pulled_back(fn, params, cotangent):
  """The gradient of Σ fn(params) · cotangent with respect to params (chain rule)."""
  _, vjp = jax.vjp(fn, params)
  return vjp(jnp.asarray(cotangent, jnp.float32))[0]


# The row layouts a step is checked on: padded rows in 1 or 2 micro-batches, and packed rows
# (rows of P + R slots, 2 per micro-batch: the batch's 8 sequences make K = 3 micro-batches).
LAYOUTS = {"padded": layout_lib.Padded(2), "padded1": layout_lib.Padded(1),
           "packed": layout_lib.Packed(packing.PackSpec(P + R, 2, 1))}


def run_step(step_fn, hp, graphdef, params, mesh, batch, layout=LAYOUTS["padded"]):
  """One compiled step with plain SGD(lr=1) on a row layout: (metrics, gradient read off the
  parameters)."""
  state = train_state.init_state(params, SGD)
  before = jax.device_get(state.params)
  axes = shd.batch_axes(mesh)
  step = layout.step("step", train_state.compile_step(
      functools.partial(step_fn, graphdef, SGD, hp, layout), state, mesh, axes), mesh, axes)
  batch = batch_lib.RolloutBatch(**batch)
  state, metrics, skipped = step(state, batch_lib.shard_batch(batch, mesh, shd.batch_axes(mesh)))
  metrics = dict(metrics, skipped=skipped)
  after = jax.device_get(state.params)
  grads = jax.tree.map(lambda b, a: np.asarray(b, np.float64) - np.asarray(a), before, after)
  return jax.device_get(metrics), grads


def assert_grads_close(got, want):
  want = jax.tree.map(np.asarray, want)
  scale = max(float(np.max(np.abs(w))) for w in jax.tree.leaves(want))
  assert scale > 1e-3  # the step really moves the parameters
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=2e-3, atol=1e-5 * scale)


def tree_norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                           for x in jax.tree.leaves(tree))))


# ------------------------------------------------------------------------------ policy


def preset_config(preset):
  c = config_lib.apply_preset(config_lib.default_config_dict(), preset)
  return config_lib.from_config_dict(c)


def preset_hparams(preset):
  return learners.policy_hparams(preset_config(preset))


# The presets' hyper-parameters as the paper and the baselines define them.
PRESET_EXPECT = {
    "ppo": dict(loss_mode="seq_mean_token_mean", eps_high=0.2, nll_coef=0.0),
    "grpo": dict(loss_mode="seq_mean_token_mean", eps_high=0.2, nll_coef=0.0, kl_coef=0.04),
    "dapo": dict(loss_mode="token", eps_high=0.28, nll_coef=0.0),
    "vapo": dict(loss_mode="token", eps_high=0.28, nll_coef=0.1),
}


def mode_hparams(mode):
  """Every aggregation mode, with dual clip, a temperature, a large NLL weight and the KL
  penalty."""
  return dataclasses.replace(preset_hparams("vapo"), loss_mode=mode, dual_clip=3.0,
                             nll_coef=0.5, temperature=0.7, kl_coef=0.05)


MODES = ("token", "seq_mean_token_mean", "seq_mean_token_sum")  # as documented in losses
# Presets in 2 padded micro-batches; every mode in 1 padded and on packed rows (the default
# path: a normaliser there that ignored the loss mode would fail here).
CASES = ([pytest.param(preset_hparams, p, "padded", id=f"preset-{p}") for p in PRESET_EXPECT]
         + [pytest.param(preset_hparams, "grpo", "packed", id="preset-grpo-packed")]
         + [pytest.param(mode_hparams, m, lay, id=f"mode-{m}-{lay}") for m in MODES
            for lay in ("padded1", "packed")])


@pytest.mark.parametrize("make_hp, name, lay", CASES)
def test_policy_step_matches_reference(make_hp, name, lay):
  hp = make_hp(name)
  if make_hp is preset_hparams:
    for field, want in PRESET_EXPECT[name].items():
      assert getattr(hp, field) == pytest.approx(want), field
    assert hp.eps_low == pytest.approx(0.2) and hp.nll_threshold == 1.0
  mesh = one_device_mesh()
  model = policy_model(mesh)
  graphdef, params = nnx.split(model)
  batch = policy_batch(model, temperature=hp.temperature)
  logp32, entropy = ref_logp_entropy(model, batch["tokens_BxL"], batch["mask_BxL"],
                                     hp.temperature)

  with jax.enable_x64(True):
    logp = jnp.asarray(np.asarray(logp32), jnp.float64)
    (total, (pg, nll)), dl_dlogp = jax.value_and_grad(
        lambda lp: ref_policy_loss(lp, batch, hp), has_aux=True)(logp)
    total, pg, nll, dl_dlogp = map(np.asarray, (total, pg, nll, dl_dlogp))

  def model_logp(p):
    return ref_logp_entropy(nnx.merge(graphdef, p), batch["tokens_BxL"], batch["mask_BxL"],
                            hp.temperature)[0]

  want_grads = pulled_back(model_logp, params, dl_dlogp)
  metrics, grads = run_step(update.policy_step, hp, graphdef, params, mesh, batch,
                            LAYOUTS[lay])

  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["nll_loss"], nll, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["policy_loss"], total, rtol=1e-5, atol=1e-7)
  assert_grads_close(grads, want_grads)
  np.testing.assert_allclose(metrics["policy_grad_norm"], tree_norm(want_grads), rtol=1e-4)
  assert metrics["skipped"] == 0 and metrics["rows"] == len(SCORES)

  # The token-mean diagnostics, over the batch's real tokens.
  m = batch["response_mask_BxR"] > 0
  old, adv = batch["old_logp_BxR"].astype(np.float64), batch["advantages_BxR"]
  logp = np.asarray(logp)
  ratio = np.exp(logp - old)
  low = (adv < 0) & (ratio < 1 - hp.eps_low) & m
  high = (adv > 0) & (ratio > 1 + hp.eps_high) & m
  assert low.any() and high.any()  # the batch exercises both clip bounds
  np.testing.assert_allclose(metrics["clip_frac_low"], low.sum() / m.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac_high"], high.sum() / m.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["ratio_mean"], ratio[m].mean(), rtol=1e-5)
  log_r = logp - old  # k3 of KL(π_old‖π_θ) on tokens drawn from π_old: r = π_θ / π_old
  np.testing.assert_allclose(metrics["approx_kl"], (np.exp(log_r) - 1 - log_r)[m].mean(),
                             rtol=1e-4)
  np.testing.assert_allclose(metrics["entropy"], np.asarray(entropy, np.float64)[m].mean(),
                             rtol=1e-5)
  if hp.dual_clip:
    per_token = -np.minimum(ratio * adv,
                            np.clip(ratio, 1 - hp.eps_low, 1 + hp.eps_high) * adv)
    dual = (adv < 0) & (per_token > -hp.dual_clip * adv) & m
    np.testing.assert_allclose(metrics["clip_frac_dual"], dual.sum() / m.sum(), rtol=1e-6)



# ------------------------------------------------------------------------------ critic


def ref_values(critic, tokens, mask):
  """V(s_t) for response token t: the value head at column P + t − 1 (float32)."""
  return critic(jnp.asarray(tokens), jnp.asarray(mask, jnp.int32))[:, P - 1:-1]


@pytest.mark.parametrize("hp, lay", [
    (learners.critic_hparams(preset_config("vapo")), "padded"),
    (learners.critic_hparams(preset_config("ppo")), "padded1"),
    (update.CriticHParams(value_clip=0.05, loss_mode="token"), "padded"),
    (update.CriticHParams(value_clip=0.05, loss_mode="token"), "packed"),
], ids=["vapo", "ppo", "value-clip", "value-clip-packed"])
def test_critic_step_matches_reference(hp, lay):
  mesh = one_device_mesh()
  critic = critic_model(mesh)
  graphdef, params = nnx.split(critic)
  batch = policy_batch(policy_model(mesh), seed=1)
  values32 = ref_values(critic, batch["tokens_BxL"], batch["mask_BxL"])
  rng = np.random.default_rng(7)
  batch["old_values_BxR"] = ((np.asarray(values32) + rng.normal(scale=0.1, size=values32.shape))
                             * batch["response_mask_BxR"]).astype(np.float32)

  with jax.enable_x64(True):
    values = jnp.asarray(np.asarray(values32), jnp.float64)
    loss, dl_dv = jax.value_and_grad(lambda v: ref_value_loss(v, batch, hp.value_clip))(values)
    loss, dl_dv = np.asarray(loss), np.asarray(dl_dv)

  want_grads = pulled_back(
      lambda p: ref_values(nnx.merge(graphdef, p), batch["tokens_BxL"], batch["mask_BxL"]),
      params, dl_dv)
  metrics, grads = run_step(update.critic_step, hp, graphdef, params, mesh, batch,
                            LAYOUTS[lay])
  np.testing.assert_allclose(metrics["value_loss"], loss, rtol=1e-5, atol=1e-7)
  assert_grads_close(grads, want_grads)
  np.testing.assert_allclose(metrics["critic_grad_norm"], tree_norm(want_grads), rtol=1e-4)
  assert metrics["skipped"] == 0
  if hp.value_clip:
    v, old = np.asarray(values32, np.float64), batch["old_values_BxR"]
    ret, m = batch["returns_BxR"], batch["response_mask_BxR"] > 0
    clipped = old + np.clip(v - old, -hp.value_clip, hp.value_clip)
    frac = ((clipped - ret) ** 2 > (v - ret) ** 2) & m
    assert 0 < frac.sum() < m.sum()
    np.testing.assert_allclose(metrics["value_clip_frac"], frac.sum() / m.sum(), rtol=1e-6)


# ------------------------------------------------------------------ 1 device = 8 devices


def test_policy_step_on_8_devices_equals_one_device():
  hp = dataclasses.replace(preset_hparams("ppo"), nll_coef=0.2)
  out = []
  for mesh in (one_device_mesh(), shd.make_mesh(data=2, fsdp=2, tensor=2)):
    model = policy_model(mesh)
    graphdef, params = nnx.split(model)
    batch = policy_batch(model)
    out.append(run_step(update.policy_step, hp, graphdef, params, mesh, batch))
  (one, g1), (eight, g8) = out
  assert one["policy_grad_norm"] > 0
  np.testing.assert_allclose(eight["policy_grad_norm"], one["policy_grad_norm"], rtol=1e-5)
  for k in ("policy_loss", "pg_loss", "nll_loss", "entropy", "clip_frac_low", "approx_kl"):
    np.testing.assert_allclose(eight[k], one[k], rtol=1e-5, atol=1e-7, err_msg=k)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g8)):
    np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-4)
