"""The Weights & Biases writer: the run's metrics, beside metrics.jsonl and TensorBoard.

On with `metrics.wandb=True` (project `metrics.wandb_project`, run name `metrics.wandb_name`,
empty: W&B picks one). `wandb` is imported only then; without it the run stops before any
work with one line saying what to install. Each stage is its own x-axis:

    <stage>/<metric>   plotted against   <stage>/step      (e.g. rl/reward/mean vs rl/step)

The W&B run's files go under `workdir/wandb/` (with `WANDB_MODE=offline`, an
`offline-run-*` folder that `wandb sync` uploads later). The run id is kept in
`workdir/wandb_id`, so a run resumed from a checkpoint logs into the same W&B run; the steps
it runs again are logged again (W&B cannot take points back the way metrics.jsonl is cut).
"""

import os
import secrets
from typing import Any

RUN_ID_FILE = "wandb_id"
MISSING = ("metrics.wandb=True needs the wandb package: pip install wandb "
           "(or set --config.metrics.wandb=False)")


def require() -> None:
  """Raises the one-line ImportError (what to install) when `wandb` is not importable."""
  _import_wandb()


def _import_wandb():
  try:
    import wandb  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(MISSING) from e
  return wandb


def _run_id(workdir: str) -> str:
  """This workdir's W&B run id: the one saved there, else a new one (then saved)."""
  path = os.path.join(workdir, RUN_ID_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      run_id = f.read().strip()
    if run_id:
      return run_id
  run_id = secrets.token_hex(6)  # W&B ids: letters, digits, - and _
  with open(path, "w", encoding="utf-8") as f:
    f.write(run_id + "\n")
  return run_id


class WandbWriter:
  """One W&B run for one workdir (process 0 only; the caller decides).

  Args:
    workdir: the run directory (holds `wandb/` and `wandb_id`).
    project: the W&B project.
    name: the run's display name; "" lets W&B choose.
    config: the run's config as a plain dict (shown in W&B's config panel).
  """

  def __init__(self, workdir: str, *, project: str, name: str = "",
               config: dict[str, Any] | None = None):
    wandb = _import_wandb()
    self._run = wandb.init(project=project, name=name or None, dir=workdir,
                           id=_run_id(workdir), resume="allow", config=config or {})
    self._stages: set[str] = set()

  def write(self, stage: str, step: int, metrics: dict[str, Any]) -> None:
    """Logs the record's numbers as `<stage>/<name>` at `<stage>/step` = step."""
    if stage not in self._stages:
      self._run.define_metric(f"{stage}/step")
      self._run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
      self._stages.add(stage)
    row = {f"{stage}/{k}": float(v) for k, v in metrics.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool)}
    self._run.log({f"{stage}/step": int(step), **row})

  def close(self) -> None:
    """Ends the run (writes its summary; in offline mode, closes its files)."""
    if self._run is not None:
      self._run.finish()
      self._run = None
