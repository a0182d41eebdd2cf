"""What the compile check reads from one compiled program: its per-chip memory and cost
(`Result`, `compile_one`), two probes' figures extrapolated to the model's depth, the probes'
model and when they cannot stand for it, and the printed lines and verdict. The peak per chip:

  peak = resident + (arguments − its resident arguments) + temporaries + outputs − aliased

(`compile_check` for the whole check and its command).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import jax

from vapo_jax.models import platform
from vapo_jax.pod import slices
from vapo_jax.sampler import kv_pool

GB = 1e9


@dataclasses.dataclass
class Result:
  program: str
  fits: bool
  peak: float = 0.0          # bytes per chip
  arguments: float = 0.0
  temporaries: float = 0.0
  outputs: float = 0.0
  aliased: float = 0.0
  flops: float = 0.0         # per chip, one call (loop trip counts applied)
  bytes_accessed: float = 0.0
  compile_s: float = 0.0
  error: str = ""
  collectives: float = 0.0       # in the compiled HLO, loop bodies once (`hlo_stats`)
  collective_bytes: float = 0.0  # their result bytes per chip
  kernel_calls: int = 0          # Pallas (Mosaic) kernel call sites in the compiled HLO


def compile_one(prog, parts: dict[str, int], budget: float, device=None) -> Result:
  """Compiles one program; its per-chip memory and cost, or the compiler's refusal.

  device: one of the slice's (topology) devices, the default device while lowering: a
  Pallas kernel (the engine's decode attention) reads the TPU generation from it."""
  t0 = time.perf_counter()
  where = jax.default_device(device) if device is not None else contextlib.nullcontext()
  try:
    with platform.targeting("tpu"), where:  # trace the TPU forms, not this host's CPU ones
      compiled = prog.fn.lower(*prog.args, **prog.kwargs).compile()
  except Exception as e:  # pylint: disable=broad-except
    msg = str(e).split("\n")[0][:300]
    if "RESOURCE_EXHAUSTED" not in msg and "memory" not in msg.lower():
      raise
    return Result(prog.name, False, compile_s=time.perf_counter() - t0, error=msg)
  m = compiled.memory_analysis()
  from vapo_jax.pod import hlo_stats  # pylint: disable=import-outside-toplevel
  text = compiled.as_text()
  coll = hlo_stats.collectives(text)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  args, temp = m.argument_size_in_bytes, m.temp_size_in_bytes
  out, alias = m.output_size_in_bytes, m.alias_size_in_bytes
  resident = sum(parts[k] for k in prog.resident)
  peak = resident + (args - prog.resident_arg_bytes) + temp + out - alias
  # A loop body is counted once by XLA: scale by the micro-batch loop's trip count (the
  # small vocab-chunk loop inside, ~2% of a 32B forward, stays counted once).
  return Result(prog.name, peak <= budget, peak, args, temp, out, alias,
                prog.trips * float(cost.get("flops", 0.0)),
                prog.trips * float(cost.get("bytes accessed", 0.0)),
                time.perf_counter() - t0, collectives=coll.total,
                collective_bytes=coll.total_bytes, kernel_calls=text.count("tpu_custom_call"))


def step_time(results: dict[str, Result], plan, cfg, s: slices.Slice, mfu: float,
              bw: float) -> float:
  """Estimated seconds of one RL step (see the module docstring)."""

  def t(name):  # packed programs are name[rows=nxT], one per packed shape: their sum
    return sum(max(r.flops / (s.gen.bf16_flops * mfu),
                   r.bytes_accessed / (s.gen.hbm_bandwidth * bw))
               for key, r in results.items() if key.split("[")[0] == name)

  if "decode_chunk" in results:  # the engine: one prefill per prompt, one insert per row
    sh = plan.shapes
    rollout = (t("decode_copy") + cfg.rl.rollout_prompts * t("prefill") + sh["rows"] * t("insert")
               + sh["engine_chunks"] * t("decode_chunk"))  # decode_chunk: chunk_steps trips
    return rollout + t("logprobs") + t("values") + (
        cfg.rl.num_minibatches * cfg.rl.ppo_epochs * (t("policy_step") + t("critic_step")))
  calls = plan.shapes["rows"] // plan.shapes["sampler_rows"]
  rollout = calls * (t("prefill") + plan.shapes["response_len"] * t("decode_step"))
  updates = cfg.rl.num_minibatches * cfg.rl.ppo_epochs * (t("policy_step") + t("critic_step"))
  return rollout + t("logprobs") + t("values") + updates


def extrapolate(ra: Result, rb: Result, la: int, lb: int, layers: int, prog, parts,
                budget: float) -> Result:
  """The program's figures at `layers` layers, linear in the layer count from two compiles.

  Exact for identical stacked layers in everything that scales with them (parameters,
  optimizer state, remat checkpoints, per-layer KV cache, FLOPs); what does not (embedding,
  head, one layer's recomputation) is the intercept.
  """
  if ra.error or rb.error:
    return ra if ra.error else rb
  lin = lambda a, b: a + (b - a) * (layers - la) / (lb - la)  # noqa: E731
  f = {k: lin(getattr(ra, k), getattr(rb, k)) for k in
       ("arguments", "temporaries", "outputs", "aliased", "flops", "bytes_accessed",
        "collectives", "collective_bytes")}
  # Temporaries need not grow with depth (remat keeps one layer's activations); when XLA's
  # schedules of the two probes differ the line can slope down: never go below a probe.
  f["temporaries"] = max(f["temporaries"], ra.temporaries, rb.temporaries)
  resident = sum(parts[k] for k in prog.resident)
  peak = (resident + f["arguments"] - prog.resident_arg_bytes + f["temporaries"]
          + f["outputs"] - f["aliased"])
  return Result(prog.name, peak <= budget, peak, compile_s=ra.compile_s + rb.compile_s,
                error="", kernel_calls=round(lin(ra.kernel_calls, rb.kernel_calls)), **f)


def probe_refusal(mcfg, probe_layers: tuple[int, int]) -> str:
  """Why probes of these layer counts cannot stand for `mcfg`'s partial remat ("" if they
  can): each probe must rematerialise exactly the model's fraction N / L of its blocks, or
  the line through the two probes prices a kept block as a per-layer cost (48 of 64 with
  probes of 2 and 4 layers: 2 of 2 and 3 of 4, and the critic step extrapolated to 134 GB
  where 4- and 8-layer probes, 3 of 4 and 6 of 8, give 44 GB). With the blocks under scan
  (`ModelConfig.scan_layers`) a probe needs >= 2 layers: XLA inlines a one-trip scan."""
  if getattr(mcfg, "scan_layers", False) and min(probe_layers) < 2:
    return (f"probes of {','.join(str(k) for k in probe_layers)} layers: XLA inlines the "
            "blocks' scan at one layer, not the program of a deeper model; use "
            "--probe_layers=2,4 or more")
  n, total = mcfg.remat_layers, mcfg.num_layers
  sel = getattr(mcfg, "remat_selective", 0)
  if sel and sel < mcfg.num_remat:
    bad = [k for k in probe_layers if (sel * k) % total]
    if bad:
      step = total // math.gcd(sel, total)
      return (f"probes of {','.join(str(k) for k in probe_layers)} layers cannot hold "
              f"model.remat_selective={sel} of {total} blocks in proportion; use layer "
              f"counts that are multiples of {step}, e.g. --probe_layers={step},{2 * step}")
  if not mcfg.remat or not 0 < n < total:
    return ""
  bad = [k for k in probe_layers if (n * k) % total]
  if not bad:
    return ""
  step = total // math.gcd(n, total)
  return (f"probes of {','.join(str(k) for k in probe_layers)} layers cannot rematerialise "
          f"model.remat_layers={n} of {total} blocks in proportion ({n * bad[0] / total:g} "
          f"of {bad[0]}); use layer counts that are multiples of {step}, e.g. "
          f"--probe_layers={step},{2 * step}")


def probe_model(mcfg, layers: int):
  """`mcfg` at `layers` layers; a partial remat keeps its fraction of rematerialised blocks
  (rounded; `probe_refusal` says when the rounding changes the mix), so the probes
  extrapolate to the same mix."""
  out = mcfg.replace(num_layers=layers, remat_selective=0)
  if mcfg.remat and 0 <= mcfg.remat_layers < mcfg.num_layers:
    out = out.replace(remat_layers=round(mcfg.remat_layers * layers / mcfg.num_layers))
  if mcfg.remat_selective:
    out = out.replace(remat_selective=min(out.num_remat, round(
        mcfg.remat_selective * layers / mcfg.num_layers)))
  return out


def kv_pool_lines(plan, results: dict[str, Result], budget: float) -> list[str]:
  """One line per engine: its pool (pages, tokens, bytes per chip) and whether resident
  train state + decode copy + pool + its programs' other bytes fit (FITS / DOES NOT FIT)."""
  out = []
  for key, part, names in (("rollout", "kv_pool", ("prefill", "insert", "decode_chunk")),
                           ("eval", "eval_kv_pool", ("eval_insert", "eval_decode_chunk"))):
    pool = plan.pools.get(key)
    if pool is None:
      continue
    mine = [results[n] for n in names if n in results]
    held = (sum(plan.resident_parts.values()) + plan.rollout_parts.get("decode_copy", 0)
            + plan.rollout_parts.get(part, 0))
    peak = max([r.peak for r in mine if not r.error] + [held])
    ok = bool(mine) and all(r.fits for r in mine) and peak <= budget
    verdict = "FITS" if ok else ("DOES NOT FIT" if mine else "not compiled")
    f = kv_pool.fmt_bytes
    kernel = {"tpu": "Pallas kernel", "jax": "pure-JAX attention"}[plan.engines[key].ecfg.kernel]
    out.append(f"  kv_pool {key:8s} {pool.describe()}, {kernel}; resident while sampling {f(held)} "
               f"(train {f(sum(plan.resident_parts.values()))} + decode copy "
               f"{f(plan.rollout_parts.get('decode_copy', 0))} + pool "
               f"{f(plan.rollout_parts.get(part, 0))}), peak with its programs {f(peak)} of "
               f"{f(budget)}: {verdict}")
  return out


def line(r: Result, budget: float) -> str:
  if r.error:
    return f"  {r.program:12s} DOES NOT FIT (compiler: {r.error})"
  return (f"  {r.program:12s} peak {r.peak / GB:8.2f} GB of {budget / GB:6.1f} "
          f"[args {r.arguments / GB:7.2f} temp {r.temporaries / GB:7.2f} out "
          f"{r.outputs / GB:7.2f} aliased {r.aliased / GB:7.2f}] "
          f"{r.flops / 1e12:9.2f} TFLOP/chip, {r.collectives:.0f} collectives "
          f"({r.collective_bytes / 1e6:.0f} MB)  {'ok' if r.fits else 'DOES NOT FIT'}  "
          f"({r.compile_s:.0f} s)")


def summary(report: dict) -> str:
  """The verdict on one slice, with the reason when it does not fit."""
  name = report["slice"]
  if "error" in report:
    return f"{name}: DOES NOT FIT — {report['error']}"
  lines = [f"{name} ({report['chips']} chips, {report['hosts']} hosts, mesh {report['mesh']}):"
           f" resident {sum(report['resident'].values()) / GB:.2f} GB/chip "
           + ", ".join(f"{k} {v / GB:.2f}" for k, v in report["resident"].items())]
  if "extrapolated_from_layers" in report:
    lines.append("  (figures extrapolated from compiles of "
                 f"{' and '.join(map(str, report['extrapolated_from_layers']))} layers)")
  bad = [p for p in report["programs"].values() if not p["fits"]]
  if not bad:
    lines.append(f"{name}: FITS — every program within {report['budget_per_chip'] / GB:.1f} GB "
                 f"per chip; XLA-cost RL step {report['step_time_s']:.0f} s (MFU "
                 f"{report['assumed']['mfu']:.0%}; loop bodies once, no communication: "
                 "use --lengths for the step model)")
  for p in bad:
    why = (p["error"] or f"needs {p['peak'] / GB:.1f} GB per chip, "
           f"{report['hbm_per_chip'] / GB:.1f} GB HBM less "
           f"{report['assumed']['headroom']:.0%} headroom allows "
           f"{report['budget_per_chip'] / GB:.1f} GB")
    lines.append(f"{name}: DOES NOT FIT — {p['program']} {why}. Use a larger slice, more "
                 "tensor/fsdp sharding, a smaller rl.micro_batch_size or "
                 "sampling.prompts_per_call, or shorter sequences.")
  return "\n".join(lines)


def _worst(rep: dict, names) -> dict:
  """{program: its worst shape's {"peak", "error"}} of a compile check report (packed programs
  are named per row shape, "policy_step[rows=NxT]")."""
  got = {}
  for k, v in rep.get("programs", {}).items():
    base = k.split("[")[0]
    if base in names and (base not in got or v["error"] or (
        not got[base]["error"] and v["peak"] > got[base]["peak"])):
      got[base] = v
  return {n: got.get(n, {"peak": float("inf"), "error": "not built"}) for n in names}


def mix_search(check, at, names, layers: int, *, fewest: bool, what: str, said: str,
               probe_layers=None, log=print, max_rounds: int = 3) -> dict:
  """How many of `layers` blocks take a memory-moving kind (k = 0..L), chosen by memory.

  check(mcfg) -> a compile check report of the programs `names`; at(k) -> the model config
  with k blocks of the kind. Compiled at k = 0 (peak P_0) and k = L (P_L), a block of the
  kind moves a program's peak by (P_L − P_0) / L, so k blocks peak at about
  P_0 + k (P_L − P_0) / L. fewest: the smallest k under the budget (the kind lowers the peak:
  rematerialised blocks), else the largest (it raises it: selective blocks). That k, rounded
  toward the feasible side to what the probes represent (multiples of L / probe_layers[0]),
  is compiled and stepped toward the feasible side until every program fits (at most
  max_rounds compiles; XLA's schedules are not linear in the mix). A program whose own end
  does not compile counts as an infinite peak there.

  Returns {"k": the pick (None: not even the safe end fits), "peaks": {program: (P_0, P_L)},
  "budget", "verified": {k: {program: peak}}}; `what` names k in the lines ("remat_layers"),
  `said` the search ("remat search").
  """
  ends, budget = {}, None
  safe = layers if fewest else 0    # the end with the lowest peak, compiled first
  for k in (safe, layers - safe):
    rep = check(at(k))
    if "error" in rep:
      log(f"  {said}: {rep['error']}")
      return {"k": None, "peaks": {}, "budget": rep.get("budget_per_chip")}
    ends[k], budget = _worst(rep, names), rep["budget_per_chip"]
  peaks, pick = {}, 0 if fewest else layers
  for name in names:
    p0, pl = (ends[k][name]["peak"] if not ends[k][name]["error"] else math.inf
              for k in (0, layers))
    peaks[name] = (p0, pl)
    p_safe = pl if fewest else p0
    if p_safe > budget:
      why = ends[safe][name]["error"] or f"{p_safe / GB:.2f} GB over {budget / GB:.1f} GB"
      log(f"  {said}: {name} does not fit even at model.{what}={safe} ({why})")
      return {"k": None, "peaks": peaks, "budget": budget}
    per = (pl - p0) / layers
    if fewest:
      need = 0 if p0 <= budget else (layers if per == -math.inf else
                                     min(layers, math.ceil((p0 - budget) / -per)))
      pick = max(pick, need)
    else:
      need = layers if per <= 0 else max(0, min(layers, int((budget - p0) // per)))
      pick = min(pick, need)
    log(f"  {said} {name}: model.{what}=0 " + (f"{p0 / GB:.2f} GB" if p0 < math.inf else
        "does not compile") + f", ={layers} " + (f"{pl / GB:.2f} GB" if pl < math.inf else
        "does not compile") + f"; {abs(per) / GB:.2f} GB per block: "
        f"{'≥' if fewest else '≤'} {need} of {layers} fit {budget / GB:.1f} GB (linear)")
  grid = (math.lcm(*(layers // math.gcd(layers, k) for k in probe_layers)) if probe_layers
          else 1)
  k = min(layers, -(-pick // grid) * grid) if fewest else pick // grid * grid
  verified = {}
  for _ in range(max_rounds):
    if k in (0, layers):
      break  # compiled above
    got = _worst(check(at(k)), names)
    verified[k] = {n: v["peak"] for n, v in got.items()}
    over = max([v["peak"] - budget for v in got.values() if not v["error"]]
               + [math.inf for v in got.values() if v["error"]] + [-1.0])
    log(f"  {said}: compiled at model.{what}={k}: " + ", ".join(
        f"{n} {v['peak'] / GB:.2f} GB" if not v["error"] else f"{n} does not compile"
        for n, v in got.items()) + (" — fits" if over <= 0 else " — does not fit"))
    if over <= 0:
      break
    # Step by the blocks the overshoot needs on the line, at least one grid step.
    slope = min((abs(a - b) / layers for a, b in peaks.values() if math.inf not in (a, b)),
                default=math.inf)
    step = grid if over == math.inf or slope in (0, math.inf) else max(
        grid, -(-math.ceil(over / slope) // grid) * grid)
    k = min(layers, k + step) if fewest else max(0, k - step)
  else:
    k = safe
  return {"k": k, "peaks": peaks, "budget": budget,
          "verified": {str(n): v for n, v in verified.items()}}


def selective_search(check, mcfg, names, *, probe_layers=None, log=print,
                     max_rounds: int = 3) -> dict:
  """model.remat_selective chosen by memory, every block rematerialised (remat_layers=-1):
  the most selective blocks (matmul outputs kept) whose update programs fit (`mix_search`).
  Returns {"selective": S (None: not even S = 0 fits), "peaks", "budget", "verified"}."""
  base = mcfg.replace(remat=True, remat_layers=-1, remat_selective=0)
  found = mix_search(check, lambda k: base.replace(remat_selective=k), names, mcfg.num_layers,
                     fewest=False, what="remat_selective", said="selective search",
                     probe_layers=probe_layers, log=log, max_rounds=max_rounds)
  sel = found.pop("k")
  if sel is not None:
    log(f"  selective search: model.remat_layers=-1, model.remat_selective={sel} (the most "
        f"selective blocks that fit every update"
        f"{', checked by compile' if found['verified'] else ''})")
  return {"selective": sel, **found}

