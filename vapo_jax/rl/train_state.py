"""What a train step updates and how it is compiled: `TrainState`, the optimizer, gradient
accumulation over micro-batches, the skip of non-finite updates, and `Learner`, the record
of one trained network.

A step is a pure function `(TrainState, batch) -> (TrainState, metrics, skipped)` over a
mini-batch (`rl.update`), compiled once with `jax.jit` with input/output shardings and (off
CPU) the state donated (`compile_step`). A mini-batch's gradient is summed over its
micro-batches (`accumulate`, a `lax.scan`), which the row layout makes (`rl.layout`: padded
micro-batch i takes rows i, i + n, i + 2n, … so that with the batch sharded over the mesh
every device contributes to every micro-batch; packed micro-batches come from the plan).
"""

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from vapo_jax import sharding as shd
from vapo_jax.models import lora
from vapo_jax.rl import batch as batch_lib


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: Any      # nnx.State of the model's parameters (with LoRA: base and adapters)
  opt_state: Any   # optax state of `trainable(params)`
  step: jax.Array  # int32 number of updates applied


class Optimizer(NamedTuple):
  """An optax GradientTransformation (init, update) that also tells its learning rate."""
  init: Callable
  update: Callable
  learning_rate: optax.Schedule  # update count -> the rate that update applies


@dataclasses.dataclass
class Learner:
  """One trained network ("sft", "policy", "critic", "reward_model", …): everything a stage
  needs to update it. Built by `run.learners.learner` from one row of `run.learners.LEARNERS`."""
  name: str
  graphdef: Any     # nnx.GraphDef of the model
  tx: Optimizer
  step: Callable    # compiled (TrainState, batch) -> (TrainState, metrics, skipped 0/1)
  state: TrainState

  def learning_rate(self) -> float:
    """The rate its optimizer applies at the next update (its own schedule)."""
    return float(self.tx.learning_rate(self.state.step))

  def model(self) -> nnx.Module:
    return nnx.merge(self.graphdef, self.state.params)


def make_optimizer(lr: float, *, warmup_steps: int, weight_decay: float, b1: float, b2: float,
                   eps: float, grad_clip: float) -> Optimizer:
  """AdamW with linear warm-up to a constant rate, after global-norm clipping (grad_clip 0:
  none). The settings are config.optim's (`run.learners.optimizer`), which holds the
  defaults."""
  schedule = (optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps
              else optax.constant_schedule(lr))
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  tx = optax.chain(*parts)
  return Optimizer(tx.init, tx.update, schedule)


def trainable(params):
  """The parameters the optimizer updates: all of them, or with LoRA adapters only those (and
  the critic's value head); the frozen rest passes through the steps unchanged."""
  return lora.split_trainable(params)[0]


def opt_state_shardings(params, tx: optax.GradientTransformation):
  """Shardings of tx.init(trainable(params)): each per-parameter leaf (Adam's μ, ν, …) is
  sharded like its parameter, everything else (counts, scalars) replicated on the mesh."""
  params = trainable(params)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  by_path = {jax.tree_util.keystr(p): x.sharding for p, x in leaves}
  replicated = NamedSharding(leaves[0][1].sharding.mesh, PartitionSpec())

  def one(path, leaf):
    del leaf
    key = jax.tree_util.keystr(path)
    matches = [p for p in by_path if key.endswith(p)]
    return by_path[max(matches, key=len)] if matches else replicated

  return jax.tree_util.tree_map_with_path(one, jax.eval_shape(tx.init, params))


def init_state(params, tx: optax.GradientTransformation) -> TrainState:
  """A TrainState whose optimizer state is created, under jit, where the parameters live."""
  shardings = opt_state_shardings(params, tx)
  opt_state = jax.jit(tx.init, out_shardings=shardings)(trainable(params))
  mesh = jax.tree.leaves(params)[0].sharding.mesh
  step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(mesh, PartitionSpec()))
  return TrainState(params, opt_state, step)


def accumulate(loss_fn: Callable, params, micro, n: int):
  """Σ over n micro-batches of (loss, grads, metrics) from loss_fn(params, x_i) -> (loss, m).

  micro: the n inputs x_i stacked on axis 0 (a `lax.scan` runs them one after another), or
  with n = 1 the one input itself. What an input is belongs to the row layout (`rl.layout`:
  a padded micro-batch's rows, or a packed micro-batch's index). Gradients are of
  `trainable(params)` only. Metrics are summed too: loss_fn returns them already weighted
  for summation. The token-level losses are normalised by the *mini-batch's* token counts,
  computed from the masks before the scan, so the accumulated gradient equals the gradient
  of the whole mini-batch exactly (`losses.LossSum`).
  """
  params, frozen = lora.split_trainable(params)
  grad_fn = jax.value_and_grad(lambda p, mb: loss_fn(lora.join(p, frozen), mb), has_aux=True)
  if n == 1:
    (loss, metrics), grads = grad_fn(params, micro)
    return loss, grads, metrics

  def body(carry, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    acc = jax.tree.map(jnp.add, carry, (loss, grads, metrics))
    return acc, None

  first = jax.tree.map(lambda x: x[0], micro)
  (loss0, metrics0), grads0 = jax.eval_shape(grad_fn, params, first)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, grads0, metrics0))
  (loss, grads, metrics), _ = jax.lax.scan(body, zeros, micro)
  return loss, grads, metrics


def accumulate_count(loss_fn: Callable, params, count: jax.Array):
  """`accumulate` over inputs i = 0 .. count - 1 with a *traced* count: a `fori_loop` (a
  while loop) calls loss_fn(params, i) -> (loss, metrics) for each index, so one compiled
  program serves every count (the packed layout's micro-batches, `rl.layout.Packed`).
  Gradients are taken inside the loop body, of `trainable(params)` only; sums as in
  `accumulate`, in the order i = 0, 1, … (the same order a scan would take).
  """
  params, frozen = lora.split_trainable(params)
  grad_fn = jax.value_and_grad(lambda p, i: loss_fn(lora.join(p, frozen), i), has_aux=True)
  (loss0, metrics0), grads0 = jax.eval_shape(grad_fn, params, jnp.int32(0))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, grads0, metrics0))

  def body(i, acc):
    (loss, metrics), grads = grad_fn(params, i)
    return jax.tree.map(jnp.add, acc, (loss, grads, metrics))

  loss, grads, metrics = jax.lax.fori_loop(0, jnp.asarray(count, jnp.int32), body, zeros)
  return loss, grads, metrics


def apply_update(tx, state: TrainState, grads, loss) -> tuple[TrainState, jax.Array, jax.Array]:
  """Applies one optimizer update unless the loss or a gradient is NaN/inf.

  A non-finite update would poison the parameters and Adam's moments for good, so it is
  dropped: parameters, optimizer state (and with it the learning-rate schedule's count) and
  `step` stay as they were. Selecting with `jnp.where` keeps this inside the one jitted step;
  a finite update passes through unchanged, bit for bit.

  Returns:
    (new state, global gradient norm (inf/NaN when skipped), skipped: float32 0 or 1).
  """
  grad_norm = optax.tree.norm(grads)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  old, frozen = lora.split_trainable(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, old)
  params = optax.apply_updates(old, updates)

  def keep(new, old):
    return jnp.where(ok, new, old)

  new_state = TrainState(lora.join(jax.tree.map(keep, params, old), frozen),
                         jax.tree.map(keep, opt_state, state.opt_state),
                         state.step + ok.astype(state.step.dtype))
  return new_state, grad_norm, 1.0 - ok.astype(jnp.float32)


def compile_step(step_fn, state: TrainState, mesh, batch_axes,
                 rules: shd.Rules = shd.DEFAULT_RULES):
  """jax.jit(step_fn) with the state's shardings in and out, batch rows sharded, donation.

  The model's activations inside are pinned to the mesh by `rules` (`sharding.constrain`).
  """
  state_sh = jax.tree.map(lambda x: x.sharding, state)
  replicated = NamedSharding(mesh, PartitionSpec())
  return jax.jit(shd.traced_under(step_fn, mesh, rules),
                 in_shardings=(state_sh, batch_lib.batch_sharding(mesh, batch_axes)),
                 out_shardings=(state_sh, replicated, replicated),
                 donate_argnums=_donate(mesh))


def _donate(mesh) -> tuple[int, ...]:
  """The state is donated on TPU/GPU (it is most of the memory), not on CPU.

  XLA's CPU backend keeps a donated parameter readable by inserting a full copy of it at the
  start of the step, which saves no memory there and costs a few per cent of the step
  (`benchmarks/model_bench.py` measures it).
  """
  return () if mesh.devices.flat[0].platform == "cpu" else (0,)
