"""The train passes' splash kernel (`models.splash_attention`): values and gradients against
the pure-JAX blocked path in Pallas interpret mode (CPU), its per-row block tables, how
`model.attention_kernel` chooses it, and a v5p AOT compile of a packed train step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.models import attention
from vapo_jax.models import splash_attention as spa

from tpu_aot import NEEDS_LIBTPU  # pylint: disable=wrong-import-order


def _packed(b=2, t=300, h=2, k=1, dh=32, seed=0):
  """Two packed rows: segments of uneven lengths, padding at the ends (T not a multiple
  of the 128-slot block), GQA (2 q heads per kv head)."""
  rng = np.random.default_rng(seed)
  seg = np.zeros((b, t), np.int32)
  seg[0, :100], seg[0, 100:250], seg[0, 250:280] = 1, 2, 3
  seg[1, :40], seg[1, 40:140], seg[1, 140:290] = 1, 2, 3
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
  return f(b, t, h, dh), f(b, t, k, dh), f(b, t, k, dh), jnp.asarray(seg), f(b, t, h, dh)


@pytest.mark.floor
@pytest.mark.parametrize("fused", [True, False])
def test_values_and_gradients_match_the_blocked_path_with_segments_and_padding(
    fused, monkeypatch):
  monkeypatch.setattr(spa, "FUSED_BWD", fused)  # the fused backward (per row) or split
  q, k, v, seg, w = _packed()
  real = seg > 0

  def vjp(fn):
    out, back = jax.vjp(fn, q, k, v)
    return out, back(w)  # a cotangent on padding queries too: they must pass none

  splash = lambda *a: attention.splash_causal_attention(  # noqa: E731
      *a, real, seg, block=128, interpret=True)
  blocked = lambda *a: attention.causal_blocked_attention(*a, real, 128, seg)  # noqa: E731
  (o1, g1), (o2, g2) = vjp(splash), vjp(blocked)
  np.testing.assert_allclose(o1, o2, atol=2e-5)
  assert float(jnp.abs(o1[~real]).max()) == 0.0  # padding queries: 0
  for a, b in zip(g1, g2):
    np.testing.assert_allclose(a, b, atol=2e-5)
  # The segment rule matters here: attention over whole rows differs by O(1).
  unseg = attention.causal_blocked_attention(q, k, v, real, 128)
  assert float(jnp.abs(unseg - o2).max()) > 0.1


def test_block_tables_skip_padding_other_segments_and_later_blocks_per_row():
  seg = np.zeros((2, 512), np.int32)
  seg[0, :200], seg[0, 200:300] = 1, 2          # blocks: {1}, {1, 2}, {2}, pad
  seg[1, :] = 1                                  # one segment over the whole row
  live = np.asarray(spa.live_blocks(jnp.asarray(seg), 128))
  np.testing.assert_array_equal(live[0], [[1, 0, 0, 0],
                                          [1, 1, 0, 0],
                                          [0, 1, 1, 0],   # skips block 0: segment 1 only
                                          [0, 0, 0, 1]])  # padding: its own block only
  np.testing.assert_array_equal(live[1], np.tril(np.ones((4, 4))))
  fwd, dq, dkv = spa.mask_infos(jnp.asarray(seg), 128)
  assert dq is fwd and fwd.data_next.shape == (1, 8, 4) and dkv.data_next.shape == (1, 4, 8)
  # Row 0's query block 2 walks key blocks 1, 2 then repeats 2 (no new copy), switched off.
  np.testing.assert_array_equal(np.asarray(fwd.data_next)[0, 2], [1, 2, 2, 2])
  np.testing.assert_array_equal(np.asarray(fwd.block_mask)[0, 2], [1, 1, 0, 0])
  # Row 1 (blocks 4..7 of the folded sequence): key block 1 is seen by query blocks 1..3.
  np.testing.assert_array_equal(np.asarray(dkv.data_next)[0, :, 5], [5, 6, 7, 7])
  np.testing.assert_array_equal(np.asarray(dkv.block_mask)[0, :, 5], [1, 1, 1, 0])
  # The fused backward, per row: dq None; its dk/dv grid visits every query block i at step
  # i (the kernel writes key block j's dq partial there), live ones switched on; a dead step
  # names the last live query block before it (else the first after): no new copy.
  fwd, dq, dkv = spa.mask_infos(jnp.asarray(seg[:1]), 128, fused_bwd=True)
  assert dq is None and dkv.data_next.shape == (1, 4, 4)
  np.testing.assert_array_equal(np.asarray(dkv.block_mask)[0], live[0].astype(int))
  np.testing.assert_array_equal(np.asarray(dkv.data_next)[0], [[0, 1, 2, 3],
                                                             [1, 1, 2, 3],
                                                             [1, 2, 2, 3],
                                                             [1, 2, 2, 3]])
  with pytest.raises(ValueError, match="per row"):
    spa.mask_infos(jnp.asarray(seg), 128, fused_bwd=True)


def test_auto_is_the_pure_jax_path_off_tpu_and_tpu_is_refused_clearly():
  said = []
  log = lambda *a, **kw: said.append(a)  # noqa: E731
  for want in ("auto", "jax"):
    assert spa.choose(want, 4, 2, 128, jnp.bfloat16, log=log) == "jax"
  assert not said
  with pytest.raises(ValueError, match="TPU only.*cpu"):
    spa.choose("tpu", 4, 2, 128, jnp.bfloat16)
  from vapo_jax.models.config import ModelConfig
  with pytest.raises(ValueError, match="attention_kernel"):
    ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                num_heads=2, num_kv_heads=1, attention_kernel="splash")


def _v5p_mesh(tensor):
  from jax.sharding import Mesh
  from vapo_jax.pod import slices
  devs = slices.devices(slices.parse("v5p-8"))
  return devs, Mesh(np.array(devs).reshape(1, len(devs) // tensor, tensor),
                    ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)


@NEEDS_LIBTPU
def test_auto_picks_splash_on_a_tpu_slice_and_refuses_split_gqa_groups():
  from vapo_jax import sharding as shd
  _, mesh = _v5p_mesh(2)
  rules = (mesh, shd.DEFAULT_RULES)
  said = []
  log = lambda *a, **kw: said.append(a[0])  # noqa: E731
  assert spa.choose("auto", 8, 2, 128, jnp.bfloat16, 2, 1024, 512, rules, log=log,
                    target="tpu") == "tpu"
  assert not said
  # 1 kv head, 8 q heads over 2 tensor shards: the kv head is replicated, q heads split.
  assert spa.choose("auto", 8, 1, 128, jnp.bfloat16, 2, 1024, 512, rules, log=log,
                    target="tpu") == "jax"
  assert len(said) == 1 and "kv heads" in said[0]


@NEEDS_LIBTPU
@pytest.mark.parametrize("head_dim,fused", [pytest.param(128, True, marks=pytest.mark.floor),
                                            (64, True), (128, False)])
def test_packed_train_step_with_the_splash_kernel_compiles_for_v5p(head_dim, fused,
                                                                   monkeypatch):
  """The gradient of a packed forward (segment ids, fsdp x tensor mesh, remat) lowered and
  AOT-compiled for a v5p-8 slice from this CPU host: the splash kernels (forward, and dq
  plus dk/dv, or the fused backward) per layer are in the compiled program."""
  monkeypatch.setattr(spa, "FUSED_BWD", fused)
  from flax import nnx
  from vapo_jax import sharding as shd
  from vapo_jax.models import platform, transformer
  from vapo_jax.models.config import ModelConfig
  devs, mesh = _v5p_mesh(2)
  mcfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=head_dim, dtype=jnp.bfloat16,
                     param_dtype=jnp.float32, remat=True, attention_impl="blocked",
                     attention_block=256)
  g, abs_state = nnx.split(nnx.eval_shape(
      lambda: transformer.Transformer(mcfg, rngs=nnx.Rngs(0))))
  abs_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                           abs_state, shd.state_shardings(abs_state, mesh))
  b, t = 4, 1000
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  ints = jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=rows)

  def loss(state, tokens, pos, seg):
    model = nnx.merge(g, state)
    x, _ = model(tokens, pos, seg > 0, segment_ids_BxT=seg)
    return jnp.mean(jnp.square(x.astype(jnp.float32)))

  step = jax.jit(shd.traced_under(jax.grad(loss), mesh))
  with platform.targeting("tpu"), jax.default_device(devs[0]):
    compiled = step.lower(abs_state, ints, ints, ints).compile()
  text = compiled.as_text()
  assert text.count("splash") >= 3 * mcfg.num_layers or text.count("tpu_custom_call") >= 6
  assert ("splash_mha_dq" in text) == (not fused), "the fused backward runs no dq kernel"
  assert "splash_mha_dkv" in text
  assert compiled.memory_analysis() is not None
