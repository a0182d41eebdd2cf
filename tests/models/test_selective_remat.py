"""A selective remat (`transformer.selective_block`: matmul outputs kept, the rest recomputed)
gives the loss and gradients of a full remat and of none, scanned or looped, packed or padded,
with LoRA or without; and it keeps what it says it keeps."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.models import lora, stacked, transformer
from vapo_jax.models.config import tiny_config

L = 3


def model(scan: bool, lora_rank: int, **kw):
  cfg = tiny_config(vocab_size=40, hidden_size=64, intermediate_size=96, num_layers=L,
                    qkv_bias=True, lora_rank=lora_rank,
                    lora_targets=("q", "o", "down") if lora_rank else (), **kw)
  m = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
  if lora_rank:  # fresh B is zero: random, so the adapters' gradients all flow
    for mod in (m.blocks.attn, m.blocks.mlp):
      for name in cfg.lora_targets:
        var = getattr(mod, name + "_lora_b", None)
        if var is not None:
          var.set_value(0.3 * jax.random.normal(jax.random.key(len(name)),
                                                var.get_value().shape))
  return m if scan else stacked.unstack(m)


def batch(packed: bool):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, 40, (2, 10)), jnp.int32)
  if not packed:
    mask = jnp.asarray(np.r_[[[0] * 3 + [1] * 7], [[1] * 10]], jnp.int32)
    return tokens, transformer.positions_from_mask(mask), mask, None
  seg = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 2, 2, 3, 3, 3]],
                    jnp.int32)
  pos = jnp.asarray([[0, 1, 2, 0, 1, 2, 3, 0, 0, 0], [0, 1, 2, 3, 4, 0, 1, 0, 1, 2]],
                    jnp.int32)
  return tokens, pos, (seg > 0).astype(jnp.int32), seg


def loss_and_grads(m, packed):
  tokens, pos, mask, seg = batch(packed)
  w = jax.random.normal(jax.random.key(1), (2, 10, 40))
  graphdef, params = nnx.split(m)
  train, frozen = lora.split_trainable(params)

  def loss(tr):
    mm = nnx.merge(graphdef, lora.join(tr, frozen))
    hidden, _ = mm(tokens, pos, mask, segment_ids_BxT=seg)
    return jnp.sum(jnp.tanh(mm.logits(hidden)) * w)

  value, grads = jax.jit(jax.value_and_grad(loss))(train)
  return float(value), nnx.to_pure_dict(grads)


POLICIES = {"none": dict(remat=False), "full": dict(remat=True),
            "selective": dict(remat=True, remat_selective=L),
            # one block of each kind: full, selective, plain (three scans when scanned)
            "mixed": dict(remat=True, remat_layers=2, remat_selective=1)}


@pytest.mark.parametrize("scan,packed,lora_rank", [
    (True, False, 0), (True, True, 2), (False, True, 0), (False, False, 2)])
def test_selective_equals_full_and_no_remat(scan, packed, lora_rank):
  out = {k: loss_and_grads(model(scan, lora_rank, **kw), packed)
         for k, kw in POLICIES.items()}
  loss0, grads0 = out["none"]
  for name, (loss, grads) in out.items():
    assert loss == pytest.approx(loss0, abs=1e-5), name
    assert jax.tree.structure(grads) == jax.tree.structure(grads0), name
    for g, g0 in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0)):
      # float32 summation order: 1e-5 of the leaf's scale (|g| up to ~10 here)
      scale = max(1.0, float(np.abs(g0).max()))
      np.testing.assert_allclose(np.asarray(g), np.asarray(g0), atol=1e-5 * scale, rtol=0,
                                 err_msg=name)
  if lora_rank:
    paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(out["selective"][1])]
    assert paths and all(str(p[-1].key).endswith(lora.SUFFIXES) for p in paths)
