"""The trained networks of a run: the settings of each train step (Config → dataclass
adapters), the row counts of an RL step, `LEARNERS` (one row per network: its optimizer's
schedule and its step, written once over a row layout) and the row layout of each pass
(`rl.layout`: packed with rl.packing, else padded).

A new trained network is one row in `LEARNERS`, whatever rl.packing says: its step
(`rl.update`) is written once over `rl.layout`, and `learner` builds it on either layout.
"""

import dataclasses
import functools
from typing import Callable

import jax
import optax

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.rl import layout as layout_lib
from vapo_jax.rl import train_state
from vapo_jax.rl import update
from vapo_jax.run import pass_sizes


def policy_hparams(cfg: config_lib.Config) -> update.PolicyHParams:
  """The policy step's settings (the config's VAPO switches resolved)."""
  rl = cfg.rl
  return update.PolicyHParams(
      temperature=cfg.sampling.temperature, eps_low=rl.eps_low, eps_high=cfg.eps_high,
      dual_clip=rl.dual_clip or None, loss_mode=cfg.loss_mode, nll_coef=rl.nll_coef,
      nll_threshold=rl.nll_threshold, kl_coef=rl.kl_coef, policy_loss=rl.policy_loss,
      old_logprobs=cfg.old_logprobs, correction=rl.correction)


def critic_hparams(cfg: config_lib.Config) -> update.CriticHParams:
  return update.CriticHParams(value_clip=cfg.rl.value_clip or None, loss_mode="token")


@dataclasses.dataclass(frozen=True)
class Rows:
  """Row counts of one RL step."""
  rollout: int         # B = prompts_per_step × responses_per_prompt
  minibatch: int       # rows of one mini-batch (one optimizer update)
  micro_batches: int   # gradient-accumulation micro-batches per mini-batch
  forward_chunks: int  # micro-batches of the old-log-prob and value passes over B rows


def rows_of(cfg: config_lib.Config) -> Rows:
  rows = cfg.rl.rollout_prompts * cfg.rl.group_size
  minibatch = rows // cfg.rl.num_minibatches
  micro = cfg.rl.micro_batch_size
  # The old-log-prob and value passes over the whole rollout run in train-sized
  # micro-batches: at 32B × 20k tokens the whole batch at once would not fit any pod.
  return Rows(rows, minibatch, minibatch // micro if micro else 1, rows // micro if micro else 1)


def ppo_loop(cfg: config_lib.Config) -> update.PPOLoop:
  return update.PPOLoop(epochs=cfg.rl.ppo_epochs, num_minibatches=cfg.rl.num_minibatches,
                        minibatch_rows=rows_of(cfg).minibatch, seed=cfg.seed)


def sft_warmup(cfg: config_lib.Config) -> int:
  return min(cfg.optim.warmup_steps, cfg.sft.steps // 10)


# ------------------------------------------------------------------------------ learners


@dataclasses.dataclass(frozen=True)
class LearnerRow:
  """How one trained network is built: its optimizer's (rate, warm-up) from the config; its
  step written once over a row layout, step(cfg, graphdef, tx, layout) -> (TrainState, rows)
  -> (TrainState, metrics, skipped) (`rl.update`); and the rows of one update and its padded
  micro-batches (they size both layouts: `pass_layout`); and the value head's own rate, if
  any (`optimizer`)."""
  schedule: Callable[[config_lib.Config], tuple[float, int]]
  step: Callable
  # The value head's own rate (`critic.HEAD` parameters), or None: one rate for all.
  head_lr: Callable[[config_lib.Config], float | None] = lambda cfg: None
  batch_rows: Callable[[config_lib.Config], int] = lambda cfg: rows_of(cfg).minibatch
  micro_batches: Callable[[config_lib.Config], int] = lambda cfg: rows_of(cfg).micro_batches


# Every network a run trains, by name: the one table, whatever rl.packing says (a process
# reward model or a second critic is one more row, with its step function in rl.update).
LEARNERS: dict[str, LearnerRow] = {
    "sft": LearnerRow(lambda cfg: (cfg.optim.sft_lr, sft_warmup(cfg)),
                      lambda cfg, g, tx, layout: functools.partial(update.sft_step, g, tx,
                                                                   layout),
                      batch_rows=lambda cfg: cfg.sft.batch_size, micro_batches=lambda cfg: 1),
    "policy": LearnerRow(lambda cfg: (cfg.optim.policy_lr, cfg.optim.warmup_steps),
                         lambda cfg, g, tx, layout: functools.partial(
                             update.policy_step, g, tx, policy_hparams(cfg), layout)),
    "critic": LearnerRow(lambda cfg: (cfg.optim.critic_lr, cfg.optim.warmup_steps),
                         lambda cfg, g, tx, layout: functools.partial(
                             update.critic_step, g, tx, critic_hparams(cfg), layout),
                         head_lr=lambda cfg: value_head_lr(cfg)),
    "reward_model": LearnerRow(lambda cfg: (cfg.optim.critic_lr, cfg.optim.warmup_steps),
                               lambda cfg, g, tx, layout: functools.partial(
                                   update.reward_model_step, g, tx, critic_hparams(cfg),
                                   layout),
                               head_lr=lambda cfg: value_head_lr(cfg)),
}


def value_head_lr(cfg: config_lib.Config) -> float | None:
  """optim.critic_head_lr, or None when it is -1 (the head takes optim.critic_lr)."""
  return None if cfg.optim.critic_head_lr < 0 else cfg.optim.critic_head_lr


def optimizer(cfg: config_lib.Config, name: str) -> train_state.Optimizer:
  """The AdamW of one of LEARNERS; with a head rate (`LearnerRow.head_lr`), one AdamW for
  the value head's parameters and one for the rest (`head_optimizer`)."""
  o = cfg.optim
  lr, warmup = LEARNERS[name].schedule(cfg)
  head_lr = LEARNERS[name].head_lr(cfg)
  adamw = functools.partial(train_state.make_optimizer, warmup_steps=warmup,
                            weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps)
  if head_lr is None:
    return adamw(lr, grad_clip=o.grad_clip)
  return head_optimizer(adamw(lr, grad_clip=0.0), adamw(head_lr, grad_clip=0.0), o.grad_clip)


def head_optimizer(body: train_state.Optimizer, head: train_state.Optimizer,
                   grad_clip: float) -> train_state.Optimizer:
  """Global-norm clipping over all gradients, then `head` on the value head's parameters
  (`critic.HEAD`, top-level names) and `body` on the rest (`optax.multi_transform`).

  The rate it tells (`Optimizer.learning_rate`) is the body's."""
  def labels(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "head" if path and _key(path[0]) in critic_lib.HEAD else "body",
        params)

  tx = optax.multi_transform({"body": optax.GradientTransformation(body.init, body.update),
                              "head": optax.GradientTransformation(head.init, head.update)},
                             labels)
  if grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip), tx)
  return train_state.Optimizer(tx.init, tx.update, body.learning_rate)


def _key(k) -> str:
  """A pytree path entry's name (a dict key, attribute or index) as a string."""
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def learner_step(cfg, name: str, graphdef, tx, state, mesh, rules) -> Callable:
  """The `Learner.step` of one of LEARNERS: its step on the run's row layout (`pass_layout`),
  compiled, behind the layout's host side (packed: `.compiled` is the jitted step of
  (TrainState, rl.layout.PackedBatch), `.spec` its PackSpec; the compile check lowers them)."""
  layout = pass_layout(cfg, name, mesh, rules)
  axes = shd.batch_axes(mesh, rules)
  compiled = train_state.compile_step(LEARNERS[name].step(cfg, graphdef, tx, layout), state,
                                      mesh, axes, rules)
  return layout.step(name, compiled, mesh, axes)


def learner(cfg, name: str, graphdef, params, mesh, rules) -> train_state.Learner:
  """One of LEARNERS set up: its optimizer, a fresh TrainState of `params`, its step."""
  tx = optimizer(cfg, name)
  state = train_state.init_state(params, tx)
  return train_state.Learner(name, graphdef, tx,
                             learner_step(cfg, name, graphdef, tx, state, mesh, rules), state)


# ------------------------------------------------------------------------------ row layouts


FORWARDS = ("logprobs", "values")  # the forward passes over a whole rollout


def micro_batches(cfg, name: str) -> tuple[int, int]:
  """(rows, padded micro-batches) of one pass: a LEARNERS step's update, or one of FORWARDS
  (the rollout, in rows_of(cfg).forward_chunks)."""
  if name in FORWARDS:
    rows = rows_of(cfg)
    return rows.rollout, rows.forward_chunks
  row = LEARNERS[name]
  return row.batch_rows(cfg), row.micro_batches(cfg)


def pass_spec(cfg, name: str, mesh, rules) -> packing.PackSpec:
  """The PackSpec of one packed pass on `mesh` (`spec_of`)."""
  return spec_of(cfg, name, pass_sizes.batch_shards(mesh, rules))


def spec_of(cfg, name: str, shards: int) -> packing.PackSpec:
  """The PackSpec of one packed pass (a LEARNERS step or one of FORWARDS) over `shards` batch
  shards (`run.pass_sizes.pack_spec`); the pod tools ask it too."""
  return pass_sizes.pack_spec(cfg, *micro_batches(cfg, name), shards,
                              forward=name in FORWARDS)


def pass_layout(cfg, name: str, mesh, rules) -> layout_lib.Layout:
  """The row layout of one pass (a LEARNERS step or one of FORWARDS): with rl.packing,
  packed rows of `pass_spec`, else padded rows in its micro-batches."""
  if cfg.rl.packing:
    return layout_lib.Packed(pass_spec(cfg, name, mesh, rules))
  return layout_lib.Padded(micro_batches(cfg, name)[1])
