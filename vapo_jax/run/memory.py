"""What a run keeps in device memory while its rollout engine samples, from shapes alone.

Per chip (max over the mesh's devices), from abstract parameters with the run's shardings
(nothing allocated, so it works for a 32B model on any host):

  policy_state    the policy's TrainState (parameters + optimizer state)
  critic_state    the critic's, with a critic
  reference       GRPO's frozen initial policy (rl.kl_coef > 0)
  rollout_batch   the last rollout batch ([B, P + R] rows)
  decode_copy     the engine's decode copy of the policy (sampling.decode_dtype, FSDP dropped)

The train states lie on the train passes' mesh (`run.meshes.build_train_mesh`: the decode
mesh, or with mesh.train_tensor a second mesh over the same devices) under the train rules.

`pod.programs` counts the same parts for the compile check (a test ties the two). The
engine's KV pool is sized from HBM less these (`sampler.kv_pool`).
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax import critic as critic_lib
from vapo_jax import sharding as shd
from vapo_jax.models import transformer
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import train_state
from vapo_jax.run import learners
from vapo_jax.run import meshes
from vapo_jax.sampler import decode_weights
from vapo_jax.sampler import kv_pool


def device_hbm(mesh) -> float | None:
  """Memory per device (bytes) as the runtime reports it; None on CPU or without a figure.

  Read from a device this process owns (another host's device has no `memory_stats` here)
  and, on a multi-process run, the smallest figure over the processes, so that every host
  sizes the same KV pool and compiles the same programs.
  """
  own = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  dev = own[0] if own else mesh.devices.flat[0]
  if dev.platform == "cpu":
    return None
  try:
    stats = dev.memory_stats() or {}
  except Exception as e:  # pylint: disable=broad-except  (some runtimes do not implement it)
    print(f"[memory] {dev} reports no memory_stats ({e}); the KV pool is sized by its slots "
          "(set sampling.kv_tokens to size it yourself)", flush=True)
    stats = {}
  limit = float(stats.get("bytes_limit") or 0)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    limits = np.asarray(multihost_utils.process_allgather(np.float64(limit)))
    limit = 0.0 if (limits <= 0).any() else float(limits.min())
  return limit or None


def _abstract(build, mesh, rules):
  graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))
  sh = shd.state_shardings(abs_state, mesh, rules)
  return graphdef, jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abs_state, sh)


def _state_bytes(params, tx) -> int:
  opt_sh = train_state.opt_state_shardings(params, tx)
  opt = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                     jax.eval_shape(tx.init, train_state.trainable(params)), opt_sh)
  return kv_pool.per_device_bytes(params) + kv_pool.per_device_bytes(opt) + 4


def decode_dtype(cfg, mcfg):
  d = cfg.sampling.decode_dtype
  return jnp.dtype(mcfg.dtype if d == "auto" else d)


def decode_copy_bytes(cfg, mcfg, graphdef, params, mesh, rules) -> int:
  """Per-chip bytes of the engine's decode copy of `params` (abstract or concrete)."""
  _, _, shardings, abstract = decode_weights.decode_layout(
      graphdef, params, decode_dtype(cfg, mcfg), mesh, rules)
  if shardings is not None:
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract, shardings)
  return kv_pool.per_device_bytes(abstract)


def resident(cfg, mcfg, mesh, rules) -> dict[str, int]:
  """The parts above, bytes per chip. `mesh`, `rules`: the decode replicas' (the train
  states and the rollout batch lie on the train mesh under the train rules, `run.meshes`;
  each learner's optimizer is `run.learners.optimizer`)."""
  t_mesh, t_rules = meshes.build_train_mesh(cfg, mesh), meshes.train_rules_of(cfg)
  graphdef, params = _abstract(lambda r: transformer.Transformer(mcfg, rngs=r), t_mesh,
                               t_rules)
  out = {"policy_state": _state_bytes(params, learners.optimizer(cfg, "policy")),
         "critic_state": 0}
  if cfg.uses_critic:
    _, c_params = _abstract(critic_lib.builder(mcfg, head_bias=cfg.model.critic_head_bias,
                                               full=cfg.full_critic), t_mesh, t_rules)
    out["critic_state"] = _state_bytes(c_params, learners.optimizer(cfg, "critic"))
  out["reference"] = kv_pool.per_device_bytes(params) if cfg.rl.kl_coef > 0 else 0
  rows = learners.rows_of(cfg).rollout
  # The rollout batch as the sampler gives it, or on its own train mesh as it moves there.
  b_mesh, b_rules = (mesh, rules) if t_mesh is mesh else (t_mesh, t_rules)
  sh = batch_lib.batch_sharding(b_mesh, shd.batch_axes(b_mesh, b_rules))
  out["rollout_batch"] = kv_pool.per_device_bytes(batch_lib.abstract(
      rows, cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens, sh,
      reference=cfg.rl.kl_coef > 0))
  out["decode_copy"] = decode_copy_bytes(cfg, mcfg, graphdef, params, mesh, rules)
  return out


def engine_memory(cfg, mcfg, mesh, rules, hbm: float | None = None) -> kv_pool.Memory:
  """The Memory a run's engines are sized from: `hbm` (default: the device's own figure)
  less everything `resident` counts."""
  hbm = device_hbm(mesh) if hbm is None else hbm
  if hbm is None:
    return kv_pool.Memory(None, 0.0, cfg.sampling.kv_headroom)
  return kv_pool.Memory(hbm, float(sum(resident(cfg, mcfg, mesh, rules).values())),
                        cfg.sampling.kv_headroom)
