"""A decode step's matmuls at M = 16 rows on this CPU: XLA's, numpy's (OpenBLAS) and torch's.

  python benchmarks/results/cpu-attention-2026-12-07/small_m_matmul.py > small_m_matmul.txt

Each line: 30 layers' [16, K] x [K, N] float32 products in one call (XLA: one jitted scan
over stacked weights; numpy and torch: a Python loop), the median of 7 calls after one
warm-up, as GFLOP/s and as weight bytes read per second (the decode floor's term: a
decode step reads every weight once). Part 1 sweeps the projection widths of SmolLM2-135M
through XLA's dot; part 2 sets the gate / up shape (576 x 1536) against other ways to write
the product and against the other libraries.
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

M, L = 16, 30


def timed(f, *a) -> float:
  jax.block_until_ready(f(*a))
  ts = []
  for _ in range(7):
    t = time.perf_counter()
    jax.block_until_ready(f(*a))
    ts.append(time.perf_counter() - t)
  return float(np.median(ts))


def scanned(op):
  @jax.jit
  def f(x, w):
    def body(c, wl):
      return c, op(c, wl)[:, :1]
    return jax.lax.scan(body, x, w)[1]
  return f


def line(name: str, k: int, n: int, t: float) -> str:
  return f"{name:12s} K={k:5d} N={n:5d}  {2 * M * k * n * L / t / 1e9:5.0f} GFLOP/s  " \
         f"{k * n * L * 4 / t / 1e9:4.1f} GB/s of weights"


def main():
  rng = np.random.default_rng(0)
  print(f"# part 1: XLA's dot, M = {M}, {L} layers (jax {jax.__version__})")
  for k, n in [(576, 192), (576, 576), (576, 960), (576, 1536), (576, 3072), (1536, 576),
               (576, 6144)]:
    w = jnp.asarray(rng.standard_normal((L, k, n), np.float32))
    x = jnp.asarray(rng.standard_normal((M, k), np.float32))
    print(line("xla dot", k, n, timed(scanned(lambda c, wl: c @ wl), x, w)), flush=True)

  k, n = 576, 1536
  wn = rng.standard_normal((L, k, n), np.float32)
  xn = rng.standard_normal((M, k), np.float32)
  w, x = jnp.asarray(wn), jnp.asarray(xn)
  wt = jnp.asarray(np.ascontiguousarray(wn.transpose(0, 2, 1)))
  print(f"# part 2: one shape, other ways and libraries (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)")
  rows = [("xla dot", scanned(lambda c, wl: c @ wl), x, w),
          ("xla x*w sum", scanned(lambda c, wl: (c[:, :, None] * wl[None]).sum(1)), x, w),
          ("xla W^T x^T", scanned(lambda c, wl: (wl @ c.T).T), x, wt),
          ("xla highest", scanned(lambda c, wl: jnp.dot(c, wl, precision="highest")), x, w)]
  for name, f, a, b in rows:
    print(line(name, k, n, timed(f, a, b)), flush=True)

  def loop(a, b):
    r = None
    for i in range(L):
      r = a @ b[i]
    return r
  print(line("numpy", k, n, timed(loop, xn, wn)), flush=True)
  print(line("torch", k, n, timed(loop, torch.from_numpy(xn), torch.from_numpy(wn))),
        flush=True)


if __name__ == "__main__":
  main()
