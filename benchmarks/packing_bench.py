"""The train side of one RL step, packed vs padded rows, interleaved in one process, CPU.

  python benchmarks/packing_bench.py                       # both mixes, 5 rounds
  python benchmarks/packing_bench.py --mix=longtail --median=64 --rounds=3 --json out.json

The train side is what `Trainer.experience` and the PPO loop run on the device after the
rollout: old log-probs and values over the rollout batch, then for each mini-batch one policy
and one critic update (`rl.update`, padded [B, P + R] rows; `rl.layout.Packed`, the same batch
packed into rows of P + R slots with segment ids, `vapo_jax.packing`; the planner's host
time is counted on the packed side). Model, batch and mini-batch sizes are the config's
(configs/longcot.py by default); the response lengths come from a mix:

  longcot   the toy's own: prompts of 40-68 tokens (one per group), responses of 89-151
  longtail  prompts of 8-32 tokens, responses lognormal (median --median, sigma --sigma)
            capped at 8x the median, which is max_new_tokens

Both sides run in interleaved rounds (benchmarks/quiet.py), after one untimed round that
compiles them; the script prints per-round times, the per-round ratios padded / packed
(> 1: packing is faster), the real / computed token share of both sides, and the first
update's losses and gradient norms on both sides (equal to float tolerance: packing keeps
the math). A run whose load went above 1 is marked LOADED - not a result.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import time

from flax import nnx
import jax
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo
from vapo_jax import config as config_lib  # noqa: E402
from vapo_jax import critic as critic_lib  # noqa: E402
from vapo_jax import packing  # noqa: E402
from vapo_jax import sharding as shd  # noqa: E402
from vapo_jax.models import Transformer, init_sharded, tiny_config  # noqa: E402
from vapo_jax.rl import batch as batch_lib  # noqa: E402
from vapo_jax.rl import forward  # noqa: E402
from vapo_jax.rl import layout as layout_lib  # noqa: E402
from vapo_jax.rl import train_state  # noqa: E402
from vapo_jax.rl import update  # noqa: E402
from vapo_jax.run import learners  # noqa: E402
from benchmarks import quiet  # noqa: E402  load recording, interleaved rounds, LOADED marking


def _flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/longcot.py")
  p.add_argument("--mix", default="both", choices=("both", "longcot", "longtail"))
  p.add_argument("--median", type=int, default=64, help="longtail: median response tokens")
  p.add_argument("--sigma", type=float, default=1.0, help="longtail: lognormal sigma")
  p.add_argument("--rows", type=int, default=0, help="rollout rows (0: the config's)")
  p.add_argument("--layers", type=int, default=0, help="model layers (0: the config's)")
  p.add_argument("--vocab", type=int, default=64)
  p.add_argument("--row_factor", type=int, default=1,
                 help="packed rows of this many times P + R slots (same tokens per device)")
  p.add_argument("--rounds", type=int, default=5)
  quiet.add_flags(p)
  return p.parse_args(argv)


def load_config(path):
  spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return config_lib.from_config_dict(module.get_config())


def lengths(mix: str, rows: int, group: int, a, rng):
  """(P, R, prompt lengths [B], response lengths [B]) of a mix."""
  if mix == "longcot":
    p, r = 72, 160
    prompt = np.repeat(rng.integers(40, 69, rows // group), group)
    resp = rng.integers(89, 152, rows)
  else:
    p, r = 32, 8 * a.median
    prompt = np.repeat(rng.integers(8, 33, rows // group), group)
    resp = np.minimum(np.round(rng.lognormal(np.log(a.median), a.sigma, rows)), r)
  return p, r, prompt, resp.astype(np.int64)


def make_batch(p, r, prompt, resp, vocab, rng):
  """A rollout batch's fields (host arrays) with these lengths: left-padded prompts, random
  tokens."""
  cols = np.arange(p + r)[None]
  pm = (cols >= p - prompt[:, None]) & (cols < p)
  rm = (cols >= p) & (cols < p + resp[:, None])
  mask = (pm | rm).astype(np.float32)
  tokens = (rng.integers(1, vocab, mask.shape) * mask).astype(np.int32)
  m = rm[:, p:].astype(np.float32)
  noise = lambda s=1.0: (rng.normal(size=m.shape) * s * m).astype(np.float32)  # noqa: E731
  return {"tokens_BxL": tokens, "mask_BxL": mask, "old_logp_BxR": noise() - 3 * m,
          "advantages_BxR": noise(), "returns_BxR": noise(), "old_values_BxR": noise(0.1),
          "response_mask_BxR": m,
          "scores_B": (rng.random(len(prompt)) < 0.5).astype(np.float32)}


def build(cfg, a, mcfg, mesh, batch, p):
  """The two sides: (name, run() -> (seconds of one train side, first-update metrics))."""
  axes = shd.batch_axes(mesh)
  rows = learners.rows_of(cfg)
  hp = learners.policy_hparams(cfg)
  chp = learners.critic_hparams(cfg)
  policy = init_sharded(lambda r: Transformer(mcfg, rngs=r), mesh, seed=1)
  critic = init_sharded(lambda r: critic_lib.Critic(mcfg, rngs=r), mesh, seed=2)
  (pg, pp), (cg, cp) = (nnx.split(m) for m in (policy, critic))
  tx = optax.adamw(1e-4)
  pstate, cstate = train_state.init_state(pp, tx), train_state.init_state(cp, tx)
  b = batch["scores_B"].shape[0]
  mb_rows = b // cfg.rl.num_minibatches
  dev = batch_lib.shard_batch(batch_lib.RolloutBatch(**batch), mesh, axes)
  # The packed side's budget: the padded micro-batch's tokens per device, in rows of
  # row_factor (P + R) slots.
  shards = int(np.prod([mesh.shape[x] for x in axes])) if axes else 1
  seq = batch["tokens_BxL"].shape[1]
  budget = mb_rows // rows.micro_batches * seq // shards
  spec = packing.PackSpec.from_budget(budget, min(budget, a.row_factor * seq), shards)
  pl, rl = layout_lib.lengths(dev.mask_BxL, p)

  # The same steps and forwards (written once) on the two row layouts.
  fwd_pad = layout_lib.Padded(rows.forward_chunks)
  pad, pak = layout_lib.Padded(rows.micro_batches), layout_lib.Packed(spec)
  pad_lp = fwd_pad.forward("logprobs", functools.partial(forward.policy_logprobs, pg), mesh,
                           axes, static=("temperature",))
  pad_v = fwd_pad.forward("values", functools.partial(forward.critic_values, cg), mesh, axes)
  compile_ = functools.partial(train_state.compile_step, mesh=mesh, batch_axes=axes)
  pad_ps = compile_(functools.partial(update.policy_step, pg, tx, hp, pad), pstate)
  pad_cs = compile_(functools.partial(update.critic_step, cg, tx, chp, pad), cstate)
  pak_lp = pak.forward("logprobs", functools.partial(forward.policy_logprobs, pg), mesh, axes,
                       static=("temperature",)).jitted
  pak_v = pak.forward("values", functools.partial(forward.critic_values, cg), mesh,
                      axes).jitted
  pak_ps = compile_(functools.partial(update.policy_step, pg, tx, hp, pak), pstate)
  pak_cs = compile_(functools.partial(update.critic_step, cg, tx, chp, pak), cstate)
  minibatches = [np.arange(k * mb_rows, (k + 1) * mb_rows)
                 for k in range(cfg.rl.num_minibatches)]
  effs = {"padded": float(batch["mask_BxL"].sum()) / batch["mask_BxL"].size}

  def rows_of_batch(idx):
    return batch_lib.shard_batch(batch_lib.RolloutBatch(**{k: v[idx] for k, v in
                                                           batch.items()}), mesh, axes)

  def padded():
    t0 = time.perf_counter()
    out = [pad_lp(pp, dev.tokens_BxL, dev.mask_BxL, prompt_len=p,
                  temperature=hp.temperature),
           pad_v(cp, dev.tokens_BxL, dev.mask_BxL, prompt_len=p)]
    first = None
    for idx in minibatches:
      mb = rows_of_batch(idx)
      m1, m2 = pad_ps(pstate, mb)[1], pad_cs(cstate, mb)[1]
      first = first or {**m1, **m2}
      out += [m1, m2]
    jax.block_until_ready(out)
    return time.perf_counter() - t0, first

  def packed():
    t0 = time.perf_counter()
    arrays, plan = layout_lib.plan_arrays(pl, rl, spec, p, seq)
    plan_dev = batch_lib.shard_batch(arrays, mesh, axes)
    out = [pak_lp(pp, dev.tokens_BxL, dev.mask_BxL, plan_dev, prompt_len=p,
                  temperature=hp.temperature),
           pak_v(cp, dev.tokens_BxL, dev.mask_BxL, plan_dev, prompt_len=p)]
    first = None
    for idx in minibatches:
      arr, _ = layout_lib.plan_arrays(pl[idx], rl[idx], spec, p, seq)
      mb = layout_lib.PackedBatch(rows_of_batch(idx), batch_lib.shard_batch(arr, mesh, axes))
      m1, m2 = pak_ps(pstate, mb)[1], pak_cs(cstate, mb)[1]
      first = first or {**m1, **m2}
      out += [m1, m2]
    jax.block_until_ready(out)
    effs["packed"] = effs.get("packed") or (
        f"forward {plan.efficiency:.3f} (shape n={plan.rows}, K={plan.micro_batches}, "
        f"T={plan.row_len})")
    return time.perf_counter() - t0, first

  return [("padded", padded), ("packed", packed)], effs, spec


def run_mix(mix, cfg, a, load, rng):
  group = cfg.rl.group_size
  rows = a.rows or cfg.rl.rollout_prompts * group
  p, r, prompt, resp = lengths(mix, rows, group, a, rng)
  mc = cfg.model
  mcfg = tiny_config(vocab_size=a.vocab, hidden_size=mc.hidden_size,
                     intermediate_size=mc.intermediate_size,
                     num_layers=a.layers or mc.num_layers, num_heads=mc.num_heads,
                     num_kv_heads=mc.num_kv_heads, head_dim=mc.head_dim,
                     max_position_embeddings=4 * (p + r))
  mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  batch = make_batch(p, r, prompt, resp, a.vocab, rng)
  sides, effs, spec = build(cfg, a, mcfg, mesh, batch, p)
  firsts = {}
  for name, fn in sides:              # untimed: compiles every shape this batch needs
    firsts[name] = fn()[1]
  rounds = quiet.interleave([(n, (lambda fn=fn: fn()[0])) for n, fn in sides], a.rounds,
                            load=load)
  print(f"\n[{mix}] rows={rows} P={p} R={r} (response lengths: median "
        f"{np.median(resp):.0f}, mean {resp.mean():.0f}, max {resp.max()}); model layers="
        f"{mcfg.num_layers} hidden={mcfg.hidden_size}; {cfg.rl.num_minibatches} mini-batch(es)"
        f"; packed rows of {spec.row_len}, {spec.rows_per_device} per device per micro-batch")
  print(f"  real / computed tokens: padded {effs['padded']:.3f}, packed {effs['packed']}")
  for key in ("policy_loss", "policy_grad_norm", "value_loss", "critic_grad_norm"):
    print(f"  first update {key}: padded {float(firsts['padded'][key]):.7g}, "
          f"packed {float(firsts['packed'][key]):.7g}")
  for name in ("padded", "packed"):
    per = ", ".join(f"{t * 1e3:.0f}" for t in rounds.times[name])
    print(load.tag(f"  {name}: train side {rounds.median(name) * 1e3:.0f} ms (median; per "
                   f"round {per} ms)"))
  print(load.tag("  " + rounds.describe_ratio("packed", "padded",
                                              "packed vs padded (padded time / packed)")))
  return {"rows": rows, "P": p, "R": r, "efficiency": effs,
          "first_update": {n: {k: float(v) for k, v in f.items()} for n, f in firsts.items()},
          **rounds.to_json([("packed", "padded")])}


def main(argv=None, load: quiet.Load | None = None):
  """Runs the benchmark (`load`: how load is judged; tests pass one that does not wait)."""
  a = _flags(argv)
  cfg = load_config(a.config)
  load = load or quiet.Load()
  results = {}
  with load:
    facts = quiet.machine_facts(peers=("optax",))
    quiet.print_header(facts, load)
    mixes = ("longcot", "longtail") if a.mix == "both" else (a.mix,)
    for mix in mixes:
      results[mix] = run_mix(mix, cfg, a, load, np.random.default_rng(0))
  print(load.verdict())
  quiet.write_json(a.json, load, facts, results)
  return results


if __name__ == "__main__":
  main()
