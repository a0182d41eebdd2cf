"""When value pretraining ends: its stopping rules as one pure function.

The stage runs at most `value_pretrain.max_steps` rollout steps (the cap) and stops earlier,
after at least `min_steps`, at the first step where one rule holds:

  "value_loss"          value loss < stop_value_loss                      (0: off)
  "explained_variance"  explained variance ≥ stop_explained_variance      (1: off)
  "group_ev"            within-group EV of the step's fresh batch ≥ stop_group_ev (1: off;
                        `run.critic_diagnostics.within_group_ev`, metrics.critic_diagnostics)
  "plateau"             with m_i = mean(loss_{i−s+1..i}) (s = plateau_smooth):
                        m_{i−w} − m_i < tol · m_{i−w}   (w = plateau_window; 0: off)

The plateau rule is the one that can fire on any task: explained variance has a ceiling below
1 that depends on the task (a perfect critic of a chain where errors are independent reaches
only ~0.4), so a fixed threshold above it never holds. `stop_reason` returns the rule that
held, or "cap" at the last allowed step, or None to go on; the trainer logs it as
`value_pretrain/stopped_by` so a stage that ran to its cap says so.
"""

from typing import Sequence

RULES = ("value_loss", "explained_variance", "group_ev", "plateau")


def moving_average(values: Sequence[float], window: int) -> list[float]:
  """m_i = mean(values[max(0, i−window+1) .. i]) for every i (shorter at the start)."""
  out = []
  for i in range(len(values)):
    part = values[max(0, i - window + 1):i + 1]
    out.append(sum(part) / len(part))
  return out


def plateaued(losses: Sequence[float], window: int, smooth: int, tol: float) -> bool:
  """True when the smoothed loss improved by less than `tol` (relative) over `window` steps.

  Needs window + smooth losses (so both ends are full moving averages); False before that
  and with window = 0.
  """
  if window <= 0 or len(losses) < window + smooth:
    return False
  m = moving_average(losses, smooth)
  before, now = m[-1 - window], m[-1]
  return before - now < tol * abs(before)


def stop_reason(losses: Sequence[float], explained_variance: float, *, step: int,
                max_steps: int, min_steps: int = 0, stop_value_loss: float = 0.0,
                stop_explained_variance: float = 1.0, plateau_window: int = 0,
                plateau_smooth: int = 3, plateau_tol: float = 0.02,
                group_ev: float | None = None, stop_group_ev: float = 1.0) -> str | None:
  """Why the stage ends after the step whose loss is `losses[-1]`, or None to go on.

  Args:
    losses: the value loss of the steps seen so far (this stage, in order; a resumed stage
      sees only the steps since it resumed, so its plateau rule starts afresh).
    explained_variance: of the last step's values against its targets.
    step: the number of steps done (1 after the first).
    max_steps .. plateau_tol, stop_group_ev: the `value_pretrain` settings.
    group_ev: the within-group EV of the last step's fresh batch (None: not measured).

  Returns:
    one of RULES, "cap" (the step is the max_steps-th and no rule held), or None.
  """
  if step >= min_steps:
    if stop_value_loss > 0 and losses[-1] < stop_value_loss:
      return "value_loss"
    if explained_variance >= stop_explained_variance:
      return "explained_variance"
    if group_ev is not None and group_ev >= stop_group_ev:
      return "group_ev"
    if plateaued(losses, plateau_window, plateau_smooth, plateau_tol):
      return "plateau"
  return "cap" if step >= max_steps else None
