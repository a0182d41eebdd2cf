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


# ------------------------------------------------------- one RL step on a mesh


def mesh_shards(mesh) -> int:
  """The batch shards of a mesh (data x fsdp)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def rl_step(mcfg, mesh, layout_name):
  """Loss metrics and the gradient (read off an SGD(lr=1) step) of one policy update."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import functools  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import batch as batch_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import layout as layout_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import train_state, update  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import learners  # pylint: disable=import-outside-toplevel
  p, r = 4, 6
  plen, rlen = np.array([4, 2, 3, 4, 1, 4, 2, 3]), np.array([6, 1, 3, 0, 5, 2, 6, 4])
  cols = np.arange(p + r)[None]
  prompt = (cols >= p - plen[:, None]) & (cols < p)
  resp = (cols >= p) & (cols < p + rlen[:, None])
  mask, resp = (prompt | resp).astype(np.float32), resp[:, p:].astype(np.float32)
  rng = np.random.default_rng(0)
  tokens = (rng.integers(1, mcfg.vocab_size, mask.shape) * mask).astype(np.int32)
  z = lambda: (rng.normal(size=resp.shape) * resp).astype(np.float32)  # noqa: E731
  batch = batch_lib.RolloutBatch(
      tokens_BxL=tokens, mask_BxL=mask, old_logp_BxR=z() - 3.0 * resp, advantages_BxR=z(),
      response_mask_BxR=resp, scores_B=np.array([1, 0, 1, 1, 0, 1, 0, 1], np.float32),
      returns_BxR=z(), old_values_BxR=np.zeros_like(resp), ref_logp_BxR=z() - 3.0 * resp)
  c = config_lib.apply_preset(config_lib.default_config_dict(), "vapo")
  hp = dataclasses.replace(learners.policy_hparams(config_lib.from_config_dict(c)),
                           nll_coef=0.2)
  layout = {"padded": layout_lib.Padded(2),
            # 4 rows of 10 slots per micro-batch on either mesh (4 batch shards on 8 devices)
            "packed": layout_lib.Packed(packing.PackSpec(p + r, 4 // mesh_shards(mesh),
                                                         mesh_shards(mesh)))}[layout_name]
  sgd = optax.sgd(1.0)
  model = transformer.init_sharded(lambda rr: transformer.Transformer(mcfg, rngs=rr), mesh,
                                   seed=3)
  graphdef, params = nnx.split(model)
  state = train_state.init_state(params, sgd)
  before = jax.device_get(state.params)
  axes = shd.batch_axes(mesh)
  step = layout.step("step", train_state.compile_step(
      functools.partial(update.policy_step, graphdef, sgd, hp, layout), state, mesh, axes),
      mesh, axes)
  state, metrics, _ = step(state, batch_lib.shard_batch(batch, mesh, axes))
  grads = jax.tree.map(lambda b, a: np.asarray(b, np.float64) - np.asarray(a), before,
                       jax.device_get(state.params))
  return jax.device_get(metrics), grads
