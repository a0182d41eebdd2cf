"""The rollout of one RL step: the static sampler's windowed calls, or the continuous engine as
an event simulation per decode replica (formulas: `vapo_jax.pod.step`)."""

from __future__ import annotations

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


def continuous_rollout(st: Setup, resp: np.ndarray, prompts: np.ndarray, floor: bool,
                       name: str = "rollout", n: int | None = None,
                       engine: EngineShape | None = None) -> Program:
  """Continuous batching on replicas of tp chips: event-driven, step cost linear in live KV.

  Per replica (sequences dealt round robin, admitted FIFO while live KV tokens < the cap
  and fewer than `slots` are live): a step with n live sequences holding X tokens costs
  max((weights + X kv_bytes / tp) / BW', n (m + head) / tp / (peak · mfu')) + latency
  + rows · `step_terms.decode_allreduce_s` (the TP all-reduces' bytes; rows = the slots of
  a built engine, whose step has a fixed shape, else the live rows).
  The rollout ends with the slowest replica. A response of ℓ tokens is ℓ steps (its first
  token comes from the prefill: one fewer decode step in fact, as compile_check counts).

  engine (with `--engine_layout=built`, never for the floor): the engine as built, its
  `replicas` of tp = Setup.tensor chips (heads over mesh.tensor), each with slots / replicas
  slots and kv_tokens / replicas as the cap. Otherwise replicas of `--engine_tp` chips, no
  slot limit, a cap of admit · kv_budget · tp / kv_bytes tokens.
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
  bw = st.bw * (1.0 if floor else k.bw_efficiency)
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
  # Pallas kernel's KV blocks (a slot reads whole blocks: (Bt − 1) / 2 tokens more per step).
  built = engine is not None and not floor
  max_pages = -(-(st.prompt_len + st.max_new - 1) // engine.page_size) if built else 0
  block = step_terms.kernel_block_tokens(engine, max_pages) if built else 0
  pad = (block - 1) / 2.0 if block else 0.0
  worst, worst_terms, flops, steps_max, worst_live = 0.0, {}, 0.0, 0, 0.0
  for r in range(reps):
    lens, ps = resp[r::reps], prompts[r::reps]
    if not len(lens):
      continue
    now, x, live, q, heap = 0, 0.0, 0, 0, []
    cost = pre = 0.0
    w_time = kv_time = pad_time = live_sum = slot_steps = ar_time = 0.0
    while q < len(lens) or heap:
      while q < len(lens) and (x + ps[q] < cap or live == 0) and (
          max_live is None or live < max_live):
        heapq.heappush(heap, (now + int(lens[q]), int(ps[q]) + int(lens[q])))
        x += ps[q]
        if not built:
          pre += ps[q] * (a.matmul / tp) / (st.peak * (k.mfu_ceiling if floor else k.mfu)) / n
        live += 1
        q += 1
      nxt = heap[0][0]
      m = nxt - now
      c = _interval_cost(m, x + live * pad, live, a_, b_, live * per_tok)
      ar = m * (max_live if max_live is not None else live) * row_ar
      cost += c + m * lat + ar
      ar_time += ar
      w_time += m * a_
      kv_time += _interval_cost(m, x, live, 0.0, b_, 0.0)
      pad_time += m * live * pad * b_
      live_sum += m * x + live * m * (m - 1) / 2.0   # Σ over the m steps of live tokens
      slot_steps += m * live
      x += live * m
      now = nxt
      while heap and heap[0][0] == now:
        _, tot = heapq.heappop(heap)
        x -= tot
        live -= 1
    total = cost + pre
    flops += (a.matmul + a.head) * float(lens.sum() + (0 if built else ps.sum() / n)) / tp
    if total > worst:
      worst, steps_max = total, now
      worst_live = live_sum / max(1.0, slot_steps)
      mem = w_time + kv_time + pad_time
      worst_terms = {"decode weights": w_time, "decode KV": kv_time,
                     "decode compute": max(0.0, cost - now * lat - ar_time - mem),
                     "decode latency": now * lat, "decode all-reduce bytes": ar_time,
                     "prefill": pre}
      if built:
        worst_terms["decode kernel blocks"] = pad_time
  mem_time = worst_terms.get("decode weights", 0.0) + worst_terms.get("decode KV", 0.0)
  prog = Program(name, flops / reps, mem_time * bw,
                 0 if floor else steps_max * (2 * a.layers + 2))
  if not floor:
    reshard = 2.0 * a.params / tp / st.ici
    worst_terms["bf16 reshard"] = reshard
  prog.terms = worst_terms
  prog.steps = steps_max
  if built:
    secs, pf_flops, pf_coll, line = step_terms.engine_prefill(st, prompts[::n], tp, reps)
    prog.terms["prefill"] = secs
    prog.flops += pf_flops
    prog.collectives += pf_coll
    prog.lines.append(line)
    decode_s = worst - pre   # the slowest replica's decode: what a chunk in flight hides
    secs, line = step_terms.host_gap(st, engine, steps_max, worst_live, len(resp), decode_s)
    prog.terms["host gap"] = secs
    prog.lines.append(line)
    line = step_terms.kernel_line(st, engine, block, prog.terms["decode kernel blocks"], tp)
    prog.lines.append(line)
  if max_live is not None:
    prog.note = (f"as built: {reps} replicas × TP{tp} of {max_live} slots, a pool of "
                 f"{cap:.0f} tokens each ({cap * kvb / tp / GB:.1f} GB/chip), slowest "
                 f"replica {steps_max} steps")
  else:
    prog.note = (f"{reps} replicas × TP{tp}, KV budget {kv_budget(st, tp) / GB:.1f} GB/chip "
                 f"(≈{cap:.0f} live tokens), slowest replica {steps_max} steps")
  return prog

