"""The train passes on packed rows (`vapo_jax.packing`): forwards and steps, same results.

Each function here is the packed twin of one in `rl.forward` or `rl.update`:
`policy_logprobs`, `critic_values` (old log-probs, entropies and values of a whole rollout
batch) and `policy_step`, `critic_step`, `reward_model_step`, `sft_step` (one update on a
mini-batch). They take a `Packed` batch: the padded `RolloutBatch` as it is ([B, ...]) and
its packing plan (`plan_arrays`: gather tables [n, K, T] and per-row slots [B]); the model
runs on the K
packed micro-batches of [n, T] tokens, one after another (`lax.scan` / `lax.map`), and
every per-token output is unpacked back to response-aligned [B, R] before any loss, so the
losses, their normalisers (from the real masks, `losses.LossSum`), metrics and everything
after see exactly what the padded path gives them. Micro-batch k contributes the loss terms
of the responses it holds: the loss inputs of the other rows are replaced by finite
stand-ins (old log-probs, old values) under a zero mask.

Axis 0 of every array in a packed batch is rows (B or n), split over the data-parallel mesh
axes like the padded batch (`rl.batch.shard_batch`). `packed_learner_step` wraps a compiled
packed step as a `Learner.step` of the padded batch (the plan is made on the host, from the
lengths, before each call) that also reports the pass's real / computed tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import critic as critic_lib
from vapo_jax import distributed
from vapo_jax import losses
from vapo_jax import packing
from vapo_jax import policy as policy_lib
from vapo_jax import sharding as shd
from vapo_jax.models import lora
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import train_state
from vapo_jax.rl import update

PLAN_KEYS = ("src", "segment_ids", "positions", "micro_B", "row_B", "start_B")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packed:
  """A padded batch and its packing plan (both pytrees of arrays with rows on axis 0)."""
  batch: Any          # rl.batch.RolloutBatch
  plan: dict          # PLAN_KEYS -> array


def lengths(mask_BxL: jax.Array, prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(p_B, l_B) on the host, every process the same: summed on the device, [B] moved."""
  m = (mask_BxL > 0).astype(jnp.int32)
  p, r = distributed.to_host((jnp.sum(m[:, :prompt_len], -1), jnp.sum(m[:, prompt_len:], -1)))
  return np.asarray(p), np.asarray(r)


def plan_arrays(prompt_B, response_B, spec: packing.PackSpec, prompt_len: int,
                seq_len: int) -> tuple[dict[str, np.ndarray], packing.Plan]:
  """(host arrays of the plan, the plan) for rows with p_b prompt and l_b response tokens."""
  p = packing.plan(prompt_B, response_B, spec)
  return {**packing.pack_indices(p, prompt_len, seq_len), **packing.response_slots(p)}, p


def _packed(tokens_BxL: jax.Array, plan: dict, k=None) -> dict:
  """Token, position and segment arrays of micro-batch k ([n, T]) or of all ([n, K, T])."""
  tok = packing.gather(tokens_BxL, plan["src"])
  out = {"tokens": tok, "positions": plan["positions"], "segment_ids": plan["segment_ids"]}
  return out if k is None else {name: packing.micro(x, k) for name, x in out.items()}


def _slots(plan: dict) -> dict:
  return {k: plan[k] for k in ("micro_B", "row_B", "start_B")}


def _resp_of_mask(mask_BxL: jax.Array, prompt_len: int) -> jax.Array:
  """The response part of the padded mask [B, R] (what the padded forwards multiply by)."""
  return mask_BxL[:, prompt_len:].astype(jnp.float32)


def _scan(loss_fn: Callable, params, k: int):
  """Σ over the K packed micro-batches of (loss, grads of trainable params, metrics)."""
  params, frozen = lora.split_trainable(params)
  grad_fn = jax.value_and_grad(lambda p, i: loss_fn(lora.join(p, frozen), i), has_aux=True)
  if k == 1:
    (loss, metrics), grads = grad_fn(params, 0)
    return loss, grads, metrics
  (loss0, m0), g0 = jax.eval_shape(grad_fn, params, 0)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, g0, m0))

  def body(carry, i):
    (loss, metrics), grads = grad_fn(params, i)
    return jax.tree.map(jnp.add, carry, (loss, grads, metrics)), None

  (loss, grads, metrics), _ = jax.lax.scan(body, zeros, jnp.arange(k))
  return loss, grads, metrics


def _num_micro(plan: dict) -> int:
  return plan["src"].shape[1]


# --------------------------------------------------------------------------------- steps


def policy_step(graphdef, tx, hp: update.PolicyHParams, state: train_state.TrainState,
                packed: Packed):
  """`update.policy_step` on packed rows (hp.micro_batches is unused: K comes from the plan).

  Rows of other micro-batches see their old log-probs (ratio 1, finite) under a zero mask.
  """
  batch, plan = packed.batch, packed.plan
  resp_mask = batch.response_mask_BxR
  real = _resp_of_mask(batch.mask_BxL, batch.prompt_len)
  pg_count = losses.aggregation_count(resp_mask, hp.loss_mode)
  correct = (batch.scores_B >= hp.nll_threshold).astype(jnp.float32)
  nll_count = jnp.sum(resp_mask * correct[:, None])
  rows = jnp.asarray(resp_mask.shape[0], jnp.float32)
  tokens = jnp.sum(resp_mask)
  slots = _slots(plan)

  def loss_fn(params, k):
    model = nnx.merge(graphdef, params)
    logp, entropy = policy_lib.packed_response_logprobs(
        model, _packed(batch.tokens_BxL, plan, k), slots, real, k,
        temperature=hp.temperature, chunk=hp.vocab_chunk)
    here = (slots["micro_B"] == k)[:, None]
    m = resp_mask * here
    ref = batch.ref_logp_BxR
    return update.policy_objective(
        hp, logp, entropy, m, batch.old_logp_BxR, batch.advantages_BxR, batch.scores_B, ref,
        pg_count=pg_count, nll_count=nll_count, tokens=tokens,
        ratio_logp=jnp.where(here, logp, batch.old_logp_BxR),
        kl_logp=jnp.where(here, logp, ref) if hp.kl_coef else None)

  loss, grads, metrics = _scan(loss_fn, state.params, _num_micro(plan))
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  metrics.update(policy_loss=loss, policy_grad_norm=grad_norm, rows=rows)
  return state, metrics, skipped


def critic_step(graphdef, tx, hp: update.CriticHParams, state: train_state.TrainState,
                packed: Packed):
  """`update.critic_step` on packed rows."""
  batch, plan = packed.batch, packed.plan
  resp_mask = batch.response_mask_BxR
  real = _resp_of_mask(batch.mask_BxL, batch.prompt_len)
  count = losses.aggregation_count(resp_mask, hp.loss_mode)
  slots = _slots(plan)

  def loss_fn(params, k):
    critic = nnx.merge(graphdef, params)
    values = critic_lib.packed_response_values(critic, _packed(batch.tokens_BxL, plan, k),
                                               slots, real, k)
    here = (slots["micro_B"] == k)[:, None]
    return update.critic_objective(hp, jnp.where(here, values, batch.old_values_BxR),
                                   batch.returns_BxR, resp_mask * here, batch.old_values_BxR,
                                   count=count, tokens=jnp.sum(resp_mask))

  loss, grads, metrics = _scan(loss_fn, state.params, _num_micro(plan))
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  metrics.update(value_loss=loss, critic_grad_norm=grad_norm)
  return state, metrics, skipped


def reward_model_step(graphdef, tx, hp: update.CriticHParams, state: train_state.TrainState,
                      packed: Packed):
  """`update.reward_model_step` on packed rows."""
  batch, plan = packed.batch, packed.plan
  resp_mask = batch.response_mask_BxR
  lengths_B = jnp.sum(resp_mask, -1).astype(jnp.int32)
  count = jnp.sum((lengths_B > 0).astype(jnp.float32))
  slots = _slots(plan)

  def loss_fn(params, k):
    model = nnx.merge(graphdef, params)
    pred = critic_lib.packed_last_token_values(model, _packed(batch.tokens_BxL, plan, k),
                                               slots, lengths_B, k)
    valid = (lengths_B > 0) & (slots["micro_B"] == k)
    out = losses.outcome_loss(pred, batch.scores_B, valid)
    return losses.safe_divide(out.total, count), {
        "rm_pred_mean": losses.safe_divide(jnp.sum(jnp.where(valid, pred, 0.0)), count)}

  loss, grads, metrics = _scan(loss_fn, state.params, _num_micro(plan))
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  metrics.update(rm_loss=loss, rm_grad_norm=grad_norm)
  return state, metrics, skipped


def sft_step(graphdef, tx, state: train_state.TrainState, packed: Packed):
  """`update.sft_step` on packed rows."""
  batch, plan = packed.batch, packed.plan
  resp_mask = batch.response_mask_BxR
  real = _resp_of_mask(batch.mask_BxL, batch.prompt_len)
  slots = _slots(plan)

  def loss_fn(params, k):
    model = nnx.merge(graphdef, params)
    logp, _ = policy_lib.packed_response_logprobs(model, _packed(batch.tokens_BxL, plan, k),
                                                  slots, real, k)
    return losses.safe_divide(-jnp.sum(logp * resp_mask), jnp.sum(resp_mask)), {}

  loss, grads, _ = _scan(loss_fn, state.params, _num_micro(plan))
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  return state, {"sft_loss": loss, "sft_grad_norm": grad_norm}, skipped


def packed_learner_step(name: str, compiled: Callable, spec: packing.PackSpec, mesh,
                        batch_axes) -> Callable:
  """A `Learner.step` (state, padded RolloutBatch) -> (state, metrics, skipped) that plans
  the batch on the host (the same plan on every process: lengths are all-gathered), puts
  the plan on the mesh and runs the compiled packed step (one compile per (K, n) shape).
  Adds `perf/<name>_token_efficiency` = real / computed tokens of the pass."""
  shapes_seen = set()

  def step(state, batch):
    p_B, l_B = lengths(batch.mask_BxL, batch.prompt_len)
    arrays, plan = plan_arrays(p_B, l_B, spec, batch.prompt_len, batch.tokens_BxL.shape[1])
    if plan.shape not in shapes_seen:
      shapes_seen.add(plan.shape)
      print(f"[packing] {name}: packed shape [n, K, T] = {list(plan.shape)} "
            f"({len(shapes_seen)} so far)", flush=True)
    state, metrics, skipped = compiled(
        state, Packed(batch, batch_lib.shard_batch(arrays, mesh, batch_axes)))
    return state, {**metrics, f"perf/{name}_token_efficiency": plan.efficiency}, skipped

  step.compiled, step.spec = compiled, spec
  return step


# ------------------------------------------------------------------------------- forwards


def _map_micro(fn, tokens_BxL, plan: dict):
  """fn(micro-batch k's packed dict) -> [n, T] outputs, over all K: [n, K, T]."""
  moved = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), _packed(tokens_BxL, plan))  # [K,n,T]
  out = jax.lax.map(fn, moved)
  return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), out)


def policy_logprobs(graphdef, params, tokens_BxL, mask_BxL, plan: dict, prompt_len: int, *,
                    temperature: float, vocab_chunk: int = 128):
  """(log-probs, entropies) [B, R] of the responses, as `forward.policy_logprobs`; the K
  packed micro-batches run one after another (`lax.map`)."""
  model = nnx.merge(graphdef, params)

  def one(pk):
    return policy_lib.packed_logprobs(model, pk["tokens"], pk["positions"], pk["segment_ids"],
                                      temperature=temperature, chunk=vocab_chunk)

  logp, ent = _map_micro(one, tokens_BxL, plan)
  real, slots = _resp_of_mask(mask_BxL, prompt_len), _slots(plan)
  return packing.unpack(logp, slots, real), packing.unpack(ent, slots, real)


def critic_values(graphdef, params, tokens_BxL, mask_BxL, plan: dict, prompt_len: int):
  """V(s_t) [B, R] for every response token, as `forward.critic_values`."""
  critic = nnx.merge(graphdef, params)
  values = _map_micro(lambda pk: critic.packed(pk["tokens"], pk["positions"],
                                               pk["segment_ids"]), tokens_BxL, plan)
  return packing.unpack(values, _slots(plan), _resp_of_mask(mask_BxL, prompt_len))


def packed_forward(name: str, fn: Callable, spec: packing.PackSpec, mesh, batch_axes,
                   rules: shd.Rules = shd.DEFAULT_RULES, static=()) -> Callable:
  """fn(params, tokens_BxL, mask_BxL, plan, prompt_len, **kw) as the padded forward's
  callable (params, tokens_BxL, mask_BxL, *, prompt_len, **kw): planned on the host, jitted
  once per packed shape. `.last_efficiency` holds the last call's real / computed tokens."""
  jitted = jax.jit(shd.traced_under(fn, mesh, rules), static_argnames=("prompt_len",) + static)

  def run(params, tokens_BxL, mask_BxL, *, prompt_len, **kw):
    p_B, l_B = lengths(mask_BxL, prompt_len)
    arrays, plan = plan_arrays(p_B, l_B, spec, prompt_len, tokens_BxL.shape[1])
    run.last_efficiency = plan.efficiency
    return jitted(params, tokens_BxL, mask_BxL,
                  batch_lib.shard_batch(arrays, mesh, batch_axes), prompt_len=prompt_len, **kw)

  run.last_efficiency = None
  run.jitted, run.spec = jitted, spec
  run.__name__ = name
  return run


def token_efficiency(p: packing.Plan) -> dict[str, float]:
  """Real tokens, computed tokens and their ratio of one packed pass."""
  computed = float(np.prod(p.shape))
  return {"real_tokens": float(p.real_tokens), "computed_tokens": computed,
          "efficiency": p.real_tokens / computed}
