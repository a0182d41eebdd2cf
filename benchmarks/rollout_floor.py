"""A rollout's physical floor on this machine: the least time its prefill and decode steps need.

    floor = prefill + Σ_steps max(bytes_i / copy_bw, flops_i / matmul_peak)

Decode step i (i = 0 .. max length − 1) computes only the responses still generating at i
(`live_i`: responses longer than i), whatever rows the engine ran:

    bytes_i = W · w + Σ_live (P_b + i) · kv          (each weight once, each live row's cache)
    flops_i = live_i · (2 M + 4 L H Dh (P_b + i))     (projections and head; q·k and p·v)

W: parameters (the embedding read as the tied head), w: bytes per decode weight (4 float32,
2 bfloat16), kv = 2 L K Dh · w bytes per cached token, M: matmul parameters per token (the
blocks' projections and the head), P_b: response b's prompt length. The prefill runs each
distinct prompt once (`prompt_tokens`): max(W w / copy_bw, (2 M + 2 L H Dh P) P / peak)
summed per prompt. The peaks are the machine's own (`quiet.all_peaks`, measured in the
same run). It assumes compute and memory overlap perfectly (the roofline's max), so no
implementation reaches it: the issue asks our engine for ≥ 40% of it on the TRL bench.

    python benchmarks/rollout_floor.py [--rounds=5] [--dtypes=float32,bfloat16] [--json=F]
    python benchmarks/rollout_floor.py --tiny --rounds=1        # smoke (tests)

The command times our rollout engine alone on the TRL bench's rollout (`trl_bench.py`'s
config, model and P prompts x G samples, T = 1, <= max new tokens) with one engine per
decode-copy dtype, rounds interleaved after a warm-up that compiles, and prints each one's
seconds per rollout beside its floor and the share, from the peaks measured in the same
run; the bfloat16 copy is also set against the float32 copy's floor (the floor of the
float32 computation the bench's trainer does). `trl_bench.py` prints the same line for the
engine of its rollout-alone part. A run whose load went above 1 is marked LOADED.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np


def model_terms(mcfg, decode_bytes: int) -> dict[str, float]:
  """Per-token constants of a decoder (`vapo_jax.models.config.ModelConfig`)."""
  d, f, L = mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_layers
  h, k, dh = mcfg.num_heads, mcfg.num_kv_heads, mcfg.head_dim
  block = d * dh * (h + 2 * k) + h * dh * d + 3 * d * f
  return {"weights_bytes": float(mcfg.num_params * decode_bytes),
          "matmul_params": float(L * block + mcfg.vocab_size * d),
          "kv_bytes_per_token": float(2 * L * k * dh * decode_bytes),
          "attn_flops_per_ctx": float(4 * L * h * dh)}


def floor_seconds(terms: dict[str, float], prompt_tokens: Sequence[int],
                  response_prompts: Sequence[int], response_lengths: Sequence[int],
                  flops_peak: float, bw_peak: float) -> dict[str, float]:
  """The floor of one rollout, split into prefill and decode (seconds), and its step count.

  prompt_tokens: the length of each distinct prompt prefilled; response_prompts[b] and
  response_lengths[b]: response b's prompt length and generated tokens (EOS included).
  """
  w, m = terms["weights_bytes"], terms["matmul_params"]
  kv, att = terms["kv_bytes_per_token"], terms["attn_flops_per_ctx"]
  pre = 0.0
  for p in prompt_tokens:
    pre += max(w / bw_peak, (2.0 * m * p + 0.5 * att * p * p) / flops_peak)
  lengths = np.asarray(response_lengths, np.int64)
  prompts = np.asarray(response_prompts, np.int64)
  steps = int(lengths.max(initial=0))
  dec = 0.0
  for i in range(steps):
    live = lengths > i
    ctx = float((prompts[live] + i).sum())
    bytes_i = w + ctx * kv
    flops_i = 2.0 * m * float(live.sum()) + att * ctx
    dec += max(bytes_i / bw_peak, flops_i / flops_peak)
  return {"prefill_s": pre, "decode_s": dec, "floor_s": pre + dec, "decode_steps": steps}


def describe(measured_s: Sequence[float], floors: Sequence[dict], label: str) -> str:
  """One line: the measured seconds, the floor and the share (floor / measured) per round."""
  shares = [f["floor_s"] / t for t, f in zip(measured_s, floors)]
  return (f"{label}: {np.mean(measured_s):.3g} s per rollout against a floor of "
          f"{np.mean([f['floor_s'] for f in floors]):.3g} s (prefill "
          f"{np.mean([f['prefill_s'] for f in floors]):.3g} s, "
          f"{np.mean([f['decode_steps'] for f in floors]):.0f} decode steps): "
          f"{100 * np.mean(shares):.0f}% of the floor (per round "
          + ", ".join(f"{100 * s:.0f}%" for s in shares) + ")")


def measure(args, load) -> dict:
  """The engine per dtype, interleaved rounds (see the module doc)."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  import quiet  # pylint: disable=import-outside-toplevel
  import trl_bench  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import sampling, trainer as trainer_lib  # pylint: disable=import-outside-toplevel

  peaks = quiet.all_peaks(reps=5) if not args.tiny else quiet.all_peaks(reps=1)
  if args.tiny:
    cfg = _tiny_config(args)
  else:
    cfg = trl_bench.our_config(args.config, args.preset, trl_bench.model_dir_of(args), args)
  t = trainer_lib.Trainer(cfg, progress=False)
  p, text = t.parts, t.parts.text
  examples = p.train_examples[:args.prompts]
  prompt_lens = [len(text.prompt_ids(e.problem)) for e in examples]
  engines = {}
  for dt in args.dtypes.split(","):
    c = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, decode_dtype=dt))
    engines[dt] = sampling.build_sampler(c, p.graphdef, p.model_cfg, p.mesh, p.rules, text,
                                         n=args.group, rows=args.prompts * args.group)
  key = jax.random.key(args.seed)
  out = {dt: {"seconds": [], "lengths": [], "stats": []} for dt in engines}
  for i in range(args.rounds + 1):  # round 0 compiles
    order = list(engines) if i % 2 == 0 else list(reversed(list(engines)))
    for dt in order:
      eng = engines[dt]
      t0 = time.perf_counter()
      roll = rollout_lib.sample(eng, t.state.policy_params,
                                lambda j: text.prompt_ids(examples[j].problem), len(examples),
                                jax.random.fold_in(key, i))
      lengths = [int(x) for x in jax.block_until_ready(roll.lengths_B)]
      dt_s = time.perf_counter() - t0
      eng.clear_cache()
      if i:
        out[dt]["seconds"].append(dt_s)
        out[dt]["lengths"].append(lengths)
        out[dt]["stats"].append(dict(getattr(eng, "last_stats", {})))
    load.sample()
  results = {"machine_peaks": peaks, "prompts": args.prompts, "group": args.group,
             "max_new_tokens": cfg.sampling.max_new_tokens, "prompt_lengths": prompt_lens,
             "engines": {}}
  for dt, o in out.items():
    dbytes = int(np.dtype(engines[dt].decode_dtype).itemsize)
    peak = peaks["flops_peak"] if dbytes == 4 else peaks.get("bf16_flops_peak",
                                                             peaks["flops_peak"])
    floors, f32 = [], []
    for lens in o["lengths"]:
      rp = [prompt_lens[b // args.group] for b in range(len(lens))]
      floors.append(floor_seconds(model_terms(p.model_cfg, dbytes), prompt_lens, rp, lens,
                                  peak, peaks["bw_peak"]))
      f32.append(floor_seconds(model_terms(p.model_cfg, 4), prompt_lens, rp, lens,
                               peaks["flops_peak"], peaks["bw_peak"]))
    line = describe(o["seconds"], floors, f"engine, {dt} decode copy")
    share32 = [f["floor_s"] / s for f, s in zip(f32, o["seconds"])]
    if dbytes != 4:
      line += f"; {100 * np.mean(share32):.0f}% of the float32 copy's floor"
    results["engines"][dt] = {**o, "floors": floors, "float32_floors": f32,
                              "share": [f["floor_s"] / s for f, s in zip(floors, o["seconds"])],
                              "share_of_float32_floor": share32, "line": line}
  t.close()
  return results


def _tiny_config(args):
  """configs/tiny.py with the bench's rollout sizes (the smoke run)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel

  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "tiny.py")
  spec = importlib.util.spec_from_file_location("tiny_cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("grpo")
  c.sampling.engine = "continuous"
  c.rl.prompts_per_step, c.rl.responses_per_prompt = args.prompts, args.group
  c.value_pretrain.enabled = False
  c.sft.enabled = False
  c.eval.every = 0
  c.checkpoint.every = 0
  return config_lib.from_config_dict(c)


def main(argv=None) -> None:
  import os  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path.insert(0, os.path.dirname(here))
  sys.path.insert(0, here)
  import quiet  # pylint: disable=import-outside-toplevel

  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default=None, help="HF directory of the converted model")
  ap.add_argument("--config", default=os.path.join(os.path.dirname(here), "configs",
                                                   "smollm2_135m.py"))
  ap.add_argument("--preset", default="grpo")
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--group", type=int, default=4)
  ap.add_argument("--max-prompt", type=int, default=128)
  ap.add_argument("--max-new", type=int, default=64)
  ap.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up")
  ap.add_argument("--dtypes", default="float32,bfloat16", help="decode-copy dtypes to run")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--tiny", action="store_true", help="configs/tiny.py (a smoke run)")
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  # trl_bench.our_config's other settings, as the TRL bench sets them
  for k, v in {"lr": 1e-6, "old_logprobs": None, "row_tokens": None, "row_steps": None,
               "micro_batch": None, "device": "cpu"}.items():
    setattr(args, k, v)
  facts = quiet.machine_facts()
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    res = measure(args, load)
  for e in res["engines"].values():
    print(load.tag(e["line"]), flush=True)
  print(load.verdict())
  quiet.write_json(args.json, load, facts, res)

if __name__ == "__main__":
  main()
