"""GAE throughput: vapo_jax.gae next to the PyTorch per-timestep loop and rlax, in one run.

  python benchmarks/gae_bench.py [--batch 256] [--time 4096] [--repeats 20] [--rounds 3]
                                 [--json out.json]

Workload: B responses × T tokens, float32, right-padded with random lengths, one λ per
response (length-adaptive), γ = 1, rewards on the last token. All sides run in interleaved
rounds (benchmarks/quiet.py), so they see the same machine state. Prints each implementation's
median time, tokens/s, its speed-up over the PyTorch loop, and the fraction of this machine's
memory-copy bandwidth it reaches (bytes of the 3 inputs + 2 outputs / time, against a large
numpy copy measured in the same run); then each impl's per-round ratios against the PyTorch
loop and rlax. Figures from a run whose 1-minute load average went above 1 are marked
LOADED — not a result. Needs the `bench` extra (torch, rlax).
"""

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import gae as gae_lib

import quiet  # benchmarks/quiet.py: load recording, interleaved rounds, LOADED marking


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
  parser.add_argument("--repeats", type=int, default=20,
                      help="timed calls per jax side in each round (their median counts)")
  parser.add_argument("--torch-repeats", type=int, default=3,
                      help="timed calls of the PyTorch loop in each round")
  parser.add_argument("--rounds", type=int, default=3,
                      help="interleaved rounds over all sides; medians and per-round ratios")
  quiet.add_flags(parser)
  args = parser.parse_args()
  load = quiet.Load()
  with load:
    results, facts = run(args, load)
  for line in results.pop("lines"):
    print(load.tag(line) if line and not line.startswith("  ") else line)
  print(load.verdict())
  quiet.write_json(args.json, load, facts, results)


def run(args, load):
  """Measures every side in interleaved rounds; returns (results, machine facts)."""
  b, t, gamma = args.batch, args.time, 1.0
  facts = quiet.machine_facts(peers=("torch", "rlax"))
  quiet.print_header(facts, load)

  rng = np.random.default_rng(0)
  lengths = rng.integers(t // 8, t + 1, size=b)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  values = rng.normal(size=(b, t)).astype(np.float32) * mask
  rewards = np.zeros((b, t), np.float32)
  rewards[np.arange(b), lengths - 1] = rng.integers(0, 2, size=b)
  lam = np.asarray(gae_lib.length_adaptive_lambda(lengths, 0.05))

  print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
  bw = copy_bandwidth(args.repeats)
  print(f"numpy copy bandwidth (read + write): {bw / 1e9:.1f} GB/s")
  print(f"workload: B={b}, T={t}, float32, per-row λ, right-padded "
        f"({int(mask.sum())} real tokens); {args.rounds} interleaved round(s), per round "
        f"median of {args.repeats} jax / {args.torch_repeats} torch calls\n")
  bytes_moved = 5 * b * t * 4  # rewards, values, mask in; advantages, returns out

  dev = [jnp.asarray(x) for x in (rewards, values, mask, lam)]
  sides, names, want = [], {}, None
  try:
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(os.cpu_count() or 1)
    tr = [torch.from_numpy(x) for x in (rewards, values, mask, lam)]
    want = torch_loop(*tr, gamma)[0].numpy()  # also the warm-up
    sides.append(("torch", lambda: timeit(lambda: torch_loop(*tr, gamma), args.torch_repeats)))
    names["torch"] = f"PyTorch loop (torch {torch.__version__})"
  except ImportError:
    print("PyTorch loop: skipped (pip install torch)")

  try:
    import rlax  # pylint: disable=import-outside-toplevel
    f_rlax = rlax_fn(gamma)
    got = np.asarray(f_rlax(*dev)[0])
    if want is not None:
      np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-4)
    sides.append(("rlax", lambda: timeit(lambda: jax.block_until_ready(f_rlax(*dev)),
                                         args.repeats)))
    names["rlax"] = f"rlax {rlax.__version__} GAE, vmapped"
  except ImportError:
    print("rlax: skipped (pip install rlax)")

  for impl in gae_lib.IMPLEMENTATIONS:
    f = jax.jit(lambda r, v, m, l, impl=impl: gae_lib.gae(r, v, m, gamma=gamma, lam=l,
                                                          impl=impl))
    if want is not None:
      np.testing.assert_allclose(np.asarray(f(*dev)[0]), want, atol=1e-3, rtol=1e-4)
    sides.append((impl, lambda f=f: timeit(lambda: jax.block_until_ready(f(*dev)),
                                           args.repeats)))
    names[impl] = f"vapo_jax.gae impl={impl!r}"

  rounds = quiet.interleave(sides, args.rounds, load=load)
  ours = list(gae_lib.IMPLEMENTATIONS)
  peers = [p for p in ("torch", "rlax") if p in names]
  lines = []
  for name, _ in sides:
    sec = rounds.median(name)
    speed = (f"{rounds.ratio(name, 'torch'):8.1f}x" if "torch" in names else "     n/a")
    lines.append(f"{names[name]:34s} {sec * 1e3:9.2f} ms  {b * t / sec / 1e6:9.1f} M tok/s  "
                 f"{speed} vs torch   {bytes_moved / sec / bw:6.1%} of copy bw")
  lines.append("")
  for impl in ours:
    for peer in peers:
      lines.append(rounds.describe_ratio(impl, peer, f"{impl} vs {peer}"))
  best = min(ours, key=rounds.median)
  lines.append(f"fastest vapo_jax impl: {best!r}; default 'scan'")
  pairs = [(o, p) for o in ours for p in peers]
  results = {"workload": {"batch": b, "time": t, "rounds": args.rounds,
                          "repeats": args.repeats, "torch_repeats": args.torch_repeats},
             "copy_bandwidth_bytes_per_s": bw, "fastest": best,
             **rounds.to_json(pairs), "lines": lines}
  return results, facts


if __name__ == "__main__":
  main()
