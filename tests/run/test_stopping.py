"""Value pretraining's stopping rules (run/stopping.py): which one ends the stage, or the cap."""

import pytest

from vapo_jax.run import stopping


def test_moving_average_and_plateau_by_hand():
  assert stopping.moving_average([3.0, 1.0, 2.0, 6.0], 2) == [3.0, 2.0, 1.5, 4.0]
  # Smoothed over 3: ..., m_{-1-w} = mean(1.0, 1.0, 1.0) = 1.0, m_{-1} = mean(.99, .99, .99).
  flat = [4.0, 2.0, 1.0, 1.0, 1.0, 0.99, 0.99, 0.99]
  assert stopping.plateaued(flat, window=3, smooth=3, tol=0.02)       # 1% < 2%
  assert not stopping.plateaued(flat, window=3, smooth=3, tol=0.005)  # 1% >= 0.5%
  assert not stopping.plateaued(flat[:5], window=3, smooth=3, tol=0.02)  # too few steps
  assert not stopping.plateaued(flat, window=0, smooth=3, tol=0.02)     # off
  falling = [1.0 * 0.8 ** i for i in range(12)]
  assert not stopping.plateaued(falling, window=5, smooth=3, tol=0.02)


def _reason(losses, ev=0.0, **kw):
  settings = {"max_steps": 10, "min_steps": 2, "plateau_window": 3, "plateau_smooth": 2,
              "plateau_tol": 0.02, **kw}
  return stopping.stop_reason(losses, ev, step=len(losses), **settings)


def test_which_rule_ends_the_stage():
  assert _reason([1.0]) is None
  assert _reason([1.0], ev=0.9, stop_explained_variance=0.5) is None  # before min_steps
  assert _reason([1.0, 0.5], ev=0.9, stop_explained_variance=0.5) == "explained_variance"
  assert _reason([1.0, 0.05], stop_value_loss=0.1) == "value_loss"
  assert _reason([1.0, 0.5, 0.3, 0.3, 0.3, 0.3, 0.3]) == "plateau"
  assert _reason([1.0, 0.5, 0.4, 0.3, 0.3, 0.3]) is None  # m: 0.45 -> 0.3 over 3 steps
  assert _reason([1.0, 0.5, 0.4, 0.3, 0.2, 0.1]) is None
  steady = [1.0 - 0.05 * i for i in range(10)]  # falls ~5% a step: never a plateau
  assert _reason(steady) == "cap" and _reason(steady[:9]) is None
  # The cap counts steps done, also on a resumed stage that saw only its last losses.
  assert stopping.stop_reason([0.5], 0.0, step=10, max_steps=10) == "cap"
  assert set(stopping.RULES) == {"value_loss", "explained_variance", "group_ev", "plateau"}
  # The within-group EV rule: off at 1, holds at its threshold, never before min_steps.
  assert stopping.stop_reason([1.0], 0.0, step=1, max_steps=5, group_ev=0.9) is None
  assert stopping.stop_reason([1.0], 0.0, step=1, max_steps=5, group_ev=0.1,
                              stop_group_ev=0.1) == "group_ev"
  assert stopping.stop_reason([1.0], 0.0, step=1, max_steps=5, min_steps=2, group_ev=0.5,
                              stop_group_ev=0.1) is None
  assert stopping.stop_reason([1.0], 0.0, step=1, max_steps=5, group_ev=None,
                              stop_group_ev=0.1) is None


@pytest.mark.parametrize("ev_threshold", [1.0, 0.6])
def test_an_unreachable_threshold_never_ends_the_stage_silently(ev_threshold):
  """The review's finding: a perfect critic of the long-CoT toy reaches EV ~0.4, so a 0.6
  threshold never holds; the stage ends at its cap and says so."""
  why = [stopping.stop_reason([1.0 - 0.04 * i for i in range(n)], 0.4, step=n, max_steps=8,
                              min_steps=3, stop_explained_variance=ev_threshold)
         for n in range(1, 9)]
  assert why == [None] * 7 + ["cap"]
