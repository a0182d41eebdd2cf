"""Decode-step fast paths: one-query attention, windowed decode loop."""

import functools

from flax import nnx
import jax
import numpy as np
import pytest

import toy_lm
from vapo_jax.sampler import static as static_lib
from vapo_jax.sampler import ops
from vapo_jax.models import layers
from vapo_jax.sampler.ops import SamplingConfig


@pytest.mark.parametrize("h,k", [(8, 2), (4, 4), (6, 1)])
def test_decode_attention_equals_dot_product_attention(h, k):
  b, s, dh = 5, 37, 16
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (b, 1, h, dh))
  kc = jax.random.normal(keys[1], (b, s, k, dh))
  vc = jax.random.normal(keys[2], (b, s, k, dh))
  mask = jax.random.uniform(keys[3], (b, s)) < 0.6
  mask = mask.at[:, -1].set(True).at[0].set(False).at[0, 3].set(True)
  mask_Bx1x1xS = mask[:, None, None, :]
  got = layers.decode_attention(q, kc.transpose(0, 2, 1, 3),
                                vc.transpose(0, 2, 1, 3), mask_Bx1x1xS)
  want = jax.nn.dot_product_attention(q, kc, vc, mask=mask_Bx1x1xS)
  assert got.shape == (b, 1, h, dh)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_decode_step_with_a_key_mask_sees_no_slot_after_its_own():
  """A [B, S] key mask gets the causal rule: stale slots past cache_index stay unseen."""
  from vapo_jax.models import transformer  # pylint: disable=import-outside-toplevel
  from vapo_jax.models.config import tiny_config  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(remat=False)
  attn = layers.Attention(cfg, rngs=nnx.Rngs(0))
  b, s, idx = 3, 10, 4
  keys = jax.random.split(jax.random.key(1), 3)
  shape = (b, cfg.num_kv_heads, s, cfg.head_dim)
  stale = {"k": jax.random.normal(keys[0], shape), "v": jax.random.normal(keys[1], shape)}
  x = jax.random.normal(keys[2], (b, 1, cfg.hidden_size))
  cos, sin = layers.rope_tables(jax.numpy.full((b, 1), idx),
                                layers.rope_inv_freq(cfg))
  key_mask = jax.numpy.ones((b, s), jax.numpy.int32)  # every slot "real", stale ones too
  got, _ = attn(x, cos, sin, key_mask, stale, idx)
  dense = transformer.attention_mask(key_mask, 1, idx)  # [B, 1, 1, S], slots <= idx
  want, _ = attn(x, cos, sin, dense, stale, idx)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # The rule matters here: the kernel itself attends wherever its mask says.
  q = jax.random.normal(keys[2], (b, 1, cfg.num_heads, cfg.head_dim))
  all_slots = layers.decode_attention(q, stale["k"], stale["v"], key_mask[:, None, None, :])
  causal = layers.decode_attention(q, stale["k"], stale["v"], dense)
  assert not np.allclose(all_slots, causal, atol=1e-3)


@pytest.mark.parametrize("p,r,n", [(4, 1, 3), (4, 2, 3), (8, 7, 1), (8, 7, 3),
                                   (16, 128, 4), (3, 5, 10)])
def test_decode_windows_cover_every_step_once(p, r, n):
  cfg = SamplingConfig(max_new_tokens=r, decode_windows=n)
  windows = ops.decode_windows(p, cfg)
  steps = [t for a, b, _ in windows for t in range(a, b)]
  assert steps == list(range(1, r))  # each decode step once, in order
  assert len(windows) == min(n, max(r - 1, 0))
  for a, b, w in windows:
    assert w == p + b - 1  # step b - 1 writes slot p + b - 2, attends p + b - 1
  if windows:
    assert windows[-1][2] == p + r - 1 <= cfg.total_cache_len


def test_decode_windows_validation():
  with pytest.raises(ValueError, match="SamplingConfig.decode_windows"):
    SamplingConfig(max_new_tokens=4, decode_windows=0)


@pytest.mark.parametrize("n", [2, 3, 9])
def test_windowed_loop_equals_one_window(n):
  """Same tokens, lengths and log-probs with the loop split into n windows."""
  v, d = 13, 8
  model = toy_lm.ToyLM(v, d, 64, nnx.Rngs(0), scale=0.3)
  graphdef, state = nnx.split(model)
  init = functools.partial(toy_lm.init_cache, dim=d)
  prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]

  def run(windows):
    cfg = SamplingConfig(max_new_tokens=9, temperature=0.9, stop_token_ids=(5,),
                         n_per_prompt=2, max_prompt_len=8,
                         decode_windows=windows)
    out = static_lib.Sampler(graphdef, init, cfg)(state, prompts,
                                                   jax.random.key(3))
    return jax.tree.map(np.asarray, out)

  one, many = run(1), run(n)
  assert (~one.truncated_B).any()  # some rows stop inside a window
  for field in ("response_BxR", "response_mask_BxR", "lengths_B",
                "truncated_B"):
    np.testing.assert_array_equal(getattr(many, field), getattr(one, field))
  np.testing.assert_allclose(many.logp_BxR, one.logp_BxR, rtol=1e-5,
                             atol=1e-6)


def test_decode_step_traced_for_another_platform_uses_its_form():
  """`platform.targeting` picks the kernel forms; both compute the same step."""
  from vapo_jax.models import platform  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import transformer  # pylint: disable=import-outside-toplevel
  from vapo_jax.models.config import tiny_config  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(remat=False)
  model = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
  cache = transformer.init_cache(model, 2, 8)
  tokens = jax.numpy.array([[3], [5]], jax.numpy.int32)
  pos = jax.numpy.array([[2], [4]], jax.numpy.int32)
  kv_mask = jax.numpy.ones((2, 8), bool)

  def step():  # traced afresh each time: jit's trace cache ignores the target
    return (lambda: model(tokens, pos, kv_mask, cache=cache, cache_index=4)[0])

  assert platform.target() == jax.default_backend()
  with platform.targeting("tpu"):
    assert platform.target() == "tpu"
    tpu_jaxpr = str(jax.make_jaxpr(step())())
    tpu_out = step()()
  assert platform.target() == jax.default_backend()
  with platform.targeting("cpu"):
    cpu_jaxpr = str(jax.make_jaxpr(step())())
    cpu_out = step()()
  assert tpu_jaxpr != cpu_jaxpr  # the CPU form is not what a TPU program gets
  np.testing.assert_allclose(cpu_out, tpu_out, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_last_logits_equals_model_logits(tied):
  """The CPU head form is used only over the tied [V, D] layout."""
  from vapo_jax.models import transformer  # pylint: disable=import-outside-toplevel
  from vapo_jax.models.config import tiny_config  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(remat=False, tie_word_embeddings=tied)
  model = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
  hidden = jax.random.normal(jax.random.key(1), (3, cfg.hidden_size))
  got = ops.last_logits(model, hidden)
  np.testing.assert_allclose(got, model.logits(hidden), rtol=1e-5, atol=1e-5)
  jaxpr = str(jax.make_jaxpr(lambda h: ops.last_logits(model, h))(hidden))
  vocab_major = "optimization_barrier" in jaxpr
  assert vocab_major == (tied and jax.default_backend() == "cpu")


def test_decode_step_over_a_bfloat16_cache_of_a_float32_model():
  """The cache's own dtype is read as is: bf16 keys/values, float32 model, float32 out."""
  from vapo_jax.models import transformer  # pylint: disable=import-outside-toplevel
  from vapo_jax.models.config import tiny_config  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(remat=False)
  model = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
  b, p, s = 2, 5, 8
  tokens = jax.random.randint(jax.random.key(2), (b, p + 1), 1, cfg.vocab_size)
  pos = jax.numpy.broadcast_to(jax.numpy.arange(p + 1), (b, p + 1))
  kv_mask = jax.numpy.ones((b, s), jax.numpy.int32).at[:, p + 1:].set(0)
  outs = {}
  for dt in (jax.numpy.float32, jax.numpy.bfloat16):
    cache = transformer.init_cache(model, b, s, dtype=dt)
    _, cache = model(tokens[:, :p], pos[:, :p], kv_mask.at[:, p:].set(0), cache=cache,
                     cache_index=0)
    assert cache[0]["k"].dtype == dt
    h, cache = model(tokens[:, p:], pos[:, p:], kv_mask, cache=cache, cache_index=p)
    assert h.dtype == jax.numpy.float32 and cache[0]["v"].dtype == dt
    outs[dt] = np.asarray(h)
  np.testing.assert_allclose(outs[jax.numpy.bfloat16], outs[jax.numpy.float32],
                             rtol=5e-2, atol=5e-2)
