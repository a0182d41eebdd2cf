"""config.faults: non-finite updates, SIGTERM and deadlines (`run.control`,
`run.watchdog`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class FaultsSection:
  max_consecutive_nonfinite: int = 5    # updates skipped in a row (NaN/inf) before the run stops
  handle_sigterm: bool = True           # SIGTERM: checkpoint at the next step boundary, exit
  # Deadlines (seconds, 0 = none) after which a stuck process exits with a message naming
  # the stage, step and operation (exit code 3), instead of hanging: a host-side
  # collective, barrier, checkpoint save/write/restore; one whole step (compile included);
  # and the wait for a step boundary after SIGTERM (a second SIGTERM exits at once).
  collective_timeout_s: float = 1800.0
  step_timeout_s: float = 7200.0
  sigterm_grace_s: float = 900.0

  def check(self) -> None:
    need(self.max_consecutive_nonfinite >= 1, "faults.max_consecutive_nonfinite",
         self.max_consecutive_nonfinite, ">= 1")
    for name in ("collective_timeout_s", "step_timeout_s", "sigterm_grace_s"):
      value = getattr(self, name)
      need(value >= 0, f"faults.{name}", value, ">= 0 (0: no deadline)")
