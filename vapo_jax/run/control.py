"""Where a run is and whether it should stop: position, SIGTERM, non-finite updates, saves.

The trainer's stages are one sequence of steps

    sft (sft.steps) → reward_model (reward_model.steps, with model.critic_start =
    "reward_model") → value_pretrain (≤ max_steps) → rl (rl.steps) → done

and a position is `(stage, steps done in it, global step)`; the global step counts steps of
every stage and numbers the checkpoints. :class:`RunControl` keeps the position, decides
when to save, turns SIGTERM (a TPU preemption notice) into a request to stop at the next
step boundary agreed by all hosts, and counts updates skipped for a NaN/inf loss or
gradient, stopping the run when too many come in a row. It also keeps the run's deadlines
(`watchdog`): each step must end within `step_timeout_s` of the previous one, each host-side
collective or checkpoint operation run under `guard` within `collective_timeout_s`, and the
run must reach a step boundary within `sigterm_grace_s` of a SIGTERM; otherwise the process
exits with a message naming the stage, step and operation instead of hanging. No model
code: it sits below the trainer, which owns the arrays.
"""

import contextlib
import dataclasses
import signal
import warnings
from typing import Any, Iterator

from vapo_jax import distributed as dist
from vapo_jax.run import watchdog as watchdog_lib

STAGES = ("sft", "reward_model", "value_pretrain", "rl", "done")


class Preempted(Exception):
  """The run was asked to stop (SIGTERM); a checkpoint of the current position was saved."""


class NonFiniteError(RuntimeError):
  """Too many updates in a row had a NaN/inf loss or gradient."""


def stages_of(cfg) -> list[str]:
  """The stages this config runs, in order, ending with "done"."""
  out = ["sft"] if cfg.sft.enabled else []
  if cfg.model.critic_start == "reward_model" and cfg.uses_critic:
    out.append("reward_model")
  if cfg.value_pretrain.enabled and cfg.uses_critic:
    out.append("value_pretrain")
  return out + ["rl", "done"]


def next_stage(cfg, stage: str) -> str:
  """The stage after `stage` under this config."""
  order = stages_of(cfg)
  return "done" if stage == "done" else order[order.index(stage) + 1]


def first_stage(cfg) -> str:
  return stages_of(cfg)[0]


def any_host(flag: bool) -> bool:
  """True on every host if it is True on any (all hosts must stop at the same step)."""
  return dist.any_process(flag)


@dataclasses.dataclass
class RunControl:
  """Mutable run position and fault counters (the parts of a checkpoint that are not arrays).

  Attributes:
    stage: the stage being run (or next to run); one of STAGES.
    step: steps of `stage` completed.
    global_step: steps of all stages completed (the checkpoint number).
    skipped_total: updates skipped so far for a non-finite loss or gradient.
    skipped_in_a_row: the current run of consecutive skipped updates.
    max_in_a_row: stop when skipped_in_a_row reaches this.
    save_every: periodic save interval in global steps (0: stage boundaries only).
    collective_timeout_s: deadline of each `guard`ed operation (0: none).
    step_timeout_s: deadline of each step, counted from the end of the previous one.
    sigterm_grace_s: deadline for reaching a step boundary after SIGTERM.
  """
  stage: str = "sft"
  step: int = 0
  global_step: int = 0
  skipped_total: int = 0
  skipped_in_a_row: int = 0
  max_in_a_row: int = 5
  save_every: int = 0
  collective_timeout_s: float = 0.0
  step_timeout_s: float = 0.0
  sigterm_grace_s: float = 0.0
  watchdog: watchdog_lib.Watchdog = dataclasses.field(default_factory=watchdog_lib.Watchdog)
  _sigterm: bool = False
  _previous_handler: Any = None

  # ------------------------------------------------------------------------ position
  def enter(self, stage: str) -> int:
    """Marks `stage` as running; returns the steps of it already done (0 unless resumed)."""
    if self.stage != stage:
      self.stage, self.step = stage, 0
    self._arm_step()
    return self.step

  def advance(self, stage: str, done: int) -> None:
    """One step of `stage` finished; `done` steps of it are complete now."""
    self.stage, self.step = stage, done
    self.global_step += 1
    self._arm_step()

  def _arm_step(self) -> None:
    self.watchdog.arm("step", f"{self.stage} step {self.step + 1} (compile, rollout, "
                      "update, eval and saves)", self.stage, self.step + 1,
                      self.step_timeout_s, "faults.step_timeout_s")

  @contextlib.contextmanager
  def guard(self, operation: str) -> Iterator[None]:
    """Runs a host-side collective or checkpoint operation under `collective_timeout_s`."""
    with self.watchdog.guard(operation, self.stage, self.step, self.collective_timeout_s,
                             "faults.collective_timeout_s"):
      yield

  def close(self) -> None:
    """Stops the deadlines and the SIGTERM handling (the run is over)."""
    self.uninstall_sigterm()
    self.watchdog.close()

  def periodic_save_due(self) -> bool:
    return self.save_every > 0 and self.global_step % self.save_every == 0

  def state(self) -> dict[str, Any]:
    return {"stage": self.stage, "step": self.step, "global_step": self.global_step,
            "skipped_total": self.skipped_total, "skipped_in_a_row": self.skipped_in_a_row}

  def load(self, state: dict[str, Any]) -> None:
    if state["stage"] not in STAGES:
      raise ValueError(f"unknown stage {state['stage']!r} in checkpoint")
    self.stage, self.step = state["stage"], int(state["step"])
    self.global_step = int(state["global_step"])
    self.skipped_total = int(state["skipped_total"])
    self.skipped_in_a_row = int(state["skipped_in_a_row"])

  # ---------------------------------------------------------------------- preemption
  def install_sigterm(self) -> None:
    """SIGTERM sets a flag; the trainer saves and stops at the next step boundary."""

    def handler(signum, frame):
      del signum, frame
      self._sigterm = True

    try:
      self._previous_handler = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
      warnings.warn("SIGTERM handler not installed (not on the main thread)")
      return
    # The handler above runs only when the main thread runs Python; the watchdog also sees
    # SIGTERMs while it is blocked (grace deadline, second SIGTERM exits).
    self.watchdog.watch_sigterm(self.sigterm_grace_s)

  def uninstall_sigterm(self) -> None:
    if self._previous_handler is not None:
      self.watchdog.unwatch_sigterm()
      signal.signal(signal.SIGTERM, self._previous_handler)
      self._previous_handler = None

  def request_stop(self) -> None:
    """What SIGTERM does; for tests and for callers with their own preemption notice."""
    self._sigterm = True

  def stop_requested(self) -> bool:
    """Whether any host got SIGTERM (a collective on multi-host runs: call on all hosts)."""
    with self.guard("SIGTERM agreement"):
      return any_host(self._sigterm)

  # ---------------------------------------------------------------- non-finite steps
  def count_skipped(self, skipped: list[bool], where: str) -> dict[str, float]:
    """Books a step's updates (True = skipped as non-finite) in order.

    Raises:
      NonFiniteError: `max_in_a_row` consecutive updates were skipped.
    """
    for s in skipped:
      if s:
        self.skipped_total += 1
        self.skipped_in_a_row += 1
      else:
        self.skipped_in_a_row = 0
      if self.skipped_in_a_row >= self.max_in_a_row:
        raise NonFiniteError(
            f"{self.skipped_in_a_row} updates in a row had a NaN/inf loss or gradient "
            f"({where}); the run stops here (faults.max_consecutive_nonfinite="
            f"{self.max_in_a_row}). Skipped updates leave the parameters and optimizer "
            "state as they were, so the newest checkpoint holds the last good ones. Lower "
            "the learning rate or check the data and reward function, then rerun to resume.")
    return {"nonfinite/skipped_updates": float(sum(map(bool, skipped))),
            "nonfinite/skipped_total": float(self.skipped_total)}
