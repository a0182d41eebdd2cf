r"""Sampler throughput: vapo_jax's KV-cache sampler vs transformers `generate`.

Both sides run the same random Qwen2-style checkpoint (written once by
transformers and loaded by `hf_io.from_pretrained`), the same batch, prompt
length and number of new tokens, with sampling on (temperature 1, top-p 1, top-k
off, no stop token, so every row makes exactly R tokens), float32, on this CPU
with all cores (`torch.set_num_threads`).

  python benchmarks/sampler_bench.py                # --preset=tiny
  python benchmarks/sampler_bench.py --preset=small --repeats=2
  python benchmarks/sampler_bench.py --preset=all   # tiny, small, then group

The `group` preset is the RL workload: 4 prompts x 8 responses each (32 rows)
on the small model. vapo_jax prefills each prompt once and shares its cache
over the group (`n_per_prompt=8`); transformers `generate` with
`num_return_sequences=8` prefills all 32 rows. The other presets have one
response per prompt, so both sides do the same work.

Prints tokens/s (new tokens only, wall time after warm-up, median of --repeats
interleaved rounds), the ratio (median of the per-round ratios, each printed),
and the fraction of the roofline reached; the load average at start and end
(max sampled during the run) and machine facts. All figures of a run whose load
went above 1 are marked LOADED — not a result (benchmarks/quiet.py); --json
writes them with "quiet": true/false. Roofline: for prefill and
each decode step, time >= max(FLOPs / peak FLOP/s, bytes / peak bandwidth),
where FLOPs = 2 * (matmul params) per token + attention over the live context
(the LM head only at the last prompt position, and each distinct prompt
prefilled once), bytes = parameters + live KV cache read once per step, and
peaks are measured in this run (float32 matmul, large copy: `quiet.machine_peaks`). Each side's
calls also print their minor page faults and user / system CPU seconds (getrusage), which stay
meaningful on a loaded machine. Like `vapo_jax.main`, the script first applies
`vapo_jax.run.host_memory`'s malloc settings (to both sides: one process); VAPO_HOST_MALLOC=0
runs with glibc's defaults.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np

# Run from a checkout without installing: this repository's vapo_jax first.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import quiet  # noqa: E402  # load, interleaved rounds, marking
from vapo_jax.run import host_memory  # noqa: E402  # pylint: disable=wrong-import-position

PRESETS = {
    # ~1.3M params: configs/tiny.py territory; per-step overhead dominates.
    "tiny":
        dict(vocab=4096, hidden=128, inter=352, layers=4, heads=4, kv=2,
             batch=16, prompt=64, new=128),
    # ~39M params: compute dominates on 2 cores.
    "small":
        dict(vocab=32768, hidden=512, inter=1408, layers=8, heads=8, kv=2,
             batch=16, prompt=64, new=128),
    # The RL workload on the small model: group sampling, batch = rows.
    "group":
        dict(vocab=32768, hidden=512, inter=1408, layers=8, heads=8, kv=2,
             batch=32, prompt=64, new=128, n=8),
}


def _rusage_delta(r0) -> dict:
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  return {"minflt": r1.ru_minflt - r0.ru_minflt, "user_s": r1.ru_utime - r0.ru_utime,
          "sys_s": r1.ru_stime - r0.ru_stime}


def _describe_kernel(calls) -> str:
  """Per-call means of minor faults and CPU seconds (meaningful on a loaded machine too)."""
  n = max(len(calls), 1)
  flt, user, sys_s = (sum(c[k] for c in calls) / n for k in ("minflt", "user_s", "sys_s"))
  share = 100 * sys_s / max(user + sys_s, 1e-9)
  return (f"{flt:,.0f} minor faults per call ({flt * 4096 / 2**20:.0f} MiB of fresh pages), "
          f"CPU user {user:.2f} s + system {sys_s:.2f} s ({share:.1f}% in the kernel)")


def roofline_seconds(p, flops_peak, bw_peak):
  """Lower bound on the time of one generate call (prefill + decode)."""
  d, f, L = p["hidden"], p["inter"], p["layers"]
  h, k, v = p["heads"], p["kv"], p["vocab"]
  dh = d // h
  b, P, R = p["batch"], p["prompt"], p["new"]
  prompts = b // p.get("n", 1)
  layer_params = d * dh * (h + 2 * k) + h * dh * d + 3 * d * f
  matmul_params = L * layer_params + d * v  # + LM head (tied: the embedding)
  param_bytes = 4 * (L * layer_params + d * v)
  kv_bytes_per_tok = 4 * 2 * L * k * dh

  def attn_flops(q_tokens, ctx):
    return 4 * L * h * dh * q_tokens * ctx

  prefill_flops = prompts * (2 * L * layer_params * P + 2 * d * v
                             + attn_flops(P, P / 2))
  t = max(prefill_flops / flops_peak,
          (param_bytes + prompts * P * kv_bytes_per_tok) / bw_peak)
  for i in range(R - 1):
    ctx = P + i + 1
    t += max(b * (2 * matmul_params + attn_flops(1, ctx)) / flops_peak,
             (param_bytes + b * ctx * kv_bytes_per_tok) / bw_peak)
  return t


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", choices=sorted(PRESETS) + ["all"], default="tiny")
  ap.add_argument("--repeats", "--rounds", dest="repeats", type=int, default=3,
                  help="interleaved rounds (vapo_jax, then generate, ...); medians and "
                  "per-round ratios")
  ap.add_argument("--threads", type=int, default=os.cpu_count())
  quiet.add_flags(ap)
  args = ap.parse_args()
  # As `vapo_jax.main` does, before jax starts (both sides run in this process and share it).
  malloc = host_memory.configure(host_memory.expected_platform())
  print(f"malloc: {malloc or 'glibc defaults'} (run/host_memory.py; {host_memory.ENV}=0: off)")
  names = list(PRESETS) if args.preset == "all" else [args.preset]
  facts = quiet.machine_facts(peers=("torch", "transformers"))
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    figures = [run(name, PRESETS[name], args, load) for name in names]
  for lines, _ in figures:
    for line in lines:
      print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, {r["preset"]: r for _, r in figures})


def run(preset: str, p: dict, args, load: quiet.Load):
  """Benchmarks one preset; returns (figure lines, JSON results)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler import static as static_lib  # pylint: disable=g-import-not-at-top
  from vapo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler.ops import SamplingConfig  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen2Config(
      vocab_size=p["vocab"], hidden_size=p["hidden"],
      intermediate_size=p["inter"], num_hidden_layers=p["layers"],
      num_attention_heads=p["heads"], num_key_value_heads=p["kv"],
      tie_word_embeddings=True, rms_norm_eps=1e-6)
  hf_model = transformers.Qwen2ForCausalLM(hf_cfg).float().eval()
  n_params = sum(x.numel() for x in hf_model.parameters())
  with tempfile.TemporaryDirectory(prefix="sampler_bench_") as path:
    hf_model.save_pretrained(path)
    model, model_cfg = hf_io.from_pretrained(path)
    jax.block_until_ready(nnx.state(model))  # read before the files go

  b, P, R, n = p["batch"], p["prompt"], p["new"], p.get("n", 1)
  rng = np.random.RandomState(0)
  prompts = rng.randint(1, p["vocab"], (b // n, P))
  new_tokens = b * R

  # --- vapo_jax -------------------------------------------------------------
  graphdef, state = nnx.split(model)
  cfg = SamplingConfig(max_new_tokens=R, temperature=1.0, top_p=1.0, top_k=0,
                       max_prompt_len=P, pad_id=0, n_per_prompt=n)
  sampler = static_lib.Sampler.for_transformer(graphdef, model_cfg, cfg)
  prompt_list = prompts.tolist()
  t = time.perf_counter()
  jax.block_until_ready(sampler(state, prompt_list, jax.random.key(0)))
  compile_s = time.perf_counter() - t

  # --- transformers generate (same prompts, same R, sampling on) -------------
  ids = torch.tensor(prompts, dtype=torch.long)
  mask = torch.ones_like(ids)
  gen_kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=R, min_new_tokens=R, pad_token_id=0,
                eos_token_id=None, num_return_sequences=n)
  with torch.inference_mode():
    hf_model.generate(input_ids=ids, attention_mask=mask,
                      **dict(gen_kw, max_new_tokens=4, min_new_tokens=4))

  # Interleaved, so that load from other processes hits both sides alike.
  last = {}
  kernel = {"vapo_jax": [], "transformers": []}  # per call: minor faults, user s, system s

  def ours():
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    last["out"] = jax.block_until_ready(
        sampler(state, prompt_list, jax.random.key(len(rounds_seen) + 1)))
    kernel["vapo_jax"].append(_rusage_delta(r0))

  def theirs():
    with torch.inference_mode():
      r0 = resource.getrusage(resource.RUSAGE_SELF)
      t = time.perf_counter()
      last["gen"] = hf_model.generate(input_ids=ids, attention_mask=mask, **gen_kw)
      elapsed = time.perf_counter() - t
      kernel["transformers"].append(_rusage_delta(r0))
      return elapsed

  rounds_seen = []
  rounds = quiet.interleave([("vapo_jax", ours), ("transformers", theirs)],
                            args.repeats, load=load, each_round=rounds_seen.append)
  out, gen = last["out"], last["gen"]
  assert int(np.asarray(out.lengths_B).sum()) == new_tokens
  assert gen.shape == (b, P + R), gen.shape

  # --- report ---------------------------------------------------------------
  flops_peak, bw_peak = quiet.machine_peaks()
  bound = roofline_seconds(p, flops_peak, bw_peak)
  t_ours, t_theirs = rounds.median("vapo_jax"), rounds.median("transformers")
  print(f"preset {preset}: Qwen2 {n_params / 1e6:.1f}M params "
        f"(V={p['vocab']}, D={p['hidden']}, L={p['layers']}, H={p['heads']}, "
        f"K={p['kv']}), float32, batch {b}"
        + (f" ({b // n} prompts x {n} responses)" if n > 1 else "") +
        f", prompt {P}, new tokens {R}, "
        f"sampling T=1 top_p=1 top_k=off, torch threads {args.threads}, "
        f"median of {args.repeats} interleaved runs")
  lines = [
      f"[{preset}] vapo_jax sampler      : {new_tokens / t_ours:9.1f} tokens/s  "
      f"({t_ours:.3f} s; first call incl. compile {compile_s:.1f} s)",
      f"[{preset}] transformers generate : {new_tokens / t_theirs:9.1f} tokens/s  "
      f"({t_theirs:.3f} s)",
      f"[{preset}] " + rounds.describe_ratio("vapo_jax", "transformers", "ratio"),
      f"[{preset}] roofline (peaks measured here: {flops_peak / 1e9:.0f} GFLOP/s fp32 "
      f"matmul, {bw_peak / 1e9:.1f} GB/s copy): bound {bound:.3f} s -> "
      f"vapo_jax {100 * bound / t_ours:.1f}%, "
      f"transformers {100 * bound / t_theirs:.1f}%"]
  lines += [f"[{preset}] {side:<21}: " + _describe_kernel(calls)
            for side, calls in kernel.items()]
  results = {"preset": preset, "params": n_params, "batch": b, "prompt": P, "new": R,
             "n_per_prompt": n, "compile_s": compile_s,
             "vapo_jax_tokens_per_s": new_tokens / t_ours,
             "transformers_tokens_per_s": new_tokens / t_theirs,
             "roofline_s": bound, "flops_peak": flops_peak, "bw_peak": bw_peak,
             "rusage_per_call": kernel,
             **rounds.to_json([("vapo_jax", "transformers")])}
  return lines, results


if __name__ == "__main__":
  main()
