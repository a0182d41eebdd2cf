"""Blocks under scan (stacked [L, ...] parameters) equal the per-layer loop they replace."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.models import lora, stacked, transformer
from vapo_jax.models.config import tiny_config

import model_batches  # pylint: disable=wrong-import-order

L = 3


def models(**kw):
  """(scan model, loop model) with the same values; fresh LoRA B made random."""
  cfg = tiny_config(vocab_size=40, hidden_size=64, intermediate_size=96, num_layers=L,
                    **kw)
  scan = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
  if cfg.lora_rank:
    for mod in (scan.blocks.attn, scan.blocks.mlp):
      for name in cfg.lora_targets:
        var = getattr(mod, name + "_lora_b", None)
        if var is not None:
          var.set_value(0.3 * jax.random.normal(jax.random.key(len(name)),
                                                var.get_value().shape))
  loop = stacked.unstack(scan)
  assert loop.cfg.scan_layers is False and isinstance(loop.blocks, nnx.List)
  return scan, loop


def loss_and_grads(model, packed):
  _, logits, grads = model_batches.loss_and_grads(model, packed)
  return logits, stacked.stack_tree(grads)


@pytest.mark.parametrize("remat,remat_layers,packed,lora_rank", [
    (False, -1, False, 0),
    (True, -1, False, 0),
    (True, 1, True, 0),     # one rematerialised block, then two plain ones: two scans
    (True, 2, True, 2),     # LoRA: only the adapters get gradients
    (False, -1, True, 2),
])
def test_scan_equals_the_loop_forward_and_gradients(remat, remat_layers, packed, lora_rank):
  kw = dict(remat=remat, remat_layers=remat_layers)
  if lora_rank:
    kw.update(lora_rank=lora_rank, lora_targets=("q", "o", "down"))
  scan, loop = models(**kw)
  logits_s, grads_s = loss_and_grads(scan, packed)
  logits_l, grads_l = loss_and_grads(loop, packed)
  np.testing.assert_allclose(np.asarray(logits_s), np.asarray(logits_l), atol=1e-5, rtol=0)
  paths_s = jax.tree_util.tree_leaves_with_path(grads_s)
  paths_l = jax.tree_util.tree_leaves_with_path(grads_l)
  assert [p for p, _ in paths_s] == [p for p, _ in paths_l]
  if lora_rank:
    assert all(str(p[-1].key).endswith(lora.SUFFIXES) for p, _ in paths_s)
  for (path, a), (_, b) in zip(paths_s, paths_l):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
  assert max(float(jnp.abs(g).max()) for _, g in paths_s) > 1e-3  # gradients flow


def test_layouts_round_trip_and_index():
  scan, loop = models()
  back = stacked.stack(loop)
  for a, b in zip(jax.tree.leaves(nnx.state(scan)), jax.tree.leaves(nnx.state(back))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert len(scan.blocks) == L
  q1 = scan.blocks[1].attn.q
  np.testing.assert_array_equal(np.asarray(q1[...]), np.asarray(loop.blocks[1].attn.q[...]))
  assert q1.get_metadata()["out_sharding"] == ("embed", "heads", "head_dim")
  assert scan.blocks.attn.q.get_metadata()["out_sharding"] == (
      "layers", "embed", "heads", "head_dim")
  assert stacked.is_stacked(nnx.state(scan)) and not stacked.is_stacked(nnx.state(loop))


def test_cached_decode_on_stacked_blocks_equals_the_loop():
  """Prefill + one decode step with a KV cache run per layer on both layouts."""
  scan, loop = models()
  tokens, pos, mask, _ = model_batches.batch(False)
  outs = []
  for m in (scan, loop):
    cache = transformer.init_cache(m, 2, 12)
    kv = jnp.pad(mask, ((0, 0), (0, 2)))
    h, cache = m(tokens, pos, kv, cache=cache)
    kv = kv.at[:, 10].set(1)
    h2, _ = m(tokens[:, -1:], pos[:, -1:] + 1, kv, cache=cache, cache_index=10)
    outs.append((h, h2))
  for a, b in zip(outs[0], outs[1]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)


def test_a_per_layer_checkpoint_restores_stacked(tmp_path):
  """A checkpoint saved with per-layer blocks (before 2026-12-05) restores into stacked
  blocks, optimizer-shaped trees included; a tree that differs otherwise still fails."""
  from vapo_jax.run import checkpoint_store  # pylint: disable=import-outside-toplevel
  scan, loop = models(lora_rank=2, lora_targets=("q",))
  old = {"params": nnx.state(loop), "mu": jax.tree.map(lambda x: 2 * x, nnx.state(loop)),
         "count": jnp.int32(7)}
  store = checkpoint_store.CheckpointStore(str(tmp_path / "ck"), async_save=False)
  store.save(3, {"policy": old}, {"note": "per-layer"})
  like = {"params": nnx.state(scan), "mu": nnx.state(scan), "count": jnp.int32(0)}
  got = store.restore(3, {"policy": like})["policy"]
  assert jax.tree.structure(got) == jax.tree.structure(like)
  want = stacked.stack_tree(nnx.to_pure_dict(old["mu"]))
  for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(got["mu"])), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(got["count"]) == 7
  # only the weights (a subtree), as checkpoint.restore=weights reads them
  params = store.restore(3, {"policy": nnx.state(scan)}, subtrees={"policy": "['params']"})
  np.testing.assert_array_equal(np.asarray(params["policy"]["blocks"]["attn"]["q"][...]),
                                np.asarray(scan.blocks.attn.q[...]))
  other, _ = models(num_heads=2, num_kv_heads=1, lora_rank=2, lora_targets=("q",))
  with pytest.raises(checkpoint_store.CheckpointMismatch) as e:
    store.restore(3, {"policy": {"params": nnx.state(other), "mu": nnx.state(other),
                                 "count": jnp.int32(0)}})
  assert "\n" not in str(e.value) and "['blocks'][0]" in str(e.value)
  store.close()
