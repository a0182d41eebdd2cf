"""Proof from a CPU that a run fits a TPU slice: AOT-compile every step, read its memory.

  pip install "jax[tpu]==<your jax version>"        # libtpu; no TPU needed
  python -m vapo_jax.tools.compile_check --config=configs/qwen32b.py --topology=v5p-256
  python -m vapo_jax.tools.compile_check --config=configs/qwen32b.py --topology=v5p-128,v5p-256 \
      --arch=qwen2.5-7b --config.mesh.tensor=2 --json=/tmp/fit.json

For each slice: the slice's devices come from libtpu's topology description
(`jax.experimental.topologies`), the config's mesh is laid over them, and the programs of
`vapo_jax.tools.programs` (policy and critic train steps, old-log-prob and value passes, and
the rollout engine's own programs: decode copy, prefill, insert, decode chunk, and the
evaluation engine's insert and chunk; with sampling.engine=static the static sampler's
prefill and decode step) are lowered and compiled for that TPU (with rl.packing, the
packed train programs at the planner's shapes, `name[rows=nxT]`, their trips from the first
--lengths phase, else from sequences at full length). Per program and chip:

  peak = resident + (arguments − its resident arguments) + temporaries + outputs − aliased

where `resident` is what stays in HBM while the program runs (both TrainStates and the
rollout batch; while the engine samples also its decode copy and KV pool; a static
sampler's KV cache is its own programs' argument, freed after use). It fits when
peak ≤ (1 − headroom) · HBM. A program that XLA itself cannot fit fails to compile; that
is reported as not fitting too. The engines' KV pools are sized from the chip's HBM the way a
run sizes them (`sampler.kv_pool`); one `kv_pool` line per engine gives its pages, tokens and
bytes per chip and whether resident + pool + its programs fit (FITS / DOES NOT FIT).

With `--lengths=SPEC` it also prints `tools.step_model`'s analytic step time and floor at those
lengths (the honest figure: every loop counted, collectives, decode windows and early exit),
with the decode loop's collectives per step read from the compiled `static.Sampler._generate`
(`tools.decode_hlo`, at `--decode_hlo_layers` layers, extrapolated to the model's depth).
`--no_compile` skips every compile (no libtpu needed) and prints only the analytic model.

The older compile-based step time below counts XLA's loop bodies once and has no
communication term; it is kept for comparison only. It is: per program max(FLOPs / (peak
FLOP/s · MFU), bytes accessed / (HBM bandwidth · BW efficiency)), from the compiled
per-chip cost analysis, summed over one RL step: calls × (prefill + R · decode_step) +
logprobs + values + minibatches · epochs · (policy_step + critic_step); with the engine
decode_copy + prompts · prefill + rows · insert + chunks · decode_chunk (its chunk_steps
trips), chunks = ⌈⌈rows / slots⌉ R / chunk_steps⌉. Decoding is assumed to run all R steps
(long tails do).

Exit status: 0 when everything fits on every slice given, 1 otherwise (with the reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time

# The host's own backend stays CPU (nothing runs on it); libtpu only compiles.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import jax
from ml_collections import config_flags

from vapo_jax import config as config_lib
from vapo_jax.models import platform
from vapo_jax.sampler import kv_pool
from vapo_jax.tools import archs
from vapo_jax.tools import step_model
from vapo_jax.tools import tpu_specs

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_list("topology", None, "TPU slices: v5p-128, v5litepod-16, v6e-8, "
                              "v4-32, v5p:4x4x4, …")
_ARCH = flags.DEFINE_string("arch", None, "Model architecture: a name in archs.KNOWN "
                            "(qwen2.5-32b, qwen2.5-7b, qwen2.5-0.5b, …) or a config.json; "
                            "default: the config's model.hf_path/config.json, else its name.")
_PROGRAMS = flags.DEFINE_list("programs", None, "Only these programs (default: all).")
_MFU = flags.DEFINE_float("mfu", 0.4, "Assumed model FLOPs utilisation for the estimate.")
_BW = flags.DEFINE_float("bw_efficiency", 0.7, "Assumed fraction of HBM bandwidth reached.")
_HEADROOM = flags.DEFINE_float("headroom", 0.05, "Fraction of HBM kept free.")
_JSON = flags.DEFINE_string("json", None, "Also write the results here as JSON.")
_NO_COMPILE = flags.DEFINE_bool("no_compile", False, "Compile nothing (no libtpu needed): "
                                 "print only the analytic step model of --lengths.")
_HLO_LAYERS = flags.DEFINE_list("decode_hlo_layers", ["2", "4"], "With --lengths: compile the "
                                "sampler's decode loop at these layer counts for its "
                                "collectives per step (empty: assume 9 L + 4).")
_REMAT_SEARCH = flags.DEFINE_bool(
    "remat_search", False, "Pick model.remat_layers by memory: compile the update programs "
    "with every block rematerialised and with none (with --probe_layers: extrapolated), and "
    "print the fewest rematerialised blocks whose peak fits (linear between the two).")
_PROBE = flags.DEFINE_list("probe_layers", None, "Two layer counts, e.g. 2,4: compile those "
                           "and extrapolate to the model's depth (fast, approximate); "
                           "default: compile the whole model.")

step_model.define_flags(flags, lengths_default=None)

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
  from vapo_jax.tools import hlo_stats  # pylint: disable=import-outside-toplevel
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


def step_time(results: dict[str, Result], plan, cfg, s: tpu_specs.Slice, mfu: float,
              bw: float) -> float:
  """Estimated seconds of one RL step (see the module docstring)."""

  def t(name):  # packed programs are name[rows=nxT], one per packed shape: their sum
    return sum(max(r.flops / (s.gen.bf16_flops * mfu),
                   r.bytes_accessed / (s.gen.hbm_bandwidth * bw))
               for key, r in results.items() if key.split("[")[0] == name)

  if "decode_chunk" in results:  # the engine: one prefill per prompt, one insert per row
    sh = plan.shapes
    rollout = (t("decode_copy") + cfg.prompts_per_step * t("prefill") + sh["rows"] * t("insert")
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
  out = mcfg.replace(num_layers=layers)
  if mcfg.remat and 0 <= mcfg.remat_layers < mcfg.num_layers:
    out = out.replace(remat_layers=round(mcfg.remat_layers * layers / mcfg.num_layers))
  return out


UPDATES = ("policy_step", "critic_step")


def remat_search(cfg, mcfg, s: tpu_specs.Slice, *, headroom=0.05,
                 probe_layers: tuple[int, int] | None = None, log=print, lengths=None,
                 max_rounds: int = 3) -> dict:
  """model.remat_layers chosen by memory for slice `s`: the update programs compiled with
  every block rematerialised (peak P_all) and with none (P_none); a kept block's
  activations cost (P_none − P_all) / L more than a rematerialised one's input, so n
  rematerialised blocks peak at about P_none − n (P_none − P_all) / L. That n (rounded up to
  what the probes represent exactly: multiples of L / probe_layers[0]) is then compiled, and
  raised until both programs fit (at most max_rounds compiles; XLA's schedules are not linear
  in the mix). Returns {"layers": the fewest n found that fit every update program (−1: all,
  None: not even all fit), "peaks": {program: (P_all, P_none)}, "budget", "verified": {n:
  {program: peak}}}."""
  quiet = lambda *_: None  # noqa: E731
  ends = {}
  for label, m in (("all", mcfg.replace(remat=True, remat_layers=-1)),
                   ("none", mcfg.replace(remat=True, remat_layers=0))):
    rep = check(cfg, m, s, names=UPDATES, headroom=headroom, probe_layers=probe_layers,
                log=quiet, lengths=lengths)
    if "error" in rep:
      log(f"  remat search: {rep['error']}")
      return {"layers": None, "peaks": {}, "budget": rep.get("budget_per_chip")}
    # Packed programs are named per row shape ("policy_step[rows=NxT]"): the worst counts.
    ends[label] = {}
    for name in UPDATES:
      mine = [v for k, v in rep["programs"].items() if k.split("[")[0] == name]
      bad = [v for v in mine if v["error"]]
      ends[label][name] = (bad[0] if bad else max(mine, key=lambda v: v["peak"])) if mine \
          else {"peak": float("inf"), "error": "not built"}
    budget = rep["budget_per_chip"]
  layers, n_need, peaks, per_min = mcfg.num_layers, 0, {}, float("inf")
  for name in UPDATES:
    a, z = ends["all"][name], ends["none"][name]
    if a["error"]:
      log(f"  remat search: {name} does not fit even with every block rematerialised "
          f"({a['error']})")
      return {"layers": None, "peaks": peaks, "budget": budget}
    p_all = a["peak"]
    p_none = z["peak"] if not z["error"] else float("inf")
    peaks[name] = (p_all, p_none)
    per = (p_none - p_all) / layers if p_none != float("inf") else float("inf")
    per_min = min(per_min, per)
    need = 0 if p_none <= budget else (
        layers if per == float("inf") else min(layers, math.ceil((p_none - budget) / per)))
    n_need = max(n_need, need)
    shown = "does not compile" if p_none == float("inf") else f"{p_none / GB:.2f} GB"
    log(f"  remat search {name}: every block rematerialised {p_all / GB:.2f} GB, none "
        f"{shown}; a kept block costs {per / GB:.2f} GB more: ≥ {need} of {layers} "
        f"rematerialised blocks fit {budget / GB:.1f} GB (linear)")
  # XLA's schedule is not linear in the mix: compile the pick and step up until both fit.
  # Probes of la and lb layers represent n / L exactly only on a grid of L / la blocks.
  grid = (math.lcm(*(layers // math.gcd(layers, k) for k in probe_layers)) if probe_layers
          else 1)
  n = min(layers, -(-n_need // grid) * grid)
  verified = {}
  for _ in range(max_rounds):
    if n in (0, layers):
      break  # the two ends were compiled above
    rep = check(cfg, mcfg.replace(remat=True, remat_layers=n), s, names=UPDATES,
                headroom=headroom, probe_layers=probe_layers, log=quiet, lengths=lengths)
    if "error" in rep:
      log(f"  remat search: model.remat_layers={n}: {rep['error']}")
      return {"layers": None, "peaks": peaks, "budget": budget,
              "verified": {str(k): v for k, v in verified.items()}}
    got = {}
    for k, v in rep.get("programs", {}).items():  # the worst shape of each program
      base = k.split("[")[0]
      if base not in got or v["error"] or (not got[base]["error"]
                                           and v["peak"] > got[base]["peak"]):
        got[base] = v
    verified[n] = {k: v["peak"] for k, v in got.items()}
    over = max([v["peak"] - budget for v in got.values() if not v["error"]]
               + [float("inf") for v in got.values() if v["error"]] + [-1.0])
    log(f"  remat search: compiled at model.remat_layers={n}: " + ", ".join(
        f"{k} {v['peak'] / GB:.2f} GB" if not v["error"] else f"{k} does not compile"
        for k, v in got.items()) + (" — fits" if over <= 0 else " — does not fit"))
    if over <= 0:
      break
    step = grid if over == float("inf") or per_min == float("inf") else max(
        grid, -(-math.ceil(over / per_min) // grid) * grid)
    n = min(layers, n + step)
  else:
    n = layers
  out = -1 if n >= layers else n
  log(f"  remat search: model.remat_layers={out} (the fewest rematerialised blocks that fit "
      f"both updates{', checked by compile' if verified else ''})")
  return {"layers": out, "peaks": peaks, "budget": budget,
          "verified": {str(k): v for k, v in verified.items()}}


def check(cfg, mcfg, s: tpu_specs.Slice, *, names=None, mfu=0.4, bw=0.7, headroom=0.05,
          probe_layers: tuple[int, int] | None = None, log=print, lengths=None) -> dict:
  """Compiles the run's programs for slice `s`; a dict report (see main for the fields).

  probe_layers=(a, b): compile a- and b-layer versions of the model instead of the whole
  one and extrapolate linearly (fast; the report says so). lengths: (prompt [B], response
  [B]) real lengths that pick the packed programs' shapes (`programs.build`).
  """
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.tools import programs  # pylint: disable=import-outside-toplevel
  devices = tpu_specs.devices(s)
  budget = (1 - headroom) * s.gen.hbm_bytes
  report = {"slice": s.name, "accelerator_type": s.accelerator_type,
            "topology": s.topology_name, "chips": s.chips, "hosts": s.hosts,
            "hbm_per_chip": s.gen.hbm_bytes, "budget_per_chip": budget}
  try:
    mesh = shd.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=devices)
    plan = programs.build(cfg, mcfg, mesh, names or programs.PROGRAMS, budget=budget,
                          hbm=s.gen.hbm_bytes, lengths=lengths)
  except ValueError as e:
    report.update(fits=False, error=f"config does not map onto {s.name}: {e}")
    return report
  report["mesh"] = dict(mesh.shape)
  report["shapes"] = plan.shapes
  report["resident"] = plan.resident_parts
  results = {}
  held = {k: v for k, v in plan.resident_parts.items() if v}
  if sum(held.values()) > budget:  # Nothing can run; no need to compile anything.
    report.update(fits=False, error=(
        f"the training state alone needs {sum(held.values()) / GB:.1f} GB per chip ("
        + ", ".join(f"{k} {v / GB:.1f}" for k, v in held.items())
        + f"), more than the {budget / GB:.1f} GB budget of a {s.gen.name} chip's "
        f"{s.gen.hbm_bytes / GB:.1f} GB HBM; use a slice with more chips"))
    return report
  report["rollout_parts"] = plan.rollout_parts
  updates = set(names or programs.PROGRAMS) & set(UPDATES)  # the programs remat shapes
  if probe_layers and updates and probe_refusal(mcfg, probe_layers):
    report.update(fits=False, error=probe_refusal(mcfg, probe_layers))
    return report
  if probe_layers:
    la, lb = probe_layers
    # The probes keep the full model's pools (tokens), so their bytes scale with the layers.
    pinned = {k: p.tokens for k, p in plan.pools.items() if p is not None} or None
    plan_a, plan_b = (programs.build(cfg, probe_model(mcfg, k), mesh,
                                     names or programs.PROGRAMS, kv_tokens=pinned,
                                     lengths=lengths)
                      for k in (la, lb))
    report["extrapolated_from_layers"] = [la, lb]
  for i, prog in enumerate(plan.programs):
    if probe_layers:
      ra, rb = (compile_one(p.programs[i], p.held, budget, devices[0])
                for p in (plan_a, plan_b))
      r = extrapolate(ra, rb, la, lb, mcfg.num_layers, prog, plan.held, budget)
    else:
      r = compile_one(prog, plan.held, budget, devices[0])
    results[r.program] = r
    log(_line(r, budget))
  for line in kv_pool_lines(plan, results, budget):
    log(line)
  report["kv_pools"] = {k: dataclasses.asdict(p) for k, p in plan.pools.items() if p}
  report["engines"] = {k: dataclasses.asdict(step_model.EngineShape.of(e.ecfg))
                       for k, e in plan.engines.items()}
  report["attention_kernels"] = {k: e.ecfg.kernel for k, e in plan.engines.items()}
  report["programs"] = {k: dataclasses.asdict(v) for k, v in results.items()}
  report["fits"] = all(r.fits for r in results.values())
  report["step_time_s"] = step_time(results, plan, cfg, s, mfu, bw)
  report["assumed"] = {"mfu": mfu, "bw_efficiency": bw, "headroom": headroom}
  return report


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


def _line(r: Result, budget: float) -> str:
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


def model_report(cfg, mcfg, s: tpu_specs.Slice, *, compile_decode: bool, compiled=None,
                 engines: dict | None = None, log=print) -> list:
  """`step_model` at --lengths on slice s, decode collectives from the compiled loop; with
  the compiled programs' figures, their XLA FLOPs beside the analytic ones; engines: the
  compile check's built engines ({"rollout", "eval": EngineShape fields})."""
  knobs = step_model.knobs_from_flags(flags.FLAGS)
  layers = [int(x) for x in _HLO_LAYERS.value or ()]
  if compile_decode and len(layers) == 2 and knobs.decode_collectives is None:
    from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
    from vapo_jax.tools import decode_hlo  # pylint: disable=import-outside-toplevel
    mesh = shd.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor,
                         devices=tpu_specs.devices(s))
    ra, rb = (decode_hlo.compile_generate(cfg, mcfg.replace(num_layers=n), mesh, target="tpu")
              for n in layers)
    la, lb = layers

    def lin(a, b):
      return a + (b - a) * (mcfg.num_layers - la) / (lb - la)

    knobs = dataclasses.replace(
        knobs, decode_collectives=lin(ra.per_step, rb.per_step),
        decode_collective_bytes=lin(ra.per_step_bytes, rb.per_step_bytes),  # per device
        decode_weights="gathered" if (ra.weight_gathers or rb.weight_gathers) else "stationary")
    log(f"  decode loop (libtpu, {ra.summary()}; {rb.summary()}); at {mcfg.num_layers} layers: "
        f"{knobs.decode_collectives:.0f} collectives per step")
  shapes = ({k: step_model.EngineShape(**v) for k, v in engines.items()}
            if engines else None)
  st = step_model.Setup.of(cfg, mcfg, s, knobs, shapes)
  if compiled:
    log("  FLOPs cross-check (XLA counts a loop body once: attention key blocks and LM-head "
        "chunks are undercounted; the standalone decode steps have no loop):")
    for line in step_model.crosscheck(st, compiled):
      log(line)
  log("  assumed: " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(st.knobs).items()))
  from vapo_jax.tools import lengths  # pylint: disable=import-outside-toplevel
  out = []
  for label, spec in lengths.phases(flags.FLAGS.lengths):
    r = step_model.run(st, spec, flags.FLAGS.prompt_lengths)
    log(step_model.format_report(label, r))
    sys.stdout.flush()
    out.append(r)
  return out


def _packed_lengths(cfg):
  """With rl.packing and --lengths: (prompt, response) lengths of one rollout from the first
  length phase, which pick the packed programs' shapes; else None (full lengths)."""
  if not (cfg.rl.packing and flags.FLAGS.lengths):
    return None
  from vapo_jax.tools import lengths  # pylint: disable=import-outside-toplevel
  rows = cfg.prompts_per_step * cfg.responses_per_prompt
  spec = lengths.phases(flags.FLAGS.lengths)[0][1]
  return (lengths.sample(flags.FLAGS.prompt_lengths, rows, cfg.data.max_prompt_tokens, seed=2,
                         prefix="prompt/length_"),
          lengths.sample(spec, rows, cfg.sampling.max_new_tokens))


def main(argv):
  del argv
  if _CONFIG.value is None or not _TOPOLOGY.value:
    raise app.UsageError("--config=configs/<experiment>.py and --topology=v5p-128 are needed")
  if not _NO_COMPILE.value and not tpu_specs.libtpu_available():
    sys.exit('libtpu is not installed: pip install "jax[tpu]==<jax version>" (no TPU needed), '
             "or pass --no_compile --lengths=SPEC for the analytic model alone")
  if _NO_COMPILE.value and not flags.FLAGS.lengths:
    raise app.UsageError("--no_compile needs --lengths=SPEC (there is nothing else to print)")
  cfg = config_lib.from_command_line(_CONFIG.value)
  mcfg = archs.model_config(cfg, _ARCH.value)
  if flags.FLAGS.lengths:  # a bad length spec fails now, not after the compiles
    from vapo_jax.tools import lengths  # pylint: disable=import-outside-toplevel
    for _, spec in lengths.phases(flags.FLAGS.lengths):
      lengths.sample(spec, 1, cfg.sampling.max_new_tokens)
    lengths.sample(flags.FLAGS.prompt_lengths, 1, cfg.data.max_prompt_tokens,
                   prefix="prompt/length_")
  print(f"model: {mcfg.num_layers} layers, d={mcfg.hidden_size}, "
        f"{mcfg.num_params / 1e9:.2f} B parameters")
  reports = []
  for name in _TOPOLOGY.value:
    s = tpu_specs.parse(name)
    print(f"{s.name} = {s.accelerator_type}, topology {s.topology_name}, {s.chips} chips × "
          f"{s.gen.hbm_bytes / 2**30:.0f} GiB HBM:")
    if _REMAT_SEARCH.value:
      probe = tuple(int(x) for x in _PROBE.value) if _PROBE.value else None
      found = remat_search(cfg, mcfg, s, headroom=_HEADROOM.value, probe_layers=probe,
                           lengths=_packed_lengths(cfg))
      reports.append({"slice": s.name, "remat_search": found,
                      "fits": found["layers"] is not None})
      continue
    if not _NO_COMPILE.value:
      probe = tuple(int(x) for x in _PROBE.value) if _PROBE.value else None
      reports.append(check(cfg, mcfg, s, names=_PROGRAMS.value, mfu=_MFU.value, bw=_BW.value,
                           headroom=_HEADROOM.value, probe_layers=probe,
                           lengths=_packed_lengths(cfg)))
      print(summary(reports[-1]), flush=True)
    if flags.FLAGS.lengths:
      model_report(cfg, mcfg, s, compile_decode=not _NO_COMPILE.value,
                   compiled=reports[-1].get("programs") if reports else None,
                   engines=reports[-1].get("engines") if reports else None)
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump(reports, f, indent=1)
  if not all(r["fits"] for r in reports):
    sys.exit(1)


if __name__ == "__main__":
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel,ungrouped-imports
  cli.run(main)
