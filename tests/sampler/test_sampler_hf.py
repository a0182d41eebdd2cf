"""The sampler on the real transformer: transformers parity, log-probs, mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vapo_jax.sampler import types as rollout_lib  # noqa: E402
from vapo_jax.sampler import static as static_lib  # noqa: E402
from vapo_jax import sharding  # noqa: E402
from vapo_jax.models import hf_io  # noqa: E402
from vapo_jax.models import transformer  # noqa: E402
from vapo_jax.sampler.ops import SamplingConfig  # noqa: E402
from flax import nnx  # noqa: E402
import tiny_hf  # noqa: E402

PAD, R = 0, 10
# Mixed lengths, padded to the bucket 16 (more left padding than transformers'
# 9), which must not change a single token.
PROMPTS = [[5, 17, 33, 2, 71, 8, 90, 41, 12], [3, 64, 28, 7],
           [50, 11, 9, 60, 21, 44], [77]]


def hf_greedy(model, prompts, eos):
  p = max(map(len, prompts))
  ids = np.full((len(prompts), p), PAD, np.int64)
  mask = np.zeros((len(prompts), p), np.int64)
  for i, x in enumerate(prompts):
    ids[i, p - len(x):], mask[i, p - len(x):] = x, 1
  with torch.no_grad():
    out = model.generate(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
        do_sample=False, max_new_tokens=R, min_new_tokens=0,
        eos_token_id=list(eos) or None, pad_token_id=PAD)
  resp = np.full((len(prompts), R), PAD, np.int64)
  gen = out[:, p:].numpy()
  resp[:, :gen.shape[1]] = gen
  return resp


@pytest.fixture(scope="module", params=["qwen2", "qwen2_tied", "qwen3", "llama3"])
def ckpt(request, tmp_path_factory):
  path = str(tmp_path_factory.mktemp(request.param))
  model = tiny_hf.make_model(request.param)  # weights far from the 0.02 init
  model.save_pretrained(path)
  return path, model


def greedy_cfg(eos, n=1):
  return SamplingConfig(max_new_tokens=R, greedy=True, stop_token_ids=eos,
                        pad_id=PAD, n_per_prompt=n, max_prompt_len=16,
                        min_prompt_bucket=16)


def test_greedy_equals_transformers_generate(ckpt):
  path, hf_model = ckpt
  free = hf_greedy(hf_model, PROMPTS, ())
  # Two stop tokens that end rows 0 and 2 early; rows 1 and 3 run to the limit.
  eos = (int(free[0, 3]), int(free[2, 6]))
  want = hf_greedy(hf_model, PROMPTS, eos)
  model, model_cfg = hf_io.from_pretrained(path)
  graphdef, state = nnx.split(model)
  sampler = static_lib.Sampler.for_transformer(graphdef, model_cfg,
                                                greedy_cfg(eos, n=2))
  out = jax.tree.map(np.asarray, sampler(state, PROMPTS, jax.random.key(0)))
  assert out.prompt_BxP.shape[1] == 16
  np.testing.assert_array_equal(out.response_BxR[::2], want)
  np.testing.assert_array_equal(out.response_BxR[1::2], want)  # group copies
  assert out.lengths_B[0] <= 4 and out.lengths_B[4] <= 7
  assert not out.truncated_B[0] and not out.truncated_B[4]
  # Rows without a stop token are cut at R and flagged.
  for row in range(8):
    stopped = np.isin(out.response_BxR[row, :out.lengths_B[row]], eos).any()
    assert out.truncated_B[row] == (not stopped)
    assert stopped or out.lengths_B[row] == R


def _teacher_forced(model, rollout, temperature):
  tokens_BxL, mask_BxL = rollout_lib.rollout_tokens(rollout)
  logits = transformer.forward_logits(model, tokens_BxL,
                                      mask_BxL.astype(jnp.int32))
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  p = rollout.prompt_len
  pred = jnp.take_along_axis(logp[:, p - 1:-1], tokens_BxL[:, p:, None],
                             axis=-1)[..., 0]
  return np.asarray(pred * rollout.response_mask_BxR)


def test_sampled_logprobs_equal_teacher_forced(ckpt):
  path, _ = ckpt
  model, model_cfg = hf_io.from_pretrained(path)
  graphdef, state = nnx.split(model)
  cfg = SamplingConfig(max_new_tokens=R, temperature=0.7, top_k=20, top_p=0.9,
                       stop_token_ids=(1, 2), pad_id=PAD, n_per_prompt=3,
                       max_prompt_len=16)
  sampler = static_lib.Sampler.for_transformer(graphdef, model_cfg, cfg)
  out = sampler(state, PROMPTS, jax.random.key(1))
  np.testing.assert_allclose(
      np.asarray(out.logp_BxR), _teacher_forced(model, out, 0.7), atol=5e-5)
  policy = pytest.importorskip("vapo_jax.policy")
  tokens_BxL, mask_BxL = rollout_lib.rollout_tokens(out)
  logp, _ = policy.response_logprobs(model, tokens_BxL, mask_BxL,
                                     out.prompt_len, temperature=0.7)
  np.testing.assert_allclose(
      np.asarray(logp) * np.asarray(out.response_mask_BxR),
      np.asarray(out.logp_BxR), atol=5e-5)


def test_sharded_model_on_eight_devices_equals_one(ckpt):
  path, _ = ckpt
  cfg = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=(1,),
                       pad_id=PAD, n_per_prompt=2, max_prompt_len=16)
  model, model_cfg = hf_io.from_pretrained(path)
  graphdef, state = nnx.split(model)
  one = static_lib.Sampler.for_transformer(graphdef, model_cfg, cfg)
  want = jax.tree.map(np.asarray, one(state, PROMPTS, jax.random.key(2)))
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  model, model_cfg = hf_io.from_pretrained(path, mesh=mesh)
  graphdef, state = nnx.split(model)
  many = static_lib.Sampler.for_transformer(graphdef, model_cfg, cfg,
                                             mesh=mesh)
  got = many(state, PROMPTS, jax.random.key(2))
  assert len(got.response_BxR.sharding.device_set) == 8
  got = jax.tree.map(np.asarray, got)
  np.testing.assert_array_equal(got.response_BxR, want.response_BxR)
  np.testing.assert_array_equal(got.lengths_B, want.lengths_B)
  np.testing.assert_allclose(got.logp_BxR, want.logp_BxR, atol=2e-5)
