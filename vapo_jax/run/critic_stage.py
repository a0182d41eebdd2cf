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
                      epochs 0) exactly the run's own PPO loop over the step's batch;
                      what a resumed stage needs to draw the same batches again (each one's
                      prompt iterator state and rollout key) and the held-out EV's sums are
                      kept in the summary too (`replay_state`, `set_replay_state`)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import critic as critic_lib
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import update
from vapo_jax.run import learners

SUMMARY_KEY = "critic_return_stats"  # the summary's entry: [weight, mean, sq]
REPLAY_KEY = "critic_replay"  # {"draws": [{"iterator", "key"}], "heldout": [[5 sums]]}


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


def last(items: list, k: int) -> list:
  """The last k items (none for k = 0)."""
  return items[len(items) - k:] if k > 0 else []


def draw_record(state) -> dict:
  """What draws the run's next value-pretraining batch again: its prompt iterator's state
  and the key the next `state.next_key()` returns (call before drawing)."""
  sub = jax.random.split(state.key)[1]  # (what next_key will return)
  return {"iterator": state.prompts.get_state(),
          "key": [int(x) for x in np.asarray(jax.random.key_data(sub)).ravel()]}


def examples_of(trainer, draw: dict) -> list:
  """The prompts of a recorded draw (a copy of the run's iterator at that state)."""
  it = type(trainer.state.prompts)(trainer.parts.train_examples, trainer.cfg.prompts_per_step,
                                   seed=trainer.cfg.seed)
  it.set_state(draw["iterator"])
  return next(it)


def key_of(draw: dict) -> jax.Array:
  return jax.random.wrap_key_data(jnp.asarray(draw["key"], jnp.uint32))


def replay_state(summary: dict, start: int) -> tuple[list, list]:
  """(draws of the batches to replay, held-out sums) a stage resumed at step `start` goes on
  with (none at step 0)."""
  kept = summary.get(REPLAY_KEY) if start else None
  if not kept:
    return [], []
  return list(kept["draws"]), [np.asarray(x, np.float64) for x in kept["heldout"]]


def set_replay_state(summary: dict, draws: list, heldout: list) -> None:
  summary[REPLAY_KEY] = {"draws": draws, "heldout": [[float(v) for v in x] for x in heldout]}

