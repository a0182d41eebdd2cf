"""Where a run's numbers go: one JSON line per record, and TensorBoard event files.

    workdir/metrics.jsonl                  {"stage", "step", "time", <metric>: value, ...}
    workdir/tensorboard/<stage>/events.*   one TensorBoard run per stage, x-axis = stage step
    workdir/wandb/                          Weights & Biases (optional, see `run.wandb_log`)

Only process 0 writes (on a multi-host run every process computes the same metrics).
Resuming a run from a checkpoint first cuts `metrics.jsonl` back to the records that existed
when the checkpoint was taken (`truncate`), and reopens TensorBoard with `purge_step` so the
steps that are run again replace rather than repeat their points: the files of a run killed
and resumed read like those of a run that never stopped.

No model, no trainer: this module sits on the bottom floor with `config` and `data`.
"""

import json
import math
import os
import time
import warnings
from typing import Any

import jax

JSONL = "metrics.jsonl"
TENSORBOARD = "tensorboard"


def _jsonable(value: Any) -> Any:
  """Floats as JSON can hold them (NaN/inf become strings, which json.loads keeps)."""
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """All records of a metrics file; a torn last line (killed mid-write) is ignored."""
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


class MetricsWriter:
  """JSONL + TensorBoard for one run (a no-op without a workdir or off process 0).

  Args:
    workdir: the run directory; None writes nothing.
    tensorboard: also write TensorBoard event files (needs `tensorboardX`).
    wandb: also log to Weights & Biases: the keyword arguments of `wandb_log.WandbWriter`
      (project, name, config); None: off. Without the `wandb` package this raises an
      ImportError whose one line says what to install.
  """

  def __init__(self, workdir: str | None, *, tensorboard: bool = True,
               wandb: dict[str, Any] | None = None):
    self.workdir = workdir if workdir and jax.process_index() == 0 else None
    self.path = None
    self.lines = 0
    self._tensorboard = tensorboard
    self._tb: dict[str, Any] = {}
    self._purge: dict[str, int] = {}
    self._wandb = None
    if self.workdir:
      os.makedirs(self.workdir, exist_ok=True)
      self.path = os.path.join(self.workdir, JSONL)
      if os.path.exists(self.path):
        self.lines = len(read_jsonl(self.path))
      if wandb is not None:
        from vapo_jax.run import wandb_log  # pylint: disable=import-outside-toplevel
        self._wandb = wandb_log.WandbWriter(self.workdir, **wandb)

  def write(self, stage: str, step: int, metrics: dict[str, float]) -> None:
    """Appends one record and adds each scalar to the stage's TensorBoard run."""
    if not self.path:
      return
    record = {"stage": stage, "step": int(step), "time": time.time(),
              **{k: _jsonable(v) for k, v in metrics.items()}}
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
    self.lines += 1
    tb = self._writer(stage)
    if tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
          tb.add_scalar(k, float(v), int(step))
    if self._wandb is not None:
      self._wandb.write(stage, step, metrics)

  def truncate(self, lines: int, purge_steps: dict[str, int] | None = None) -> None:
    """Keeps the first `lines` records (what a checkpoint saw) and drops the rest.

    Args:
      lines: records to keep.
      purge_steps: per stage, the first step that will be written again; TensorBoard
        discards that stage's points from there on when it next opens the run.
    """
    if not self.path:
      return
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        kept = [line for line in f if line.strip()][:lines]
      tmp = self.path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
      os.replace(tmp, self.path)
      self.lines = len(kept)
    self._close_tensorboard()
    self._purge = dict(purge_steps or {})

  def flush(self) -> None:
    for tb in self._tb.values():
      tb.flush()

  def close(self) -> None:
    """Closes the TensorBoard files and ends the W&B run."""
    self._close_tensorboard()
    if self._wandb is not None:
      self._wandb.close()
      self._wandb = None

  def _close_tensorboard(self) -> None:
    for tb in self._tb.values():
      tb.close()
    self._tb = {}

  def _writer(self, stage: str):
    if not self._tensorboard:
      return None
    if stage not in self._tb:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      except ImportError:
        warnings.warn("TensorBoard event files need `pip install tensorboardX` (or set "
                      "--config.metrics.tensorboard=False); writing metrics.jsonl only.")
        self._tensorboard = False
        return None
      self._tb[stage] = SummaryWriter(os.path.join(self.workdir, TENSORBOARD, stage),
                                      purge_step=self._purge.pop(stage, None),
                                      flush_secs=30)
    return self._tb[stage]



class _NoBar:
  """A progress bar that shows nothing."""

  def update(self, n: int = 1) -> None:
    del n

  def set_postfix(self, *args, **kwargs) -> None:
    del args, kwargs

  def close(self) -> None:
    pass


def progress_bar(total: int, desc: str, *, enabled: bool, start: int = 0):
  """A tqdm bar at `start` of `total` steps, or one that shows nothing."""
  if not enabled:
    return _NoBar()
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  bar = tqdm(total=total, desc=desc, dynamic_ncols=True, leave=True)
  bar.update(start)
  return bar
