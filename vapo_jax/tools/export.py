"""A trained policy (or critic) as an HF directory that transformers loads.

  python -m vapo_jax.tools.export --config=configs/tiny.py --workdir=/tmp/vapo_tiny \\
      --out=/tmp/vapo_tiny/hf_policy [--what=critic] [--step=best] [--dtype=bfloat16]

The policy becomes a `*ForCausalLM` directory, the critic a one-label
`*ForSequenceClassification` one (which `model.critic_path` of another run also loads).
With an HF base model (`model.hf_path`), its tokenizer files are copied alongside so
`AutoTokenizer.from_pretrained(out)` works too (`model.hf_path` may be a Hub id; `--out` is a
local directory). Every host of a multi-host run runs the same
command (the arrays are gathered); process 0 writes.
"""

import json
import os
import shutil

from absl import app
from absl import flags
from ml_collections import config_flags

from vapo_jax import cli
from vapo_jax import config as config_lib
from vapo_jax import hub

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "generation_config.json")


def export(cfg, workdir: str, out: str, *, what: str = "policy", step: str = "latest",
           dtype: str | None = None) -> dict:
  """Restores checkpoint `step` of `workdir` and writes its policy or critic to `out`."""
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax import critic as critic_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint as run_checkpoint  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  trainer = trainer_lib.Trainer(cfg, workdir, progress=False, read_only=True)
  try:
    restored = trainer.resume(run_checkpoint.select_step(trainer.ckpt, step))
    if what == "policy":
      hf_io.save_pretrained(trainer.policy_model(), trainer.parts.model_cfg, out,
                            dtype=dtype)
    else:
      if "critic" not in trainer.state.learners:
        raise ValueError(f"checkpoint {restored} has no critic (stage {trainer.ctl.stage})")
      critic_lib.save_pretrained(trainer.critic_model(), out, dtype=dtype)
  finally:
    trainer.close()
  if cfg.model.hf_path and jax.process_index() == 0:
    base = hub.resolve(cfg.model.hf_path, what="tokenizer")  # a Hub id: its cached snapshot
    for name in TOKENIZER_FILES:
      src = os.path.join(base, name)
      if os.path.exists(src):
        shutil.copy(src, os.path.join(out, name))
  return {"out": out, "what": what, "step": restored}


def define_flags() -> None:
  """The command's flags (defined only when run as a command, so the module imports freely)."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory with checkpoints/.")
  flags.DEFINE_string("out", None, "Output HF directory.")
  flags.DEFINE_enum("what", "policy", ["policy", "critic"], "Which model to export.")
  flags.DEFINE_string("step", "latest", '"latest", "best" or a checkpoint number.')
  flags.DEFINE_string("dtype", None, "Storage dtype (default: the parameters').")


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None or not f.workdir or not f.out:
    raise app.UsageError("--config, --workdir and --out are required")
  cfg = config_lib.from_command_line(f.config)
  print(json.dumps(export(cfg, f.workdir, f.out, what=f.what, step=f.step, dtype=f.dtype)))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
