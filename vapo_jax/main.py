"""Entry point: `python -m vapo_jax.main --config=configs/tiny.py [--config.rl.steps=10]`.

The config file is read, checked in full and frozen before anything is compiled; then the
stages it enables run in order (SFT warm start, value pretraining, RL).
"""

import json
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from vapo_jax import cli
from vapo_jax import config as config_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics (and checkpoints).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars.")
_DIST = flags.DEFINE_enum("distributed", "auto", ["auto", "explicit", "none"],
                          "Multi-process start: auto (TPU pod, SLURM, JAX_COORDINATOR_ADDRESS),"
                          " explicit (the three flags below), none.")
_COORD = flags.DEFINE_string("coordinator", None, "host:port of process 0 (explicit mode).")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of processes (explicit mode).")
_PID = flags.DEFINE_integer("process_id", None, "This process's index (explicit mode).")


def main(argv):
  del argv
  # CPU runs: large XLA buffers reused, not mapped afresh each step (run/host_memory.py);
  # before jax starts its CPU client and threads.
  from vapo_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  host_memory.configure(host_memory.expected_platform())
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  if _CONFIG.value is None:
    raise app.UsageError("--config=configs/<experiment>.py is required")
  cfg = config_lib.from_command_line(_CONFIG.value)
  from vapo_jax import compat  # pylint: disable=import-outside-toplevel
  compat.warn_if_unsupported()  # a jax outside setup.py's range: one warning, then go on
  from vapo_jax import distributed  # pylint: disable=import-outside-toplevel
  distributed.initialize(_DIST.value, coordinator=_COORD.value,
                         num_processes=_NPROC.value, process_id=_PID.value)
  # pylint: disable-next=import-outside-toplevel
  from vapo_jax.run import checkpoint_store, trainer as trainer_lib
  trainer = trainer_lib.Trainer(cfg, _WORKDIR.value,
                                progress=_PROGRESS.value and distributed.is_main())
  try:
    summary = trainer.run()
  except checkpoint_store.CheckpointMismatch as e:  # one line: what differs, what to do
    sys.exit(f"Cannot resume: {e}")
  finally:
    trainer.close()
  summary.pop("rl_last", None)
  distributed.main_print(json.dumps(summary, indent=1, default=float))


if __name__ == "__main__":
  cli.run(main)
