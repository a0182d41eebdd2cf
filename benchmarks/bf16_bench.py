"""bfloat16 against float32 for the forward-only work: the frozen base and the decode copy.

  python benchmarks/bf16_bench.py --json=benchmarks/results/bf16-DATE/bf16_bench.json
  python benchmarks/bf16_bench.py --tiny --rounds=1      # smoke: tiny shapes, no figures

A SmolLM2-135M-sized model with random weights (30 layers, hidden 576, 9 q / 3 kv heads,
head_dim 64, MLP 1536, vocab 49,152, tied head; `--tiny` shrinks it), on our side (jax) and
torch's, each in float32 and in bfloat16, the sides interleaved round by round
(benchmarks/quiet.py); medians of `--rounds` timed rounds after one warm-up:

  1. matmul   the model's projections, x [M, D_in] @ w [D_in, D_out], at M = --tokens (a
              forward pass) and M = --rows (a decode step): q, kv, o, gate+up, down and the
              LM head. Ours through `vapo_jax.models.matmul.matmul`, bf16 inputs with a
              float32 accumulator and output (`preferred_element_type`, as the model's head);
              torch: `torch.matmul` on bf16 tensors (its CPU kernels accumulate in float32,
              the output is bf16).
  2. forward  one forward of [--batch, --seq] tokens to float32 log-probs of the next tokens
              (the reference's / old policy's pass: a frozen copy of the weights). Ours:
              `Transformer` with param_dtype = dtype = bfloat16 (weights cast once, as the
              decode copy; norms, softmax and RoPE stay float32 inside); torch:
              transformers' LlamaForCausalLM `.to(bfloat16)`.
  3. decode   one decode step of --rows rows over a KV cache of --cache tokens (the rollout's
              step; ours through the dense cache of `Transformer.__call__`, not the engine's
              paged pool).

Printed per part: seconds (median) of each side and dtype, GFLOP/s, bf16's speed-up over
float32 on each side (f32 time / bf16 time) and ours against torch's (torch time / ours) in
each dtype; then the parity of the forward: max and mean |Δ log p| of the bf16 forward
against the float32 one, on the same weights and sequences, for each side. Machine (CPU
flags: avx512_bf16, amx_bf16), peaks (`quiet.all_peaks`) and versions go in the JSON; a
loaded machine's figures are marked LOADED — not a result.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import quiet  # noqa: E402  pylint: disable=wrong-import-position

SMOLLM2 = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, mlp=1536, vocab=49152)
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256)
DTYPES = ("float32", "bfloat16")


# ----------------------------------------------------------------------------- arithmetic
def projections(m: dict) -> dict[str, tuple[int, int]]:
  """(D_in, D_out) of each projection of model sizes `m` (kv: k and v together, gate_up:
  gate and up together, as one matmul each would be)."""
  d, h, k, dh, f, v = (m["hidden"], m["heads"], m["kv_heads"], m["head_dim"], m["mlp"],
                       m["vocab"])
  return {"q": (d, h * dh), "kv": (d, 2 * k * dh), "o": (h * dh, d), "gate_up": (d, 2 * f),
          "down": (f, d), "head": (d, v)}


def matmul_flops(rows: int, shape: tuple[int, int]) -> float:
  return 2.0 * rows * shape[0] * shape[1]


def speedups(med: dict[str, float]) -> dict[str, float | None]:
  """From medians keyed "<side> <dtype>": bf16's speed-up on each side (f32 / bf16 time) and
  ours against torch in each dtype (torch time / ours); None where a side is missing."""
  def ratio(a, b):
    return med[a] / med[b] if a in med and b in med and med[b] > 0 else None
  return {"jax bf16 speed-up": ratio("jax float32", "jax bfloat16"),
          "torch bf16 speed-up": ratio("torch float32", "torch bfloat16"),
          "torch/jax float32": ratio("torch float32", "jax float32"),
          "torch/jax bfloat16": ratio("torch bfloat16", "jax bfloat16")}


def logp_gap(lp_a: np.ndarray, lp_b: np.ndarray) -> dict[str, float]:
  """max and mean |Δ log p| of two [B, T] log-prob arrays (float64 arithmetic)."""
  d = np.abs(np.asarray(lp_a, np.float64) - np.asarray(lp_b, np.float64))
  return {"max_abs": float(d.max()), "mean_abs": float(d.mean())}


def model_sizes(args) -> dict:
  return dict(TINY if args.tiny else SMOLLM2)


# ------------------------------------------------------------------------------- our side
def jax_sides(m: dict, args, tokens: np.ndarray) -> tuple[dict, dict]:
  """({part: {dtype: fn}} of jitted jax calls, {dtype: log-probs [B, T - 1]})."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import ModelConfig, Transformer  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import transformer as tlib  # pylint: disable=import-outside-toplevel
  from vapo_jax.models.matmul import matmul  # pylint: disable=import-outside-toplevel

  def config(dtype):
    return ModelConfig(vocab_size=m["vocab"], hidden_size=m["hidden"],
                       intermediate_size=m["mlp"], num_layers=m["layers"],
                       num_heads=m["heads"], num_kv_heads=m["kv_heads"],
                       head_dim=m["head_dim"], tie_word_embeddings=True, rope_theta=1e5,
                       model_type="llama", param_dtype=dtype, dtype=dtype)

  base = Transformer(config("float32"), rngs=nnx.Rngs(0))
  _, state32 = nnx.split(base)
  fns: dict = {"matmul": {}, "forward": {}, "decode": {}}
  logps = {}
  rng = np.random.RandomState(1)
  toks = jnp.asarray(tokens)
  mask = jnp.ones(tokens.shape, jnp.int32)
  b_dec = args.rows
  dec_tok = jnp.asarray(tokens[:1, :1].repeat(b_dec, 0))
  for dt in DTYPES:
    graphdef, _ = nnx.split(nnx.eval_shape(lambda dt=dt: Transformer(config(dt),
                                                                     rngs=nnx.Rngs(0))))
    state = jax.tree.map(lambda x, dt=dt: x.astype(dt), state32)  # the decode / frozen copy
    model = nnx.merge(graphdef, state)
    gd, params = nnx.split(model)

    @jax.jit
    def logp(params, toks, mask, gd=gd):
      mdl = nnx.merge(gd, params)
      lg = tlib.forward_logits(mdl, toks, mask)[:, :-1]
      lp = jax.nn.log_softmax(lg.astype(jnp.float32), axis=-1)
      return jnp.take_along_axis(lp, toks[:, 1:, None], -1)[..., 0]
    fns["forward"][dt] = (lambda logp=logp, params=params:
                          logp(params, toks, mask).block_until_ready())
    logps[dt] = np.asarray(logp(params, toks, mask))

    cache = tlib.init_cache(model, b_dec, args.cache + 1)
    kv_mask = jnp.ones((b_dec, args.cache + 1), jnp.int32)
    pos = jnp.full((b_dec, 1), args.cache, jnp.int32)

    @jax.jit
    def step(params, cache, gd=gd):
      mdl = nnx.merge(gd, params)
      h, cache = mdl(dec_tok, pos, kv_mask, cache=cache, cache_index=args.cache)
      return mdl.logits(h[:, -1]), cache
    fns["decode"][dt] = (lambda step=step, params=params, cache=cache:
                         jax.block_until_ready(step(params, cache)))

    mm = jax.jit(lambda x, w: matmul(x, w, 1, jnp.float32))
    for name, (din, dout) in projections(m).items():
      w = jnp.asarray(rng.randn(din, dout) * 0.02, dt)
      for rows in (args.tokens, args.rows):
        x = jnp.asarray(rng.randn(rows, din), dt)
        fns["matmul"].setdefault(f"{name} M={rows}", {})[dt] = (
            lambda x=x, w=w: mm(x, w).block_until_ready())
  return fns, logps


# ----------------------------------------------------------------------------- torch side
def torch_sides(m: dict, args, tokens: np.ndarray) -> tuple[dict, dict]:
  """The same parts in torch (transformers' Llama, random weights of its own)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
      vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["mlp"],
      num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
      num_key_value_heads=m["kv_heads"], head_dim=m["head_dim"], tie_word_embeddings=True)
  base = transformers.LlamaForCausalLM(cfg).float().eval()
  toks = torch.as_tensor(tokens, dtype=torch.long)
  fns: dict = {"matmul": {}, "forward": {}, "decode": {}}
  logps = {}
  gen = torch.Generator().manual_seed(1)
  for dt in DTYPES:
    tdt = getattr(torch, dt)
    model = base if dt == "float32" else copy.deepcopy(base).to(tdt)  # same weights

    def logp(model=model):
      with torch.no_grad():
        lg = model(toks).logits[:, :-1].float()
        return torch.log_softmax(lg, -1).gather(-1, toks[:, 1:, None])[..., 0]
    fns["forward"][dt] = logp
    logps[dt] = logp().numpy()

    with torch.no_grad():
      pre = torch.as_tensor(tokens[:1, :1].repeat(args.rows, 0).repeat(args.cache, 1))
      cache = model(pre, use_cache=True).past_key_values

    def step(model=model, cache=cache, dec=pre[:, :1]):
      with torch.no_grad():
        out = model(dec, past_key_values=cache, use_cache=True)
        if hasattr(cache, "crop"):
          cache.crop(-1)  # drop the token just added: the same cache length every call
        return out.logits
    fns["decode"][dt] = step

    for name, (din, dout) in projections(m).items():
      w = (torch.randn(din, dout, generator=gen) * 0.02).to(tdt)
      for rows in (args.tokens, args.rows):
        x = torch.randn(rows, din, generator=gen).to(tdt)
        fns["matmul"].setdefault(f"{name} M={rows}", {})[dt] = (
            lambda x=x, w=w: torch.matmul(x, w))
  return fns, logps


# -------------------------------------------------------------------------------- measure
def time_part(sides: dict[str, dict], rounds: int, load) -> dict[str, float]:
  """Medians of `rounds` interleaved rounds (after one warm-up) of {"<side> <dtype>": fn}."""
  flat = [(f"{side} {dt}", fn) for side, by_dt in sides.items() for dt, fn in by_dt.items()]
  got = quiet.interleave(flat, rounds + 1, load=load)
  return {k: statistics.median(v[1:]) for k, v in got.times.items()}


def measure(args, load) -> tuple[list[str], dict]:
  m = model_sizes(args)
  tokens = np.random.RandomState(0).randint(0, m["vocab"], (args.batch, args.seq))
  jfns, jlp = jax_sides(m, args, tokens)
  sides = {"jax": jfns}
  tlp = {}
  if not args.no_torch:
    try:
      tfns, tlp = torch_sides(m, args, tokens)
      sides["torch"] = tfns
    except ImportError as e:
      print(f"note: no torch side ({e})")
  results: dict = {"model": m, "settings": {k: getattr(args, k) for k in
                                            ("tokens", "rows", "batch", "seq", "cache",
                                             "rounds", "tiny")},
                   "parts": {}}
  lines = []
  for part in ("matmul", "forward", "decode"):
    keys = list(jfns[part]) if part == "matmul" else [part]
    for key in keys:
      def pick(fns, key=key, part=part):
        return fns[part][key] if part == "matmul" else fns[part]
      med = time_part({s: pick(f) for s, f in sides.items()}, args.rounds, load)
      sp = speedups(med)
      results["parts"][key] = {"median_s": med, "ratios": sp}
      flops = None
      if part == "matmul":
        name, rows = key.split(" M=")
        flops = matmul_flops(int(rows), projections(m)[name])
      rate = "" if flops is None else " (" + ", ".join(
          f"{k} {flops / v / 1e9:.0f}" for k, v in med.items()) + " GFLOP/s)"
      lines.append(f"{key}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items())
                   + rate + "; " + ", ".join(f"{k} {v:.2f}x" for k, v in sp.items()
                                             if v is not None))
  parity = {"jax": logp_gap(jlp["bfloat16"], jlp["float32"])}
  if tlp:
    parity["torch"] = logp_gap(tlp["bfloat16"], tlp["float32"])
  results["parity"] = parity
  lines.append("parity, bf16 forward against float32 on the same weights and "
               f"{args.batch} x {args.seq} tokens: " + "; ".join(
                   f"{s} max |Δ log p| {p['max_abs']:.3g}, mean {p['mean_abs']:.3g}"
                   for s, p in parity.items()))
  return lines, results


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
  ap.add_argument("--tokens", type=int, default=None, help="M of a forward's matmuls "
                  "(default 2048; tiny 64)")
  ap.add_argument("--rows", type=int, default=None, help="decode rows (default 16; tiny 4)")
  ap.add_argument("--batch", type=int, default=None, help="forward rows (default 8; tiny 2)")
  ap.add_argument("--seq", type=int, default=None, help="forward length (default 256; tiny 16)")
  ap.add_argument("--cache", type=int, default=None, help="decode KV length (default 256; "
                  "tiny 16)")
  ap.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up")
  ap.add_argument("--no-torch", action="store_true", help="ours only")
  ap.add_argument("--no-peaks", action="store_true", help="skip quiet.all_peaks")
  quiet.add_flags(ap)
  args = ap.parse_args(argv)
  for k, full, tiny in (("tokens", 2048, 64), ("rows", 16, 4), ("batch", 8, 2), ("seq", 256, 16),
                        ("cache", 256, 16)):
    if getattr(args, k) is None:
      setattr(args, k, tiny if args.tiny else full)
  facts = quiet.machine_facts(("torch", "transformers"))
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    peaks = None if args.no_peaks else quiet.all_peaks(reps=5)
    lines, results = measure(args, load)
  if peaks:
    results["machine_peaks"] = peaks
    lines.insert(0, "peaks: " + quiet.describe_peaks(peaks["flops_peak"], peaks["bw_peak"],
                                                     peaks["bf16_flops_peak"]))
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, results)


if __name__ == "__main__":
  main()
