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

TABLE_KEYS = ("src", "segment_ids", "positions", "head")   # [n, K_cap, T] each
PLAN_KEYS = TABLE_KEYS + ("micro_B", "row_B", "start_B")   # then [B] each


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
  shards: int = 1     # D, the data-parallel blocks of the n rows (the head's compaction)

  def _real(self):
    """The response part of the padded mask [B, R] (what the padded outputs are masked by)."""
    return self.mask_BxL[:, self.prompt_len:].astype(jnp.float32)

  def _slots(self):
    return {key: self.plan[key] for key in ("micro_B", "row_B", "start_B")}

  def _packed(self, k):
    """Token, position and segment arrays of micro-batch k, [n, T] (only its tokens gathered)."""
    src = packing.micro(self.plan["src"], k)
    return {"tokens": packing.gather(self.tokens_BxL, src),
            "positions": packing.micro(self.plan["positions"], k),
            "segment_ids": packing.micro(self.plan["segment_ids"], k),
            "head": packing.micro(self.plan["head"], k)}

  def _each(self, fn):
    """fn(packed dict [n, T], k) -> [B, ...] outputs of micro-batch k (0 on other rows): of
    micro-batch self.k, or summed over all K that hold rows (a forward's), one after another
    in a loop whose trip count K = max(micro_B) + 1 is traced, not compiled in."""
    if self.k is not None:
      return fn(self._packed(self.k), self.k)
    count = micro_count(self.plan)
    first = jax.eval_shape(lambda: fn(self._packed(0), 0))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), first)
    return jax.lax.fori_loop(
        0, count, lambda k, acc: jax.tree.map(jnp.add, acc, fn(self._packed(k), k)), zeros)

  def logprobs(self, model, *, temperature: float = 1.0, chunk: int = 128):
    real, slots = self._real(), self._slots()

    def one(pk, k):
      logp, ent = policy_lib.packed_logprobs(
          model, pk["tokens"], pk["positions"], pk["segment_ids"], temperature=temperature,
          chunk=chunk, head_NxT=pk["head"], shards=self.shards)
      return packing.unpack(logp, slots, real, k), packing.unpack(ent, slots, real, k)
    return self._each(one)

  def _critic(self, critic, pk):
    """The critic's value at every slot of one micro-batch, [n, T]."""
    return critic(pk["tokens"], pk["segment_ids"] > 0, positions_BxT=pk["positions"],
                  segment_ids_BxT=pk["segment_ids"])

  def values(self, critic):
    real, slots = self._real(), self._slots()
    return self._each(lambda pk, k: packing.unpack(self._critic(critic, pk), slots, real, k))

  def last_values(self, critic, lengths_B):
    slots = self._slots()
    return self._each(lambda pk, k: packing.last_token(self._critic(critic, pk), slots,
                                                       lengths_B, k))

  # Micro-batch k's loss holds the terms of its own rows; the other rows are masked out.
  def _here(self):
    return self.plan["micro_B"] == self.k

  def mine(self, x_BxR):
    return x_BxR * self._here()[:, None]

  def pick(self, mine, other):
    return jnp.where(self._here()[:, None], mine, other)

  def valid(self, ok_B):
    return ok_B & self._here()


def micro_count(plan: dict) -> jax.Array:
  """K, the packed micro-batches that hold rows, from the plan's arrays (traced): the
  planner fills micro-batches 0 .. K - 1 (`packing.plan`), so K = max(micro_B) + 1."""
  return jnp.max(plan["micro_B"]).astype(jnp.int32) + 1


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
  """Packed rows of `spec` (`vapo_jax.packing`): n rows of T per micro-batch, fixed for the
  pass; K, the micro-batches, comes from each plan and is a loop's trip count at run time,
  so a pass compiles once per row length (at most rl.packing_row_steps programs)."""
  spec: packing.PackSpec

  def accumulate(self, loss_fn: Callable, params, packed: PackedBatch):
    """Σ over the K packed micro-batches of loss_fn(params, batch, rows_k) (the whole padded
    batch: the loss masks out the rows of other micro-batches through rows_k); K traced
    (`train_state.accumulate_count`)."""
    batch, plan = packed.batch, packed.plan
    return train_state.accumulate_count(
        lambda p, i: loss_fn(p, batch, PackedRows(batch.tokens_BxL, batch.mask_BxL,
                                                   batch.prompt_len, plan, i,
                                                   self.spec.shards)),
        params, micro_count(plan))

  def plan(self, mask_BxL, prompt_len: int, seq_len: int, mesh, batch_axes):
    """(the plan's arrays on the mesh, the host Plan) of a batch (planned on the host)."""
    p_B, l_B = lengths(mask_BxL, prompt_len)
    arrays, plan = plan_arrays(p_B, l_B, self.spec, prompt_len, seq_len)
    return batch_lib.shard_batch(arrays, mesh, batch_axes), plan

  def programs(self, rows: int) -> dict[tuple[int, int, int], str]:
    """The bounded program set of a pass over batches of `rows` sequences: {plan tables'
    shape [n, K_cap, T]: a label "rows=<n>x<T>"}, one per row length."""
    out = {}
    for t in self.spec.row_lens():
      sp = self.spec.at(t)
      out[(sp.max_rows, sp.micro_cap(rows), t)] = f"rows={sp.max_rows}x{t}"
    return out

  def _ahead(self, name: str, lower: Callable, rows: int, mesh, batch_axes) -> set:
    """Compiles every program of the pass (`programs`) for batches of `rows` sequences now:
    lower(plan arrays) -> the jitted program's `Lowered`, for dummy plan arrays of each
    shape, sharded as the real ones are (a later call with a real plan of that shape then
    finds the program compiled). Returns {(rows, table shape)} compiled."""
    progs = self.programs(rows)
    print(f"[compile] {name}: {len(progs)} program{'s' * (len(progs) > 1)} "
          f"({', '.join(progs.values())}) for batches of {rows} ...", flush=True)
    for (n, k, t) in progs:
      dummy = {key: np.zeros((n, k, t) if key in TABLE_KEYS else (rows,), np.int32)
               for key in PLAN_KEYS}
      lower(batch_lib.shard_batch(dummy, mesh, batch_axes)).compile()
    return {(rows, shape) for shape in progs}

  def _ready(self, name: str, ready: set, plan: packing.Plan, rows: int, lower: Callable,
             mesh, batch_axes) -> None:
    """Before a call: the pass's program set for batches of `rows` compiled (once per batch
    size, `_ahead`); a plan outside it would compile a new program mid-run: said once."""
    if not any(r == rows for r, _ in ready):
      ready.update(self._ahead(name, lower, rows, mesh, batch_axes))
    if (rows, plan.table_shape) not in ready:
      ready.add((rows, plan.table_shape))
      print(f"[compile] {name}: a plan of shape {list(plan.table_shape)} outside the "
            "program set compiled ahead: compiling it now", flush=True)

  def step(self, name: str, compiled: Callable, mesh, batch_axes) -> Callable:
    """A `Learner.step` (state, padded RolloutBatch) -> (state, metrics, skipped) that plans
    the batch on the host and runs the compiled step on a `PackedBatch`. Its first call
    compiles the pass's whole program set (`programs`: one per row length, the tables
    [n, K_cap, T] whatever K is; again for a new batch size), so no later batch compiles. Adds
    `perf/<name>_token_efficiency` = real / computed tokens and the plan's shape
    (`packing.Plan.metrics`)."""
    ready = set()

    def step(state, batch):
      arrays, plan = self.plan(batch.mask_BxL, batch.prompt_len, batch.tokens_BxL.shape[1],
                               mesh, batch_axes)
      self._ready(name, ready, plan, batch.tokens_BxL.shape[0],
                  lambda dummy: compiled.lower(state, PackedBatch(batch, dummy)), mesh,
                  batch_axes)
      state, metrics, skipped = compiled(state, PackedBatch(batch, arrays))
      return state, {**metrics, **plan.metrics(name)}, skipped

    step.compiled, step.spec = compiled, self.spec
    return step

  def forward(self, name: str, fn: Callable, mesh, batch_axes, rules=shd.DEFAULT_RULES,
              static=()) -> Callable:
    """fn(params, rows, **kw) as (params, tokens_BxL, mask_BxL, *, prompt_len, **kw): planned
    on the host, jitted once per row length, all of them at the first call (`.jitted` takes
    the plan's arrays after the mask). `.last_efficiency` holds the last call's real /
    computed tokens, `.last_plan` its Plan."""

    def whole(params, tokens_BxL, mask_BxL, plan, *, prompt_len, **kw):
      return fn(params, PackedRows(tokens_BxL, mask_BxL, prompt_len, plan,
                                   shards=self.spec.shards), **kw)

    jitted = jax.jit(shd.traced_under(whole, mesh, rules),
                     static_argnames=("prompt_len",) + tuple(static))
    ready = set()

    def run(params, tokens_BxL, mask_BxL, *, prompt_len, **kw):
      arrays, plan = self.plan(mask_BxL, prompt_len, tokens_BxL.shape[1], mesh, batch_axes)
      self._ready(name, ready, plan, tokens_BxL.shape[0],
                  lambda dummy: jitted.lower(params, tokens_BxL, mask_BxL, dummy,
                                             prompt_len=prompt_len, **kw), mesh, batch_axes)
      run.last_efficiency, run.last_plan = plan.efficiency, plan
      return jitted(params, tokens_BxL, mask_BxL, arrays, prompt_len=prompt_len, **kw)

    run.last_efficiency = run.last_plan = None
    run.jitted, run.spec = jitted, self.spec
    run.__name__ = name
    return run


Layout = Padded | Packed
