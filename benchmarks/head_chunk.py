"""The LM head's forward and backward per chunk size, on the real model's head (SmolLM2-135M:
D = 576, V = 49,152), over one micro-batch of 2 x 256 packed slots.

  python benchmarks/head_chunk.py [--chunks=256,128,64,32] [--counts=150,250] [--rounds=5]

`policy.chunked_logprobs` runs the head in chunks of positions up to a traced count (the
response slots of a micro-batch; `policy.packed_logprobs`), so smaller chunks compute fewer
positions past the count (`benchmarks/packing_fixed_n.py --head`: 1.2-1.6x the response
tokens at 128, 1.06-1.15x at 32). This times what that saves: the gradient of
sum(log p) + sum(entropy) with respect to the hidden states and the head weight, the head's
logits kept (no remat, as below `policy.HEAD_KEEP_BYTES`), median of --rounds after one
warm-up, chunk sizes interleaved per round. Each chunk reads the whole [D, V] weight and adds
into its whole gradient, so on a CPU small chunks are bound by those bytes, not by FLOPs.
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo

from vapo_jax import policy  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--chunks", default="256,128,64,32")
  ap.add_argument("--counts", default="150,250")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--slots", type=int, default=512)
  ap.add_argument("--dim", type=int, default=576)
  ap.add_argument("--vocab", type=int, default=49152)
  a = ap.parse_args(argv)
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(1, a.slots, a.dim)), jnp.float32)
  y = jnp.asarray(rng.integers(0, a.vocab, (1, a.slots)), jnp.int32)
  w = jnp.asarray(rng.normal(size=(a.dim, a.vocab)) * 0.02, jnp.float32)

  def program(chunk):
    def loss(h, w, count):
      lp, ent = policy.chunked_logprobs(h, y, w, chunk=chunk, count=count, remat=False)
      return jnp.sum(lp) + jnp.sum(ent)
    return jax.jit(jax.grad(loss, (0, 1)))

  chunks = [int(c) for c in a.chunks.split(",")]
  programs = {c: program(c) for c in chunks}
  print("| response slots (count) | " + " | ".join(f"chunk {c}: ms (positions)" for c in chunks)
        + " |")
  print("|---" * (1 + len(chunks)) + "|")
  for count in (int(c) for c in a.counts.split(",")):
    times = {c: [] for c in chunks}
    for f in programs.values():
      jax.block_until_ready(f(h, w, jnp.int32(count)))
    for _ in range(a.rounds):
      for c, f in programs.items():
        t0 = time.perf_counter()
        jax.block_until_ready(f(h, w, jnp.int32(count)))
        times[c].append(time.perf_counter() - t0)
    print(f"| {count} | " + " | ".join(
        f"{1e3 * float(np.median(times[c])):.0f} ({-(-count // c) * c})" for c in chunks) + " |")


if __name__ == "__main__":
  main()
