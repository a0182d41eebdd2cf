"""Step 4 of an RL step, the update: jitted policy (VAPO eq. 5), critic, reward-model and SFT
steps, and the PPO loop of mini-batch updates over one rollout batch (`ppo_updates`).

Each step is written once, over a row layout (`rl.layout`: padded rows, or packed rows with
segment ids), bound before compiling: `partial(step, graphdef, tx, [hp,] layout)` is a pure
function `(TrainState, rows) -> (TrainState, metrics, skipped)` over a mini-batch, compiled
once by `train_state.compile_step`; `skipped` is 1.0 when the update was dropped for a
NaN/inf (`train_state.apply_update`). The layout splits a mini-batch into micro-batches and
sums their gradients (`train_state.accumulate`); the losses are normalised by the
*mini-batch's* counts, computed from the masks before the micro-batch scan, so the
accumulated gradient equals the gradient of the whole mini-batch exactly (`losses.LossSum`).

A loss sees each micro-batch as (mb, view): mb the `RolloutBatch` its terms read, view the
rows the model runs on (`view.logprobs`, `values`, `last_values`: [B, R] / [B] outputs) and
which of mb's rows are its own (`view.mine`, `pick`, `valid`).

Shapes: B rows (responses), P prompt columns (left-padded), R response columns, L = P + R.
"""

import dataclasses
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import distributed
from vapo_jax import losses
from vapo_jax.rl import behaviour
from vapo_jax.rl import train_state
from vapo_jax.rl.batch import RolloutBatch
from vapo_jax.rl.train_state import Learner, TrainState


@dataclasses.dataclass(frozen=True)
class PolicyHParams:
  """The policy step's settings, built from the run's config in one place
  (`run.learners.policy_hparams`); the config's sections hold their defaults."""
  temperature: float
  eps_low: float
  eps_high: float
  dual_clip: float | None
  loss_mode: str
  nll_coef: float
  nll_threshold: float
  kl_coef: float          # β of GRPO's k3 KL penalty to the reference policy; 0: off
  policy_loss: str        # a key of losses.POLICY_LOSSES
  # Config.old_logprobs (resolved): what the batch's old_logp_BxR holds and π_old is:
  # "recompute" (log π_old), "exact" (the sampler's log π_b; π_old = sg(π_θ) of this step's
  # forward) or "behaviour" (log π_b, the ratio's π_old); `old_policy`.
  old_logprobs: str
  # rl.behaviour_correction's, taken here unless old_logprobs is "recompute" (then the
  # experience scaled the advantages already).
  correction: behaviour.Correction
  vocab_chunk: int = 128  # not a config setting: the policy's memory bound over the vocab


# The policy loss's token-mean metrics the step logs (weighted by each micro-batch's tokens),
# where the loss reports them.
POLICY_METRICS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl",
                  "ratio_mean")


@dataclasses.dataclass(frozen=True)
class CriticHParams:
  """The critic step's settings, built from the run's config in one place
  (`run.learners.critic_hparams`)."""
  value_clip: float | None
  loss_mode: str



# --------------------------------------------------------------------------------- policy


def policy_objective(hp: PolicyHParams, logp, entropy, m, old_logp, advantages, scores,
                     ref_logp, *, pg_count, nll_count, tokens, ratio_logp=None, kl_logp=None
                     ) -> tuple[jax.Array, dict]:
  """One micro-batch's share of L = L_PPO + μ·L_NLL [+ β·L_KL] and its metrics.

  logp, entropy, m (response mask), old_logp, advantages: [B, R]; scores: [B]; ref_logp: [B, R]
  or None. pg_count, nll_count, tokens: the mini-batch's normalisers (from its masks, before
  the micro-batch split: `losses.LossSum`). ratio_logp / kl_logp (default logp): what the
  surrogate and the KL see, for callers whose rows outside m must hold finite stand-ins
  (a packed micro-batch, `rl.layout`); the NLL and the entropy always take logp.
  """
  ratio_logp = logp if ratio_logp is None else ratio_logp
  kl_logp = logp if kl_logp is None else kl_logp
  pg = losses.POLICY_LOSSES[hp.policy_loss](
      ratio_logp, old_logp, advantages, m, eps_low=hp.eps_low,
      eps_high=hp.eps_high, dual_clip=hp.dual_clip, mode=hp.loss_mode)
  loss = losses.safe_divide(pg.loss.total, pg_count)
  nll = losses.positive_nll(logp, m, scores, threshold=hp.nll_threshold)
  if hp.nll_coef:
    loss = loss + hp.nll_coef * losses.safe_divide(nll.total, nll_count)
  kl = None
  if hp.kl_coef:
    kl = losses.kl_penalty(kl_logp, ref_logp, m, mode=hp.loss_mode)
    loss = loss + hp.kl_coef * losses.safe_divide(kl.total, pg_count)
  w = pg.metrics["tokens"] / jnp.maximum(tokens, 1.0)  # token share of this micro-batch
  metrics = {k: pg.metrics[k] * w for k in POLICY_METRICS if k in pg.metrics}
  metrics["entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * m) / jnp.maximum(tokens, 1.0)
  metrics["pg_loss"] = losses.safe_divide(pg.loss.total, pg_count)
  metrics["nll_loss"] = losses.safe_divide(nll.total, nll_count)
  if kl is not None:
    metrics["kl_ref"] = losses.safe_divide(jax.lax.stop_gradient(kl.total), pg_count)
  return loss, metrics


def old_policy(hp: PolicyHParams, ratio_logp, batch_logp, advantages, m, *, tokens
               ) -> tuple[jax.Array, jax.Array, dict]:
  """(π_old's log-probs for the ratio, the advantages, metrics) of one micro-batch.

  ratio_logp: the micro-batch's log π_θ [B, R] (finite stand-ins outside m); batch_logp: the
  batch's old_logp_BxR, log π_old ("recompute") or the sampler's log π_b ("exact",
  "behaviour"); advantages, m: [B, R]; tokens: the mini-batch's response tokens.
  "exact": π_old = sg(π_θ) (the weights that sampled, when each batch takes one update),
  and the gap metrics of `behaviour.gap_metrics` come from this forward, weighted by the
  micro-batch's token share. hp.correction scales the advantages here unless "recompute".
  """
  if hp.old_logprobs == "recompute":
    return batch_logp, advantages, {}
  metrics = {}
  if hp.old_logprobs == "exact":
    old = jax.lax.stop_gradient(ratio_logp)
    share = jnp.sum(m) / jnp.maximum(tokens, 1.0)
    metrics = {k: v * share for k, v in behaviour.gap_metrics(old, batch_logp, m,
                                                                      hp.correction.band).items()}
  else:
    old = batch_logp
  if hp.correction.mode != "none":
    w = behaviour.update_weights(
        ratio_logp, batch_logp, m, hp.correction,
        anchor="current" if hp.old_logprobs == "exact" else "behaviour")
    metrics["rollout/correction_weight_mean"] = jnp.sum(w * m) / jnp.maximum(tokens, 1.0)
    advantages = advantages * w
  return old, advantages, metrics


def policy_step(graphdef, tx: train_state.Optimizer, hp: PolicyHParams, layout,
                state: TrainState, rows) -> tuple[TrainState, dict, jax.Array]:
  """One policy update on a mini-batch: L = L_PPO (eq. 4) + μ·L_NLL (eq. 3) [+ β·L_KL].

  L_PPO is `losses.POLICY_LOSSES[hp.policy_loss]` ("ppo": the clipped surrogate).

  layout: the row layout (`rl.layout.Padded` / `Packed`); rows: what it takes (the
  RolloutBatch / a PackedBatch of it). The batch: tokens_BxL (int32), mask_BxL,
  old_logp_BxR, advantages_BxR, response_mask_BxR, scores_B, and ref_logp_BxR when
  hp.kl_coef > 0 (GRPO's k3 penalty to the reference policy, `losses.kl_penalty`,
  aggregated and normalised like L_PPO). The prompt length is L − R. What old_logp_BxR
  holds and what π_old is: hp.old_logprobs (`old_policy`).
  """
  batch = _padded(rows)
  resp_mask = batch.response_mask_BxR
  pg_count = losses.aggregation_count(resp_mask, hp.loss_mode)
  correct = (batch.scores_B >= hp.nll_threshold).astype(jnp.float32)
  nll_count = jnp.sum(resp_mask * correct[:, None])
  n_rows = jnp.asarray(resp_mask.shape[0], jnp.float32)
  tokens = jnp.sum(resp_mask)

  def loss_fn(params, mb, view):
    model = nnx.merge(graphdef, params)
    logp, entropy = view.logprobs(model, temperature=hp.temperature, chunk=hp.vocab_chunk)
    ref, m = mb.ref_logp_BxR, view.mine(mb.response_mask_BxR)
    ratio_logp = view.pick(logp, mb.old_logp_BxR)
    old, adv, extra = old_policy(hp, ratio_logp, mb.old_logp_BxR, mb.advantages_BxR, m,
                                 tokens=tokens)
    loss, metrics = policy_objective(
        hp, logp, entropy, m, old, adv, mb.scores_B, ref, pg_count=pg_count,
        nll_count=nll_count, tokens=tokens, ratio_logp=ratio_logp,
        kl_logp=view.pick(logp, ref) if hp.kl_coef else None)
    return loss, {**metrics, **extra}

  loss, grads, metrics = layout.accumulate(loss_fn, state.params, rows)
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  metrics.update(policy_loss=loss, policy_grad_norm=grad_norm, rows=n_rows)
  return state, metrics, skipped


def _padded(rows) -> RolloutBatch:
  """The padded batch of a layout's rows (a PackedBatch holds it as it is)."""
  return getattr(rows, "batch", rows)


# --------------------------------------------------------------------------------- critic


def critic_objective(hp: CriticHParams, values, returns, m, old_values, *, count, tokens
                     ) -> tuple[jax.Array, dict]:
  """One micro-batch's share of the critic loss ½(V − R)² (clipped with hp.value_clip) and
  its clip fraction. values, returns, m (response mask), old_values: [B, R]; count, tokens:
  the mini-batch's normaliser and response tokens (before the micro-batch split). Rows
  outside m must hold finite values (a packed micro-batch passes old values there)."""
  out = losses.value_loss(values, returns, m, old_values=old_values, clip_eps=hp.value_clip,
                          mode=hp.loss_mode)
  loss = losses.safe_divide(out.loss.total, count)
  return loss, {"value_clip_frac": out.metrics["value_clip_frac"] * out.metrics["tokens"]
                / jnp.maximum(tokens, 1.0)}


def critic_step(graphdef, tx: train_state.Optimizer, hp: CriticHParams, layout,
                state: TrainState, rows) -> tuple[TrainState, dict, jax.Array]:
  """One critic update: ½(V − R)² against the λ_critic returns (optionally clipped).

  The batch: tokens_BxL, mask_BxL, returns_BxR, old_values_BxR, response_mask_BxR (layout,
  rows: as in `policy_step`).
  """
  resp_mask = _padded(rows).response_mask_BxR
  count = losses.aggregation_count(resp_mask, hp.loss_mode)

  def loss_fn(params, mb, view):
    values = view.values(nnx.merge(graphdef, params))
    return critic_objective(hp, view.pick(values, mb.old_values_BxR), mb.returns_BxR,
                            view.mine(mb.response_mask_BxR), mb.old_values_BxR, count=count,
                            tokens=jnp.sum(resp_mask))

  loss, grads, metrics = layout.accumulate(loss_fn, state.params, rows)
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  metrics.update(value_loss=loss, critic_grad_norm=grad_norm)
  return state, metrics, skipped


# --------------------------------------------------------------------------- reward model


def reward_model_step(graphdef, tx: train_state.Optimizer, hp: CriticHParams, layout,
                      state: TrainState, rows) -> tuple[TrainState, dict, jax.Array]:
  """One update of an outcome reward model: ½(r̂ − r)² per response (`losses.outcome_loss`).

  r̂ = the model's scalar at the response's last token (`critic.last_token_values`), r the
  checker's score. The batch: tokens_BxL, mask_BxL, response_mask_BxR, scores_B (layout,
  rows: as in `policy_step`; hp is not read).
  """
  del hp
  resp_mask = _padded(rows).response_mask_BxR
  count = jnp.sum((jnp.sum(resp_mask, -1) > 0).astype(jnp.float32))

  def loss_fn(params, mb, view):
    model = nnx.merge(graphdef, params)
    lengths = jnp.sum(mb.response_mask_BxR, -1).astype(jnp.int32)
    pred = view.last_values(model, lengths)
    valid = view.valid(lengths > 0)
    out = losses.outcome_loss(pred, mb.scores_B, valid)
    return losses.safe_divide(out.total, count), {
        "rm_pred_mean": losses.safe_divide(jnp.sum(jnp.where(valid, pred, 0.0)), count)}

  loss, grads, metrics = layout.accumulate(loss_fn, state.params, rows)
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  metrics.update(rm_loss=loss, rm_grad_norm=grad_norm)
  return state, metrics, skipped


# ------------------------------------------------------------------------------------ SFT


def sft_step(graphdef, tx: train_state.Optimizer, layout, state: TrainState,
             rows) -> tuple[TrainState, dict, jax.Array]:
  """Supervised warm start: token-level NLL of the response (solution) tokens.

  The batch: tokens_BxL, mask_BxL, response_mask_BxR (layout, rows: as in `policy_step`;
  the loss is normalised by the whole batch's tokens, so any micro-batching sums to it).
  """
  resp_mask = _padded(rows).response_mask_BxR

  def loss_fn(params, mb, view):
    logp, _ = view.logprobs(nnx.merge(graphdef, params))  # 0 outside the view's own rows
    return losses.safe_divide(-jnp.sum(logp * mb.response_mask_BxR), jnp.sum(resp_mask)), {}

  loss, grads, _ = layout.accumulate(loss_fn, state.params, rows)
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  return state, {"sft_loss": loss, "sft_grad_norm": grad_norm}, skipped


# --------------------------------------------------------------------------- the PPO loop

# Mini-batch shuffles are seeded by (seed, stage, step, epoch); these numbers name the
# stages there (fixed: resumed runs and existing checkpoints depend on them).
SHUFFLE_STAGE = {"value_pretrain": 0, "rl": 1, "reward_model": 2}


@dataclasses.dataclass(frozen=True)
class PPOLoop:
  """ppo_epochs passes of num_minibatches mini-batches of minibatch_rows rows each."""
  epochs: int
  num_minibatches: int
  minibatch_rows: int
  seed: int


def ppo_updates(loop: PPOLoop, learners: list[Learner], batch: RolloutBatch, take, *, stage: str,
                step: int):
  """The update: every mini-batch of every epoch goes through each learner's step, in order.

  Args:
    loop: the loop's sizes and seed.
    learners: the networks to update, e.g. [policy, critic] (their states are not changed).
    batch: the rollout batch.
    take: take(batch, idx) -> the mini-batch of rows idx, on the mesh.
    stage, step: where the run is (they seed the mini-batch shuffle).

  Returns:
    (name -> new TrainState, the updates' mean metrics and train_tokens_per_s, per-update
    "skipped" flags: a step dropped a non-finite update).
  """
  states = {learner.name: learner.state for learner in learners}
  rows = batch.scores_B.shape[0]
  records = []
  t0 = time.perf_counter()
  for epoch in range(loop.epochs):
    perm = np.random.default_rng([loop.seed, SHUFFLE_STAGE[stage], step, epoch]
                                 ).permutation(rows)
    for k in range(loop.num_minibatches):
      idx = jnp.asarray(perm[k * loop.minibatch_rows:(k + 1) * loop.minibatch_rows])
      minibatch = take(batch, idx)
      m, skips = {}, []
      for learner in learners:
        states[learner.name], sm, skipped = learner.step(states[learner.name], minibatch)
        m.update(sm)
        skips.append(skipped)
      records.append(distributed.pace((m, skips)))
  records = jax.device_get(records)
  dt = time.perf_counter() - t0
  skipped = [max(float(s) for s in skips) > 0 for _, skips in records]
  metrics = {k: float(np.mean([r[k] for r, _ in records])) for k in records[0][0]}
  tokens = float(jax.device_get(jnp.sum(batch.mask_BxL))) * loop.epochs
  metrics["train_tokens_per_s"] = tokens / max(dt, 1e-9)
  return states, metrics, skipped
