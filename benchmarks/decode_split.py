"""Where a decode step of the sampler goes: whole step, LM head, layer matmuls. CPU.

  python benchmarks/decode_split.py                  # the sampler_bench `small` shapes
  python benchmarks/decode_split.py --rows 32 --n 8  # the `group` preset

On a random Qwen2-style model (tied embeddings, float32), per decode step:

  * step: (generate call - prefill-only call) / (new tokens - 1), medians over rounds;
  * LM head: the same with the head computed twice in the loop, minus the step;
  * layer matmuls: the L layers' projections alone (q, k, v, o, gate, up, down on
    `rows` rows, distinct weights per layer) in a loop of the same length;
  * the rest (attention, norms, RoPE, cache writes, sampling) = step - head - matmuls.

The three timings run in interleaved rounds. The load average is printed at start and
end and the figures of a loaded run are marked LOADED - not a result (benchmarks/quiet.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quiet  # noqa: E402  load recording, LOADED marking


def _flags():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--hidden", type=int, default=512)
  p.add_argument("--intermediate", type=int, default=1408)
  p.add_argument("--layers", type=int, default=8)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--rows", type=int, default=16, help="rows sampled (prompts x n)")
  p.add_argument("--n", type=int, default=1, help="responses per prompt")
  p.add_argument("--prompt", type=int, default=64)
  p.add_argument("--new", type=int, default=128)
  p.add_argument("--rounds", type=int, default=3)
  quiet.add_flags(p)
  return p.parse_args()


def main():
  a = _flags()
  load = quiet.Load()
  with load:
    quiet.print_header(quiet.machine_facts(), load)
    lines, results = _measure(a, load)
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(a.json, load, quiet.machine_facts(), results)


def _measure(a, load):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from vapo_jax.models import ModelConfig, Transformer  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler import ops  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler import static  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler.ops import SamplingConfig  # pylint: disable=g-import-not-at-top

  mc = ModelConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                   num_layers=a.layers, num_heads=a.heads, num_kv_heads=a.kv_heads,
                   qkv_bias=True, tie_word_embeddings=True, rms_norm_eps=1e-6)
  gd, st = nnx.split(Transformer(mc, rngs=nnx.Rngs(0)))
  prompts = np.random.RandomState(0).randint(1, a.vocab, (a.rows // a.n, a.prompt)).tolist()
  head = ops.last_logits

  def twice(model, h):  # the head once more, kept alive by a negligible term
    return head(model, h) + 1e-30 * head(model, h * 1.0001)

  def sampler(new, head_fn):
    cfg = SamplingConfig(max_new_tokens=new, temperature=1.0, top_p=1.0, top_k=0,
                         max_prompt_len=a.prompt, pad_id=0, n_per_prompt=a.n)
    ops.last_logits = head_fn  # read when the sampler's jit traces
    s = static.Sampler.for_transformer(gd, mc, cfg)
    key = [0]

    def call():
      key[0] += 1
      t = time.perf_counter()
      jax.block_until_ready(s(st, prompts, jax.random.key(key[0])))
      return time.perf_counter() - t
    call()
    ops.last_logits = head
    return call

  d, f, dh = a.hidden, a.intermediate, a.hidden // a.heads
  rng = np.random.RandomState(1)
  shapes = [(d, a.heads * dh), (d, a.kv_heads * dh), (d, a.kv_heads * dh), (a.heads * dh, d),
            (d, f), (d, f), (f, d)]
  ws = [[jnp.asarray(0.02 * rng.randn(*s), jnp.float32) for s in shapes]
        for _ in range(a.layers)]
  steps = a.new - 1

  @jax.jit
  def matmuls(ws, x):
    def body(_, x):
      for q, k, v, o, g, u, dn in ws:
        x = x + 1e-3 * (x @ q + jnp.tile(x @ k + x @ v, a.heads // a.kv_heads)) @ o
        x = x + 1e-3 * ((x @ g) * (x @ u)) @ dn
      return x
    return jax.lax.fori_loop(0, steps, body, x)

  x0 = jnp.asarray(rng.randn(a.rows, d), jnp.float32)
  matmuls(ws, x0).block_until_ready()

  def matmul_call():
    t = time.perf_counter()
    matmuls(ws, x0).block_until_ready()
    return time.perf_counter() - t

  calls = {"full": sampler(a.new, head), "prefill": sampler(1, head),
           "head_twice": sampler(a.new, twice), "matmuls": matmul_call}
  times = {k: [] for k in calls}
  for _ in range(a.rounds):
    for k, fn in calls.items():
      times[k].append(fn())
      load.sample()
  med = {k: statistics.median(v) for k, v in times.items()}
  step = (med["full"] - med["prefill"]) / steps
  head_s = (med["head_twice"] - med["full"]) / steps
  mm = med["matmuls"] / steps
  rest = step - head_s - mm
  params = a.layers * sum(i * o for i, o in shapes)
  lines = [
      f"model: L={a.layers} D={d} F={f} V={a.vocab} H={a.heads} K={a.kv_heads}, float32; "
      f"{a.rows} rows ({a.n} per prompt), prompt {a.prompt}, {a.new} new tokens; medians of "
      f"{a.rounds} interleaved rounds",
      f"generate call {med['full']:.3f} s, prefill-only call {med['prefill']:.3f} s",
      f"decode step        {1e3 * step:7.2f} ms",
      f"  LM head          {1e3 * head_s:7.2f} ms  {head_s / step:6.1%}  "
      f"({4 * a.vocab * d / head_s / 1e9:.1f} GB/s of weights)",
      f"  layer matmuls    {1e3 * mm:7.2f} ms  {mm / step:6.1%}  "
      f"({4 * params / mm / 1e9:.1f} GB/s, {2 * a.rows * params / mm / 1e9:.0f} GFLOP/s)",
      f"  the rest         {1e3 * rest:7.2f} ms  {rest / step:6.1%}  "
      "(attention, norms, RoPE, cache writes, sampling)"]
  results = {"args": vars(a), "seconds": times, "median_s": med,
             "per_step_ms": {"step": 1e3 * step, "head": 1e3 * head_s,
                             "layer_matmuls": 1e3 * mm, "rest": 1e3 * rest}}
  return lines, results


if __name__ == "__main__":
  main()
