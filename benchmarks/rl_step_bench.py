"""Time split of one VAPO RL step on a config: rollout, reward, forward passes, updates.

  python benchmarks/rl_step_bench.py [--config configs/tiny.py] [--steps 5] [--json out.json]

Runs the pieces of `Trainer.experience` and `Trainer._updates` one at a time, each waited
for, so the split is exact (the trainer itself overlaps reward scoring with the forward
passes). Prints per-phase medians over the steps after the first (which compiles), tokens/s
of the rollout and of the updates, and the model-FLOPs rate of the updates against a matmul
peak measured in the same run. There is no peer here, so nothing to interleave; the load
average is printed at start and end and sampled after every step (benchmarks/quiet.py), and
the figures of a run whose load went above 1 are marked LOADED — not a result.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo
from vapo_jax import config as config_lib  # noqa: E402  pylint: disable=wrong-import-position
from vapo_jax.run import trainer as trainer_lib
from vapo_jax.models import config as model_config

import quiet  # benchmarks/quiet.py: load recording, LOADED marking


def load_config(path, preset):
  spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return config_lib.from_config_dict(module.get_config(preset))


def matmul_peak(n=1024, repeats=10):
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  t = min(_timed(lambda: f(a).block_until_ready()) for _ in range(repeats))
  return 2 * n**3 / t


def _timed(fn):
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


_COMPILE_S = [0.0]


def _on_duration(event: str, duration: float, **_):
  if event.startswith("/jax/core/compile/"):
    _COMPILE_S[0] += duration


def compile_seconds() -> float:
  """Seconds JAX has spent tracing, lowering and compiling in this process since the first
  call (its "/jax/core/compile/..." duration events). A step's time minus the compile
  seconds inside it is its time once every shape it meets has compiled: packed passes
  compile once per packed shape (`rl.layout`), so short benchmarks meet new ones."""
  if not getattr(compile_seconds, "registered", False):
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    compile_seconds.registered = True
  return _COMPILE_S[0]


def one_step(t: trainer_lib.Trainer, i: int) -> dict:
  """One RL step, then its forward passes and reward scoring again, each timed alone;
  "compile": the seconds of the step (its rollout, experience and updates, not the passes
  timed again) that JAX spent compiling."""
  cfg = t.cfg
  examples = next(t.state.prompts)
  c0 = compile_seconds()
  t0 = time.perf_counter()
  batch, em = t.experience(examples)
  jax.block_until_ready(batch)
  out = {"rollout": em["time/rollout_s"],
         "overlapped": time.perf_counter() - t0 - em["time/rollout_s"]}
  compiled = compile_seconds() - c0
  tokens, mask = batch.tokens_BxL, batch.mask_BxL
  p = tokens.shape[1] - batch.response_mask_BxR.shape[1]
  t0 = time.perf_counter()
  ex = t.parts.experience
  if cfg.old_logprobs == "recompute":  # "exact" / "behaviour" run no old-policy pass
    jax.block_until_ready(ex.logprobs(t.state.policy_params, tokens, mask, prompt_len=p,
                                      temperature=cfg.sampling.temperature))
  if t.state.ref_params is not None:  # the KL penalty's reference (grpo)
    jax.block_until_ready(ex.logprobs(t.state.ref_params, tokens, mask, prompt_len=p,
                                      temperature=cfg.sampling.temperature))
  if t.state.train_state("critic") is not None:
    jax.block_until_ready(t.critic_values(t.state.train_state("critic").params, tokens, mask,
                                          prompt_len=p))
  out["forward"] = time.perf_counter() - t0
  n = cfg.rl.group_size
  resp, rmask = np.asarray(tokens)[:, p:], np.asarray(batch.response_mask_BxR)
  texts = [t.parts.text.decode(r[m > 0].tolist()) for r, m in zip(resp, rmask)]
  t0 = time.perf_counter()
  t.parts.scorer.score_batch([ex.problem for ex in examples for _ in range(n)], texts,
                       [ex.answer for ex in examples for _ in range(n)])
  out["reward"] = time.perf_counter() - t0
  t0, c1 = time.perf_counter(), compile_seconds()
  t.update(batch, stage="rl", step=i, policy=True)
  t.state.policy_params = t.state.train_state("policy").params
  jax.block_until_ready(t.state.policy_params)
  out["updates"] = time.perf_counter() - t0
  out["compile"] = compiled + compile_seconds() - c1
  out["response_tokens"] = float(rmask.sum())
  out["train_tokens"] = float(np.asarray(mask).sum()) * cfg.rl.ppo_epochs
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/tiny.py")
  parser.add_argument("--preset", default="vapo")
  parser.add_argument("--steps", "--rounds", dest="steps", type=int, default=5)
  quiet.add_flags(parser)
  args = parser.parse_args()
  facts = quiet.machine_facts()
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    lines, results = measure(args, load)
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, results)


def measure(args, load):
  """Times the steps; returns (figure lines, JSON results)."""
  cfg = load_config(args.config, args.preset)
  print(f"jax {jax.__version__} ({jax.device_count()} {jax.devices()[0].platform} devices)")
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    if cfg.uses_critic:
      t.setup("critic")
    if cfg.rl.kl_coef > 0:  # as Trainer.rl: the reference's log-probs join the experience
      t.setup("reference")
    t.setup("policy")
    runs = []
    for i in range(args.steps):
      runs.append(one_step(t, i))
      load.sample()
  finally:
    t.close()
  warm = runs[1:] or runs
  med = {k: statistics.median(r[k] for r in warm) for k in warm[0]}
  phases = ("rollout", "overlapped", "updates")
  total = sum(med[k] for k in phases)
  rows = cfg.rl.rollout_prompts * cfg.rl.group_size
  print(f"config {args.config} ({args.preset}): {cfg.rl.rollout_prompts} prompts x "
        f"{cfg.rl.group_size} = {rows} responses, max_new_tokens "
        f"{cfg.sampling.max_new_tokens}; medians of {len(warm)} step(s)"
        + ("" if runs[1:] else " (only the first, compiling step: use --steps >= 2)"))
  lines = [f"first step (with compiles) {sum(runs[0][k] for k in phases):.1f} s"]
  names = {"rollout": "rollout (sampler)",
           "overlapped": "reward + forward (overlapped) + advantages",
           "updates": "policy + critic updates"}
  for k in phases:
    lines.append(f"  {names[k]:44s} {med[k]:8.3f} s  {med[k] / total:6.1%}")
  lines.append(f"  {'step':44s} {total:8.3f} s")
  if med["compile"] > 0.05:
    lines.append(f"  of which compiling (a packed shape met the first time) {med['compile']:.3f} "
                 f"s; the step without it {total - med['compile']:.3f} s")
  lines.append(f"  alone: reward scoring {med['reward']:.3f} s, forward passes (old log-probs "
               f"+ reference's + values) {med['forward']:.3f} s")
  peak = matmul_peak()
  mcfg = t.parts.model_cfg
  seq = t.cfg.data.max_prompt_tokens + t.cfg.sampling.max_new_tokens
  flops_tok = model_config.flops_per_token(mcfg, seq)  # forward FLOPs per token
  nets = 2 if cfg.uses_critic else 1
  update_flops = 3 * flops_tok * med["train_tokens"] * nets
  lines.append(
      f"rollout: {med['response_tokens'] / med['rollout']:.0f} response tokens/s; "
      f"updates: {med['train_tokens'] * nets / med['updates']:.0f} tokens/s "
      f"({update_flops / med['updates'] / 1e9:.2f} GFLOP/s = "
      f"{update_flops / med['updates'] / peak:.1%} of the {peak / 1e9:.0f} GFLOP/s matmul "
      f"peak measured now); whole step: {med['response_tokens'] / total:.0f} response "
      f"tokens/s")
  results = {"config": args.config, "preset": args.preset, "steps": args.steps,
             "per_step": runs, "median_warm": med, "step_s": total,
             "matmul_peak_flops": peak}
  return lines, results


if __name__ == "__main__":
  main()
