"""The sizes of a run's passes, asked by the trainer and by the pod tools alike: one home for
the packed row layout of a pass and the engine's prompt buckets, so that `pod.step` counts
the shapes the trainer builds instead of a copy of its arithmetic.

  shards   = the batch shards of the train passes' mesh (data × fsdp; `sharding.batch_axes`)
  pass     = `rows` sequences of P + R tokens in `micro_batches` padded micro-batches
  PackSpec = `packing.spec_for(P + R, rows / micro_batches, shards, rl.packing_row_tokens,
             rl.packing_tokens_per_device, rl.packing_row_steps, rows, share)`, the share
             larger for the forward-only passes (`packing.FORWARD_SHARE`)
  buckets  = powers of two from sampling.prompt_bucket_min up to P with the rollout engine
             (`sampler.ops.power_buckets`), else (P,): every prompt padded to P

(P = data.max_prompt_tokens, R = sampling.max_new_tokens.) `run.learners.pass_spec` gives a
pass its (rows, micro_batches) by name; `run.sampling.build_sampler` takes the buckets.
"""

import numpy as np

from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.sampler import ops


def batch_shards(mesh, rules) -> int:
  """Shards of the batch on `mesh` under `rules` (the product of its batch axes; 1: none)."""
  axes = shd.batch_axes(mesh, rules)
  return int(np.prod([mesh.shape[a] for a in axes])) if axes else 1


def pack_spec(cfg, rows: int, micro_batches: int, shards: int,
              forward: bool = False) -> packing.PackSpec:
  """The PackSpec of a packed pass of `rows` sequences whose padded form runs in
  `micro_batches` micro-batches over `shards` batch shards: a token budget of one padded
  micro-batch, capped at a share of the pass (`packing.spec_for`; a larger share for a
  `forward`-only pass), and the config's overrides."""
  share = packing.FORWARD_SHARE if forward else packing.DEFAULT_SHARE
  return packing.spec_for(cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens,
                          rows // max(micro_batches, 1), shards, cfg.rl.packing_row_tokens,
                          cfg.rl.packing_tokens_per_device, cfg.rl.packing_row_steps, rows,
                          share)


def prompt_buckets(cfg) -> tuple[int, ...]:
  """The prompt lengths a run's rollout pads to (see the module docstring)."""
  p = cfg.data.max_prompt_tokens
  if cfg.sampling.engine == "continuous":
    return ops.power_buckets(p, cfg.sampling.prompt_bucket_min)
  return (p,)
