"""What the packed row length buys: the planner's real / computed tokens and the train side's
FLOPs and modelled time, per row length, on a config's length mix (arithmetic, no timing).

  python benchmarks/packing_rows.py --config=configs/tiny.py \
      --lengths=/tmp/vapo_tiny/metrics.jsonl --prompt_lengths=/tmp/vapo_tiny/metrics.jsonl
  python benchmarks/packing_rows.py --config=configs/longcot.py --lengths=uniform:89,151 \
      --prompt_lengths=uniform:40,68
  python benchmarks/packing_rows.py --config=configs/qwen32b.py --topology=v5p-128 \
      --arch=qwen2.5-32b --lengths=review --prompt_lengths=uniform:80,400

For each row length T = f (P + R), f in --row_factors (rl.packing_row_tokens; the token
budget per device stays the config's rule, `packing.spec_for`), it runs the code's own
planner (`packing.plan`, with the PackSpecs `pod.step.Setup.of` builds, the same
as `run.learners.pass_spec` on that slice) on one step's lengths and prints: the packed shape of
the old-log-prob / value forward, the share of real tokens in the forward and in the policy /
critic steps, and the train side's FLOPs (matmul + LM head, attention as the kernels compute
it: `step_counts.packed_pairs`, which skips another segment's key blocks only when no row of
the micro-batch needs them) and `step_model` time, each relative to the padded rows. On a
CPU the toys run the same attention path (`model.attention_impl`), so the FLOP ratio is
theirs too; the time column is the TPU model's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo

from vapo_jax import config as config_lib  # noqa: E402
from vapo_jax import packing  # noqa: E402
from vapo_jax.pod import archs  # noqa: E402
from vapo_jax.pod import step as step_model  # noqa: E402
from vapo_jax.pod import slices  # noqa: E402
from vapo_jax.pod import lengths as lengths_lib  # noqa: E402


def _flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/tiny.py")
  p.add_argument("--arch", default=None, help="as compile_check --arch (default: the config's)")
  p.add_argument("--topology", default="v5p-8", help="slice whose batch shards the plan uses")
  p.add_argument("--lengths", required=True, help="response lengths (pod.lengths spec)")
  p.add_argument("--prompt_lengths", default="fixed:0", help="real prompt lengths (0: P)")
  p.add_argument("--row_factors", default="1,2,4,8")
  return p.parse_args(argv)


def load(path, **over):
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  for key, v in over.items():
    sec, name = key.split(".")
    c[sec][name] = v
  return config_lib.from_config_dict(c)


def figures(cfg, mcfg, s, resp, prompts, factor: int) -> dict:
  """One row length's figures (factor 0: the padded rows)."""
  seq = cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
  if factor:
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, packing_row_tokens=factor * seq))
  st = step_model.Setup.of(cfg, mcfg, s, step_model.Knobs(train="packed" if factor else "padded"))
  progs = step_model.train_side(st, resp, prompts)
  out = {"flops": sum(p.flops for p in progs), "time": sum(p.time for p in progs)}
  real = float((resp + prompts).sum())
  if not factor:
    return {**out, "T": seq, "forward": real / (len(resp) * seq), "steps": real / (len(resp) * seq)}
  fwd = packing.plan(prompts, resp, st.pack_forward)
  per = len(resp) // max(1, cfg.rl.num_minibatches)
  plans = [packing.plan(prompts[i:i + per], resp[i:i + per], st.pack_steps)
           for i in range(0, len(resp), per)]
  computed = sum(float(p.shape[0] * p.shape[1] * p.shape[2]) for p in plans)
  return {**out, "T": st.pack_forward.row_len, "shape": fwd.shape,
          "rows_per_device": st.pack_forward.rows_per_device, "forward": fwd.efficiency,
          "steps": real / computed}


def main(argv=None):
  a = _flags(argv)
  cfg = load(a.config)
  mcfg = archs.model_config(cfg, a.arch)
  s = slices.parse(a.topology)
  rows = cfg.rl.rollout_prompts * cfg.rl.group_size
  p_len, r_len = cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens
  resp = lengths_lib.sample(a.lengths, rows, r_len, lo=0)
  prompts = (lengths_lib.sample(a.prompt_lengths, rows, p_len, seed=2, prefix="prompt/length_")
             if a.prompt_lengths != "fixed:0" else resp * 0 + p_len)
  print(f"{a.config}: B={rows}, P={p_len}, R={r_len}, responses mean {resp.mean():.0f} "
        f"(max {resp.max()}), prompts mean {prompts.mean():.0f}; {s.name}; attention "
        f"{mcfg.attention_impl} (block {mcfg.attention_block})")
  pad = figures(cfg, mcfg, s, resp, prompts, 0)
  print(f"  {'rows':>14s} {'T':>7s} {'fwd [n,K,T]':>18s} {'real/comp fwd':>13s} "
        f"{'steps':>6s} {'FLOPs vs padded':>15s} {'model time vs padded':>20s}")
  print(f"  {'padded':>14s} {pad['T']:7d} {'':>18s} {pad['forward']:13.3f} {pad['steps']:6.3f} "
        f"{1.0:15.3f} {1.0:20.3f}")
  for f in (int(x) for x in a.row_factors.split(",")):
    r = figures(cfg, mcfg, s, resp, prompts, f)
    print(f"  {f'packed {f}(P+R)':>14s} {r['T']:7d} {str(list(r['shape'])):>18s} "
          f"{r['forward']:13.3f} {r['steps']:6.3f} {r['flops'] / pad['flops']:15.3f} "
          f"{r['time'] / pad['time']:20.3f}")


if __name__ == "__main__":
  main()
