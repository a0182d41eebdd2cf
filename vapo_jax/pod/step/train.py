"""The train side of one RL step: the old-log-prob and value forwards and the policy and critic
updates, padded or packed (the code's own planner), per chip (formulas: `vapo_jax.pod.step`)."""

from __future__ import annotations

import numpy as np

from vapo_jax.pod.step import counts as step_counts
from vapo_jax.pod.step import terms as step_terms
from vapo_jax.pod.step.setup import Program, Setup



def _train_program(st: Setup, name: str, rows_t: list[tuple[int, int, float, float]],
                   critic: bool, train: bool, floor: bool) -> Program:
  """rows_t: [(count, T, pairs per row, head positions per row)]."""
  a, k = st.arch, st.knobs
  mfu = k.mfu_ceiling if floor else k.mfu
  splash = a.kernel == "splash" and not floor
  fac = (step_counts.train_factors(0.0 if floor else a.remat, "splash" if splash else "jax",
                                   0.0 if floor else a.selective)
         if train else {"matmul": 1.0, "attention": 1.0, "head": 1.0})
  if floor and train:
    fac = {"matmul": 3.0, "attention": 3.5, "head": 3.0}
  tokens = sum(c * t for c, t, _, _ in rows_t)
  mm = tokens * a.matmul * fac["matmul"]
  if train and a.full_remat and not floor:  # a full remat's recompute drops MLP down
    mm -= tokens * a.down * a.full_remat
  at = sum(c * pr for c, _, pr, _ in rows_t) * a.pair * fac["attention"]
  hd = sum(c * hp for c, _, _, hp in rows_t) * (2.0 * a.d if critic else a.head) * fac["head"]
  chips, rate = st.chips, st.peak * mfu
  # HBM bytes per (pair, head): the pure-JAX scan's f32 scores (--attn_score_bytes), or the
  # splash kernel's key / value block reads (its scores stay on chip).
  per_pair = ((lambda t: a.splash_score_bytes(t)) if splash
              else (lambda t: k.attn_score_bytes))
  score_bytes = 0.0 if floor else (sum(c * pr * per_pair(t) for c, t, pr, _ in rows_t)
                                   * a.layers * a.h * fac["attention"])
  if splash and train:  # the fused backward's dq partials (0 with the split kernels)
    score_bytes += sum(c * step_counts.splash_dq_bytes(a, t) for c, t, _, _ in rows_t)
  weights = (a.critic_params if critic else a.params) * 2.0 / st.train_tp
  prog = Program(name, (mm + at + hd) / chips, score_bytes / chips + weights)
  prog.terms = {"matmul": (mm + hd) / chips / rate,
                "attention": max(at / chips / rate,
                                 score_bytes / chips / (st.bw * k.bw_efficiency))}
  if score_bytes / chips / (st.bw * k.bw_efficiency) > at / chips / rate:
    prog.note = ("attention bound by its HBM " + ("key / value block reads" if splash
                                                  else "score traffic"))
  return prog


def attention_line(st: Setup, rows_t: list, seq: np.ndarray) -> str:
  """What a train pass's attention and rows compute against the exact work: its kernel,
  pairs / Σ n (n + 1) / 2 of the real sequences, real / computed tokens, row lengths."""
  a = st.arch
  if a.kernel == "splash":
    kind = ("jax's Pallas splash kernel (block tables per row, no score traffic; backward "
            + ("fused, its dq partials through HBM)" if step_counts.splash_bwd() == 2.5
               else "as separate dq and dk/dv kernels)"))
  elif a.uses_blocked(st.prompt_len + st.max_new, st.prompt_len + st.max_new):
    kind = (f"the pure-JAX blocked scan (C = {a.block}; key blocks skipped per micro-batch; "
            f"f32 scores through HBM, {st.knobs.attn_score_bytes:g} B per pair and head)")
  else:
    kind = "the pure-JAX dense path"
  seq = np.asarray(seq, np.float64)
  exact = float((seq * (seq + 1) / 2).sum())
  pairs = sum(c * pr for c, _, pr, _ in rows_t)
  tokens = sum(c * t for c, t, _, _ in rows_t)
  lens = sorted({t for _, t, _, _ in rows_t})
  return (f"attention: {kind}: {pairs / exact:.2f}× the exact causal pairs per pass; "
          f"{seq.sum() / tokens:.1%} of its {tokens / 1e6:.1f}M computed tokens real; "
          f"rows of {', '.join(str(t) for t in lens)}")


def head_positions(plan, micro: int, chunk: int = 128) -> float:
  """Per row, the LM head's positions in packed micro-batch `micro`: each shard runs the
  chunks up to the shard with the most response tokens (`policy.packed_logprobs`)."""
  d = plan.shards
  per_shard = plan.rows // d
  here = (plan.micro_B == micro) & (plan.response_B > 0)
  counts = np.bincount(plan.row_B[here] // per_shard, plan.response_B[here], minlength=d)
  return float(-(-int(counts.max(initial=0)) // chunk) * chunk) / per_shard


def packed_groups(st: Setup, spec, prompts: np.ndarray, resp: np.ndarray, calls: int = 1
                  ) -> list[tuple[int, int, float, float]]:
  """The `_train_program` rows of a packed pass run on `calls` equal slices of the batch:
  each slice planned by the code's own planner (`packing.plan` with the pass's PackSpec),
  per packed micro-batch (n rows of T, the attention pairs `step_counts.packed_pairs` gives
  for its layout, the LM head at the response slots: `policy.packed_logprobs` projects each
  shard's response tokens rounded up to a chunk, `head_positions` per row)."""
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  out = []
  per = len(resp) // calls
  for i in range(calls):
    plan = packing.plan(prompts[i * per:(i + 1) * per], resp[i * per:(i + 1) * per], spec)
    n, k, t = plan.shape
    segs = packing.row_segments(plan)
    for mk in range(k):
      pairs = step_counts.packed_pairs(st.arch, [segs.get((mk, r), []) for r in range(n)], t)
      out.append((n, t, pairs / n, head_positions(plan, mk)))
  return out


def hidden_line(prog: Program, hidden: float, bound: bool) -> str:
  """The hidden traffic's share of the program's compute; with `bound` (`Knobs.hidden_bound`)
  the program takes at least that long: the excess is a term of its own."""
  compute = prog.terms.get("matmul", 0.0) + prog.terms.get("attention", 0.0)
  prog.hidden = hidden
  beyond = max(0.0, hidden - compute)
  text = f" = {hidden / max(compute, 1e-30):.0%} of its {compute:.0f} s of compute"
  if not bound:
    return text + " (not counted: --nohidden_bound)"
  if beyond:
    prog.terms["hidden traffic beyond compute"] = beyond
    return text + f": the program takes the traffic's time, +{beyond:.0f} s"
  return text + " (within it)"


def train_side(st: Setup, resp: np.ndarray, prompts: np.ndarray, floor: bool = False
               ) -> list[Program]:
  """logprobs (unless st.old_logprobs_pass is off), values, policy_step (all mini-batches ×
  epochs), critic_step."""
  a, k = st.arch, st.knobs
  t_row = st.prompt_len + st.max_new
  if floor:
    seq = prompts + resp
    groups = [(1, int(t), t * (t + 1) / 2.0, int(r)) for t, r in zip(seq, resp)]
  elif k.train == "packed":
    groups = packed_groups(st, st.pack_forward, prompts, resp)
    steps = packed_groups(st, st.pack_steps, prompts, resp, max(1, st.minibatches))
  elif a.kernel == "splash":
    # Padded rows on the splash kernel: per row its one segment [P − p_b, P + l_b).
    head = step_counts.padded_head_positions(st.max_new)
    count: dict[float, int] = {}
    for p_b, l_b in zip(prompts, resp):
      pr = step_counts.splash_pairs(a, [(st.prompt_len - int(p_b), int(p_b + l_b))], t_row)
      count[pr] = count.get(pr, 0) + 1
    groups = [(c, t_row, pr, head) for pr, c in sorted(count.items())]
  else:
    pr = step_counts.attention_pairs(a, t_row, t_row, causal=True)
    groups = [(st.rows, t_row, pr, step_counts.padded_head_positions(st.max_new))]
  if floor or k.train != "packed":
    steps = groups
  progs = ([_train_program(st, "logprobs", groups, False, False, floor)]
           if st.old_logprobs_pass else [])
  if st.use_critic:
    progs.append(_train_program(st, "values", groups, True, False, floor))
  ep = [(c * st.epochs, t, pr, hp) for c, t, pr, hp in steps]
  progs.append(_train_program(st, "policy_step", ep, False, True, floor))
  if st.use_critic:
    progs.append(_train_program(st, "critic_step", ep, True, True, floor))
  if floor:
    return progs
  for prog in progs:
    prog.lines.append(attention_line(st, steps if prog.name.endswith("_step") else groups,
                                     prompts + resp))
  # The micro-batches [(n rows, T)] and calls of each program per step, for its collectives.
  if k.train == "packed":  # one per packed micro-batch
    mbs = {"fwd": [(c, t) for c, t, _, _ in groups],
           "upd": [(c, t) for c, t, _, _ in steps] * st.epochs}
  else:
    per = max(1, st.micro_rows or st.rows // max(1, st.minibatches))
    mbs = {"fwd": [(per, t_row)] * -(-st.rows // per),
           "upd": [(per, t_row)] * (-(-st.rows // per) * st.epochs)}
  fwd_micro, upd_micro = len(mbs["fwd"]), len(mbs["upd"])
  upd_calls = max(1, st.minibatches) * st.epochs
  for prog in progs:
    update = prog.name.endswith("_step")
    secs, hidden, line = step_terms.train_collectives(
        st, prog.name, upd_micro if update else fwd_micro, upd_calls if update else 1)
    if line:
      line += hidden_line(prog, hidden, k.hidden_bound)
    if not line:  # not compiled: counted from the layout (`step_terms.layout_collectives`)
      secs, line = step_terms.layout_collectives(
          st, prog.name, mbs["upd" if update else "fwd"], update,
          a.critic_params if prog.name.startswith(("critic", "values")) else a.params,
          compute_s=sum(prog.terms.values()))
    if line:
      prog.terms["collectives"] = secs
      prog.lines.append(line)
  return progs

