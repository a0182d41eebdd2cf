"""Compile time of a SmolLM2-sized train step and forward: blocks under scan vs the loop.

One run lowers and compiles, on this machine's CPU backend, for the same SmolLM2-135M-sized
config (30 layers, hidden 576, 9 / 3 heads, MLP 1536, vocab 49,152; abstract weights, so
nothing is initialised), two programs per layout:

  * forward: float32 logits-free hidden states of a [B, T] batch (`Transformer.__call__`),
  * train step: the gradient of the mean next-token NLL (`policy.token_logprobs`) and one
    SGD update of every parameter, remat of every block (`model.remat`),

once with `ModelConfig.scan_layers=True` (stacked blocks under `jax.lax.scan`) and once with
False (a Python loop over 30 blocks), interleaved round by round, and prints the seconds
(trace + lower, compile) of each, their ratio (loop / scan) and the load (`quiet.py`: a
figure from a loaded machine is marked as not a result). The persistent compilation cache
is off, so every round compiles.

Usage: python benchmarks/scan_compile.py [--layers 30 --rounds 2 --batch 2 --seq 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from vapo_jax import policy  # noqa: E402
from vapo_jax.models import ModelConfig, Transformer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quiet  # noqa: E402  benchmarks/quiet.py


def smollm2(layers: int, scan: bool) -> ModelConfig:
  return ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                     num_layers=layers, num_heads=9, num_kv_heads=3, head_dim=64,
                     rope_theta=1e5, tie_word_embeddings=True, remat=True,
                     scan_layers=scan, model_type="llama")


def programs(cfg: ModelConfig, batch: int, seq: int):
  """{name: (jitted fn, abstract args)} of the forward and the train step."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

  def forward(p, t):
    model = nnx.merge(graphdef, p)
    mask = jnp.ones_like(t)
    return model(t, jnp.broadcast_to(jnp.arange(t.shape[1]), t.shape), mask)[0]

  def train(p, t):
    def loss(q):
      return -jnp.mean(policy.token_logprobs(nnx.merge(graphdef, q), t, jnp.ones_like(t)))
    value, grads = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda w, g: w - 1e-4 * g, p, grads)

  return {"forward": (jax.jit(forward), (params, tokens)),
          "train_step": (jax.jit(train), (params, tokens))}


def compile_seconds(fn, args) -> tuple[float, float]:
  """(trace + lower seconds, compile seconds) of one program."""
  t0 = time.perf_counter()
  lowered = fn.lower(*args)
  t1 = time.perf_counter()
  lowered.compile()
  return t1 - t0, time.perf_counter() - t1


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--layers", type=int, default=30)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--seq", type=int, default=256)
  a = p.parse_args()
  jax.config.update("jax_enable_compilation_cache", False)
  load = quiet.Load()
  with load:
    quiet.print_header(quiet.machine_facts(), load)
    print(f"SmolLM2-sized: {a.layers} layers, hidden 576, 9/3 heads, mlp 1536, vocab 49152; "
          f"batch {a.batch} x {a.seq}; remat every block; seconds = trace+lower, compile")
    best: dict[tuple[str, str], float] = {}
    for r in range(a.rounds):
      order = ("scan", "loop") if r % 2 == 0 else ("loop", "scan")
      for layout in order:
        progs = programs(smollm2(a.layers, layout == "scan"), a.batch, a.seq)
        for name, (fn, args) in progs.items():
          lower_s, compile_s = compile_seconds(fn, args)
          total = lower_s + compile_s
          best[(layout, name)] = min(best.get((layout, name), total), total)
          print(f"round {r}: {layout:4s} {name:10s} lower {lower_s:6.2f} s  compile "
                f"{compile_s:6.2f} s  total {total:6.2f} s", flush=True)
  for name in ("forward", "train_step"):
    loop, scan = best[("loop", name)], best[("scan", name)]
    print(load.tag(f"{name}: loop {loop:.2f} s, scan {scan:.2f} s (best of {a.rounds}); "
                   f"loop / scan = {loop / scan:.2f}x"))
  print(load.verdict())


if __name__ == "__main__":
  main()
