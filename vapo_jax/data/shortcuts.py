"""Shortcut baselines: answers a model could give without reading a problem's operations.

A shortcut maps the numbers a problem states, in the order it states them, to an answer:

  sum               n_1 + n_2 + ... + n_m         ("add every number")
  product           n_1 · n_2 · ... · n_m
  first, last       n_1, n_m
  max, min          max_j n_j, min_j n_j
  first_minus_rest  n_1 − (n_2 + ... + n_m)       ("take every later number away")
  range             max_j n_j − min_j n_j

The numbers are the integers written in digits plus the multiplier words ("doubles", "twice"
-> 2, "triples", "three times" -> 3), so "the product" of "12 pencils ... doubles" is 24.
A shortcut is right on a problem when its value equals the reference answer as a number; its
score on a set of problems is the share it gets right. `best` is the highest of these scores:
a model's accuracy at or below it is no evidence of solving.

`template` is a different floor: the best left-to-right operator pattern over the numbers
(n_1 ∘_1 n_2 ∘_2 n_3 with each ∘ in {+, −, ·}, one pattern per count of numbers), chosen on
the same problems it is scored on, so it is optimistic. On a task with few operation
structures it is about the share of the most common structure: it tells how much guessing
the structure, not reading the story, would score.

`operations` reads the kinds of operations, in order, from a worked solution of one line
per operation ("7 + 4 = 11", "9-6=3", "A:23+4=27", as the synthetic tasks write them), or
None when the solution is not of that form (data sets' free-text solutions).
"""

import itertools
import math
import re

from vapo_jax.data import sources

_WORDS = {"doubles": 2, "double": 2, "doubled": 2, "twice": 2, "triples": 3, "triple": 3,
          "tripled": 3, "three times": 3}
_TOKEN = re.compile(r"\d+|" + "|".join(sorted(_WORDS, key=len, reverse=True)), re.I)
_STEP = re.compile(r"(?:[A-Za-z]+:)?\s*(-?\d+)\s*([-+*/])\s*(-?\d+)\s*=\s*(-?\d+)\s*")

SHORTCUTS = {
    "sum": sum,
    "product": math.prod,
    "first": lambda n: n[0],
    "last": lambda n: n[-1],
    "max": max,
    "min": min,
    "first_minus_rest": lambda n: n[0] - sum(n[1:]),
    "range": lambda n: max(n) - min(n),
}


def numbers(problem: str) -> list[int]:
  """The integers a problem states, in order: digits and the multiplier words of `_WORDS`."""
  out = []
  for tok in _TOKEN.findall(problem):
    out.append(int(tok) if tok.isdigit() else _WORDS[tok.lower()])
  return out


def _value(answer: str) -> float | None:
  try:
    return float(answer.replace(",", "").strip())
  except ValueError:
    return None


def verdicts(example: sources.Example) -> dict[str, bool]:
  """{shortcut name: whether its value equals the example's answer} (all False without
  numbers in the problem or a numeric answer)."""
  nums, ref = numbers(example.problem), _value(example.answer)
  if not nums or ref is None:
    return {name: False for name in SHORTCUTS}
  return {name: fn(nums) == ref for name, fn in SHORTCUTS.items()}  # int == float: exact


def _templates(m: int):
  """Every left-to-right operator pattern over m numbers: tuples of m − 1 of "+-*"."""
  return itertools.product("+-*", repeat=max(m - 1, 0))


def _apply(nums: list[int], ops) -> int:
  value = nums[0]
  for op, b in zip(ops, nums[1:]):
    value = value + b if op == "+" else value - b if op == "-" else value * b
  return value


def template_score(examples) -> float:
  """Share right of the best operator pattern per count of numbers (see the module doc):
  Σ_m max_t #{problems with m numbers that pattern t gets right} / #problems.
  Problems of more than 5 numbers count as missed (3^4 patterns are the most tried)."""
  hits: dict[tuple[int, tuple], int] = {}
  for ex in examples:
    nums, ref = numbers(ex.problem), _value(ex.answer)
    if not nums or ref is None or len(nums) > 5:
      continue
    for ops in _templates(len(nums)):
      if _apply(nums, ops) == ref:
        hits[len(nums), ops] = hits.get((len(nums), ops), 0) + 1
  best: dict[int, int] = {}
  for (m, _), count in hits.items():
    best[m] = max(best.get(m, 0), count)
  return sum(best.values()) / max(len(examples), 1)


def scores(examples) -> dict[str, float]:
  """{shortcut: share of `examples` it gets right, "best": the highest, "template": the
  operator-pattern floor}."""
  examples = list(examples)
  if not examples:
    return {}
  right = [verdicts(ex) for ex in examples]
  out = {name: sum(r[name] for r in right) / len(examples) for name in SHORTCUTS}
  out["best"] = max(out.values())
  out["template"] = template_score(examples)
  return out


def operations(solution: str | None) -> list[str] | None:
  """The operation kinds ("+", "-", "*", "/") of a one-step-per-line worked solution, in
  order; None if any line but the last (the final answer) is not `a op b = c`."""
  if not solution:
    return None
  lines = [line for line in solution.strip().splitlines() if line.strip()]
  steps = [_STEP.fullmatch(line) for line in lines[:-1]]
  if not steps or not all(steps):
    return None
  return [s.group(2) for s in steps]
