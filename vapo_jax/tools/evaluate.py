"""avg@k and pass@k of any checkpoint, with the run's own sampler and checker.

  python -m vapo_jax.tools.evaluate --config=configs/tiny.py --workdir=/tmp/vapo_tiny
  python -m vapo_jax.tools.evaluate --config=configs/tiny.py --workdir=/tmp/vapo_tiny \\
      --step=best --config.eval.samples_per_problem=32 --config.eval.num_examples=30
  python -m vapo_jax.tools.evaluate --config=configs/qwen32b.py \\
      --config.model.hf_path=/ckpt/exported          # an HF directory, no workdir

k is `eval.samples_per_problem` (the paper's AIME avg@32 is k = 32); the problems are the
config's held-out set (`data.eval_path`, else the first `eval.num_examples` training
problems). Prints a JSON line and, with a workdir, writes `workdir/eval/step_<N>.json` and
its per-problem records beside it, `workdir/eval/step_<N>.jsonl` (`run.eval_records`; or
wherever `--records=PATH` says, also without a workdir). The summary holds the shortcut
baselines (`shortcut/*`) of the same problems; compare two record files with
`python -m vapo_jax.tools.compare`.
"""

import json
import os

from absl import app
from absl import flags
from ml_collections import config_flags

from vapo_jax import cli
from vapo_jax import config as config_lib


def evaluate_checkpoint(cfg, workdir: str | None, step: str = "latest",
                        records_path: str | None = None) -> dict:
  """Restores a checkpoint of `workdir` (or none: the config's model) and evaluates it.

  The per-problem records go to `records_path`, else (with a workdir) beside the summary."""
  from vapo_jax.run import checkpoint as run_checkpoint  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  trainer = trainer_lib.Trainer(cfg, workdir, progress=False, read_only=True)
  try:
    out = {}
    if workdir:
      out["step"] = trainer.resume(run_checkpoint.select_step(trainer.ckpt, step))
      out["stage"] = trainer.ctl.stage
    if records_path is None and out.get("step") is not None:
      records_path = os.path.join(workdir, "eval", f"step_{out['step']}.jsonl")
    out.update(trainer.evaluate(records_path=records_path))
    out["num_problems"] = min(len(trainer.parts.eval_examples), cfg.eval.num_examples)
    out["k"] = cfg.eval.samples_per_problem
    out["records"] = records_path
  finally:
    trainer.close()
  if workdir and out.get("step") is not None:
    os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
    with open(os.path.join(workdir, "eval", f"step_{out['step']}.json"), "w") as f:
      json.dump(out, f, indent=1)
  return out


def define_flags() -> None:
  """The command's flags (defined only when run as a command, so the module imports freely)."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory with checkpoints/ (optional).")
  flags.DEFINE_string("step", "latest", '"latest", "best" or a checkpoint number.')
  flags.DEFINE_string("records", None, "Per-problem records (JSONL) to write (default: "
                      "beside workdir/eval/step_<N>.json; none without a workdir).")


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None:
    raise app.UsageError("--config=configs/<experiment>.py is required")
  cfg = config_lib.from_command_line(f.config)
  print(json.dumps(evaluate_checkpoint(cfg, f.workdir, f.step, f.records)))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
