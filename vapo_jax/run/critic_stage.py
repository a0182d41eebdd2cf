"""The critic's side of value pretraining and RL: its targets' scale and reused rollouts.

  return statistics   rl.value_norm="running": `critic.ReturnStats` of the targets, kept in
                      the run's summary (`return_stats`, `set_return_stats`) so a checkpoint
                      holds them and a resumed run un-standardises with the same (μ, σ)
  critic units        a batch as the critic step takes it (`in_critic_units`): returns
                      (R − μ')/σ' by the statistics updated with this batch, old values
                      (V − μ)/σ by the ones V was read with (= the critic's own outputs)
  reused rollouts     value pretraining trains on the last value_pretrain.replay_batches
                      batches joined (`joined`), value_pretrain.epochs passes in mini-batches
                      of the run's size (`pretrain_loop`); with the defaults (1 batch,
                      epochs 0) exactly the run's own PPO loop over the step's batch
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vapo_jax import critic as critic_lib
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import update
from vapo_jax.run import learners

SUMMARY_KEY = "critic_return_stats"  # the summary's entry: [weight, mean, sq]


def return_stats(summary: dict) -> critic_lib.ReturnStats:
  """The statistics kept in a run's summary (none yet: the identity)."""
  return critic_lib.ReturnStats(*summary.get(SUMMARY_KEY, ()))


def set_return_stats(summary: dict, stats: critic_lib.ReturnStats) -> None:
  summary[SUMMARY_KEY] = [float(x) for x in stats]


def in_critic_units(batch: batch_lib.RolloutBatch, before: critic_lib.ReturnStats,
                    after: critic_lib.ReturnStats) -> batch_lib.RolloutBatch:
  """returns_BxR standardised by `after`, old_values_BxR (V, read with `before`) by
  `before`: the critic's own outputs v, so value clipping stays centred on them."""
  m = batch.response_mask_BxR
  return dataclasses.replace(
      batch, returns_BxR=critic_lib.standardise(batch.returns_BxR, m, after),
      old_values_BxR=critic_lib.standardise(batch.old_values_BxR, m, before))


def joined(batches: list[batch_lib.RolloutBatch]) -> batch_lib.RolloutBatch:
  """The batches' rows one after another (one batch: itself)."""
  if len(batches) == 1:
    return batches[0]
  return jax.tree.map(lambda *x: jnp.concatenate(x, axis=0), *batches)


def pretrain_loop(cfg, num_batches: int) -> update.PPOLoop:
  """Value pretraining's loop over `num_batches` joined batches: value_pretrain.epochs
  (0: rl.ppo_epochs) passes of rl.num_minibatches mini-batches per batch, each of the run's
  mini-batch rows (the compiled step's shape)."""
  loop = learners.ppo_loop(cfg)
  return dataclasses.replace(loop, epochs=cfg.value_pretrain.epochs or loop.epochs,
                             num_minibatches=loop.num_minibatches * num_batches)
