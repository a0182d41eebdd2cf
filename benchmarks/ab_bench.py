"""A/B of the train step between two checkouts of vapo_jax, in one process, CPU.

  python benchmarks/ab_bench.py --old=../vapo_jax-main --new=.          # model_bench's config
  python benchmarks/ab_bench.py --old=A --new=B --rounds=6 --layers=2 --hidden=128 ...

Each checkout's `vapo_jax` is imported in turn (a fresh `sys.modules` entry per checkout) and
builds `benchmarks/model_bench.py`'s train step (`jax_step_fn`) from its own model: forward +
backward + AdamW on the mean next-token NLL over full logits, float32, same config, tokens and
initial parameters.
The two steps then run in interleaved rounds (best of --steps per round) and the script
prints the per-round ratios old/new (> 1: the new checkout is faster) and the losses of the
first step (equal when the change keeps the math).

Why one process: model_bench runs on this 2-core machine differed by up to 8% in our own
step time with the code unchanged (626-676 ms), and their per-round ratios against PyTorch
ranged 0.95-1.06; judged here instead, the causal attention blocks of a1176dd gave per-round
ratios of 1.02-1.08 against 61bd333, all on one side of 1. The load average is printed at
start and end and a loaded run's figures are marked LOADED - not a result
(benchmarks/quiet.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_bench  # noqa: E402  the train step being compared
import quiet  # noqa: E402  load recording, interleaved rounds, LOADED marking


def _flags():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--old", required=True, help="checkout (repository root) of side A")
  p.add_argument("--new", required=True, help="checkout (repository root) of side B")
  model_bench.add_config_flags(p)
  p.add_argument("--steps", type=int, default=4, help="timed steps per round (best counts)")
  p.add_argument("--rounds", type=int, default=5)
  quiet.add_flags(p)
  return p.parse_args()


def load_models(root: str):
  """`vapo_jax.models` of the checkout at `root`, imported afresh."""
  root = os.path.abspath(root)
  if not os.path.isfile(os.path.join(root, "vapo_jax", "__init__.py")):
    raise SystemExit(f"error: {root} is not a vapo_jax checkout (no vapo_jax/__init__.py)")
  for name in [m for m in sys.modules if m == "vapo_jax" or m.startswith("vapo_jax.")]:
    del sys.modules[name]
  sys.path.insert(0, root)
  try:
    models = importlib.import_module("vapo_jax.models")
  finally:
    sys.path.remove(root)
  if not os.path.abspath(models.__file__).startswith(root + os.sep):
    raise SystemExit(f"error: imported {models.__file__}, not the checkout at {root}")
  return models


def step_fn(models, a, tokens: np.ndarray):
  """(run, first loss): model_bench's train step built from this checkout's model."""
  cfg = model_bench.model_config(a, models.ModelConfig)
  # Traced on the first call, while this checkout's modules are the imported ones.
  run = model_bench.jax_step_fn(cfg, tokens, False, transformer=models.Transformer)
  return run, float(run())


def main():
  a = _flags()
  load = quiet.Load()
  with load:
    quiet.print_header(quiet.machine_facts(peers=("optax",)), load)
    tokens = np.random.RandomState(0).randint(0, a.vocab, (a.batch, a.seq)).astype(np.int32)
    sides, losses = [], {}
    for name, root in (("old", a.old), ("new", a.new)):
      run, losses[name] = step_fn(load_models(root), a, tokens)

      def best(run=run):
        run()  # untimed first step of the round
        times = []
        for _ in range(a.steps):
          t0 = time.perf_counter()
          run()
          times.append(time.perf_counter() - t0)
        return min(times)

      sides.append((name, best))
    rounds = quiet.interleave(sides, a.rounds, load=load)
  print(f"config: layers={a.layers} hidden={a.hidden} mlp={a.intermediate} heads={a.heads}/"
        f"{a.kv_heads} vocab={a.vocab} batch={a.batch} seq={a.seq}, float32, AdamW; "
        f"{a.rounds} interleaved round(s), best of {a.steps} steps per round")
  print(f"first-step loss: old {losses['old']:.6f}, new {losses['new']:.6f}")
  lines = [f"{name}: {os.path.abspath(root)}, step {rounds.median(name) * 1e3:.0f} ms (median)"
           for name, root in (("old", a.old), ("new", a.new))]
  lines.append(rounds.describe_ratio("new", "old", "new checkout vs old (old time / new time)"))
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(a.json, load, quiet.machine_facts(peers=("optax",)),
                   {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new),
                    "first_loss": losses, **rounds.to_json([("new", "old")])})


if __name__ == "__main__":
  main()
