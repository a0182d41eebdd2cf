"""The critic of a finished run, read out after the fact (issue 53: the registered comparison's
secondary figures that its runs did not log).

  python -m experiments.real_model.critic_readout --config=configs/smollm2_135m.py:vapo \\
      --config.seed=1 --run=/work/runs/registered-2026-12-05/seed1/vapo --steps=8,28 \\
      --out=experiments/real_model/results/registered-2026-12-05/critic_seed1.json

For each checkpoint step (default: the run's newest), the run's policy and critic as they were
there (restored read-only: nothing in the run's folder is written), on `--fresh_batches`
batches of fresh held-out rollouts of that policy (`critic_fit.fresh_rollouts`: the held-out
split's prompts with keys from a stream no run draws from, the same batches the critic-lever
measurement scored, now sampled by this policy):

  fresh EV      1 − Var[R − V] / Var[R] over the batches' real tokens, pooled
                (`run.critic_diagnostics.pooled_ev`), R the Monte Carlo return
  ρ             Spearman of V(s_0), the value at the prompt's last token, against the
                prompt's pass rate among its n responses (`prompt_spearman`)
  EV halves     on each response's first and second half, and at its last token

From the run's own metrics.jsonl (each (stage, step) once, the last record written: a resumed
run logs a step again): value pretraining's explained variance per batch (each batch scored
before the critic trains on it: held out), its last batch and the mean of its last 4; RL's
per-step explained variance (the value pass runs before the update: held out too), the mean
over the steps and over the last 5.

The command's config must be the run's (preset, seed and overrides): a checkpoint that does
not fit it is refused with the setting that differs (`run.checkpoint.restore`).
"""

from __future__ import annotations

import json
import math
import os

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from vapo_jax import config as config_lib
from vapo_jax.run import checkpoint as run_checkpoint
from vapo_jax.run import critic_stage
from vapo_jax.run import trainer as trainer_lib

from experiments.real_model import critic_fit

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined only when it runs (importing the module defines none)."""
  config_flags.DEFINE_config_file("config", None, "The run's config file (preset, overrides).")
  flags.DEFINE_string("run", None, "The run's folder (its checkpoints/ and metrics.jsonl).")
  flags.DEFINE_list("steps", ["latest"], "Checkpoint steps to read out: numbers, latest "
                    "or best (run.checkpoint.select_step).")
  flags.DEFINE_integer("fresh_batches", 4, "Held-out batches of fresh rollouts per step.")
  flags.DEFINE_string("out", "", "JSON file for the figures (a .md table is written beside).")


def logged(path: str) -> dict:
  """The critic's explained variance from a run's metrics.jsonl: {"value_pretrain": {step:
  EV}, "rl": {step: EV}, and the summaries in the module docstring}."""
  rows = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      r = json.loads(line)
      if "value/explained_variance" in r and r.get("stage") in ("value_pretrain", "rl"):
        rows[(r["stage"], int(r["step"]))] = float(r["value/explained_variance"])
  out = {}
  for stage in ("value_pretrain", "rl"):
    by = dict(sorted((s, v) for (g, s), v in rows.items() if g == stage))
    out[stage] = {str(s): v for s, v in by.items()}
    ev = list(by.values())
    k = 4 if stage == "value_pretrain" else 5
    out[f"{stage}_last"] = ev[-1] if ev else math.nan
    out[f"{stage}_mean_last{k}"] = float(np.mean(ev[-k:])) if ev else math.nan
    out[f"{stage}_mean"] = float(np.mean(ev)) if ev else math.nan
  return out


def read_out(cfg, run: str, step: str, batches: int) -> dict:
  """The critic of checkpoint `step` ("latest", "best" or a number) on fresh held-out
  rollouts of the policy of that checkpoint."""
  t = trainer_lib.Trainer(cfg, run, progress=False, read_only=True)
  try:
    got = t.resume(run_checkpoint.select_step(t.ckpt, step))
    if "critic" not in t.state.learners:
      raise ValueError(f"{run}: checkpoint {got} holds no critic")
    fresh = critic_fit.fresh_rollouts(t, batches)
    figures = critic_fit.fresh_figures(t, fresh)
    scores = np.concatenate([np.asarray(b.scores_B, np.float64) for b in fresh])
    # With --config.metrics.critic_heldout_batches=K: the run's own held-out readout
    # (`run.critic_stage.heldout_readout`: within-group EV with its interval, AUROC, ...).
    readout = critic_stage.heldout_readout(t, 0)
    return {"step": got, "responses": int(scores.size), "reward_mean": float(scores.mean()),
            **{k: float(v) for k, v in figures.items()}, **readout}
  finally:
    t.close()


def table(results: dict) -> str:
  lines = ["| checkpoint | responses | reward | fresh EV | ρ(V(s0), pass rate) | EV 1st half | "
           "EV 2nd half | EV last token |", "|---|---|---|---|---|---|---|---|"]
  for r in results["checkpoints"]:
    lines.append(
        f"| {r['step']} | {r['responses']} | {r['reward_mean']:.3f} | {r['fresh_ev']:+.3f} | "
        f"{r.get('critic/prompt_value_spearman', math.nan):+.3f} | "
        f"{r['critic/ev_first_half']:+.3f} | {r['critic/ev_second_half']:+.3f} | "
        f"{r['critic/ev_last_token']:+.3f} |")
  g = results["logged"]
  lines.append("")
  lines.append(
      f"Logged by the run (held out when scored): value pretraining EV last "
      f"{g['value_pretrain_last']:+.3f}, mean of its last 4 {g['value_pretrain_mean_last4']:+.3f}; "
      f"RL EV mean {g['rl_mean']:+.3f}, last 5 {g['rl_mean_last5']:+.3f}.")
  return "\n".join(lines) + "\n"


def main(_):
  if not FLAGS.run:
    raise app.UsageError("--run=<the run's folder> is needed")
  metrics = os.path.join(FLAGS.run, "metrics.jsonl")
  if not os.path.exists(metrics):
    raise app.UsageError(f"{metrics}: not found (is --run a run's folder?)")
  cfg = config_lib.from_command_line(FLAGS.config)
  steps = FLAGS.steps or ["latest"]
  results = {"run": FLAGS.run, "fresh_batches": FLAGS.fresh_batches, "logged": logged(metrics),
             "checkpoints": [read_out(cfg, FLAGS.run, s, FLAGS.fresh_batches) for s in steps]}
  text = table(results)
  print(text, flush=True)
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)
    with open(os.path.splitext(FLAGS.out)[0] + ".md", "w", encoding="utf-8") as f:
      f.write(text)


if __name__ == "__main__":
  define_flags()
  app.run(main)
