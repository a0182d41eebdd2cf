"""The decode loop on a toy attention LM: stops, groups, log-probs, meshes."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import toy_lm
from vapo_jax.sampler import types
from vapo_jax.sampler import static as static_lib
from vapo_jax import sharding
from vapo_jax.sampler.ops import SamplingConfig

V, D = 13, 8
PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]


def make(cfg, mesh=None, seed=0, scale=0.5):
  model = toy_lm.ToyLM(V, D, 64, nnx.Rngs(seed), scale=scale)
  graphdef, state = nnx.split(model)
  init = functools.partial(toy_lm.init_cache, dim=D)
  return model, state, static_lib.Sampler(graphdef, init, cfg, mesh=mesh)


def as_np(rollout):
  return jax.tree.map(np.asarray, rollout)


def test_rollout_contract_and_teacher_forced_logprobs():
  cfg = SamplingConfig(max_new_tokens=7, temperature=0.8, stop_token_ids=(5, 9),
                       pad_id=0, vocab_size=11, n_per_prompt=3,
                       max_prompt_len=8, min_prompt_bucket=4)
  model, state, sampler = make(cfg, scale=0.2)
  out = as_np(sampler(state, PROMPTS, jax.random.key(1)))
  b, r = 12, 7
  assert out.prompt_BxP.shape == (b, 8) and out.response_BxR.shape == (b, r)
  assert out.response_BxR.dtype == np.int32
  assert out.response_mask_BxR.dtype == np.float32
  np.testing.assert_array_equal(out.group_ids_B, np.repeat(np.arange(4), 3))
  for row in range(b):
    prompt = PROMPTS[row // 3]
    assert out.prompt_BxP[row, 8 - len(prompt):].tolist() == prompt
    assert out.prompt_mask_BxP[row].sum() == len(prompt)
    n = out.lengths_B[row]
    resp = out.response_BxR[row]
    np.testing.assert_array_equal(out.response_mask_BxR[row], np.arange(r) < n)
    assert np.all(resp[n:] == 0) and np.all(out.logp_BxR[row, n:] == 0)
    assert np.all(resp[:n] < 11)  # padded vocabulary rows never sampled
    stops = np.isin(resp[:n], [5, 9])
    if out.truncated_B[row]:
      assert n == r and not stops.any()
    else:
      # The stop token is kept, then nothing.
      assert stops[-1] and not stops[:-1].any()
  assert out.truncated_B.any() and (~out.truncated_B).any()
  first_row = out.response_BxR[0, :out.lengths_B[0]].tolist()
  assert types.response_lists(out)[0] == first_row
  tokens_BxL, mask_BxL = types.rollout_tokens(out)
  assert tokens_BxL.shape == (b, 8 + r) and mask_BxL.dtype == jnp.float32
  np.testing.assert_array_equal(mask_BxL[:, 8:], out.response_mask_BxR)
  ref = toy_lm.teacher_forced_logprobs(model, tokens_BxL, mask_BxL,
                                       out.prompt_BxP.shape[1], temperature=0.8,
                                       vocab_size=11)
  np.testing.assert_allclose(
      np.asarray(ref) * out.response_mask_BxR, out.logp_BxR, atol=2e-5)


def test_prefill_runs_once_per_prompt_and_loop_stops_early():
  try:  # jax.debug.callback runs its Python on a CPU device
    jax.devices("cpu")
  except RuntimeError:
    pytest.skip("needs the CPU backend (JAX_PLATFORMS without cpu)")
  calls = []

  class Counting(toy_lm.ToyLM):

    def __call__(self, tokens_BxT, *args, **kw):
      calls.append(tokens_BxT.shape)  # at trace time
      jax.debug.callback(lambda: calls.append("step"))
      return super().__call__(tokens_BxT, *args, **kw)

  model = Counting(V, D, 64, nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  # Greedy: find the 2nd token every row generates, and make it the stop token.
  cfg = SamplingConfig(max_new_tokens=20, greedy=True, n_per_prompt=4,
                       max_prompt_len=8, min_prompt_bucket=8)
  init = functools.partial(toy_lm.init_cache, dim=D)
  sampler = static_lib.Sampler(graphdef, init, cfg)
  first = as_np(sampler(state, [[1, 2]], jax.random.key(0)))
  stop = int(first.response_BxR[0, 1])
  calls.clear()
  cfg = SamplingConfig(max_new_tokens=20, greedy=True, n_per_prompt=4,
                       max_prompt_len=8, min_prompt_bucket=8,
                       stop_token_ids=(stop,))
  sampler = static_lib.Sampler(graphdef, init, cfg)
  out = as_np(sampler(state, [[1, 2]], jax.random.key(0)))
  jax.effects_barrier()
  assert calls[0] == (1, 8)  # prefill: 1 prompt row, not n = 4
  assert (4, 1) in calls  # decode: 4 rows
  assert calls.count("step") == 2  # prefill + one decode step, not 20
  np.testing.assert_array_equal(out.lengths_B, 2)
  assert not out.truncated_B.any()


def test_group_rows_share_prompt_and_sampling_is_keyed():
  cfg = SamplingConfig(max_new_tokens=6, n_per_prompt=4, max_prompt_len=8,
                       min_prompt_bucket=8)
  _, state, sampler = make(cfg, scale=0.3)
  a = as_np(sampler(state, PROMPTS, jax.random.key(1)))
  b = as_np(sampler(state, PROMPTS, jax.random.key(1)))
  c = as_np(sampler(state, PROMPTS, jax.random.key(2)))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert np.any(a.response_BxR != c.response_BxR)
  # Responses within a group differ (independent draws), prompts are identical.
  assert len({tuple(x) for x in a.response_BxR[:4]}) > 1
  greedy = SamplingConfig(max_new_tokens=6, n_per_prompt=3, greedy=True,
                          max_prompt_len=8)
  _, state, sampler = make(greedy)
  g = as_np(sampler(state, PROMPTS, jax.random.key(1)))
  for p in range(4):
    np.testing.assert_array_equal(g.response_BxR[3 * p],
                                  g.response_BxR[3 * p + 2])


def test_cache_reused_across_calls_and_buckets_bound_compiles():
  cfg = SamplingConfig(max_new_tokens=5, n_per_prompt=2, max_prompt_len=16,
                       min_prompt_bucket=4)
  model, state, sampler = make(cfg)
  long = [[1] * 16, [2] * 15]
  short = [[3, 4, 5], [6]]
  sampler(state, long, jax.random.key(0))
  buf = jax.tree.leaves(sampler._caches[4])[0]
  reused = as_np(sampler(state, short, jax.random.key(5)))
  assert buf.is_deleted()  # donated to the call, not regrown
  fresh = as_np(make(cfg)[2](state, short, jax.random.key(5)))
  # Stale slots of the reused buffer are masked: same result as a fresh one.
  jax.tree.map(np.testing.assert_array_equal, reused, fresh)
  # Prompt lengths 3 and 4 share the bucket 4: no new compile.
  sampler(state, [[1, 2, 3, 4], [5]], jax.random.key(0))
  assert sampler._generate._cache_size() == 2


def test_params_on_a_mesh_compile_once():
  # Parameters from hf_io.from_pretrained live on a one-device mesh; the cache
  # the first call hands back must have the type of the one it was given, or
  # the second call compiles the sampler again.
  cfg = SamplingConfig(max_new_tokens=4, n_per_prompt=2, max_prompt_len=8)
  _, state, sampler = make(cfg)
  mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  state = jax.device_put(state, NamedSharding(mesh, P()))
  first = as_np(sampler(state, PROMPTS, jax.random.key(0)))
  for i in range(2):
    sampler(state, PROMPTS, jax.random.key(i + 1))
  assert sampler._generate._cache_size() == 1
  again = as_np(sampler(state, PROMPTS, jax.random.key(0)))
  jax.tree.map(np.testing.assert_array_equal, first, again)


def test_cache_allocator_compiles_once_across_clear_cache():
  # The trainer frees the cache after every rollout (clear_cache); allocating it again must
  # reuse the compiled allocator, not trace and compile a new one each RL step.
  cfg = SamplingConfig(max_new_tokens=4, n_per_prompt=2, max_prompt_len=8)
  _, state, sampler = make(cfg)
  compiles = []

  def listener(event, _, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(1)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    sampler(state, PROMPTS, jax.random.key(0))
    sampler.clear_cache()
    n = len(compiles)
    for i in range(3):
      sampler(state, PROMPTS, jax.random.key(i + 1))
      sampler.clear_cache()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert len(compiles) == n  # nothing compiled after the first call
  assert len(sampler._allocs) == 1


def test_clear_errors():
  cfg = SamplingConfig(max_new_tokens=5, max_prompt_len=6)
  _, state, sampler = make(cfg)
  with pytest.raises(ValueError,
                     match="prompt 1 has 7 tokens.*max_prompt_len=6"):
    sampler(state, [[1], [1] * 7], jax.random.key(0))
  small = SamplingConfig(max_new_tokens=5, max_prompt_len=6, cache_len=8)
  _, state, sampler = make(small)
  with pytest.raises(ValueError, match="overflows the KV cache of 8 slots"):
    sampler(state, [[1, 2, 3, 4]], jax.random.key(0))
  with pytest.raises(ValueError, match="prompt 0 is empty"):
    sampler(state, [[]], jax.random.key(0))
  right_padded = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
  with pytest.raises(ValueError, match="prompt 0 is empty or not left-padded"):
    sampler.generate_padded(state, np.ones((2, 4), np.int32), right_padded,
                            jax.random.key(0))
  with pytest.raises(ValueError, match="leaf 0 has shapes"):
    static_lib.Sampler(None, lambda b, s: {"k": jnp.zeros((b, b))}, cfg)


@pytest.mark.parametrize("data,fsdp", [(8, 1), (2, 4)])
def test_eight_devices_equal_one(data, fsdp):
  cfg = SamplingConfig(max_new_tokens=6, temperature=0.9, top_k=6, top_p=0.9,
                       stop_token_ids=(3,), n_per_prompt=2, max_prompt_len=8)
  prompts = PROMPTS * 2
  _, state, one = make(cfg)
  want = as_np(one(state, prompts, jax.random.key(4)))
  mesh = sharding.make_mesh(data=data, fsdp=fsdp, tensor=1)
  _, state, many = make(cfg, mesh=mesh)
  got = many(state, prompts, jax.random.key(4))
  assert len(got.response_BxR.sharding.device_set) == 8
  got = as_np(got)
  # Tokens, masks and lengths bit for bit; log-probs to float32 rounding (the
  # per-device batch shapes differ, so XLA may pick other vectorised kernels).
  for field in ("prompt_BxP", "response_BxR", "response_mask_BxR", "lengths_B",
                "truncated_B", "group_ids_B"):
    np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
  np.testing.assert_allclose(got.logp_BxR, want.logp_BxR, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError,
                     match="cannot be split over the 8 batch shards"):
    many(state, PROMPTS, jax.random.key(4))


def test_lowerable_gives_the_programs_and_cache_a_call_runs():
  # The compile check lowers these (`pod.programs`); they must be the sampler's own:
  # `generate` is the jitted call itself, and the abstract cache has the real cache's
  # shapes and shardings.
  cfg = SamplingConfig(max_new_tokens=4, n_per_prompt=2, max_prompt_len=8,
                       stop_token_ids=(3,))
  mesh = sharding.make_mesh(data=2, fsdp=4, tensor=1)
  _, state, sampler = make(cfg, mesh=mesh)
  state = jax.device_put(state, NamedSharding(mesh, P()))  # as the run's parameters are
  assert isinstance(sampler, types.RolloutSampler) and not sampler.continuous
  low = sampler.lowerable(state, 8)
  assert low["generate"] is sampler._generate
  for name in ("generate", "prefill", "decode_step"):
    low[name].lower(*low[name + "_args"]).compile()
  sampler(state, PROMPTS * 2, jax.random.key(0))
  real = jax.tree.leaves(sampler._caches[16])
  want = jax.tree.leaves(low["generate_args"][3])
  assert [(x.shape, x.dtype) for x in real] == [(x.shape, x.dtype) for x in want]
  for x, w in zip(real, want):
    assert x.sharding.is_equivalent_to(w.sharding, x.ndim), (x.sharding, w.sharding)


def test_params_from_another_mesh_are_resharded_onto_the_samplers():
  # The learners' own mesh (config mesh.train_tensor): the same 8 devices in the same order,
  # laid out (1, 4, 2) against the sampler's (1, 2, 4). Each call moves the parameters onto
  # the sampler's mesh through one compiled reshard, so the sampler compiles once and
  # samples what it samples from parameters on its own mesh; the compile check's abstract
  # parameters come back on the sampler's mesh too.
  cfg = SamplingConfig(max_new_tokens=4, n_per_prompt=2, max_prompt_len=8,
                       stop_token_ids=(3,))
  decode = sharding.make_mesh(data=1, fsdp=2, tensor=4)
  train = jax.sharding.Mesh(decode.devices.reshape(1, 4, 2), decode.axis_names,
                            axis_types=decode.axis_types)
  _, state, sampler = make(cfg, mesh=decode)
  want = as_np(sampler(jax.device_put(state, NamedSharding(decode, P())), PROMPTS,
                       jax.random.key(2)))
  there = jax.device_put(state, NamedSharding(train, P()))
  for _ in range(2):
    got = as_np(sampler(there, PROMPTS, jax.random.key(2)))
    jax.tree.map(np.testing.assert_array_equal, got, want)
  assert sampler._generate._cache_size() == 1 and len(sampler._movers) == 1
  low = sampler.lowerable(there, 4)
  assert {x.sharding.mesh for x in jax.tree.leaves(low["generate_args"][0])} == {decode}
