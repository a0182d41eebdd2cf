"""Reward-function plug-ins named by `module:function` strings.

A plug-in scores one response: `fn(prompt, response, reference)` returns a
`float`, a `bool`, a `(float, reason)` pair or a `Verdict`. The default is
the math checker, `vapo_jax.rewards.math:score`; a config can name any other
importable function instead.
"""

import importlib
import math
from typing import Any, Callable

from vapo_jax.rewards import math as math_reward

DEFAULT_REWARD_FN = "vapo_jax.rewards.math:score"
LENIENT_REWARD_FN = "vapo_jax.rewards.math:score_lenient"
REWARD_MODES = ("strict", "lenient")

RewardFn = Callable[[str, str, str], Any]


def load_reward_fn(spec: str) -> RewardFn:
  """Imports the function named by `spec` (`"package.module:function"`).

  Raises:
    ValueError: `spec` is not of the form `module:function`, the module does
      not import, or the attribute is missing or not callable.
  """
  if not isinstance(spec, str) or spec.count(":") != 1:
    raise ValueError(
        f"reward fn must be 'module:function', e.g. {DEFAULT_REWARD_FN!r}; "
        f"got {spec!r}")
  module_name, attr = spec.split(":")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"reward fn {spec!r}: cannot import {module_name!r}: {e}") from e
  fn = module
  for part in attr.split("."):
    fn = getattr(fn, part, None)
    if fn is None:
      raise ValueError(f"reward fn {spec!r}: {module_name!r} has no {attr!r}")
  if not callable(fn):
    raise ValueError(f"reward fn {spec!r} is not callable")
  return fn


def fn_for_mode(fn: str, mode: str) -> str:
  """The plug-in that scores with the math checker in `mode`.

  The built-in math reward (`DEFAULT_REWARD_FN` or `LENIENT_REWARD_FN`) maps
  to its `strict` or `lenient` variant; any other plug-in is returned as it
  is (it has no modes).

  Raises:
    ValueError: `mode` is not one of `REWARD_MODES`.
  """
  if mode not in REWARD_MODES:
    raise ValueError(f"reward mode must be one of {REWARD_MODES}, got {mode!r}")
  if fn in (DEFAULT_REWARD_FN, LENIENT_REWARD_FN):
    return DEFAULT_REWARD_FN if mode == "strict" else LENIENT_REWARD_FN
  return fn


def to_score(result: Any) -> tuple[float, bool, str]:
  """Normalises a plug-in's return value to (reward, correct, reason).

  `correct` is `reward > 0`, which is what the positive-example loss of VAPO
  keys on for 0/1 rewards.

  Raises:
    TypeError: the value is none of the accepted types, or not finite.
  """
  if isinstance(result, math_reward.Verdict):
    return float(result.correct), result.correct, result.reason
  reason = None
  if isinstance(result, tuple) and len(result) == 2:
    result, reason = result
    reason = str(reason)
  if isinstance(result, bool) or type(result).__name__ == "bool_":
    r = float(bool(result))
  elif isinstance(result, (int, float)) or hasattr(result, "__float__"):
    r = float(result)
  else:
    raise TypeError(f"reward fn returned {type(result).__name__}; expected "
                    "float, bool, (float, str) or Verdict")
  if not math.isfinite(r):
    raise TypeError(f"reward fn returned a non-finite reward {r}")
  if reason is None:
    reason = "correct" if r > 0 else "incorrect"
  return r, r > 0, reason
