"""The same forward on 8 fake CPU devices (FSDP, tensor parallel) as on one."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import sharding as shd
from vapo_jax.models import (Transformer, forward_logits, hf_io, init_sharded,
                             tiny_config)

MESHES = [dict(data=1, fsdp=8, tensor=1), dict(data=2, fsdp=2, tensor=2),
          dict(data=1, fsdp=2, tensor=4)]


def test_make_mesh_and_specs():
  mesh = shd.make_mesh(data=2, fsdp=-1, tensor=2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  with pytest.raises(ValueError, match="devices"):
    shd.make_mesh(data=3, fsdp=1, tensor=1)
  P = jax.sharding.PartitionSpec
  assert shd.logical_to_spec(("embed", "heads", "head_dim")) == P(
      "fsdp", "tensor", None)
  assert shd.logical_to_spec(("batch", None)) == P(("data", "fsdp"), None)
  # kv_heads=2 does not divide over tensor=4: replicated on that dim.
  mesh = shd.make_mesh(data=1, fsdp=2, tensor=4)
  assert shd.logical_to_spec(("embed", "kv_heads", "head_dim"), mesh=mesh,
                             shape=(128, 2, 32)) == P("fsdp", None, None)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  cfg = tiny_config(vocab_size=64, tie_word_embeddings=False, qk_norm=True,
                    qkv_bias=False, model_type="qwen3")
  model = Transformer(cfg, rngs=nnx.Rngs(1))
  path = str(tmp_path_factory.mktemp("ckpt"))
  hf_io.save_pretrained(model, cfg, path)
  tokens = np.random.RandomState(0).randint(0, 64, (8, 12)).astype(np.int32)
  mask = np.ones((8, 12), np.int32)
  mask[::2, :4] = 0
  ref, _ = hf_io.from_pretrained(path)
  return path, tokens, mask, np.asarray(forward_logits(ref, tokens, mask))


@pytest.mark.parametrize("axes", MESHES, ids=str)
def test_sharded_forward_matches_one_device(checkpoint, axes):
  path, tokens, mask, ref = checkpoint
  mesh = shd.make_mesh(**axes)
  model, cfg = hf_io.from_pretrained(path, mesh=mesh)
  q = model.blocks.attn.q[...]  # stacked [L, D, H, Dh]: the layer axis never sharded
  assert q.sharding.spec == shd.logical_to_spec(
      ("layers", "embed", "heads", "head_dim"), mesh=mesh, shape=q.shape)
  assert q.sharding.spec[0] is None
  assert len(q.sharding.device_set) == 8
  graphdef, state = nnx.split(model)
  batch = jax.sharding.NamedSharding(
      mesh, shd.logical_to_spec(("batch", None), mesh=mesh, shape=(8, 12)))
  f = jax.jit(lambda s, t, m: forward_logits(nnx.merge(graphdef, s), t, m))
  out = f(state, jax.device_put(tokens, batch), jax.device_put(mask, batch))
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=1e-5)
  del cfg


def test_init_sharded_places_parameters():
  mesh = shd.make_mesh(data=1, fsdp=4, tensor=2)
  cfg = tiny_config()
  model = init_sharded(lambda r: Transformer(cfg, rngs=r), mesh)
  up = model.blocks.mlp.up[...][1]
  assert model.blocks.mlp.up[...].sharding.spec == jax.sharding.PartitionSpec(
      None, "fsdp", "tensor")
  ref = Transformer(cfg, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(up), np.asarray(ref.blocks[1].mlp.up[...]),
                             atol=1e-7)
  tokens = jnp.ones((2, 4), jnp.int32)
  np.testing.assert_allclose(forward_logits(model, tokens, tokens),
                             forward_logits(ref, tokens, tokens), atol=1e-5)


def test_fsdp_only_rules_move_the_tensor_axis_to_rows_and_embed():
  rules = shd.fsdp_only(shd.DEFAULT_RULES)
  table = dict(rules)
  assert table["batch"] == ("data", "fsdp", "tensor")
  assert table["embed"] == ("fsdp", "tensor")
  assert all(table[n] is None for n in ("heads", "kv_heads", "mlp", "vocab", "head_dim"))
  mesh = shd.make_mesh(data=1, fsdp=4, tensor=2)
  assert shd.batch_axes(mesh, rules) == ("fsdp", "tensor")
  # A custom table: data parallel rows, embed over fsdp only; tensor joins both.
  custom = (("batch", "fsdp"), ("embed", "fsdp"), ("mlp", "tensor"), ("vocab", "tensor"))
  assert dict(shd.fsdp_only(custom)) == {"batch": ("fsdp", "data", "tensor"),
                                         "embed": ("fsdp", "data", "tensor"),
                                         "mlp": None, "vocab": None}


@pytest.mark.parametrize("count", [None, 140])
@pytest.mark.parametrize("layout", ["shared", "fsdp"])
def test_chunked_logprobs_gathers_the_head_once_not_per_chunk(layout, count):
  """The LM head's FSDP shards are gathered once before the chunk loop (forward and
  backward), and neither the head's gradient nor the hidden states' is reduced inside it:
  a chunk's loop trip reduces only its [B, C] log-sum-exp, target logit and entropy sums
  over the vocab shards (the partitioner alone all-reduced the whole head's gradient in
  every chunk of the backward: 168 times per qwen32b micro-batch). With `count`, the
  chunks past it are skipped. Values and gradients are those of one device."""
  from vapo_jax import policy  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import hlo_stats  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding  # pylint: disable=import-outside-toplevel
  mesh = shd.make_mesh(data=1, fsdp=4, tensor=2)
  rules = shd.DEFAULT_RULES if layout == "shared" else shd.fsdp_only()
  b, r, d, v = 8, 256, 64, 256
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(k1, (b, r, d))
  y = jax.random.randint(k2, (b, r), 0, v)
  w = jax.random.normal(k3, (d, v)) * 0.1

  def loss(h, w, y):
    lp, ent = policy.chunked_logprobs(h, y, w, chunk=64, dtype=jnp.float32, count=count,
                                      vocab_size=200)
    return lp.sum() + 0.5 * ent.sum()

  def put(x, names):
    return jax.device_put(x, NamedSharding(mesh, shd.logical_to_spec(names, rules, mesh,
                                                                      x.shape)))

  sharded = jax.jit(jax.value_and_grad(shd.traced_under(loss, mesh, rules), argnums=(0, 1)))
  args = (put(h, ("batch", None, None)), put(w, ("embed", "vocab")), put(y, ("batch", None)))
  text = sharded.lower(*args).compile().as_text()
  assert len(hlo_stats.while_bodies(text)) >= 2          # the chunk loops, forward and back
  assert hlo_stats.invariant_gathers(text) == []
  for loop in hlo_stats.while_bodies(text):   # at most 3 sums of [B, C] floats per trip
    assert loop.collectives.total_bytes <= 3 * b * 64 * 4, (loop.body, loop.collectives)
  (val, (gh, gw)), (val1, (gh1, gw1)) = sharded(*args), jax.value_and_grad(
      loss, argnums=(0, 1))(h, w, y)
  np.testing.assert_allclose(val, val1, rtol=1e-5)
  np.testing.assert_allclose(gh, gh1, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(gw, gw1, rtol=1e-4, atol=1e-5)
