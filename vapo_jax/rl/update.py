"""Step 4 of an RL step, the update: jitted policy (VAPO eq. 5), critic and SFT steps, and
the PPO loop of mini-batch updates over one rollout batch (`Updates`).

Each step is a pure function `(TrainState, batch) -> (TrainState, metrics)` over a mini-batch,
compiled once with `jax.jit` with input/output shardings and (off CPU) the state donated. A
mini-batch is split into micro-batches (gradient accumulation in a `lax.scan`); the token-level
losses are normalised by the *mini-batch's* token counts, computed from the masks before the scan,
so the accumulated gradient equals the gradient of the whole mini-batch exactly
(`losses.LossSum`). Micro-batch i takes rows i, i + n, i + 2n, … so that with the batch
sharded over the mesh every device contributes to every micro-batch.

Shapes: B rows (responses), P prompt columns (left-padded), R response columns, L = P + R.
"""

import dataclasses
import time
from typing import Any, Callable, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from vapo_jax import critic as critic_lib
from vapo_jax import distributed as dist
from vapo_jax import losses
from vapo_jax import policy as policy_lib
from vapo_jax import sharding as shd
from vapo_jax.models import lora


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: Any      # nnx.State of the model's parameters (with LoRA: base and adapters)
  opt_state: Any   # optax state of `trainable(params)`
  step: jax.Array  # int32 number of updates applied


@dataclasses.dataclass(frozen=True)
class PolicyHParams:
  """The policy step's settings (from the run's config: `run.parts.policy_hparams`)."""
  temperature: float
  eps_low: float
  eps_high: float
  dual_clip: float | None
  loss_mode: str
  nll_coef: float
  nll_threshold: float
  micro_batches: int
  kl_coef: float = 0.0    # β of GRPO's k3 KL penalty to the reference policy; 0: off
  vocab_chunk: int = 128  # not a config setting: the policy's memory bound over the vocab


@dataclasses.dataclass(frozen=True)
class CriticHParams:
  """The critic step's settings (from the run's config: `run.parts.critic_hparams`)."""
  value_clip: float | None
  loss_mode: str
  micro_batches: int


class Optimizer(NamedTuple):
  """An optax GradientTransformation (init, update) that also tells its learning rate."""
  init: Callable
  update: Callable
  learning_rate: optax.Schedule  # update count -> the rate that update applies


def make_optimizer(lr: float, *, warmup_steps: int = 0, weight_decay: float = 0.01,
                   b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
                   grad_clip: float = 1.0) -> Optimizer:
  """AdamW with linear warm-up to a constant rate, after global-norm clipping."""
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


def _micro_split(batch, n: int):
  """[B, ...] -> [n, B/n, ...] with micro-batch i = rows i, i + n, i + 2n, …"""

  def split(x):
    b = x.shape[0]
    if b % n:
      raise ValueError(f"batch of {b} rows does not split into {n} micro-batches")
    return jnp.swapaxes(x.reshape((b // n, n) + x.shape[1:]), 0, 1)

  return jax.tree.map(split, batch)


def _accumulate(loss_fn: Callable, params, batch, n: int):
  """Σ over micro-batches of (loss, grads, metrics) from loss_fn(params, micro) -> (loss, m).

  Gradients are of `trainable(params)` only. Metrics are summed too: loss_fn returns them
  already weighted for summation.
  """
  params, frozen = lora.split_trainable(params)
  grad_fn = jax.value_and_grad(lambda p, mb: loss_fn(lora.join(p, frozen), mb), has_aux=True)
  if n == 1:
    (loss, metrics), grads = grad_fn(params, batch)
    return loss, grads, metrics

  micro = _micro_split(batch, n)

  def body(carry, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    acc = jax.tree.map(jnp.add, carry, (loss, grads, metrics))
    return acc, None

  first = jax.tree.map(lambda x: x[0], micro)
  (loss0, metrics0), grads0 = jax.eval_shape(grad_fn, params, first)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, grads0, metrics0))
  (loss, grads, metrics), _ = jax.lax.scan(body, zeros, micro)
  return loss, grads, metrics


def _apply(tx, state: TrainState, grads, loss) -> tuple[TrainState, jax.Array, jax.Array]:
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


# --------------------------------------------------------------------------------- policy


def policy_step(graphdef, tx: optax.GradientTransformation, hp: PolicyHParams,
                state: TrainState, batch: dict) -> tuple[TrainState, dict]:
  """One policy update on a mini-batch: L = L_PPO (eq. 4) + μ·L_NLL (eq. 3) [+ β·L_KL].

  batch: tokens_BxL (int32), mask_BxL, old_logp_BxR, advantages_BxR, response_mask_BxR,
  scores_B, and ref_logp_BxR when hp.kl_coef > 0 (GRPO's k3 penalty to the reference
  policy, `losses.kl_penalty`, aggregated and normalised like L_PPO). The prompt length is
  L − R.
  """
  resp_mask = batch["response_mask_BxR"]
  prompt_len = batch["tokens_BxL"].shape[1] - resp_mask.shape[1]
  pg_count = losses.aggregation_count(resp_mask, hp.loss_mode)
  correct = (batch["scores_B"] >= hp.nll_threshold).astype(jnp.float32)
  nll_count = jnp.sum(resp_mask * correct[:, None])
  rows = jnp.asarray(resp_mask.shape[0], jnp.float32)
  tokens = jnp.sum(resp_mask)

  def loss_fn(params, mb):
    model = nnx.merge(graphdef, params)
    logp, entropy = policy_lib.response_logprobs(
        model, mb["tokens_BxL"], mb["mask_BxL"], prompt_len, temperature=hp.temperature,
        chunk=hp.vocab_chunk)
    m = mb["response_mask_BxR"]
    pg = losses.ppo_policy_loss(logp, mb["old_logp_BxR"], mb["advantages_BxR"], m,
                                eps_low=hp.eps_low, eps_high=hp.eps_high,
                                dual_clip=hp.dual_clip, mode=hp.loss_mode)
    loss = losses.safe_divide(pg.loss.total, pg_count)
    nll = losses.positive_nll(logp, m, mb["scores_B"], threshold=hp.nll_threshold)
    if hp.nll_coef:
      loss = loss + hp.nll_coef * losses.safe_divide(nll.total, nll_count)
    kl = None
    if hp.kl_coef:
      kl = losses.kl_penalty(logp, mb["ref_logp_BxR"], m, mode=hp.loss_mode)
      loss = loss + hp.kl_coef * losses.safe_divide(kl.total, pg_count)
    w = pg.metrics["tokens"] / jnp.maximum(tokens, 1.0)  # token share of this micro-batch
    metrics = {k: pg.metrics[k] * w for k in
               ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl", "ratio_mean")}
    metrics["entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * m) / jnp.maximum(tokens, 1.0)
    metrics["pg_loss"] = losses.safe_divide(pg.loss.total, pg_count)
    metrics["nll_loss"] = losses.safe_divide(nll.total, nll_count)
    if kl is not None:
      metrics["kl_ref"] = losses.safe_divide(jax.lax.stop_gradient(kl.total), pg_count)
    return loss, metrics

  loss, grads, metrics = _accumulate(loss_fn, state.params, batch, hp.micro_batches)
  state, grad_norm, skipped = _apply(tx, state, grads, loss)
  metrics.update(policy_loss=loss, policy_grad_norm=grad_norm, rows=rows,
                 policy_skipped=skipped)
  return state, metrics


# --------------------------------------------------------------------------------- critic


def critic_step(graphdef, tx: optax.GradientTransformation, hp: CriticHParams,
                state: TrainState, batch: dict) -> tuple[TrainState, dict]:
  """One critic update: ½(V − R)² against the λ_critic returns (optionally clipped).

  batch: tokens_BxL, mask_BxL, returns_BxR, old_values_BxR, response_mask_BxR.
  """
  resp_mask = batch["response_mask_BxR"]
  prompt_len = batch["tokens_BxL"].shape[1] - resp_mask.shape[1]
  count = losses.aggregation_count(resp_mask, hp.loss_mode)

  def loss_fn(params, mb):
    critic = nnx.merge(graphdef, params)
    values = critic_lib.response_values(critic, mb["tokens_BxL"], mb["mask_BxL"], prompt_len)
    out = losses.value_loss(values, mb["returns_BxR"], mb["response_mask_BxR"],
                            old_values=mb["old_values_BxR"], clip_eps=hp.value_clip,
                            mode=hp.loss_mode)
    loss = losses.safe_divide(out.loss.total, count)
    return loss, {"value_clip_frac": out.metrics["value_clip_frac"] * out.metrics["tokens"]
                  / jnp.maximum(jnp.sum(resp_mask), 1.0)}

  loss, grads, metrics = _accumulate(loss_fn, state.params, batch, hp.micro_batches)
  state, grad_norm, skipped = _apply(tx, state, grads, loss)
  metrics.update(value_loss=loss, critic_grad_norm=grad_norm, critic_skipped=skipped)
  return state, metrics


# --------------------------------------------------------------------------- reward model


def reward_model_step(graphdef, tx: optax.GradientTransformation, hp: CriticHParams,
                      state: TrainState, batch: dict) -> tuple[TrainState, dict]:
  """One update of an outcome reward model: ½(r̂ − r)² per response (`losses.outcome_loss`).

  r̂ = the model's scalar at the response's last token (`critic.last_token_values`), r the
  checker's score. batch: tokens_BxL, mask_BxL, response_mask_BxR, scores_B.
  """
  resp_mask = batch["response_mask_BxR"]
  prompt_len = batch["tokens_BxL"].shape[1] - resp_mask.shape[1]
  count = jnp.sum((jnp.sum(resp_mask, -1) > 0).astype(jnp.float32))

  def loss_fn(params, mb):
    model = nnx.merge(graphdef, params)
    lengths = jnp.sum(mb["response_mask_BxR"], -1).astype(jnp.int32)
    pred = critic_lib.last_token_values(model, mb["tokens_BxL"], mb["mask_BxL"], prompt_len,
                                        lengths)
    out = losses.outcome_loss(pred, mb["scores_B"], lengths > 0)
    return losses.safe_divide(out.total, count), {
        "rm_pred_mean": losses.safe_divide(jnp.sum(jnp.where(lengths > 0, pred, 0.0)), count)}

  loss, grads, metrics = _accumulate(loss_fn, state.params, batch, hp.micro_batches)
  state, grad_norm, skipped = _apply(tx, state, grads, loss)
  metrics.update(rm_loss=loss, rm_grad_norm=grad_norm, critic_skipped=skipped)
  return state, metrics


# ------------------------------------------------------------------------------------ SFT


def sft_step(graphdef, tx: optax.GradientTransformation, state: TrainState,
             batch: dict) -> tuple[TrainState, dict]:
  """Supervised warm start: token-level NLL of the response (solution) tokens.

  batch: tokens_BxL, mask_BxL, response_mask_BxR.
  """
  resp_mask = batch["response_mask_BxR"]
  prompt_len = batch["tokens_BxL"].shape[1] - resp_mask.shape[1]

  def loss_fn(params, batch):
    model = nnx.merge(graphdef, params)
    logp, _ = policy_lib.response_logprobs(model, batch["tokens_BxL"], batch["mask_BxL"],
                                           prompt_len)
    return losses.safe_divide(-jnp.sum(logp * resp_mask), jnp.sum(resp_mask)), {}

  loss, grads, _ = _accumulate(loss_fn, state.params, batch, 1)
  state, grad_norm, skipped = _apply(tx, state, grads, loss)
  return state, {"sft_loss": loss, "sft_grad_norm": grad_norm, "sft_skipped": skipped}


# ----------------------------------------------------------------------- forward passes


def policy_logprobs(graphdef, params, tokens_BxL, mask_BxL, prompt_len: int, *,
                    temperature: float, vocab_chunk: int = 128):
  """Teacher-forced log-probs and entropies of the response tokens, [B, R] each."""
  model = nnx.merge(graphdef, params)
  return policy_lib.response_logprobs(model, tokens_BxL, mask_BxL, prompt_len,
                                      temperature=temperature, chunk=vocab_chunk)


def critic_values(graphdef, params, tokens_BxL, mask_BxL, prompt_len: int):
  """V(s_t) for every response token, [B, R]."""
  return critic_lib.response_values(nnx.merge(graphdef, params), tokens_BxL, mask_BxL,
                                    prompt_len)


def in_micro_batches(fn: Callable, n: int, mesh=None,
                     rules: shd.Rules = shd.DEFAULT_RULES) -> Callable:
  """fn(params, tokens_BxL, mask_BxL, **kw) -> pytree of [B, ...], run as n micro-batches.

  Micro-batch i is rows i, i + n, i + 2n, … (as in the train steps, so every batch shard
  works on every micro-batch); `lax.map` runs them one after another, so activations are
  those of B / n rows, and the outputs come back in row order. Row-wise fn: same result.
  Given the mesh, the model's activations are pinned to it (`sharding.constrain`).
  """
  fn = shd.traced_under(fn, mesh, rules)
  if n <= 1:
    return fn

  def run(params, tokens_BxL, mask_BxL, **kw):
    micro = _micro_split((tokens_BxL, mask_BxL), n)
    out = jax.lax.map(lambda tm: fn(params, tm[0], tm[1], **kw), micro)
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape((-1,) + y.shape[2:]), out)

  return run


# ------------------------------------------------------------------------------ compile


def batch_sharding(mesh, batch_axes) -> NamedSharding:
  """Rows split over the mesh's batch axes; everything else replicated."""
  return NamedSharding(mesh, PartitionSpec(batch_axes or None))


def compile_step(step_fn, state: TrainState, mesh, batch_axes,
                 rules: shd.Rules = shd.DEFAULT_RULES):
  """jax.jit(step_fn) with the state's shardings in and out, batch rows sharded, donation.

  The model's activations inside are pinned to the mesh by `rules` (`sharding.constrain`).
  """
  state_sh = jax.tree.map(lambda x: x.sharding, state)
  replicated = NamedSharding(mesh, PartitionSpec())
  return jax.jit(shd.traced_under(step_fn, mesh, rules),
                 in_shardings=(state_sh, batch_sharding(mesh, batch_axes)),
                 out_shardings=(state_sh, replicated), donate_argnums=_donate(mesh))


def _donate(mesh) -> tuple[int, ...]:
  """The state is donated on TPU/GPU (it is most of the memory), not on CPU.

  XLA's CPU backend keeps a donated parameter readable by inserting a full copy of it at the
  start of the step (38 copies on `benchmarks/model_bench.py`'s model, temp memory up by
  the parameters' size), which saves no memory there and cost ~4-8% of the step.
  """
  return () if mesh.devices.flat[0].platform == "cpu" else (0,)


def shard_batch(batch: dict, mesh, batch_axes) -> dict:
  """Puts a global batch (the same on every host) on the mesh, rows split over the batch axes.

  Each process copies only the slices its own devices hold, so the result, and the training
  step that consumes it, are the same for any number of processes.
  """
  sh = batch_sharding(mesh, batch_axes)
  return {k: jax.make_array_from_callback(np.shape(v), sh, lambda idx, v=np.asarray(v): v[idx])
          for k, v in batch.items()}



# --------------------------------------------------------------------------- the PPO loop

# The batch every train step takes: key -> (shape in B, L = P + R, R; dtype).
BATCH_SPEC = {"tokens_BxL": (("B", "L"), jnp.int32), "mask_BxL": (("B", "L"), jnp.float32),
              "old_logp_BxR": (("B", "R"), jnp.float32),
              "advantages_BxR": (("B", "R"), jnp.float32),
              "returns_BxR": (("B", "R"), jnp.float32),
              "old_values_BxR": (("B", "R"), jnp.float32),
              "response_mask_BxR": (("B", "R"), jnp.float32), "scores_B": (("B",), jnp.float32)}
# With GRPO's KL penalty (rl.kl_coef > 0) the batch also holds the reference's log-probs.
REF_SPEC = {"ref_logp_BxR": (("B", "R"), jnp.float32)}

# Mini-batch shuffles are seeded by (seed, stage, step, epoch); these numbers name the
# stages there (fixed: resumed runs and existing checkpoints depend on them).
SHUFFLE_STAGE = {"value_pretrain": 0, "rl": 1, "reward_model": 2}


def batch_shapes(rows: int, prompt_len: int, response_len: int, *,
                 reference: bool = False) -> dict[str, tuple]:
  """{key: (shape, dtype)} of a train-step batch of `rows` rows (BATCH_SPEC, and REF_SPEC
  with `reference`)."""
  dims = {"B": rows, "L": prompt_len + response_len, "R": response_len}
  spec = {**BATCH_SPEC, **REF_SPEC} if reference else BATCH_SPEC
  return {k: (tuple(dims[d] for d in axes), dtype) for k, (axes, dtype) in spec.items()}


@dataclasses.dataclass(frozen=True)
class PPOLoop:
  """ppo_epochs passes of num_minibatches mini-batches of minibatch_rows rows each."""
  epochs: int
  num_minibatches: int
  minibatch_rows: int
  seed: int


def ppo_updates(loop: PPOLoop, models: dict[str, tuple[Callable, TrainState]], batch: dict,
                take: Callable, *, stage: str, step: int):
  """The update: every mini-batch of every epoch goes through each model's step, in order.

  Args:
    loop: the loop's sizes and seed.
    models: name -> (compiled step, its TrainState), e.g. {"policy": …, "critic": …}.
    batch: the rollout batch (BATCH_SPEC).
    take: take(batch, idx) -> the mini-batch of rows idx, on the mesh.
    stage, step: where the run is (they seed the mini-batch shuffle).

  Returns:
    (name -> new TrainState, the updates' mean metrics and train_tokens_per_s, per-update
    "skipped" flags: a step dropped a non-finite update).
  """
  states = {name: state for name, (_, state) in models.items()}
  rows = batch["scores_B"].shape[0]
  records = []
  t0 = time.perf_counter()
  for epoch in range(loop.epochs):
    perm = np.random.default_rng([loop.seed, SHUFFLE_STAGE[stage], step, epoch]
                                 ).permutation(rows)
    for k in range(loop.num_minibatches):
      idx = jnp.asarray(perm[k * loop.minibatch_rows:(k + 1) * loop.minibatch_rows])
      minibatch = take(batch, idx)
      m = {}
      for name, (step_fn, _) in models.items():
        states[name], sm = step_fn(states[name], minibatch)
        m.update(sm)
      records.append(dist.pace(m))
  records = jax.device_get(records)
  dt = time.perf_counter() - t0
  skipped = [max(float(r.pop("policy_skipped", 0)), float(r.pop("critic_skipped", 0))) > 0
             for r in records]
  metrics = {k: float(np.mean([r[k] for r in records])) for k in records[0]}
  tokens = float(jax.device_get(jnp.sum(batch["mask_BxL"]))) * loop.epochs
  metrics["train_tokens_per_s"] = tokens / max(dt, 1e-9)
  return states, metrics, skipped
