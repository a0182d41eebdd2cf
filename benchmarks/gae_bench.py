"""GAE throughput: vapo_jax.gae next to the PyTorch per-timestep loop and rlax, in one run.

  python benchmarks/gae_bench.py [--batch 256] [--time 4096] [--repeats 20]

Workload: B responses × T tokens, float32, right-padded with random lengths, one λ per
response (length-adaptive), γ = 1, rewards on the last token. Prints each implementation's
median time, tokens/s, its speed-up over the PyTorch loop, and the fraction of this machine's
memory-copy bandwidth it reaches (bytes of the 3 inputs + 2 outputs / time, against a large
numpy copy measured in the same run). Needs the `bench` extra (torch, rlax).
"""

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import gae as gae_lib


def timeit(fn, repeats):
  fn()  # warm-up / compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def copy_bandwidth(repeats):
  """Bytes read + written per second by a 256 MiB numpy copy."""
  src = np.ones(64 * 1024 * 1024, np.float32)
  dst = np.empty_like(src)
  t = timeit(lambda: np.copyto(dst, src), repeats=max(5, repeats // 2))
  return 2 * src.nbytes / t


def torch_loop(rewards, values, mask, lam, gamma):
  """The per-timestep loop of the PyTorch RLHF frameworks (with its mask handling)."""
  import torch  # pylint: disable=import-outside-toplevel
  with torch.no_grad():
    next_values = torch.zeros_like(values[:, 0])
    last = torch.zeros_like(values[:, 0])
    out = []
    for t in reversed(range(rewards.shape[1])):
      delta = rewards[:, t] + gamma * next_values - values[:, t]
      new = delta + gamma * lam * last
      next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
      last = new * mask[:, t] + (1 - mask[:, t]) * last
      out.append(last)
    adv = torch.stack(out[::-1], dim=1) * mask
    return adv, (adv + values) * mask


def rlax_fn(gamma):
  import rlax  # pylint: disable=import-outside-toplevel

  def one_row(r, v, m, lam):
    # rlax wants V for T+1 states and a discount per step; cut the bootstrap at the end.
    v_ext = jnp.concatenate([v * m, jnp.zeros((1,), v.dtype)])
    m_next = jnp.concatenate([m[1:], jnp.zeros((1,), m.dtype)])
    adv = rlax.truncated_generalized_advantage_estimation(
        r * m, gamma * m_next, lam, v_ext)
    return adv * m, (adv + v) * m

  return jax.jit(jax.vmap(one_row))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--time", type=int, default=4096)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--torch-repeats", type=int, default=3)
  args = parser.parse_args()
  b, t, gamma = args.batch, args.time, 1.0

  rng = np.random.default_rng(0)
  lengths = rng.integers(t // 8, t + 1, size=b)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  values = rng.normal(size=(b, t)).astype(np.float32) * mask
  rewards = np.zeros((b, t), np.float32)
  rewards[np.arange(b), lengths - 1] = rng.integers(0, 2, size=b)
  lam = np.asarray(gae_lib.length_adaptive_lambda(lengths, 0.05))

  print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"jax {jax.__version__} on {jax.devices()[0].platform}")
  bw = copy_bandwidth(args.repeats)
  print(f"numpy copy bandwidth (read + write): {bw / 1e9:.1f} GB/s")
  print(f"workload: B={b}, T={t}, float32, per-row λ, right-padded "
        f"({int(mask.sum())} real tokens)\n")
  bytes_moved = 5 * b * t * 4  # rewards, values, mask in; advantages, returns out
  rows = []

  def report(name, seconds, ref=None):
    rows.append((name, seconds))
    speed = f"{ref / seconds:8.1f}x" if ref else "    1.0x"
    print(f"{name:34s} {seconds * 1e3:9.2f} ms  {b * t / seconds / 1e6:9.1f} M tok/s  "
          f"{speed} vs torch   {bytes_moved / seconds / bw:6.1%} of copy bw")

  dev = [jnp.asarray(x) for x in (rewards, values, mask, lam)]
  want = None
  try:
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(os.cpu_count() or 1)
    tr = [torch.from_numpy(x) for x in (rewards, values, mask, lam)]
    t_torch = timeit(lambda: torch_loop(*tr, gamma), args.torch_repeats)
    want = torch_loop(*tr, gamma)[0].numpy()
    report(f"PyTorch loop (torch {torch.__version__})", t_torch)
  except ImportError:
    t_torch = None
    print("PyTorch loop: skipped (pip install torch)")

  try:
    import rlax  # pylint: disable=import-outside-toplevel
    f = rlax_fn(gamma)
    t_rlax = timeit(lambda: jax.block_until_ready(f(*dev)), args.repeats)
    report(f"rlax {rlax.__version__} GAE, vmapped", t_rlax, t_torch)
    got = np.asarray(f(*dev)[0])
    if want is not None:
      np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-4)
  except ImportError:
    t_rlax = None
    print("rlax: skipped (pip install rlax)")

  ours = {}
  for impl in gae_lib.IMPLEMENTATIONS:
    f = jax.jit(lambda r, v, m, l, impl=impl: gae_lib.gae(r, v, m, gamma=gamma, lam=l,
                                                          impl=impl))
    ours[impl] = timeit(lambda f=f: jax.block_until_ready(f(*dev)), args.repeats)
    report(f"vapo_jax.gae impl={impl!r}", ours[impl], t_torch)
    if want is not None:
      np.testing.assert_allclose(np.asarray(f(*dev)[0]), want, atol=1e-3, rtol=1e-4)

  best = min(ours, key=ours.get)
  print(f"\nfastest vapo_jax impl: {best!r} "
        + (f"{t_torch / ours[best]:.0f}x the PyTorch loop" if t_torch else "")
        + (f", {t_rlax / ours[best]:.1f}x rlax" if t_rlax else "")
        + "; default 'scan': " + (f"{t_torch / ours['scan']:.0f}x torch" if t_torch else "")
        + (f", {t_rlax / ours['scan']:.1f}x rlax" if t_rlax else ""))


if __name__ == "__main__":
  main()
