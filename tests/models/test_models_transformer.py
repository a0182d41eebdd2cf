"""The transformer without HF: KV cache, remat, bf16, jit over split/merge."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.models import (ModelConfig, Transformer, forward_logits,
                             init_cache, positions_from_mask, tiny_config)


def _model(**kw):
  return Transformer(tiny_config(**kw), rngs=nnx.Rngs(0))


def _batch(b=3, t=10, vocab=40, seed=0):
  rng = np.random.RandomState(seed)
  tokens = jnp.asarray(rng.randint(0, vocab, (b, t)), jnp.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :2] = 0
  mask[2, :6] = 0
  return tokens, jnp.asarray(mask)


def test_tiny_config_and_positions():
  cfg = tiny_config(num_layers=3)
  assert cfg.head_dim == 32 and cfg.vocab_size == 40
  m = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(positions_from_mask(m),
                                [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]])
  with pytest.raises(ValueError, match="num_kv_heads"):
    ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=8,
                num_layers=1, num_heads=4, num_kv_heads=3)


def test_from_hf_accepts_rope_theta_and_rope_parameters():
  base = dict(model_type="qwen2", vocab_size=8, hidden_size=16,
              intermediate_size=8, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1)
  a = ModelConfig.from_hf({**base, "rope_theta": 123.0})
  b = ModelConfig.from_hf({**base, "rope_parameters": {
      "rope_theta": 123.0, "rope_type": "default"}})
  assert a == b and a.rope_theta == 123.0 and a.qkv_bias
  assert ModelConfig.from_hf(a.to_hf()) == a


@pytest.mark.parametrize("qk_norm,attention", [(False, "auto"), (True, "auto"),
                                               (False, "blocked")])
def test_kv_cache_decoding_matches_full_forward(qk_norm, attention):
  # attention="blocked": the full forward and the 6-token prefill into a 16-slot cache take
  # the blocked path (blocks of 4 keys); one-token steps stay dense.
  model = _model(qk_norm=qk_norm, qkv_bias=not qk_norm, attention_impl=attention,
                 attention_block=4)
  tokens, mask = _batch()
  full = forward_logits(model, tokens, mask)
  b, t = tokens.shape
  p, s = 6, 16
  graphdef, state = nnx.split(model)

  @jax.jit
  def step(state, tok, pos, kv_mask, cache, idx):
    m = nnx.merge(graphdef, state)
    h, cache = m(tok, pos, kv_mask, cache=cache, cache_index=idx)
    return m.logits(h), cache

  kv_mask = jnp.zeros((b, s), jnp.int32).at[:, :t].set(mask)
  positions = positions_from_mask(mask)
  cache = init_cache(model, b, s, jnp.float32)
  logits, cache = step(state, tokens[:, :p], positions[:, :p],
                       kv_mask.at[:, p:].set(0), cache, jnp.int32(0))
  outs = [logits]
  for i in range(p, t):  # one token at a time, traced cache_index
    logits, cache = step(state, tokens[:, i:i + 1], positions[:, i:i + 1],
                         kv_mask.at[:, i + 1:].set(0), cache, jnp.int32(i))
    outs.append(logits)
  dec = jnp.concatenate(outs, axis=1)
  m = np.asarray(mask) == 1
  assert np.abs(np.asarray(dec) - np.asarray(full))[m].max() < 1e-5
  assert cache[0]["k"].shape == (b, 2, s, 32)  # [B, K, S, Dh]


def test_remat_same_loss_and_grads():
  tokens, mask = _batch()

  def loss(model):
    return jnp.mean(forward_logits(model, tokens, mask) ** 2)

  grads = []
  # No remat (the oracle), every block, and the first block only (`remat_layers`).
  for kw in ({"remat": False}, {"remat": True}, {"remat": True, "remat_layers": 1}):
    model = _model(**kw)
    graphdef, state = nnx.split(model)
    f = jax.jit(jax.value_and_grad(
        lambda s: loss(nnx.merge(graphdef, s))))
    grads.append(f(state))
  for other in grads[1:]:
    np.testing.assert_allclose(grads[0][0], other[0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads[0][1]), jax.tree.leaves(other[1])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bfloat16_compute_close_to_float32():
  tokens, mask = _batch()
  f32 = forward_logits(_model(), tokens, mask)
  bf = _model(dtype=jnp.bfloat16)
  out = forward_logits(bf, tokens, mask)
  assert out.dtype == jnp.float32
  hidden, _ = bf(tokens, positions_from_mask(mask), mask)
  assert hidden.dtype == jnp.bfloat16
  m = np.asarray(mask) == 1
  assert np.abs(np.asarray(out) - np.asarray(f32))[m].max() < 0.05


def test_untied_head_and_real_vocab():
  model = _model(tie_word_embeddings=False, real_vocab_size=37)
  assert model.real_vocab_size == 37
  assert model.head_weight().shape == (128, 40)


def test_cache_index_needs_a_cache():
  """A cache-free call starts at slot 0: its dense path skips the keys after each query."""
  cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1)
  m = Transformer(cfg, rngs=nnx.Rngs(0))
  tok = jnp.zeros((1, 4), jnp.int32)
  pos = jnp.arange(4)[None]
  with pytest.raises(ValueError, match="without a cache"):
    m(tok, pos, jnp.ones((1, 4), jnp.int32), cache_index=2)


@pytest.mark.parametrize("attention,t", [("dense", 200), ("blocked", 40)])
def test_prefill_at_slot_zero_into_a_cache_of_t_slots_matches_the_full_forward(attention, t):
  """The sampler's prefill (slot 0, a cache of exactly T slots) takes the causal paths, which
  skip the keys after each query: 3 query blocks (dense) or 5 groups of 8-key blocks."""
  model = _model(attention_impl=attention, attention_block=8)
  tokens, mask = _batch(t=t)
  b = tokens.shape[0]
  full = forward_logits(model, tokens, mask)
  h, cache = model(tokens, positions_from_mask(mask), mask,
                   cache=init_cache(model, b, t, jnp.float32), cache_index=0)
  m = np.asarray(mask) == 1
  assert np.abs(np.asarray(model.logits(h)) - np.asarray(full))[m].max() < 1e-5
  assert cache[0]["k"].shape == (b, 2, t, 32)
