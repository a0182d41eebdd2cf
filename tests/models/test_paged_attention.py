"""Paged decode attention against jax's own reference (`ref_ragged_paged_attention`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import compat
from vapo_jax.models import paged_attention as pa

from tpu_aot import NEEDS_LIBTPU  # pylint: disable=wrong-import-order


def _case(seed, s=5, h=4, k=2, dh=8, n=20, ps=4, m=5, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((s, h, dh)), dtype)
  pages = jnp.asarray(rng.standard_normal((n, ps, 2 * k, dh)), dtype)
  lens = jnp.asarray(rng.integers(1, m * ps + 1, size=s), jnp.int32)
  table = jnp.asarray(rng.permutation(n)[:s * m].reshape(s, m) if s * m <= n
                      else rng.integers(0, n, size=(s, m)), jnp.int32)
  return q, pages, lens, table


def _ref(q, pages, lens, table):
  s, _, dh = q.shape
  return compat.ragged_paged_attention_kernel().ref_ragged_paged_attention(
      q, pages, lens, table, jnp.arange(s + 1, dtype=jnp.int32),
      jnp.array([s], jnp.int32), sm_scale=1.0 / np.sqrt(dh))


@pytest.mark.floor
@pytest.mark.parametrize("seed,block", [(0, 1), (1, 2), (2, 8)])
def test_matches_jax_reference(seed, block):
  q, pages, lens, table = _case(seed, s=4, m=5, n=20)
  got = jax.jit(pa.decode_attention, static_argnums=4)(q, pages, lens, table, block)
  np.testing.assert_allclose(got, _ref(q, pages, lens, table), rtol=2e-5, atol=2e-5)


def test_bf16_pages_match_reference():
  q, pages, lens, table = _case(3, s=3, m=4, n=12, dtype=jnp.bfloat16)
  got = pa.decode_attention(q, pages, lens, table, 2)
  want = _ref(q, pages, lens, table)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=3e-2, atol=3e-2)


def test_stale_kv_of_previous_owner_is_never_seen():
  """A refilled slot: whatever its pages hold past its length (even NaN) changes nothing."""
  q, pages, lens, table = _case(4, s=3, m=5, n=15)
  clean = pa.decode_attention(q, pages, lens, table, 2)
  ps = pages.shape[1]
  pos = np.arange(5 * ps)
  dirty = np.asarray(pages).copy()
  for s in range(3):
    for p in pos[pos >= int(lens[s])]:
      dirty[int(table[s, p // ps]), p % ps] = np.nan
  got = pa.decode_attention(q, jnp.asarray(dirty), lens, table, 2)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(clean))
  # Pages outside a slot's table (another slot's, or free ones) are never read either.
  unused = np.setdiff1d(np.arange(15), np.asarray(table).ravel())
  dirty2 = np.asarray(pages).copy()
  dirty2[unused] = np.nan
  np.testing.assert_array_equal(
      np.asarray(pa.decode_attention(q, jnp.asarray(dirty2), lens, table, 2)),
      np.asarray(clean))


def test_empty_slot_gives_zeros_and_reads_only_live_blocks():
  q, pages, lens, table = _case(5, s=3, m=5, n=15)
  lens = lens.at[1].set(0)
  out = pa.decode_attention(q, pages, lens, table, 1)
  assert np.all(np.asarray(out[1]) == 0) and np.all(np.isfinite(np.asarray(out)))


def test_writes_land_at_page_and_offset_and_drop_without_page():
  n, ps, k, dh = 6, 4, 1, 2
  pages = jnp.zeros((n, ps, 2 * k, dh))
  table = jnp.array([[3, 1], [n, n]], jnp.int32)  # slot 1 has no pages
  kv = pa.combine(jnp.ones((2, k, dh)), 2 * jnp.ones((2, k, dh)))
  out = pa.write_tokens(pages, kv, table, jnp.array([5, 0], jnp.int32))
  assert float(out[1, 1, 0, 0]) == 1 and float(out[1, 1, 1, 0]) == 2
  assert float(jnp.sum(out)) == 3 * dh  # nothing else written
  prompt = jnp.arange(6 * 2 * dh, dtype=jnp.float32).reshape(6, 2 * k, dh)
  out = pa.write_prompt(pages, prompt, jnp.array([2, 4], jnp.int32))
  np.testing.assert_array_equal(out[2], prompt[:4])
  np.testing.assert_array_equal(out[4, :2], prompt[4:])


@NEEDS_LIBTPU
@pytest.mark.parametrize("fsdp,replicas", [pytest.param(1, 1, marks=pytest.mark.floor), (2, 2)])
def test_engine_decode_chunk_with_the_pallas_kernel_compiles_for_v5p(fsdp, replicas):
  """The TPU path (jax's ragged paged attention kernel inside the engine's decode chunk,
  per tensor shard; with decode replicas, per replica and tensor shard) AOT-compiled for a
  v5p-8 slice from this CPU host."""
  from flax import nnx
  from jax.sharding import Mesh
  from vapo_jax import sharding as shd
  from vapo_jax.models import transformer
  from vapo_jax.models.config import ModelConfig
  from vapo_jax.sampler import continuous
  from vapo_jax.sampler.ops import SamplingConfig
  from vapo_jax.pod import slices
  devs = slices.devices(slices.parse("v5p-8"))
  mesh = Mesh(np.array(devs).reshape(1, fsdp, len(devs) // fsdp), ("data", "fsdp", "tensor"),
              axis_types=(jax.sharding.AxisType.Auto,) * 3)
  mcfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                     num_heads=8, num_kv_heads=4, head_dim=128, dtype=jnp.bfloat16,
                     param_dtype=jnp.float32)
  g, abs_state = nnx.split(nnx.eval_shape(
      lambda: transformer.Transformer(mcfg, rngs=nnx.Rngs(0))))
  abs_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                           abs_state, shd.state_shardings(abs_state, mesh))
  cfg = SamplingConfig(max_new_tokens=64, max_prompt_len=64, prompt_buckets=(64,))
  eng = continuous.Engine(g, mcfg, cfg, continuous.EngineConfig(
      slots=8, page_size=16, kv_tokens=8 * 128, kernel="tpu", decode_dtype="bfloat16",
      replicas=replicas),
      mesh=mesh)
  progs = eng.lowerable(abs_state)
  # Pallas reads the TPU generation from the default device while lowering.
  with jax.default_device(devs[0]):
    compiled = progs["decode_chunk"].lower(*progs["decode_chunk_args"]).compile()
  assert "tpu_custom_call" in compiled.as_text()
  assert compiled.memory_analysis() is not None


def test_the_kernel_refusal_is_the_kernels_own_checks():
  assert pa.tpu_kernel_refusal(8, 2, 128, jnp.bfloat16) is None
  assert pa.tpu_kernel_refusal(1, 1, 256, jnp.float32) is None
  why = pa.tpu_kernel_refusal(14, 2, 64, jnp.bfloat16)  # Qwen2.5-0.5B's shard on one chip
  assert "head_dim 64" in why and "multiple of 128" in why
  assert "divisible" in pa.tpu_kernel_refusal(8, 3, 128, jnp.bfloat16)
  assert "tiled" in pa.tpu_kernel_refusal(6, 3, 128, jnp.float32)


def _mesh(devs, tensor):
  from jax.sharding import Mesh
  return Mesh(np.array(devs).reshape(1, len(devs) // tensor, tensor),
              ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)


def test_attention_kernel_off_tpu_is_pure_jax_and_tpu_is_refused_clearly():
  from vapo_jax.models.config import ModelConfig
  from vapo_jax.sampler import continuous
  mcfg = ModelConfig(vocab_size=64, hidden_size=256, intermediate_size=64, num_layers=1,
                     num_heads=2, num_kv_heads=1, head_dim=128)
  said = []
  log = lambda *a, **k: said.append(a)  # noqa: E731
  mesh = _mesh(jax.devices()[:4], 2)
  for m in (None, mesh):
    assert continuous.attention_kernel("auto", mcfg, m, log=log) == "jax"
    assert continuous.attention_kernel("jax", mcfg, m, log=log) == "jax"
    with pytest.raises(ValueError, match="TPU only.*cpu"):
      continuous.attention_kernel("tpu", mcfg, m)
  assert not said  # off TPU "auto" is silent
  from vapo_jax.sampler.ops import SamplingConfig
  with pytest.raises(ValueError, match="kernel='tpu'.*TPU only"):
    continuous.Engine(None, mcfg, SamplingConfig(max_new_tokens=4, max_prompt_len=4),
                      continuous.EngineConfig(slots=2, kv_tokens=64, kernel="tpu"))


@NEEDS_LIBTPU
def test_attention_kernel_on_a_tpu_slice_follows_the_shard_shapes():
  from vapo_jax.models.config import ModelConfig
  from vapo_jax.sampler import continuous
  from vapo_jax.pod import slices
  devs = slices.devices(slices.parse("v5p-8"))
  said = []
  log = lambda *a, **k: said.append(a[0])  # noqa: E731
  cfg = lambda **kw: ModelConfig(**{**dict(  # noqa: E731
      vocab_size=64, hidden_size=512, intermediate_size=64, num_layers=1, num_heads=8,
      num_kv_heads=4, head_dim=128, dtype=jnp.bfloat16), **kw})
  assert continuous.attention_kernel("auto", cfg(), _mesh(devs, 4), log=log) == "tpu"
  assert continuous.attention_kernel("tpu", cfg(), _mesh(devs, 2), log=log) == "tpu"
  assert not said
  # head_dim 64 (Qwen2.5-0.5B, the Colab config): auto falls back with one line; tpu refuses.
  small = cfg(head_dim=64, hidden_size=256)
  assert continuous.attention_kernel("auto", small, _mesh(devs, 1), log=log) == "jax"
  assert continuous.attention_kernel("auto", small, _mesh(devs, 1), log=log) == "jax"
  assert len(said) == 1 and "multiple of 128" in said[0]
  with pytest.raises(ValueError, match="head_dim 64"):
    continuous.attention_kernel("tpu", small, _mesh(devs, 1))
  # 2 kv heads over 4 tensor shards: each shard would hold a key without its value.
  with pytest.raises(ValueError, match="apart from its value"):
    continuous.attention_kernel("tpu", cfg(num_kv_heads=2), _mesh(devs, 4))


def test_the_kernels_page_table_must_fit_its_scalar_memory():
  # A v5p compile of 256 slots × 1,344 pages (1.38 MB of int32) in one call failed in the
  # kernel's prefetched scalar memory (1 MiB); 128 slots (0.69 MB) compiled. More slots now
  # run in slot groups (tests/sampler/test_slot_groups.py); only a single row can refuse.
  from vapo_jax.models import paged_attention  # pylint: disable=import-outside-toplevel
  assert paged_attention.slot_limit(1344) == 182
  assert paged_attention.table_refusal(256, 1344) is None
  assert paged_attention.table_refusal(1, 300_000) is not None
