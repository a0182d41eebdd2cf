"""The sampler's real decode loop, compiled from shapes: its HLO, loop collectives, weight gathers.

  python -m vapo_jax.pod.decode_hlo --config=configs/qwen32b.py --topology=v5p-128 \
      --layers=2,4 [--arch=qwen2.5-32b] [--json=decode.json]

Lowers `static.Sampler._generate` (the jitted prefill + windowed `while_loop`s that
`rl.rollout.sample` runs, not a copy of it) for one sampler call's rows, with the policy's
parameters as `jax.ShapeDtypeStruct`s in the config's shardings (fp32 master weights: what the
rollout passes it today) and the KV cache as its donated argument. On a TPU topology (libtpu, no
TPU needed) or on this host's (fake) CPU devices. Reports per layer count:

  loops            per while loop: collectives in one trip of its body (count, bytes)
  weight_gathers   all-gathers in a loop body whose operand is a loop-invariant carry
                   (`hlo_stats.invariant_gathers`): a weight re-gathered every token step

This settles the review's hypothesis A (weights stay put, activations move: many small
collectives per step) vs B (FSDP weights gathered every step) for the given mesh.
"""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from vapo_jax.pod import hlo_stats  # noqa: E402


@dataclasses.dataclass
class DecodeHLO:
  layers: int
  rows: int
  loops: list              # [hlo_stats.Loop]
  weight_gathers: list     # [hlo_stats.Gather]
  total: hlo_stats.Counts  # the whole program (loop bodies once)
  text: str = dataclasses.field(repr=False, default="")
  carry: dict = dataclasses.field(default_factory=dict)  # loop-invariant carry bytes by dtype

  @property
  def per_step(self) -> int:
    """Collectives in one decode step: the largest loop body (the windows' bodies agree)."""
    return max((lp.collectives.total for lp in self.loops), default=0)

  @property
  def per_step_bytes(self) -> int:
    return max((lp.collectives.total_bytes for lp in self.loops), default=0)

  def summary(self) -> str:
    gathers = (f"{len(self.weight_gathers)} all-gathers of loop-invariant carries in the "
               f"decode loop ({sum(g.nbytes for g in self.weight_gathers) / 1e6:.1f} MB/step)"
               if self.weight_gathers else "no all-gather of a loop-invariant carry "
               "(weights stay sharded in place)")
    carry = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(self.carry.items()))
    return (f"{self.layers} layers, {self.rows} rows: {len(self.loops)} while loops, "
            f"{self.per_step} collectives ({self.per_step_bytes / 1e6:.2f} MB) per decode "
            f"step; {gathers}; loop-invariant carry per chip (weights as read): {carry}")


def compile_generate(cfg, mcfg, mesh, *, target: str | None = None) -> DecodeHLO:
  """Compiles the rollout sampler's `_generate` for one call on `mesh`; its HLO statistics.

  target: "tpu" to trace the TPU forms of the model (`platform.targeting`), None for the
  mesh's own platform.
  """
  from vapo_jax.models import platform, transformer  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import inputs, meshes, sampling  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  # This measures the static sampler's loop (`static.Sampler._generate`), whatever the
  # run's engine.
  cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, engine="static"))
  rules = meshes.rules_of(cfg)
  graphdef, params = programs.abstract_model(
      lambda r: transformer.Transformer(mcfg, rngs=r), mesh, rules)
  text = inputs.Text(encode=None, decode=None, bos_ids=(), template=None,
                     eos_ids=(int(mcfg.eos_token_id or 0),), pad_id=0,
                     vocab_size=mcfg.real_vocab_size or mcfg.vocab_size)
  ctx = platform.targeting(target) if target else _null()
  with ctx:
    sampler = sampling.samplers(cfg, graphdef, mcfg, mesh, rules, text).rollout
    bp = cfg.sampling.prompts_per_call or cfg.rl.rollout_prompts
    rows = bp * sampler.cfg.n_per_prompt
    low = sampler.lowerable(params, bp)  # `static.Sampler.lowerable`: its own programs
    hlo = low["generate"].lower(*low["generate_args"]).compile().as_text()
  loops = hlo_stats.while_bodies(hlo)
  step = max(loops, key=lambda lp: lp.collectives.total, default=None)
  return DecodeHLO(mcfg.num_layers, rows, loops, hlo_stats.invariant_gathers(hlo),
                   hlo_stats.collectives(hlo), hlo,
                   hlo_stats.invariant_carry_bytes(hlo, step.body) if step else {})


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import archs  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import slices  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  cfg, mcfg, s = archs.from_flags(f)
  if not slices.libtpu_available():
    sys.exit('libtpu is not installed: pip install "jax[tpu]==<jax version>" (no TPU needed)')
  mesh = shd.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor,
                       devices=slices.devices(s))
  print(f"{s.name}, mesh {dict(mesh.shape)}, d={mcfg.hidden_size}:")
  got = {}
  for n in (int(x) for x in f.layers):
    r = got[n] = compile_generate(cfg, mcfg.replace(num_layers=n), mesh, target="tpu")
    print("  " + r.summary(), flush=True)
    for g in r.weight_gathers[:8]:
      print(f"    {g.instr} {g.shape} (carry {g.carry_index}) in {g.loop_body}")
  if f.json:
    out = write_json(f.json, cfg, mcfg, s.name, got)
    print(f"  at {mcfg.num_layers} layers: {out['collectives_per_step']:.0f} collectives, "
          f"{out['bytes_per_step'] / 1e6:.1f} MB per decode step; written to {f.json}")


def write_json(path: str, cfg, mcfg, slice_name: str, got: dict) -> dict:
  """The decode loop's collectives per step at the model's depth (linear through the two
  largest layer counts compiled), with their stamp (`pod.stamp`): what `step_model
  --decode_hlo=FILE` reads for --decode_collectives / --decode_collective_bytes."""
  import json  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import stamp  # pylint: disable=import-outside-toplevel
  la, lb = sorted(got)[-2:] if len(got) > 1 else (min(got), min(got))

  def lin(x, y):
    return x if lb == la else x + (y - x) * (mcfg.num_layers - la) / (lb - la)

  a, b = got[la], got[lb]
  out = {"stamp": stamp.make(cfg, mcfg, slice_name, "decode_collectives"),
         "slice": slice_name, "layers": mcfg.num_layers, "probes": [la, lb],
         "per_probe": {str(n): {"collectives_per_step": r.per_step,
                                "bytes_per_step": r.per_step_bytes,
                                "weight_gathers": len(r.weight_gathers)}
                       for n, r in got.items()},
         "collectives_per_step": lin(a.per_step, b.per_step),
         "bytes_per_step": lin(a.per_step_bytes, b.per_step_bytes),
         "weight_gathers": bool(a.weight_gathers or b.weight_gathers)}
  with open(path, "w", encoding="utf-8") as fh:
    json.dump(out, fh, indent=1)
  return out


if __name__ == "__main__":
  from absl import flags as _flags  # pylint: disable=ungrouped-imports
  from ml_collections import config_flags
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel,ungrouped-imports
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  _flags.DEFINE_string("topology", "v5p-128", "TPU slice, e.g. v5p-128")
  _flags.DEFINE_string("arch", None, "Architecture (archs.KNOWN name or config.json).")
  _flags.DEFINE_list("layers", ["2", "4"], "Layer counts to compile (real width).")
  _flags.DEFINE_string("json", None, "Write the collectives per decode step at the model's "
                       "depth here, stamped (step_model --decode_hlo reads it).")
  cli.run(main)
