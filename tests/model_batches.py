"""A tiny batch (2 rows of 10 tokens, vocabulary 40), padded or packed, and the loss and
gradients of a model on it: shared by the model tests that compare two code paths of one
network (scan vs loop, remat kinds), each with its own oracle."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax.models import lora, transformer


def batch(packed: bool):
  """(tokens, positions, mask, segment ids or None) [2, 10]: padded = one left-padded row
  and one full; packed = segments of 3 + 4 (+ 3 padding) and 5 + 2 + 3."""
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


def loss_and_grads(model, packed: bool, squash=lambda x: x):
  """(loss, logits [2, 10, 40], gradients of the trainable parameters as a pure dict) of
  loss = Σ squash(logits) · w, w a fixed normal draw; LoRA models train their adapters."""
  tokens, pos, mask, seg = batch(packed)
  w = jax.random.normal(jax.random.key(1), (2, 10, 40))
  graphdef, params = nnx.split(model)
  train, frozen = lora.split_trainable(params)

  def loss(tr):
    m = nnx.merge(graphdef, lora.join(tr, frozen))
    hidden, _ = m(tokens, pos, mask, segment_ids_BxT=seg)
    logits = m.logits(hidden)
    return jnp.sum(squash(logits) * w), logits

  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(train)
  return float(value), logits, nnx.to_pure_dict(grads)
