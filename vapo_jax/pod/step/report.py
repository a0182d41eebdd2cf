"""One RL step and its floor, from a length spec: the programs of `train` and `rollout` summed,
the analytic FLOPs per compiled program (compile_check's cross-check), and the printed report."""

from __future__ import annotations

import dataclasses

import numpy as np

from vapo_jax.pod.step import counts as step_counts
from vapo_jax.pod.step import efficiency
from vapo_jax.pod.step import terms as step_terms
from vapo_jax.pod.step.rollout import continuous_rollout, static_rollout
from vapo_jax.pod.step.setup import Program, Setup
from vapo_jax.pod.step.train import train_side



@dataclasses.dataclass
class Step:
  programs: list[Program]

  @property
  def time(self) -> float:
    return sum(p.time for p in self.programs)

  def dominant(self, n: int = 3) -> list[tuple[str, float]]:
    terms = [(f"{p.name}: {k}", v) for p in self.programs for k, v in p.terms.items()]
    return sorted(terms, key=lambda kv: -kv[1])[:n]


def _eval_lengths(st: Setup, resp: np.ndarray) -> np.ndarray:
  """Evaluation response lengths: the rollout's distribution (an assumption), eval_rows rows."""
  if not st.eval_rows:
    return resp[:0]
  idx = np.linspace(0, len(resp) - 1, st.eval_rows).astype(int)
  return np.random.default_rng(1).permutation(np.sort(resp)[idx])


def estimate(st: Setup, resp: np.ndarray, prompts: np.ndarray) -> Step:
  """One RL step with the knobs' code paths (today: padded, static)."""
  built = st.knobs.engine_layout == "built"
  if built and st.knobs.rollout == "continuous" and st.engine is None:
    raise ValueError("the engine's KV pool cannot hold one whole response on this slice "
                     "(sampler.kv_pool); use a larger slice or --engine_layout=replicas")
  if st.knobs.rollout == "continuous":
    roll = continuous_rollout(st, resp, prompts, floor=False,
                              engine=st.engine if built else None)
  else:
    roll = static_rollout(st, resp)
  progs = [roll, Program("reward", note="host process pool, overlaps the forwards: 0 s")]
  progs += train_side(st, resp, prompts)
  ev_resp = _eval_lengths(st, resp)
  if len(ev_resp):
    ev = (continuous_rollout(st, ev_resp, prompts[:len(ev_resp)], False, "evaluation",
                             st.eval_n, engine=st.eval_engine if built else None)
          if st.knobs.rollout == "continuous" else
          static_rollout(st, ev_resp, "evaluation", st.eval_per_call, st.eval_n))
    ev.terms = {k: v / st.eval_every for k, v in ev.terms.items()}
    ev.flops /= st.eval_every
    ev.hbm_bytes /= st.eval_every
    ev.collectives /= st.eval_every
    ev.note = f"every {st.eval_every} steps, amortised; " + ev.note
    progs.append(ev)
  return Step(progs)


def floor(st: Setup, resp: np.ndarray, prompts: np.ndarray) -> Step:
  """The physical floor of the same step (see the module docstring)."""
  progs = [continuous_rollout(st, resp, prompts, floor=True)]
  progs += train_side(st, resp, prompts, floor=True)
  ev_resp = _eval_lengths(st, resp)
  if len(ev_resp):
    ev = continuous_rollout(st, ev_resp, prompts[:len(ev_resp)], True, "evaluation",
                            st.eval_n)
    ev.terms = {k: v / st.eval_every for k, v in ev.terms.items()}
    progs.append(ev)
  return Step(progs)


ENGINE_ONLY = ("decode_copy", "insert", "decode_chunk", "eval_insert", "eval_decode_chunk")


def program_flops(st: Setup, name: str, engine: bool = False) -> float:
  """Analytic FLOPs per chip of one call of a `pod.programs` program (padded shapes; the
  standalone decode steps attend the whole cache of P + R slots). engine: the rollout
  engine's programs (its prefill: one prompt, on every tensor group: FLOPs / tensor)."""
  if engine and name == "prefill":
    return sum(step_counts.forward_flops(st.arch, 1, st.prompt_len, 1).values()) / st.tensor
  a = st.arch
  t = st.prompt_len + st.max_new
  fwd = step_counts.forward_flops(a, 1, t, step_counts.padded_head_positions(st.max_new))
  crit = step_counts.forward_flops(a, 1, t, t, critic=True)
  fac = step_counts.train_factors(a.remat, selective=a.selective)  # padded: the jax path
  mb = st.rows // max(1, st.minibatches)
  down = a.down * a.full_remat
  per_row = {
      "policy_step": mb * (sum(fac[k] * v for k, v in fwd.items()) - t * down),
      "critic_step": mb * (sum(fac[k] * v for k, v in crit.items()) - t * down),
      "logprobs": st.rows * sum(fwd.values()),
      "values": st.rows * sum(crit.values()),
      "prefill": sum(step_counts.forward_flops(a, st.per_call, st.prompt_len, 1).values()),
      "decode_step": step_counts.decode_step_flops(a, st.per_call * st.n, t),
      "eval_decode_step": step_counts.decode_step_flops(a, st.eval_per_call, t),
  }
  if name not in per_row:
    raise ValueError(f"no analytic count for program {name!r}; known: {sorted(per_row)}")
  return per_row[name] / st.chips


def crosscheck(st: Setup, programs: dict) -> list[str]:
  """Lines comparing compile_check's XLA FLOPs (loop bodies once × micro-batch trips) with
  `program_flops`; programs: {name: {"flops": ...}} (compile_check's report)."""
  out = []
  engine = any(n in programs for n in ENGINE_ONLY)
  for name, p in programs.items():
    if p.get("error") or name in ENGINE_ONLY or "[" in name:
      continue  # the engine's programs (a live-length loop) and the packed ones
      # (test_programs_packed) have no count here
    ours = program_flops(st, name, engine)
    out.append(f"  {name:16s} XLA {p['flops'] / 1e12:10.1f} TFLOP/chip, analytic "
               f"{ours / 1e12:10.1f} (XLA / analytic {p['flops'] / ours:.2f})")
  return out


# ---------------------------------------------------------------------------- report
def lengths_for(st: Setup, spec: str, prompt_spec: str) -> tuple[np.ndarray, np.ndarray]:
  """(response lengths [B], real prompt lengths [B]) of one step from the specs."""
  from vapo_jax.pod import lengths  # pylint: disable=import-outside-toplevel
  resp = lengths.sample(spec, st.rows, st.max_new)
  prompts = lengths.sample(prompt_spec, st.rows, st.prompt_len, seed=2,
                           prefix="prompt/length_")
  return resp, prompts


def run(st: Setup, spec: str, prompt_spec: str) -> dict:
  """Estimate and floor of one length spec, as a dict (for --json and the table)."""
  resp, prompts = lengths_for(st, spec, prompt_spec)
  est, flo = estimate(st, resp, prompts), floor(st, resp, prompts)
  model = efficiency.model_flops(st, resp, prompts)
  # The floor at the estimate's own efficiency too (--mfu_ceiling = --mfu): the like-for-like
  # ratio, the code's own work and exposure at equal HFU.
  k = st.knobs
  same = (flo if k.mfu_ceiling == k.mfu else
          floor(dataclasses.replace(st, knobs=dataclasses.replace(k, mfu_ceiling=k.mfu)),
                resp, prompts))
  # The optimistic reading (`Knobs.optimistic`): the train programs and the floor again.
  other = {}
  if k.optimistic() != k:
    st_o = dataclasses.replace(st, knobs=k.optimistic())
    est_o = Step([p for p in est.programs if p.name not in efficiency.TRAIN]
                 + train_side(st_o, resp, prompts))
    flo_o = floor(st_o, resp, prompts)
    other = {"estimate_s": est_o.time, "floor_s": flo_o.time,
             "ratio": est_o.time / flo_o.time}
  tokens = float((resp + prompts).sum())
  return {"spec": spec, "mean_length": float(resp.mean()),
          "truncated": float((resp >= st.max_new).mean()),
          "estimate_s": est.time, "floor_s": flo.time, "ratio": est.time / flo.time,
          "floor_same_s": same.time, "ratio_same": est.time / same.time,
          "optimistic": other, "tokens": tokens,
          "tokens_per_s_chip": tokens / est.time / st.chips, "peak": st.peak,
          "hidden_share": hidden_shares(est.programs),
          "efficiency": {"estimate": efficiency.of(st, est.programs, model),
                         "floor": efficiency.of(st, flo.programs, model)},
          "mfu": (k.mfu, k.mfu_ceiling),
          "dominant": est.dominant(), "programs": est.programs, "floor_programs": flo.programs,
          "layouts": layouts(st, est, resp, prompts) if st.knobs.compare_layouts else []}


# NeMo-RL v0.4 (docs/about/performance-summary.md): GRPO on Qwen3-32B, 32 H100s, 2,048
# samples of ~3,206 tokens (4k cap), 393 s per step: tokens per second per GPU, and the
# H100's dense bf16 peak.
PEER = {"name": "NeMo-RL GRPO, Qwen3-32B, 32 H100s", "tokens_per_s": 540.0, "peak": 989e12}


def hidden_shares(programs: list) -> dict:
  """{train program: (hidden traffic s, compute s)} (`train.hidden_line`)."""
  return {p.name: (p.hidden, p.terms.get("matmul", 0.0) + p.terms.get("attention", 0.0))
          for p in programs if p.hidden}


def throughput_line(r: dict) -> str:
  per_pf = r["tokens_per_s_chip"] / (r["peak"] / 1e15)
  peer = PEER["tokens_per_s"] / (PEER["peak"] / 1e15)
  return (f"end-to-end: {r['tokens']:,.0f} tokens (prompt + response) per step / "
          f"{r['estimate_s']:,.0f} s = {r['tokens_per_s_chip']:,.0f} tokens/s per chip, "
          f"rollout, old log-probs, critic and evaluation included ({per_pf:,.0f} per PFLOP/s "
          f"of bf16 peak); {PEER['name']}: {PEER['tokens_per_s']:.0f} tokens/s per GPU "
          f"({peer:,.0f} per PFLOP/s; GRPO: no critic, responses of ≤ 4k)")


def layouts(st: Setup, est: Step, resp: np.ndarray, prompts: np.ndarray) -> list[str]:
  """`step_terms.layout_line` of the packed train side on FSDP × mesh.tensor and on
  FSDP-only meshes of the same chips (issue 44 item 3; arithmetic, not a compile)."""
  if st.knobs.train != "packed":
    return ["train layouts: compared for packed rows only (--train=packed)"]
  compute = sum(p.terms.get("matmul", 0.0) + p.terms.get("attention", 0.0)
                for p in est.programs if p.name in ("logprobs", "values", "policy_step",
                                                    "critic_step"))
  tps = sorted({t for t in (st.tensor, st.train_tp, 2, 1)
                if t <= max(st.tensor, st.train_tp) and st.chips % t == 0}, reverse=True)
  return [step_terms.layout_line(st, step_terms.train_layout(st, tp, resp, prompts), compute)
          for tp in tps]


def format_report(label: str, r: dict) -> str:
  lines = [f"{label} ({r['spec']}: mean {r['mean_length']:.0f} tokens, "
           f"{r['truncated']:.1%} truncated)",
           f"  {'program':12s} {'TFLOP/chip':>11s} {'HBM TB/chip':>12s} {'collectives':>12s} "
           f"{'time s':>9s}  terms"]
  for p in r["programs"]:
    terms = ", ".join(f"{k} {v:.0f}" for k, v in sorted(p.terms.items(), key=lambda kv: -kv[1])
                      if v >= 0.5)
    lines.append(f"  {p.name:12s} {p.flops / 1e12:11.1f} {p.hbm_bytes / 1e12:12.1f} "
                 f"{p.collectives:12.0f} {p.time:9.0f}  {terms}")
    if p.note:
      lines.append(f"  {'':12s} {p.note}")
    for extra in p.lines:
      if extra:
        lines.append(f"  {'':12s} + {extra}")
  fl = ", ".join(f"{p.name} {p.time:.0f}" for p in r["floor_programs"])
  lines.append(f"  step estimate {r['estimate_s']:.0f} s; floor {r['floor_s']:.0f} s ({fl}); "
               f"ratio {r['ratio']:.2f}×")
  if r.get("optimistic"):
    o = r["optimistic"]
    lines.append(f"  optimistic reading (permutes at a two-link ring's bandwidth, hidden "
                 f"traffic free, the floor's HBM at 100%): estimate {o['estimate_s']:.0f} s, "
                 f"floor {o['floor_s']:.0f} s, ratio {o['ratio']:.2f}×")
  if r.get("hidden_share"):
    lines.append("  hidden traffic / compute: " + ", ".join(
        f"{k} {h:.0f} / {c:.0f} s ({h / max(c, 1e-30):.0%})"
        for k, (h, c) in r["hidden_share"].items()))
  if "tokens" in r:
    lines.append("  " + throughput_line(r))
  if "efficiency" in r:
    lines.append("  " + efficiency.line(r["efficiency"]["estimate"], r["efficiency"]["floor"]))
    mfu, ceiling = r["mfu"]
    if mfu != ceiling:
      lines.append(f"  at equal compute efficiency (the floor at --hfu={mfu:g} too, not "
                   f"{ceiling:g}): floor {r['floor_same_s']:.0f} s, ratio "
                   f"{r['ratio_same']:.2f}×")
  lines.append("  dominant: " + "; ".join(f"{k} {v:.0f} s" for k, v in r["dominant"]))
  for line in r.get("layouts", []):
    lines.append("  train layout " + line)
  lines.append("  " + step_terms.NOT_COUNTED)
  return "\n".join(lines)

