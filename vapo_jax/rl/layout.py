"""How a train pass lays out its rows: `Padded` [B, L] rows, or `Packed` rows with segment ids.

Every learner step (`rl.update`) and every forward (`rl.forward`) is written once, over a
layout; what differs between the two layouts is only
  - how the rows a model runs on are built: a micro-batch of the padded rows, or one of the
    K packed micro-batches of [n, T] slots (`vapo_jax.packing`) whose attention is kept inside
    each segment (the model's `segment_ids_BxT`);
  - how per-token outputs come back to response-aligned [B, R] (`Rows.logprobs`, `values`,
    `last_values`): a slice of the padded columns, or `packing.unpack` / `packing.last_token`;
  - which rows' loss terms a micro-batch holds (`Rows.mine`, `pick`, `valid`): a padded
    micro-batch's loss sees only its own rows; a packed micro-batch's loss sees all B rows,
    those of other micro-batches under a zero mask with finite stand-ins (old log-probs, old
    values) in place of their outputs, which come out 0;
  - the host side (`step`, `forward`): packed passes plan each batch on the host from its
    lengths (the same plan on every process) and report real / computed tokens.
Micro-batch accumulation is `train_state.accumulate`, for both.

The compiled step takes the padded `RolloutBatch` (`Padded`) or a `PackedBatch` (the padded
batch as it is and its plan's arrays, `PLAN_KEYS`: gather tables [n, K, T], per-row slots
[B]); axis 0 of every array is rows, split over the data-parallel mesh axes. The losses,
their normalisers (from the real masks, `losses.LossSum`), metrics and everything after see
exactly what the padded path gives them.

Shapes: B rows, P prompt columns (left-padded), R response columns, L = P + R.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import critic as critic_lib
from vapo_jax import distributed
from vapo_jax import packing
from vapo_jax import policy as policy_lib
from vapo_jax import sharding as shd
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import train_state

PLAN_KEYS = ("src", "segment_ids", "positions", "micro_B", "row_B", "start_B")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedBatch:
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


# ------------------------------------------------------------------- rows as a model sees them


@dataclasses.dataclass(frozen=True)
class PaddedRows:
  """Padded rows [b, L] (a micro-batch's, or all): the model runs on them as they are."""
  tokens_BxL: jax.Array
  mask_BxL: jax.Array
  prompt_len: int

  def logprobs(self, model, *, temperature: float = 1.0, chunk: int = 128):
    """(log-probs, entropies) of the response tokens, [b, R] each (0 on padding)."""
    return policy_lib.response_logprobs(model, self.tokens_BxL, self.mask_BxL, self.prompt_len,
                                        temperature=temperature, chunk=chunk)

  def values(self, critic):
    """V(s_t) [b, R] (0 on padding)."""
    return critic_lib.response_values(critic, self.tokens_BxL, self.mask_BxL, self.prompt_len)

  def last_values(self, critic, lengths_B):
    """The value after each whole response, [b]."""
    return critic_lib.last_token_values(critic, self.tokens_BxL, self.mask_BxL,
                                        self.prompt_len, lengths_B)

  # A padded micro-batch's loss sees only its own rows: nothing to mask.
  def mine(self, x_BxR):
    return x_BxR

  def pick(self, mine, other):
    del other
    return mine

  def valid(self, ok_B):
    return ok_B


@dataclasses.dataclass(frozen=True)
class PackedRows:
  """The packed rows of a padded [B, L] batch: micro-batch k ([n, T], a step's), or all K
  one after another (k None, a forward's); outputs come back as [B, R] / [B]."""
  tokens_BxL: jax.Array
  mask_BxL: jax.Array
  prompt_len: int
  plan: dict
  k: Any = None

  def _real(self):
    """The response part of the padded mask [B, R] (what the padded outputs are masked by)."""
    return self.mask_BxL[:, self.prompt_len:].astype(jnp.float32)

  def _slots(self):
    return {key: self.plan[key] for key in ("micro_B", "row_B", "start_B")}

  def _packed(self, k=None):
    """Token, position and segment arrays of micro-batch k ([n, T]) or of all ([n, K, T])."""
    tok = packing.gather(self.tokens_BxL, self.plan["src"])
    out = {"tokens": tok, "positions": self.plan["positions"],
           "segment_ids": self.plan["segment_ids"]}
    return out if k is None else {name: packing.micro(x, k) for name, x in out.items()}

  def _each(self, fn):
    """fn(packed dict [n, T]) -> [n, T] outputs: of micro-batch k, or of all K ([n, K, T],
    run one after another with `lax.map`)."""
    if self.k is not None:
      return fn(self._packed(self.k))
    moved = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), self._packed())  # [K, n, T]
    out = jax.lax.map(fn, moved)
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), out)

  def logprobs(self, model, *, temperature: float = 1.0, chunk: int = 128):
    logp, ent = self._each(lambda pk: policy_lib.packed_logprobs(
        model, pk["tokens"], pk["positions"], pk["segment_ids"], temperature=temperature,
        chunk=chunk))
    real, slots = self._real(), self._slots()
    return (packing.unpack(logp, slots, real, self.k), packing.unpack(ent, slots, real, self.k))

  def _critic(self, critic):
    """The critic's value at every slot, [n, T] (or [n, K, T])."""
    return self._each(lambda pk: critic(pk["tokens"], pk["segment_ids"] > 0,
                                        positions_BxT=pk["positions"],
                                        segment_ids_BxT=pk["segment_ids"]))

  def values(self, critic):
    return packing.unpack(self._critic(critic), self._slots(), self._real(), self.k)

  def last_values(self, critic, lengths_B):
    return packing.last_token(self._critic(critic), self._slots(), lengths_B, self.k)

  # Micro-batch k's loss holds the terms of its own rows; the other rows are masked out.
  def _here(self):
    return self.plan["micro_B"] == self.k

  def mine(self, x_BxR):
    return x_BxR * self._here()[:, None]

  def pick(self, mine, other):
    return jnp.where(self._here()[:, None], mine, other)

  def valid(self, ok_B):
    return ok_B & self._here()


# ------------------------------------------------------------------------------ layouts


@dataclasses.dataclass(frozen=True)
class Padded:
  """Padded rows, in `micro_batches` micro-batches (micro-batch i = rows i, i + n, …: with
  the rows sharded, every device works on every micro-batch)."""
  micro_batches: int = 1

  def accumulate(self, loss_fn: Callable, params, batch):
    """Σ over micro-batches of loss_fn(params, batch_i, rows_i) -> (loss, metrics), with the
    gradients of the trainable params (`train_state.accumulate`)."""
    n = self.micro_batches
    micro = batch if n == 1 else batch_lib.micro_split(batch, n)
    return train_state.accumulate(
        lambda p, mb: loss_fn(p, mb, PaddedRows(mb.tokens_BxL, mb.mask_BxL, mb.prompt_len)),
        params, micro, n)

  def step(self, name: str, compiled: Callable, mesh, batch_axes) -> Callable:
    """The `Learner.step` of a compiled step: the step itself."""
    del name, mesh, batch_axes
    return compiled

  def forward(self, name: str, fn: Callable, mesh, batch_axes, rules=shd.DEFAULT_RULES,
              static=()) -> Callable:
    """fn(params, rows, **kw) -> pytree of [b, ...] as (params, tokens_BxL, mask_BxL, *,
    prompt_len, **kw), jitted, run as n micro-batches one after another (`lax.map`: the
    activations are those of B / n rows), the outputs back in row order."""
    del name, batch_axes
    n = self.micro_batches

    def one(params, tokens_BxL, mask_BxL, *, prompt_len, **kw):
      return fn(params, PaddedRows(tokens_BxL, mask_BxL, prompt_len), **kw)

    one = shd.traced_under(one, mesh, rules)
    if n <= 1:
      run = one
    else:
      def run(params, tokens_BxL, mask_BxL, **kw):
        micro = batch_lib.micro_split((tokens_BxL, mask_BxL), n)
        out = jax.lax.map(lambda tm: one(params, tm[0], tm[1], **kw), micro)
        return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape((-1,) + y.shape[2:]), out)
    return jax.jit(run, static_argnames=("prompt_len",) + tuple(static))


@dataclasses.dataclass(frozen=True)
class Packed:
  """Packed rows of `spec` (`vapo_jax.packing`); K, the micro-batches, comes from each plan."""
  spec: packing.PackSpec

  def accumulate(self, loss_fn: Callable, params, packed: PackedBatch):
    """Σ over the K packed micro-batches of loss_fn(params, batch, rows_k) (the whole padded
    batch: the loss masks out the rows of other micro-batches through rows_k)."""
    batch, plan = packed.batch, packed.plan
    k = plan["src"].shape[1]
    return train_state.accumulate(
        lambda p, i: loss_fn(p, batch, PackedRows(batch.tokens_BxL, batch.mask_BxL,
                                                   batch.prompt_len, plan, i)),
        params, 0 if k == 1 else jnp.arange(k), k)

  def plan(self, mask_BxL, prompt_len: int, seq_len: int, mesh, batch_axes):
    """(the plan's arrays on the mesh, the host Plan) of a batch (planned on the host)."""
    p_B, l_B = lengths(mask_BxL, prompt_len)
    arrays, plan = plan_arrays(p_B, l_B, self.spec, prompt_len, seq_len)
    return batch_lib.shard_batch(arrays, mesh, batch_axes), plan

  def step(self, name: str, compiled: Callable, mesh, batch_axes) -> Callable:
    """A `Learner.step` (state, padded RolloutBatch) -> (state, metrics, skipped) that plans
    the batch on the host and runs the compiled step on a `PackedBatch` (one compile per
    (K, n) shape). Adds `perf/<name>_token_efficiency` = real / computed tokens."""
    shapes_seen = set()

    def step(state, batch):
      arrays, plan = self.plan(batch.mask_BxL, batch.prompt_len, batch.tokens_BxL.shape[1],
                               mesh, batch_axes)
      if plan.shape not in shapes_seen:
        shapes_seen.add(plan.shape)
        print(f"[packing] {name}: packed shape [n, K, T] = {list(plan.shape)} "
              f"({len(shapes_seen)} so far)", flush=True)
      state, metrics, skipped = compiled(state, PackedBatch(batch, arrays))
      return state, {**metrics, f"perf/{name}_token_efficiency": plan.efficiency}, skipped

    step.compiled, step.spec = compiled, self.spec
    return step

  def forward(self, name: str, fn: Callable, mesh, batch_axes, rules=shd.DEFAULT_RULES,
              static=()) -> Callable:
    """fn(params, rows, **kw) as (params, tokens_BxL, mask_BxL, *, prompt_len, **kw): planned
    on the host, jitted once per packed shape (`.jitted` takes the plan's arrays after the
    mask). `.last_efficiency` holds the last call's real / computed tokens."""

    def whole(params, tokens_BxL, mask_BxL, plan, *, prompt_len, **kw):
      return fn(params, PackedRows(tokens_BxL, mask_BxL, prompt_len, plan), **kw)

    jitted = jax.jit(shd.traced_under(whole, mesh, rules),
                     static_argnames=("prompt_len",) + tuple(static))

    def run(params, tokens_BxL, mask_BxL, *, prompt_len, **kw):
      arrays, plan = self.plan(mask_BxL, prompt_len, tokens_BxL.shape[1], mesh, batch_axes)
      run.last_efficiency = plan.efficiency
      return jitted(params, tokens_BxL, mask_BxL, arrays, prompt_len=prompt_len, **kw)

    run.last_efficiency = None
    run.jitted, run.spec = jitted, self.spec
    run.__name__ = name
    return run


Layout = Padded | Packed
