"""LoRA on the policy and the critic (`models.lora`): the math against float64 and the chain
rule, only adapters trained and held by the optimizer, the sampler scoring like the train
step, a resumed run equal to an uninterrupted one, and the CLI run + export reloaded in
transformers with equal logits."""

import dataclasses
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
from vapo_jax import policy as policy_lib
from vapo_jax import sharding as shd
from vapo_jax.models import lora, stacked, transformer
from vapo_jax.models.config import LORA_TARGETS, tiny_config
from vapo_jax.rl import forward
from vapo_jax.rl import layout
from vapo_jax.run import checkpoint_store
from vapo_jax.run import trainer as trainer_lib
from vapo_jax.sampler import static as static_lib
from vapo_jax.sampler import types
from vapo_jax.sampler.ops import SamplingConfig
from checkpoint_runs import (Recorder, assert_bitwise_equal, compile_cache,  # noqa: F401 (fixture)
                             run_to_end, small)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK, ALPHA = 4, 8.0


def mesh1():
  return shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def adapted(seed=0, targets=LORA_TARGETS, randomize_b=True, **kw):
  """(base model, adapted model) of a tiny config; B random so the adapters matter."""
  cfg = tiny_config(vocab_size=40, lora_rank=RANK, lora_alpha=ALPHA, lora_targets=targets,
                    **kw)
  base = transformer.Transformer(lora.base_config(cfg), rngs=nnx.Rngs(seed))
  model = lora.attach(base, cfg, mesh1(), seed=seed + 1)
  if randomize_b:
    key = jax.random.key(seed + 7)
    for blk in ([model.blocks] if model.cfg.scan_layers else model.blocks):  # (stacked [L])
      for mod in (blk.attn, blk.mlp):
        for name in targets:
          var = getattr(mod, name + "_lora_b", None)
          if var is not None:
            key, sub = jax.random.split(key)
            var.set_value(0.3 * jax.random.normal(sub, var.get_value().shape))
  return base, model


def batch(b=3, t=11, vocab=40, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[0, :3] = 0  # left padding
  return jnp.asarray(tokens), jnp.asarray(mask)


def test_projection_is_the_float64_formula():
  _, model = adapted()
  attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
  x = np.random.default_rng(1).normal(size=(2, 5, 128))
  s = ALPHA / RANK
  f64 = lambda v: np.asarray(v[...], np.float64)  # noqa: E731
  want_q = (np.einsum("btd,dhk->bthk", x, f64(attn.q))
            + s * np.einsum("btd,dr,rhk->bthk", x, f64(attn.q_lora_a), f64(attn.q_lora_b)))
  got_q = lora.project(attn, "q", jnp.asarray(x, jnp.float32), 1, jnp.float32)
  np.testing.assert_allclose(np.asarray(got_q), want_q, rtol=1e-4, atol=1e-4)
  h = np.random.default_rng(2).normal(size=(2, 5, 4, 32))  # o: two in-axes
  want_o = (np.einsum("bthk,hkd->btd", h, f64(attn.o))
            + s * np.einsum("bthk,hkr,rd->btd", h, f64(attn.o_lora_a), f64(attn.o_lora_b)))
  got_o = lora.project(attn, "o", jnp.asarray(h, jnp.float32), 2, jnp.float32)
  np.testing.assert_allclose(np.asarray(got_o), want_o, rtol=1e-4, atol=1e-4)
  assert attn.q_lora_a.shape == (128, RANK) and attn.o_lora_a.shape == (4, 32, RANK)
  assert mlp.down_lora_b.shape == (RANK, 128)
  assert attn.q_lora_a[...].dtype == jnp.float32  # adapters stay float32


def test_fresh_adapters_change_nothing_and_merging_keeps_the_logits():
  base, model = adapted(randomize_b=False)
  tokens, mask = batch()
  want = transformer.forward_logits(base, tokens, mask)
  np.testing.assert_array_equal(np.asarray(transformer.forward_logits(model, tokens, mask)),
                                np.asarray(want))  # B = 0: exactly the base
  _, model = adapted()
  ours = transformer.forward_logits(model, tokens, mask)
  assert np.abs(np.asarray(ours - want)).max() > 1e-3  # the adapters matter
  plain = lora.merged(model)
  assert plain.cfg.lora_rank == 0 and not lora.has_adapters(nnx.state(plain))
  np.testing.assert_allclose(np.asarray(transformer.forward_logits(plain, tokens, mask)),
                             np.asarray(ours), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("remat", [False, True])
def test_gradients_are_the_adapters_chain_rule(remat):
  """dL/dA = s dL/dW' B^T and dL/dB = s A^T dL/dW' with W' = W + s A B (the merged model)."""
  _, model = adapted(remat=remat, targets=("q", "o", "down"))
  tokens, mask = batch()
  w_out = jax.random.normal(jax.random.key(3), (3, 11, 40))
  graphdef, params = nnx.split(model)

  def loss(p, gd):
    return jnp.sum(transformer.forward_logits(nnx.merge(gd, p), tokens, mask) * w_out)

  train, frozen = lora.split_trainable(params)
  names = {str(p[-1]) for p in nnx.to_flat_state(train).paths}
  assert names == {f"{n}{s}" for n in ("q", "o", "down") for s in lora.SUFFIXES}
  grads = jax.grad(lambda tr: loss(lora.join(tr, frozen), graphdef))(train)
  plain = lora.merged(model)
  p_graphdef, p_params = nnx.split(plain)
  full = jax.grad(lambda p: loss(p, p_graphdef))(p_params)
  s = ALPHA / RANK
  per_layer = lambda t: stacked.unstack_tree(nnx.to_pure_dict(t))["blocks"]  # noqa: E731
  grads, params, full = per_layer(grads), per_layer(params), per_layer(full)
  for blk in range(2):
    for mod, name, n_in in (("attn", "q", 1), ("attn", "o", 2), ("mlp", "down", 1)):
      g = grads[blk][mod]
      a = params[blk][mod][name + "_lora_a"]
      b = params[blk][mod][name + "_lora_b"]
      dw = full[blk][mod][name]
      n_out = dw.ndim - n_in
      want_a = s * jnp.tensordot(dw, b, axes=(tuple(range(n_in, dw.ndim)),
                                              tuple(range(1, 1 + n_out))))
      want_b = s * jnp.tensordot(a, dw, axes=(tuple(range(n_in)), tuple(range(n_in))))
      np.testing.assert_allclose(np.asarray(g[name + "_lora_a"]), np.asarray(want_a),
                                 rtol=2e-3, atol=2e-4)
      np.testing.assert_allclose(np.asarray(g[name + "_lora_b"]), np.asarray(want_b),
                                 rtol=2e-3, atol=2e-4)


def test_sampler_logprobs_equal_the_train_steps():
  _, model = adapted(seed=2)
  cfg = SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=20, top_p=0.9,
                       stop_token_ids=(1, 2), pad_id=0, n_per_prompt=3, max_prompt_len=16)
  graphdef, state = nnx.split(model)
  sampler = static_lib.Sampler.for_transformer(graphdef, model.cfg, cfg)
  out = sampler(state, [[5, 17, 33, 2, 7], [3, 14], [9]], jax.random.key(1))
  tokens_BxL, mask_BxL = types.rollout_tokens(out)
  # What the policy step scores the rollout with: forward.policy_logprobs on the params.
  logp, _ = forward.policy_logprobs(
      graphdef, state, layout.PaddedRows(tokens_BxL, mask_BxL, out.prompt_len), temperature=0.7)
  m = np.asarray(out.response_mask_BxR)
  assert m.sum() > 10
  np.testing.assert_allclose(np.asarray(logp) * m, np.asarray(out.logp_BxR), atol=5e-5)
  # ... and they are not the base model's.
  plain, _ = adapted(seed=2)
  logp0, _ = policy_lib.response_logprobs(plain, tokens_BxL, mask_BxL, out.prompt_len,
                                          temperature=0.7)
  assert np.abs((np.asarray(logp0) - np.asarray(logp)) * m).max() > 1e-3


def with_lora(cfg, **kw):
  lora_cfg = config_lib.LoraSection(rank=RANK, alpha=ALPHA, **kw)
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=lora_cfg,
                                                            param_dtype="bfloat16"))


def flat(tree) -> dict:
  return {jax.tree_util.keystr(p).removesuffix(".value"): np.asarray(x)
          for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(tree))}


def test_resumed_lora_run_equals_uninterrupted_and_trains_only_adapters(tmp_path, monkeypatch):
  cfg = with_lora(small(**{"sft.steps": 2}))
  start = trainer_lib.Trainer(cfg, None, progress=False)
  initial = flat(start.parts.policy_params)
  start.close()
  assert any(k.endswith("q_lora_a']") for k in initial)
  assert all(v.dtype == jnp.bfloat16 for k, v in initial.items() if "lora" not in k)

  Recorder(monkeypatch)
  want, _ = run_to_end(cfg, str(tmp_path / "a"))
  for name in ("policy", "critic"):
    params = flat(want[name].params)
    frozen = {k for k in params if "lora" not in k and k != "['score']"}
    # The critic starts from the policy after SFT, whose base SFT did not touch either.
    assert frozen and all(np.array_equal(params[k], initial[k.replace("['backbone']", "")])
                          for k in frozen)
    changed = [k for k in params if "_lora_b" in k and np.abs(params[k]).max() > 0]
    assert changed, f"{name}: adapters never trained"
    # Adam's moments: one per trainable parameter (adapters, and the critic's head) only.
    opt = flat(want[name].opt_state)
    trainable = sum(v.size for k, v in params.items() if "lora" in k or k == "['score']")
    assert sum(v.size for v in opt.values()) <= 2 * trainable + 16
  assert np.abs(np.asarray(want["critic"].params["score"][...])).max() > 0

  Recorder(monkeypatch, kill_at=[("sft", 1), ("value_pretrain", 1), ("rl", 2)])
  got, summaries = run_to_end(cfg, str(tmp_path / "b"))
  assert len(summaries) == 4 and all("preempted" in s for s in summaries[:3])
  assert_bitwise_equal(got, want)


def test_lora_config_errors_name_the_field():
  c = config_lib.default_config_dict()
  c.model.lora.rank = 4
  c.model.lora.targets = ("q", "qkv")
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.lora\.targets="):
    config_lib.from_config_dict(c)
  c.model.lora.targets = ("q",)
  c.model.lora.rank = -1
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.lora\.rank=-1"):
    config_lib.from_config_dict(c)


def test_cli_run_with_lora_exports_a_plain_checkpoint_transformers_loads(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  flags = ["--config=configs/tiny.py", "--config.model.lora.rank=4",
           "--config.model.lora.alpha=8.0", "--config.model.param_dtype=bfloat16",
           "--config.sft.steps=2", "--config.sft.batch_size=8",
           "--config.value_pretrain.max_steps=1", "--config.value_pretrain.min_steps=1",
           "--config.rl.steps=2", "--config.rl.prompts_per_step=4",
           "--config.rl.responses_per_prompt=2", "--config.sampling.max_new_tokens=8",
           "--config.eval.num_examples=4", "--config.eval.batch_prompts=4",
           "--config.data.num_train=64", "--config.data.num_eval=4",
           "--config.metrics.tensorboard=False", "--config.metrics.plot=False",
           "--config.mesh.fsdp=1"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  workdir = str(tmp_path / "run")

  def run(module, *extra):
    out = subprocess.run([sys.executable, "-m", module, *flags, *extra], cwd=ROOT, env=env,
                         text=True, capture_output=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]

  run("vapo_jax.main", "--noprogress", f"--workdir={workdir}")
  for what in ("policy", "critic"):
    run("vapo_jax.tools.export", f"--workdir={workdir}", f"--out={tmp_path / what}",
        f"--what={what}", "--dtype=float32")

  store = checkpoint_store.CheckpointStore(os.path.join(workdir, "checkpoints"), read_only=True)
  try:  # the run's config, as the command built it
    cfg = config_lib.from_config_dict(store.read_meta(store.steps()[-1])["config"])
  finally:
    store.close()
  assert cfg.model.lora.rank == 4
  t = trainer_lib.Trainer(cfg, workdir, progress=False, read_only=True)
  try:
    t.resume()
    policy, critic = t.policy_model(), t.critic_model()
  finally:
    t.close()
  assert lora.has_adapters(nnx.state(policy)) and lora.has_adapters(nnx.state(critic))
  tokens = np.random.default_rng(0).integers(3, t.parts.text.vocab_size, (2, 12))
  tokens = tokens.astype(np.int32)
  mask = np.ones_like(tokens)
  ours = np.asarray(transformer.forward_logits(policy, jnp.asarray(tokens), jnp.asarray(mask)))
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "policy",
                                                          dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
  values = np.asarray(critic(jnp.asarray(tokens), jnp.asarray(mask)))
  hf_critic = transformers.AutoModelForSequenceClassification.from_pretrained(
      tmp_path / "critic", dtype=torch.float32).eval()
  with torch.no_grad():
    score = hf_critic(torch.tensor(tokens, dtype=torch.long)).logits.numpy()[:, 0]
  np.testing.assert_allclose(values[:, -1], score, atol=2e-4, rtol=1e-4)


def test_critic_values_use_its_adapters():
  _, model = adapted(seed=4)
  critic = critic_lib.Critic.from_policy(model, head_scale=1.0)
  tokens, mask = batch()
  plain = lora.merged(critic)
  np.testing.assert_allclose(np.asarray(critic(tokens, mask)), np.asarray(plain(tokens, mask)),
                             atol=2e-5, rtol=1e-5)
  assert lora.has_adapters(nnx.state(critic)) and not lora.has_adapters(nnx.state(plain))
