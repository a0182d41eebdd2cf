"""Proof from a CPU that a run fits a TPU slice: AOT-compile every step, read its memory.

  pip install "jax[tpu]==<your jax version>"        # libtpu; no TPU needed
  python -m vapo_jax.pod.compile_check --config=configs/qwen32b.py --topology=v5p-256
  python -m vapo_jax.pod.compile_check --config=configs/qwen32b.py --topology=v5p-128,v5p-256 \
      --arch=qwen2.5-7b --config.mesh.tensor=2 --json=/tmp/fit.json

For each slice: the slice's devices come from libtpu's topology description
(`jax.experimental.topologies`), the config's mesh is laid over them, and the programs of
`vapo_jax.pod.programs` (policy and critic train steps, old-log-prob and value passes, and
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

With `--lengths=SPEC` it also prints `pod.step_model`'s analytic step time and floor at those
lengths (the honest figure: every loop counted, collectives, decode windows and early exit),
with the decode loop's collectives per step read from the compiled `static.Sampler._generate`
(`pod.decode_hlo`, at `--decode_hlo_layers` layers, extrapolated to the model's depth).
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

import dataclasses
import json
import os
import sys

# The host's own backend stays CPU (nothing runs on it); libtpu only compiles.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from ml_collections import config_flags

from vapo_jax import config as config_lib
from vapo_jax.pod import archs
from vapo_jax.pod import fitting
from vapo_jax.pod import slices
from vapo_jax.pod import step
from vapo_jax.pod import step_model
from vapo_jax.pod.step import compiles

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_list("topology", None, "TPU slices: v5p-128, v5litepod-16, v6e-8, "
                              "v4-32, v5p:4x4x4, …")
_ARCH = flags.DEFINE_string("arch", None, "Model architecture: a name in archs.KNOWN "
                            "(qwen2.5-32b, qwen2.5-7b, qwen2.5-0.5b, …) or a config.json; "
                            "default: the config's model.hf_path/config.json, else its name.")
_PROGRAMS = flags.DEFINE_list("programs", None, "Only these programs (default: all).")
_MFU = flags.DEFINE_float("hfu", 0.4, "The fraction of peak the programs run the FLOPs they "
                          "execute at (HFU of compute; the step model prints MFU and HFU).")
flags.DEFINE_alias("mfu", "hfu")
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
_SELECTIVE_SEARCH = flags.DEFINE_bool(
    "selective_search", False, "Pick model.remat_selective by memory, every block "
    "rematerialised: compile the update programs with no block selective and with every one, "
    "and print the most selective blocks (matmul outputs kept) whose peak fits.")
_PROBE = flags.DEFINE_list("probe_layers", None, "Two layer counts, e.g. 2,4: compile those "
                           "and extrapolate to the model's depth (fast, approximate); "
                           "default: compile the whole model.")

step_model.define_flags(flags, lengths_default=None)

GB = 1e9


UPDATES = ("policy_step", "critic_step")


def remat_search(cfg, mcfg, s: slices.Slice, *, headroom=0.05,
                 probe_layers: tuple[int, int] | None = None, log=print, lengths=None,
                 max_rounds: int = 3) -> dict:
  """model.remat_layers chosen by memory for slice `s`: the fewest rematerialised blocks
  whose update programs fit (`fitting.mix_search`: compiled with every block rematerialised
  and with none, linear between, the pick compiled and raised until both fit). Returns
  {"layers": n (−1: all, None: not even all fit), "peaks": {program: (P_all, P_none)},
  "budget", "verified": {n: {program: peak}}}."""
  def at(n):
    return mcfg.replace(remat=True, remat_layers=-1 if n == mcfg.num_layers else n)

  found = fitting.mix_search(
      lambda m: check(cfg, m, s, names=UPDATES, headroom=headroom, probe_layers=probe_layers,
                      log=lambda *_: None, lengths=lengths),
      at, UPDATES, mcfg.num_layers, fewest=True, what="remat_layers", said="remat search",
      probe_layers=probe_layers, log=log, max_rounds=max_rounds)
  n = found.pop("k")
  found["peaks"] = {k: (pl, p0) for k, (p0, pl) in found["peaks"].items()}
  if n is None:
    return {"layers": None, **found}
  out = -1 if n >= mcfg.num_layers else n
  log(f"  remat search: model.remat_layers={out} (the fewest rematerialised blocks that fit "
      f"both updates{', checked by compile' if found['verified'] else ''})")
  return {"layers": out, **found}


def check(cfg, mcfg, s: slices.Slice, *, names=None, mfu=0.4, bw=0.7, headroom=0.05,
          probe_layers: tuple[int, int] | None = None, log=print, lengths=None) -> dict:
  """Compiles the run's programs for slice `s`; a dict report (see main for the fields).

  probe_layers=(a, b): compile a- and b-layer versions of the model instead of the whole
  one and extrapolate linearly (fast; the report says so). lengths: (prompt [B], response
  [B]) real lengths that pick the packed programs' shapes (`programs.build`).
  """
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  devices = slices.devices(s)
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
  if probe_layers and updates and fitting.probe_refusal(mcfg, probe_layers):
    report.update(fits=False, error=fitting.probe_refusal(mcfg, probe_layers))
    return report
  if probe_layers:
    la, lb = probe_layers
    # The probes keep the full model's pools (tokens), so their bytes scale with the layers.
    pinned = {k: p.tokens for k, p in plan.pools.items() if p is not None} or None
    plan_a, plan_b = (programs.build(cfg, fitting.probe_model(mcfg, k), mesh,
                                     names or programs.PROGRAMS, kv_tokens=pinned,
                                     lengths=lengths)
                      for k in (la, lb))
    report["extrapolated_from_layers"] = [la, lb]
  for i, prog in enumerate(plan.programs):
    if probe_layers:
      ra, rb = (fitting.compile_one(p.programs[i], p.held, budget, devices[0])
                for p in (plan_a, plan_b))
      r = fitting.extrapolate(ra, rb, la, lb, mcfg.num_layers, prog, plan.held, budget)
    else:
      r = fitting.compile_one(prog, plan.held, budget, devices[0])
    results[r.program] = r
    log(fitting.line(r, budget))
  for line in fitting.kv_pool_lines(plan, results, budget):
    log(line)
  report["kv_pools"] = {k: dataclasses.asdict(p) for k, p in plan.pools.items() if p}
  report["engines"] = {k: dataclasses.asdict(step.EngineShape.of(e.ecfg))
                       for k, e in plan.engines.items()}
  report["attention_kernels"] = {k: e.ecfg.kernel for k, e in plan.engines.items()}
  report["programs"] = {k: dataclasses.asdict(v) for k, v in results.items()}
  report["fits"] = all(r.fits for r in results.values())
  report["step_time_s"] = fitting.step_time(results, plan, cfg, s, mfu, bw)
  report["assumed"] = {"mfu": mfu, "bw_efficiency": bw, "headroom": headroom}
  return report


def model_report(cfg, mcfg, s: slices.Slice, *, compile_decode: bool, compiled=None,
                 engines: dict | None = None, log=print, checked: dict | None = None) -> list:
  """`step_model` at --lengths on slice s, decode collectives from the compiled loop; with
  the compiled programs' figures, their XLA FLOPs beside the analytic ones; engines: the
  compile check's built engines ({"rollout", "eval": EngineShape fields}); checked: this
  slice's report, whose compile times the compile line takes."""
  knobs = step_model.knobs_from_flags(flags.FLAGS)
  from vapo_jax.pod import stamp  # pylint: disable=import-outside-toplevel
  try:
    path, evidence = stamp.resolve_train(knobs.train_collectives, cfg, mcfg, s.name,
                                         allow_unstamped=flags.FLAGS.allow_unstamped)
  except stamp.StampError as e:
    if not compiled:   # --no_compile: the model was all there was to print
      from vapo_jax import cli  # pylint: disable=import-outside-toplevel
      cli.fail(str(e))
    log(f"  step model not run: {e}")
    return []
  log(f"  {evidence}")
  knobs = dataclasses.replace(knobs, train_collectives=path)
  layers = [int(x) for x in _HLO_LAYERS.value or ()]
  if compile_decode and len(layers) == 2 and knobs.decode_collectives is None:
    from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
    from vapo_jax.pod import decode_hlo  # pylint: disable=import-outside-toplevel
    mesh = shd.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor,
                         devices=slices.devices(s))
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
  shapes = ({k: step.EngineShape(**v) for k, v in engines.items()}
            if engines else None)
  st = step.Setup.of(cfg, mcfg, s, knobs, shapes)
  if checked:
    st = dataclasses.replace(st, **compiles.from_check(checked, s.name))
  if compiled:
    log("  FLOPs cross-check (XLA counts a loop body once: attention key blocks and LM-head "
        "chunks are undercounted; the standalone decode steps have no loop):")
    for line in step.crosscheck(st, compiled):
      log(line)
  log("  assumed: " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(st.knobs).items()))
  log("  " + compiles.line(st)[1])
  from vapo_jax.pod import lengths  # pylint: disable=import-outside-toplevel
  out = []
  for label, spec in lengths.phases(flags.FLAGS.lengths):
    r = step.run(st, spec, flags.FLAGS.prompt_lengths)
    log(step.format_report(label, r))
    sys.stdout.flush()
    out.append(r)
  return out


def _packed_lengths(cfg):
  """With rl.packing and --lengths: (prompt, response) lengths of one rollout from the first
  length phase, which pick the packed programs' shapes; else None (full lengths)."""
  if not (cfg.rl.packing and flags.FLAGS.lengths):
    return None
  from vapo_jax.pod import lengths  # pylint: disable=import-outside-toplevel
  rows = cfg.rl.rollout_prompts * cfg.rl.group_size
  spec = lengths.phases(flags.FLAGS.lengths)[0][1]
  return (lengths.sample(flags.FLAGS.prompt_lengths, rows, cfg.data.max_prompt_tokens, seed=2,
                         prefix="prompt/length_"),
          lengths.sample(spec, rows, cfg.sampling.max_new_tokens))


def main(argv):
  del argv
  if _CONFIG.value is None or not _TOPOLOGY.value:
    raise app.UsageError("--config=configs/<experiment>.py and --topology=v5p-128 are needed")
  if not _NO_COMPILE.value and not slices.libtpu_available():
    sys.exit('libtpu is not installed: pip install "jax[tpu]==<jax version>" (no TPU needed), '
             "or pass --no_compile --lengths=SPEC for the analytic model alone")
  if _NO_COMPILE.value and not flags.FLAGS.lengths:
    raise app.UsageError("--no_compile needs --lengths=SPEC (there is nothing else to print)")
  cfg = config_lib.from_command_line(_CONFIG.value)
  mcfg = archs.model_config(cfg, _ARCH.value)
  if flags.FLAGS.lengths:  # a bad length spec fails now, not after the compiles
    from vapo_jax.pod import lengths  # pylint: disable=import-outside-toplevel
    for _, spec in lengths.phases(flags.FLAGS.lengths):
      lengths.sample(spec, 1, cfg.sampling.max_new_tokens)
    lengths.sample(flags.FLAGS.prompt_lengths, 1, cfg.data.max_prompt_tokens,
                   prefix="prompt/length_")
  print(f"model: {mcfg.num_layers} layers, d={mcfg.hidden_size}, "
        f"{mcfg.num_params / 1e9:.2f} B parameters")
  reports = []
  for name in _TOPOLOGY.value:
    s = slices.parse(name)
    print(f"{s.name} = {s.accelerator_type}, topology {s.topology_name}, {s.chips} chips × "
          f"{s.gen.hbm_bytes / 2**30:.0f} GiB HBM:")
    if _SELECTIVE_SEARCH.value:
      probe = tuple(int(x) for x in _PROBE.value) if _PROBE.value else None
      found = fitting.selective_search(
          lambda m, s=s, probe=probe: check(cfg, m, s, names=UPDATES, headroom=_HEADROOM.value,
                                            probe_layers=probe, log=lambda *_: None,
                                            lengths=_packed_lengths(cfg)),
          mcfg, UPDATES, probe_layers=probe)
      reports.append({"slice": s.name, "selective_search": found,
                      "fits": found["selective"] is not None})
      continue
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
      print(fitting.summary(reports[-1]), flush=True)
    if flags.FLAGS.lengths:
      model_report(cfg, mcfg, s, compile_decode=not _NO_COMPILE.value,
                   compiled=reports[-1].get("programs") if reports else None,
                   engines=reports[-1].get("engines") if reports else None,
                   checked=reports[-1] if reports else None)
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump(reports, f, indent=1)
  if not all(r["fits"] for r in reports):
    sys.exit(1)


if __name__ == "__main__":
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel,ungrouped-imports
  cli.run(main)
