"""The rollout of one RL step: the static sampler's windowed calls, or the continuous engine as
an event simulation per decode replica (formulas: `vapo_jax.pod.step`)."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math

import numpy as np

from vapo_jax.pod.step import counts as step_counts
from vapo_jax.pod.step import terms as step_terms
from vapo_jax.pod.step.setup import GB, EngineShape, Program, Setup



def _decode_collectives(st: Setup) -> float:
  k = st.knobs
  return k.decode_collectives if k.decode_collectives is not None else 9.0 * st.arch.layers + 4


def static_rollout(st: Setup, resp: np.ndarray, name: str = "rollout",
                   rows_per_call: int | None = None, n: int | None = None) -> Program:
  """Today's sampler: sequential calls, each prefill + windowed loops to its longest row
  (n responses per prompt: the prefill runs once per prompt)."""
  a, k = st.arch, st.knobs
  n = n or st.n
  b = rows_per_call or st.per_call * n
  calls = -(-len(resp) // b)
  kvb = a.kv_bytes()
  # Weights read per step, in place; an untied embedding is only looked up (B rows).
  w_bytes = a.decode_weights * k.decode_weight_itemsize / st.chips
  gathered = a.params * st.param_bytes / st.tensor if k.decode_weights == "gathered" else 0.0
  ncoll = _decode_collectives(st)
  lat = ncoll * k.collective_latency_us * 1e-6 + k.decode_collective_bytes / st.ici
  eff_bw = st.bw * k.bw_efficiency
  terms = {"decode weights": 0.0, "decode KV": 0.0, "decode logits": 0.0, "decode compute": 0.0,
           "decode latency": 0.0, "window copies": 0.0, "prefill": 0.0}
  prog = Program(name)
  steps_total = 0
  for ci in range(calls):
    lmax = int(resp[ci * b:(ci + 1) * b].max())
    # Prefill of the call's prompts (P padded slots), causal, one head position each.
    bp = max(1, b // n)
    pf = step_counts.forward_flops(a, bp, st.prompt_len, 1)
    pf_flops = sum(pf.values()) / st.chips
    terms["prefill"] += pf_flops / (st.peak * k.mfu) + b * st.prompt_len * kvb / st.chips / eff_bw
    prog.flops += pf_flops
    for t0, t1, w in st.windows:
      steps = max(0, min(t1, lmax) - t0)
      copy = 4.0 * b * w * kvb / st.chips                  # cut + write back, read + write
      terms["window copies"] += copy / eff_bw
      prog.hbm_bytes += copy
      if not steps:
        continue
      steps_total += steps
      kv = b * w * kvb / st.chips
      logits = 4.0 * b * a.vocab * 4 / st.tensor
      byts = w_bytes + gathered + kv + logits
      fl = step_counts.decode_step_flops(a, b, w) / st.chips
      t_mem, t_cmp = byts / eff_bw, fl / (st.peak * k.mfu)
      if t_mem >= t_cmp:
        terms["decode weights"] += steps * (w_bytes + gathered) / eff_bw
        terms["decode KV"] += steps * kv / eff_bw
        terms["decode logits"] += steps * logits / eff_bw
      else:
        terms["decode compute"] += steps * t_cmp
      terms["decode latency"] += steps * (lat + gathered / st.ici)
      prog.flops += steps * fl
      prog.hbm_bytes += steps * byts
      prog.collectives += steps * ncoll
      prog.ici_bytes += steps * gathered
  prog.terms = terms
  prog.note = (f"{calls} calls × {b} rows, {steps_total} decode steps "
               f"({steps_total / max(calls, 1):.0f} per call), token efficiency "
               f"{resp.sum() / max(b * steps_total, 1):.1%}, {ncoll:.0f} collectives/step")
  return prog


def kv_budget(st: Setup, tp: int) -> float:
  """KV bytes per chip the engine may fill: HBM less headroom, train state, bf16 weights and
  workspace."""
  k = st.knobs
  return ((1 - k.headroom) * st.hbm - st.resident - 2.0 * st.arch.params / tp
          - k.workspace_gb * GB)


def _interval_cost(m: int, x0: float, n: int, a_: float, b_: float, g: float) -> float:
  """Σ_{j<m} max(a_ + b_ (x0 + n j), g): m steps with x0 + n j live tokens."""
  if m <= 0:
    return 0.0
  if b_ * n > 0:
    kstar = min(m, max(0, math.ceil((g - a_ - b_ * x0) / (b_ * n))))
  else:
    kstar = m if a_ + b_ * x0 < g else 0
  rest = m - kstar
  lin = rest * (a_ + b_ * x0) + b_ * n * (kstar * rest + rest * (rest - 1) / 2.0)
  return kstar * g + lin


@dataclasses.dataclass
class Replica:
  """One decode replica's rollout in the event simulation (seconds, steps, tokens)."""
  cost: float = 0.0          # decode seconds (weights, KV, compute, latency, all-reduces)
  prefill: float = 0.0       # real-token prefill (the unbuilt engine and the floor)
  steps: int = 0
  weights: float = 0.0
  kv: float = 0.0
  pad: float = 0.0           # the kernel's whole KV blocks
  allreduce: float = 0.0
  live_tokens: float = 0.0   # Σ over steps and live slots of KV tokens
  slot_steps: float = 0.0    # Σ over steps of live slots
  pool_bound: int = 0        # steps on which the pool, not the slots, held admission back
  evictions: int = 0
  redone: float = 0.0        # tokens decoded again after an eviction
  rows_steps: dict = dataclasses.field(default_factory=dict)  # rows per step -> steps


def bucket_rows(live: int, buckets: tuple[int, ...]) -> int:
  """The rows a decode step runs for `live` occupied slots: the smallest bucket ≥ live
  (buckets largest first, the largest every slot)."""
  return min((b for b in buckets if b >= live), default=buckets[0])


def simulate_replica(lens, ps, *, cap: float, max_live: int | None, a_: float, b_: float,
                     per_row: float, lat: float, row_ar: float, pad: float, prefill_tok: float,
                     reserve: float | None, buckets: tuple[int, ...] | None = None
                     ) -> Replica:
  """A replica's responses (lengths `lens`, prompts `ps`, FIFO) on continuous batching.

  Admitted while fewer than `max_live` are live and the pool holds the prompt: live KV X + (n
  + 1) · reserve + prompt ≤ cap (or none is live). A step with n live slots costs max(a_ + b_
  (X + n · pad), compute) + lat + rows · row_ar, compute = rows · per_row, rows = the
  smallest of `buckets` ≥ n (the built engine's decode-chunk shapes, largest = max_live;
  None: (max_live,), its fixed-shape step over every slot), or n (unbuilt: max_live None).
  The engine picks its bucket from the slots it holds, which lag a response's end by at most
  two chunks (the overlapped host loop); the model takes the live count, so it undercounts
  that lag. reserve (the engine as built, else None: no eviction): tokens each live slot
  holds beyond its KV (the pages reserved ahead and a half page); when X + n · reserve would
  pass cap the youngest response is evicted (its KV freed, its tokens decoded again from its
  prompt later: `slots.Scheduler.reserve`), and admission waits for the next response to
  finish.
  """
  rep = Replica()
  if buckets is None and max_live is not None:
    buckets = (max_live,)
  queue = collections.deque(range(len(lens)))
  heap: list = []          # (finish step, seq)
  running: dict = {}       # seq -> (index, start step)
  order: list = []         # seqs by admission (the youngest last; lazily pruned)
  now, x, live, seq, blocked = 0, 0.0, 0, 0, False
  while queue or running:
    if not blocked:
      while queue and (max_live is None or live < max_live):
        i = queue[0]
        fits = (x + ps[i] + (live + 1) * (reserve or 0.0) <= cap) if reserve is not None \
            else x + ps[i] < cap
        if not (fits or live == 0):
          break
        queue.popleft()
        running[seq] = (i, now)
        heapq.heappush(heap, (now + int(lens[i]), seq))
        order.append(seq)
        seq += 1
        x += ps[i]
        rep.prefill += ps[i] * prefill_tok
        live += 1
    while heap[0][1] not in running:   # evicted: its finish is stale
      heapq.heappop(heap)
    m = heap[0][0] - now
    evict = False
    if reserve is not None and live > 1:
      room = cap - x - live * reserve
      if live * m > room:
        m, evict = max(0, int(room // live)), True
    if queue and (max_live is None or live < max_live):
      rep.pool_bound += m
    rows = bucket_rows(live, buckets) if buckets else live
    if buckets and len(buckets) > 1:
      rep.rows_steps[rows] = rep.rows_steps.get(rows, 0) + m
    rep.cost += (_interval_cost(m, x + live * pad, live, a_, b_, rows * per_row)
                 + m * lat + m * rows * row_ar)
    rep.allreduce += m * rows * row_ar
    rep.weights += m * a_
    rep.kv += _interval_cost(m, x, live, 0.0, b_, 0.0)
    rep.pad += m * live * pad * b_
    rep.live_tokens += m * x + live * m * (m - 1) / 2.0
    rep.slot_steps += m * live
    x += live * m
    now += m
    if evict:
      while order[-1] not in running:
        order.pop()
      i, start = running.pop(order.pop())
      x -= ps[i] + (now - start)
      live -= 1
      queue.appendleft(i)
      rep.evictions += 1
      rep.redone += now - start
      blocked = True
      continue
    while heap and heap[0][0] == now:
      _, done = heapq.heappop(heap)
      if done in running:
        i, _ = running.pop(done)
        x -= ps[i] + lens[i]
        live -= 1
        blocked = False
  rep.steps = now
  return rep


def continuous_rollout(st: Setup, resp: np.ndarray, prompts: np.ndarray, floor: bool,
                       name: str = "rollout", n: int | None = None,
                       engine: EngineShape | None = None) -> Program:
  """Continuous batching on replicas of tp chips: event-driven, step cost linear in live KV
  (`simulate_replica`).

  Per replica (sequences dealt round robin, admitted FIFO while live KV tokens < the cap
  and fewer than `slots` are live): a step with n live sequences holding X tokens costs
  max((weights + X kv_bytes / tp) / BW', rows (m + head) / tp / (peak · mfu')) + latency
  + rows · `step_terms.decode_allreduce_s` (the TP all-reduces' bytes), rows = the slots of
  a built engine, whose step has a fixed shape (its matmuls and all-reduces run over every
  slot, live or idle), else the live rows. The rollout ends with the slowest replica. A
  response of ℓ tokens is ℓ steps (its first token comes from the prefill: one fewer decode
  step in fact, as compile_check counts).

  engine (with `--engine_layout=built`, never for the floor): the engine as built, its
  `replicas` of tp = Setup.tensor chips (heads over mesh.tensor), each with slots / replicas
  slots and kv_tokens / replicas as the cap; late in a run the pool, not the slots, bounds
  the live responses, and the engine evicts the youngest when its reserved pages run
  short (counted: `simulate_replica`). Otherwise replicas of `--engine_tp` chips, no slot
  limit, a cap of admit · kv_budget · tp / kv_bytes tokens.
  """
  a, k = st.arch, st.knobs
  n = n or st.n                  # responses per prompt: one prefill per prompt
  kvb = a.kv_bytes()
  if engine is not None and not floor:
    reps = engine.replicas
    tp, cap, max_live = st.tensor, engine.kv_tokens / reps, engine.slots // reps
  else:
    tp = k.engine_tp
    reps, max_live = max(1, st.chips // tp), None
    cap = k.engine_admit * kv_budget(st, tp) * tp / kvb
  bw = st.bw * (k.floor_bw if floor else k.bw_efficiency)
  rate = st.peak * (1.0 if floor else k.mfu)
  w = 2.0 * a.decode_weights / tp   # bf16 copy; an untied embedding is only looked up
  a_, b_ = w / bw, kvb / tp / bw
  per_tok = (a.matmul + a.head) / tp / rate
  lat = 0.0 if floor else (2.0 * a.layers + 2) * k.collective_latency_us * 1e-6
  # Their bytes: the TP all-reduces of each decode row's activations (`decode_allreduce_s`),
  # for every slot of a built engine's fixed-shape step, else for the live rows.
  row_ar = 0.0 if floor else step_terms.decode_allreduce_s(st, tp)
  # The engine as built: its prefill as it runs (every prompt at its bucket, on every
  # replica: `step_terms.engine_prefill`) instead of real prompt tokens ÷ replicas; the
  # Pallas kernel's KV blocks (a slot reads whole blocks: (Bt − 1) / 2 tokens more per step);
  # the pages each slot holds ahead of its KV (two chunks with overlap, one without) and
  # half a page, which the pool's admission and eviction count.
  built = engine is not None and not floor
  max_pages = -(-(st.prompt_len + st.max_new - 1) // engine.page_size) if built else 0
  block = step_terms.kernel_block_tokens(engine, max_pages) if built else 0
  pad = (block - 1) / 2.0 if block else 0.0
  reserve = None
  if built and cap < max_live * max_pages * engine.page_size:
    # (A pool of whole responses for every slot never binds: a slot holds at most one.)
    reserve = ((2 if engine.overlap else 1) * engine.chunk_steps
               + (engine.page_size - 1) / 2.0)
  prefill_tok = 0.0 if built else (a.matmul / tp) / (
      st.peak * (k.mfu_ceiling if floor else k.mfu)) / n
  worst, worst_terms, flops, steps_max, worst_live = 0.0, {}, 0.0, 0, 0.0
  worst_rep, evictions, redone = None, 0, 0.0
  for r in range(reps):
    lens, ps = resp[r::reps], prompts[r::reps]
    if not len(lens):
      continue
    rep = simulate_replica(lens, ps, cap=cap, max_live=max_live if built else None,
                           a_=a_, b_=b_, per_row=per_tok, lat=lat, row_ar=row_ar, pad=pad,
                           prefill_tok=prefill_tok, reserve=reserve,
                           buckets=engine.row_buckets() if built else None)
    evictions += rep.evictions
    redone += rep.redone
    total = rep.cost + rep.prefill
    flops += (a.matmul + a.head) * float(lens.sum() + rep.redone
                                         + (0 if built else ps.sum() / n)) / tp
    if total > worst:
      worst, steps_max, worst_rep = total, rep.steps, rep
      worst_live = rep.live_tokens / max(1.0, rep.slot_steps)
      mem = rep.weights + rep.kv + rep.pad
      now_lat = rep.steps * lat
      worst_terms = {"decode weights": rep.weights, "decode KV": rep.kv,
                     "decode compute": max(0.0, rep.cost - now_lat - rep.allreduce - mem),
                     "decode latency": now_lat, "decode all-reduce bytes": rep.allreduce,
                     "prefill": rep.prefill}
      if built:
        worst_terms["decode kernel blocks"] = rep.pad
  pre = worst_rep.prefill if worst_rep is not None else 0.0
  mem_time = worst_terms.get("decode weights", 0.0) + worst_terms.get("decode KV", 0.0)
  prog = Program(name, flops / reps, mem_time * bw,
                 0 if floor else steps_max * (2 * a.layers + 2))
  if not floor:
    reshard = 2.0 * a.params / tp / st.ici
    worst_terms["bf16 reshard"] = reshard
  prog.terms = worst_terms
  prog.steps = steps_max
  if built:
    secs, pf_flops, pf_coll, line = step_terms.engine_prefill(st, prompts[::n], tp, reps,
                                                              engine.slots, n)
    prog.terms["prefill"] = secs
    prog.flops += pf_flops
    prog.collectives += pf_coll
    prog.lines.append(line)
    decode_s = worst - pre   # the slowest replica's decode: what a chunk in flight hides
    secs, line = step_terms.host_gap(st, engine, steps_max, worst_live, len(resp), decode_s)
    prog.terms["host gap"] = secs
    prog.lines.append(line)
    line = step_terms.kernel_line(st, engine, block, prog.terms["decode kernel blocks"], tp,
                                  max_pages)
    prog.lines.append(line)
    prog.lines.append(pool_line(worst_rep, max_live, cap, evictions, redone, resp))
  if max_live is not None:
    prog.note = (f"as built: {reps} replicas × TP{tp} of {max_live} slots, a pool of "
                 f"{cap:.0f} tokens each ({cap * kvb / tp / GB:.1f} GB/chip), slowest "
                 f"replica {steps_max} steps")
    if worst_rep is not None and len(engine.row_buckets()) > 1:
      by = ", ".join(f"{r} rows {worst_rep.rows_steps.get(r, 0) / max(1, steps_max):.0%}"
                     for r in engine.row_buckets())
      prog.note += f"; its decode steps by bucket: {by}"
  else:
    prog.note = (f"{reps} replicas × TP{tp}, KV budget {kv_budget(st, tp) / GB:.1f} GB/chip "
                 f"(≈{cap:.0f} live tokens), slowest replica {steps_max} steps")
  return prog



def pool_line(rep: Replica | None, slots: int, cap: float, evictions: int, redone: float,
              resp: np.ndarray) -> str:
  """The KV pool's hold on the built engine's live slots (the slowest replica) and the
  evictions of all replicas."""
  if rep is None:
    return ""
  live = rep.slot_steps / max(1, rep.steps)
  return (f"KV pool of {cap:,.0f} tokens per replica: {live:.0f} of {slots} slots live on "
          f"average (slowest replica), admission held back by the pool on "
          f"{rep.pool_bound / max(1, rep.steps):.0%} of its steps; {evictions:,} evictions "
          f"in all replicas, {redone:,.0f} tokens decoded again "
          f"({redone / max(1.0, float(resp.sum())):.1%} of the rollout's)")
