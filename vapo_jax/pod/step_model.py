"""The step model's command: one RL step on a TPU slice and its floor, per phase
(`vapo_jax.pod.step` holds the model and its formulas; docs/step_model.md).

  python -m vapo_jax.pod.step_model --config=configs/qwen32b.py --arch=qwen2.5-32b --hfu=0.5

The train programs' collectives come from the stamped `pod.train_hlo --json` file made for
this config's settings, found in benchmarks/hlo/ (`pod.stamp`), or `--train_collectives=FILE`
(checked against the config: a file made for other settings is refused);
`--train_collectives=layout` counts them from the layout's arithmetic (refused with
model.collective_matmul, whose rings it cannot see). The report says which file it read.
  ... --train=padded --rollout=static            # the code paths before packing / the engine
  ... --lengths=/run/metrics.jsonl               # a run's logged length quantiles
  ... --efficiency=calibrate.json               # the train programs' measured HFU in place of
                                                # --mfu (benchmarks/calibrate_train.py)
"""

from __future__ import annotations

import dataclasses

from vapo_jax.pod.step import compiles
from vapo_jax.pod.step import measured
from vapo_jax.pod.step import report
from vapo_jax.pod.step.setup import Knobs, Setup


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import archs  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  if f.config is None:
    raise ValueError("--config=configs/<experiment>.py is needed")
  cfg, mcfg, s = archs.from_flags(f)
  knobs = knobs_from_flags(f)
  used = f"efficiency: ASSUMED --hfu={knobs.mfu:g} (no --efficiency file)"
  if f.efficiency:
    m = measured.extrapolate(measured.load(f.efficiency), mcfg.num_layers)
    used = measured.line(m, f.efficiency, knobs.mfu)
    knobs = dataclasses.replace(knobs, mfu=m["hfu"])
  from vapo_jax.pod import stamp  # pylint: disable=import-outside-toplevel
  try:
    path, evidence = stamp.resolve_train(f.train_collectives, cfg, mcfg, s.name,
                                         allow_unstamped=f.allow_unstamped)
  except stamp.StampError as e:
    from vapo_jax import cli  # pylint: disable=import-outside-toplevel
    cli.fail(str(e))
  knobs = dataclasses.replace(knobs, train_collectives=path)
  if f.decode_hlo:
    try:
      evidence += "\n" + stamp.check(f.decode_hlo, cfg, mcfg, s.name, "decode_collectives")
    except stamp.StampError as e:
      from vapo_jax import cli  # pylint: disable=import-outside-toplevel
      cli.fail(str(e))
    import json  # pylint: disable=import-outside-toplevel
    with open(f.decode_hlo, encoding="utf-8") as fh:
      dec = json.load(fh)
    knobs = dataclasses.replace(knobs, decode_collectives=dec["collectives_per_step"],
                                decode_collective_bytes=dec["bytes_per_step"])
  st = Setup.of(cfg, mcfg, s, knobs)
  if f.compile_times:
    import json  # pylint: disable=import-outside-toplevel
    with open(f.compile_times, encoding="utf-8") as fh:
      st = dataclasses.replace(st, **compiles.from_check(json.load(fh), s.name))
  print(f"{s.name}: {s.chips} chips; {mcfg.num_layers} layers, d={mcfg.hidden_size}, "
        f"{mcfg.num_params / 1e9:.2f} B parameters; {st.rows} rows of {st.prompt_len} + "
        f"{st.max_new} tokens")
  knobs = st.knobs   # the code paths resolved from the config
  # (Knobs.mfu and .mfu_ceiling are the HFU knobs, --hfu and --hfu_ceiling.)
  print("assumed: " + ", ".join(f"{k.replace('mfu', 'hfu')}={v}"
                                for k, v in dataclasses.asdict(knobs).items()))
  print(used)
  print(evidence)
  print(compiles.line(st)[1])
  from vapo_jax.pod import lengths  # pylint: disable=import-outside-toplevel
  rows = []
  for label, spec in lengths.phases(f.lengths):
    r = report.run(st, spec, f.prompt_lengths)
    text = report.format_report(label, r)
    print(measured.mark(text) if f.efficiency else text, flush=True)
    rows.append(markdown_row(label, r, f"train={knobs.train}, rollout={knobs.rollout}"))
  if f.markdown:
    print("| phase | code | estimate s | floor s | ratio | MFU / HFU (estimate) | "
          "dominant terms |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def markdown_row(label: str, r: dict, code: str) -> str:
  dom = "; ".join(f"{k} {v:,.0f} s" for k, v in r["dominant"])
  e = r["efficiency"]["estimate"]
  return (f"| {label} (mean {r['mean_length']:,.0f}) | {code} | {r['estimate_s']:,.0f} | "
          f"{r['floor_s']:,.0f} | {r['ratio']:.2f}× | {e['mfu']:.1%} / {e['hfu']:.1%} | "
          f"{dom} |")


def define_flags(flags, lengths_default: str | None = "review"):
  """The model's flags (shared with compile_check)."""
  d = Knobs()
  flags.DEFINE_string("lengths", lengths_default, "Response lengths: lognormal:MEDIAN,SIGMA, "
                      "uniform:A,B, fixed:N, early|mid|late|review, a metrics.jsonl; ';' joins")
  flags.DEFINE_string("prompt_lengths", "uniform:80,400", "Real prompt lengths (same forms).")
  flags.DEFINE_float("hfu_ceiling", d.mfu_ceiling, "The floor's compute efficiency: the "
                     "fraction of peak its programs run their FLOPs at (as --hfu).")
  flags.DEFINE_alias("mfu_ceiling", "hfu_ceiling")
  flags.DEFINE_float("bw_ceiling", d.bw_ceiling, "The floor's HBM efficiency (default: "
                     "--bw_efficiency, equal efficiency).")
  flags.DEFINE_float("permute_bw_share", d.permute_bw_share, "Share of a chip's ICI one "
                     "collective-permute gets (1/6: one link, one direction).")
  flags.DEFINE_bool("hidden_bound", d.hidden_bound, "A train program takes at least the "
                    "time of the collectives XLA hides behind its compute.")
  flags.DEFINE_bool("allow_unstamped", False, "Read a --train_collectives file made before "
                    "stamps, unchecked (the report says so).")
  flags.DEFINE_float("compile_s", d.compile_s, "Seconds to compile one program the compile "
                     "check has not timed (an assumption, printed as such).")
  flags.DEFINE_string("compile_times", None, "A compile_check --json file: its programs' "
                      "compile seconds for the compile line.")
  flags.DEFINE_float("collective_latency_us", d.collective_latency_us,
                     "Seconds·1e-6 per collective of a decode step.")
  flags.DEFINE_float("attn_score_bytes", d.attn_score_bytes, "HBM bytes per (query, key, "
                     "head) of a blocked attention forward (0: a fused kernel).")
  flags.DEFINE_float("decode_collectives", None, "Collectives per decode step (decode_hlo); "
                     "default 9 L + 4.")
  flags.DEFINE_float("decode_collective_bytes", 0.0, "Their bytes per step and chip.")
  flags.DEFINE_string("decode_hlo", None, "A stamped pod.decode_hlo --json file: the two "
                      "flags above from it (the static sampler's loop; the engine's "
                      "collectives are counted per layer: 2 L + 2).")
  flags.DEFINE_enum("decode_weights", d.decode_weights, ["stationary", "gathered"],
                    "Decode reads weights in place, or all-gathers them every step.")
  flags.DEFINE_float("decode_weight_itemsize", d.decode_weight_itemsize, "Bytes per weight "
                     "a decode step reads (2: the bf16 casts XLA hoists out of the loop).")
  flags.DEFINE_enum("train", d.train, ["padded", "packed"], "Train-side rows (default: "
                    "the config's rl.packing).")
  flags.DEFINE_enum("rollout", d.rollout, ["static", "continuous"], "Rollout sampler: "
                    "sampler/static.py or the engine of sampler/continuous.py (default: the "
                    "config's sampling.engine).")
  flags.DEFINE_enum("train_attention", d.train_attention, ["splash", "jax"], "The train "
                    "passes' self-attention kernel (default: as model.attention_kernel picks "
                    "it on the TPU slice: splash where jax's kernel takes the heads).")
  flags.DEFINE_bool("compare_layouts", False, "Also print the packed train side on "
                    "FSDP × mesh.tensor and FSDP-only meshes (collectives, memory, time).")
  flags.DEFINE_float("host_chunk_ms", None, "The engine's host work per decode chunk, ms "
                     "(default: measured on this CPU, pod.host_gap).")
  flags.DEFINE_string("train_collectives", None, "The train programs' collectives from "
                      "compiled HLO: a stamped pod.train_hlo --json file (default: the one "
                      "made for this config in benchmarks/hlo/; 'layout': the layout's "
                      "arithmetic).")
  flags.DEFINE_float("collective_bw_share", d.collective_bw_share, "Share of a chip's ICI "
                     "bandwidth one collective gets.")
  flags.DEFINE_integer("engine_tp", d.engine_tp, "Chips per engine replica "
                       "(--engine_layout=replicas).")
  flags.DEFINE_enum("engine_layout", d.engine_layout, ["built", "replicas"], "The engine as "
                    "sampler/continuous.py builds it (one pool and S slots on every chip) or "
                    "per-replica pools of --engine_tp chips.")
  flags.DEFINE_float("workspace_gb", d.workspace_gb, "Per chip, not given to the KV cache.")


def knobs_from_flags(f) -> Knobs:
  return Knobs(mfu=f.hfu, bw_efficiency=f.bw_efficiency,
               collective_latency_us=f.collective_latency_us, mfu_ceiling=f.hfu_ceiling,
               permute_bw_share=f.permute_bw_share, hidden_bound=f.hidden_bound,
               bw_ceiling=f.bw_ceiling,
               attn_score_bytes=f.attn_score_bytes, decode_collectives=f.decode_collectives,
               decode_collective_bytes=f.decode_collective_bytes,
               decode_weights=f.decode_weights,
               decode_weight_itemsize=f.decode_weight_itemsize, train=f.train,
               rollout=f.rollout, train_attention=f.train_attention,
               compare_layouts=f.compare_layouts,
               host_chunk_ms=f.host_chunk_ms,
               train_collectives=f.train_collectives,
               collective_bw_share=f.collective_bw_share,
               engine_tp=f.engine_tp, workspace_gb=f.workspace_gb,
               engine_layout=f.engine_layout, compile_s=f.compile_s)


if __name__ == "__main__":
  from absl import flags as _flags  # pylint: disable=ungrouped-imports
  from ml_collections import config_flags
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel,ungrouped-imports
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  _flags.DEFINE_string("topology", "v5p-128", "TPU slice, e.g. v5p-128")
  _flags.DEFINE_string("arch", None, "Architecture (archs.KNOWN name or config.json).")
  _flags.DEFINE_float("hfu", Knobs().mfu, "The fraction of peak the programs run the FLOPs "
                      "they execute at: an HFU of compute alone (the report prints the "
                      "train programs' MFU and HFU over their whole time).")
  _flags.DEFINE_alias("mfu", "hfu")
  _flags.DEFINE_string("efficiency", None, "A benchmarks/calibrate_train.py JSON: the "
                       "train programs' measured HFU, extrapolated to the model's layers, "
                       "replaces --mfu (pod.step.measured; the report says which was used).")
  _flags.DEFINE_float("bw_efficiency", Knobs().bw_efficiency, "Fraction of HBM bandwidth.")
  _flags.DEFINE_bool("markdown", False, "Also print one markdown table row per phase.")
  define_flags(_flags)
  cli.run(main)
