"""Curves of one run, or several side by side, as one PNG.

  python -m vapo_jax.tools.plot /tmp/vapo_tiny                       # -> /tmp/vapo_tiny/curves.png
  python -m vapo_jax.tools.plot /tmp/vapo /tmp/grpo --labels=vapo,grpo --out=compare.png

Each argument is a run directory (or a metrics.jsonl file). Needs matplotlib.
"""

import os

from absl import app
from absl import flags

_OUT = flags.DEFINE_string("out", None, "PNG to write (default: <first run>/curves.png).")
_LABELS = flags.DEFINE_list("labels", None, "One name per run (default: directory names).")


def main(argv):
  runs = argv[1:]
  if not runs:
    raise app.UsageError("give one or more run directories")
  if _LABELS.value and len(_LABELS.value) != len(runs):
    raise app.UsageError(f"--labels has {len(_LABELS.value)} names for {len(runs)} runs")
  from vapo_jax.run import plotting  # pylint: disable=import-outside-toplevel
  out = _OUT.value or os.path.join(runs[0] if os.path.isdir(runs[0])
                                   else os.path.dirname(runs[0]), "curves.png")
  print(plotting.plot_runs(runs, out, labels=_LABELS.value))


if __name__ == "__main__":
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel
  cli.run(main)
