"""policy.response_logprobs and critic.response_values: values and alignment."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import critic as critic_lib
from vapo_jax import policy
from vapo_jax.models import (Transformer, forward_logits, positions_from_mask,
                             tiny_config)

P = 4  # prompt length


def _rollout(b=3, r=5, vocab=40, seed=0):
  """Prompts left-padded to P, responses right-padded to r."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(0, vocab, (b, P + r)).astype(np.int32)
  mask = np.ones((b, P + r), np.int32)
  mask[1, :2] = 0       # short prompt
  mask[0, P + 3:] = 0   # short response
  mask[2, P + 1:] = 0
  return jnp.asarray(tokens), jnp.asarray(mask)


def _model(**kw):
  return Transformer(tiny_config(tie_word_embeddings=False, **kw),
                     rngs=nnx.Rngs(0))


def _direct(model, tokens, mask, temperature):
  z = forward_logits(model, tokens, mask) / temperature
  logp_all = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(logp_all[:, P - 1:-1], tokens[:, P:, None],
                             axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)[:, P - 1:-1]
  resp = mask[:, P:].astype(jnp.float32)
  return logp * resp, ent * resp


@pytest.mark.parametrize("chunk", [2, 128])
def test_logprobs_equal_direct_log_softmax(chunk):
  model = _model()
  tokens, mask = _rollout()
  graphdef, state = nnx.split(model)
  f = jax.jit(lambda s, t, m: policy.response_logprobs(
      nnx.merge(graphdef, s), t, m, P, temperature=0.7, chunk=chunk))
  logp, ent = f(state, tokens, mask)
  want_logp, want_ent = _direct(model, tokens, mask, 0.7)
  assert logp.shape == (3, 5) and logp.dtype == jnp.float32
  np.testing.assert_allclose(logp, want_logp, atol=1e-5)
  np.testing.assert_allclose(ent, want_ent, atol=1e-5)
  assert np.all(np.asarray(logp)[np.asarray(mask[:, P:]) == 0] == 0)


def test_logprob_gradients_equal_direct():
  model = _model()
  tokens, mask = _rollout()
  graphdef, state = nnx.split(model)

  def chunked(s):
    lp, ent = policy.response_logprobs(nnx.merge(graphdef, s), tokens, mask,
                                       P, chunk=2)
    return jnp.sum(lp) + 0.1 * jnp.sum(ent)

  def direct(s):
    lp, ent = _direct(nnx.merge(graphdef, s), tokens, mask, 1.0)
    return jnp.sum(lp) + 0.1 * jnp.sum(ent)

  g1 = jax.jit(jax.grad(chunked))(state)
  g2 = jax.jit(jax.grad(direct))(state)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_token_logprobs_is_full_sequence_nll():
  model = _model()
  tokens, mask = _rollout()
  got = policy.token_logprobs(model, tokens, mask, chunk=3)
  lp = jax.nn.log_softmax(forward_logits(model, tokens, mask), axis=-1)
  want = jnp.take_along_axis(lp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
  want = want * mask[:, 1:]
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_critic_values_alignment():
  model = _model()
  critic = critic_lib.Critic.from_policy(model, head_scale=1.0)
  assert "lm_head" not in nnx.to_pure_dict(nnx.state(critic))["backbone"]
  tokens, mask = _rollout()
  values = jax.jit(lambda c, t, m: critic_lib.response_values(c, t, m, P))(
      critic, tokens, mask)
  assert values.shape == (3, 5) and values.dtype == jnp.float32
  # values[:, t] = <hidden at column P + t - 1, w>.
  hidden, _ = model(tokens, positions_from_mask(mask), mask)
  want = jnp.einsum("btd,d->bt", hidden[:, P - 1:-1], critic.score[...])
  np.testing.assert_allclose(values, want * mask[:, P:], atol=1e-5)
  # V(s_t) depends on tokens before response token t only: changing response
  # token 2 leaves values[:, :3] alone and changes values[:, 3].
  changed = tokens.at[:, P + 2].set((tokens[:, P + 2] + 1) % 40)
  all_mask = jnp.ones_like(mask)
  v0 = critic_lib.response_values(critic, tokens, all_mask, P)
  v1 = critic_lib.response_values(critic, changed, all_mask, P)
  np.testing.assert_allclose(v0[:, :3], v1[:, :3], atol=1e-6)
  assert np.all(np.abs(np.asarray(v0[:, 3] - v1[:, 3])) > 1e-7)


def test_critic_from_policy_fresh_head_is_zero():
  critic = critic_lib.Critic.from_policy(_model())
  tokens, mask = _rollout()
  np.testing.assert_array_equal(
      critic_lib.response_values(critic, tokens, mask, P), 0.0)


def test_critic_hf_reward_model_and_own_checkpoints(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import tiny_hf  # pylint: disable=g-import-not-at-top
  rm = tiny_hf.make_model("qwen2", seq_cls=True)
  path = str(tmp_path / "rm")
  rm.save_pretrained(path)
  critic, cfg = critic_lib.Critic.from_pretrained(path)
  tokens, mask, positions = tiny_hf.batch()
  with torch.no_grad():
    h = rm.model(input_ids=torch.tensor(tokens, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 position_ids=torch.tensor(positions, dtype=torch.long))
    ref = rm.score(h.last_hidden_state)[..., 0].numpy()
  ours = np.asarray(critic(jnp.asarray(tokens), jnp.asarray(mask)))
  assert np.abs(ours - ref)[mask == 1].max() <= 1e-4

  out = str(tmp_path / "critic")
  critic_lib.save_pretrained(critic, out)
  again, _ = critic_lib.Critic.from_pretrained(out)
  np.testing.assert_array_equal(
      np.asarray(again(jnp.asarray(tokens), jnp.asarray(mask))), ours)
  hf = transformers.AutoModelForSequenceClassification.from_pretrained(
      out).eval()
  with torch.no_grad():
    h = hf.model(input_ids=torch.tensor(tokens, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 position_ids=torch.tensor(positions, dtype=torch.long))
    np.testing.assert_allclose(hf.score(h.last_hidden_state)[..., 0].numpy(),
                               ref, atol=1e-6)

  # A causal-LM (policy) directory gives a zero head; its lm_head is ignored.
  lm = str(tmp_path / "lm")
  tiny_hf.make_model("qwen2").save_pretrained(lm)
  fresh, _ = critic_lib.Critic.from_pretrained(lm)
  np.testing.assert_array_equal(np.asarray(fresh.score[...]), 0.0)
  del cfg


def test_padded_vocab_rows_have_no_probability():
  """With real_vocab_size < vocab_size the log-probs are over real tokens only."""
  cfg = tiny_config(vocab_size=48, real_vocab_size=40)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 40)
  mask = jnp.ones((2, 9), jnp.int32)
  logp, ent = policy.response_logprobs(model, tokens, mask, 4)
  logits = forward_logits(model, tokens, mask)[:, 3:-1, :40]
  want = jax.nn.log_softmax(logits, -1)
  want_logp = jnp.take_along_axis(want, tokens[:, 4:, None], -1)[..., 0]
  np.testing.assert_allclose(logp, want_logp, atol=1e-5)
  np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(want) * want, -1), atol=1e-5)
  g = jax.grad(lambda m: policy.response_logprobs(m, tokens, mask, 4)[1].sum())(model)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nnx.state(g)))
