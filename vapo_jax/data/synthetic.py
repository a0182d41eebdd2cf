"""Synthetic multi-step arithmetic with exact answers and worked solutions.

For the tiny CPU config and tests: no download, deterministic from a seed,
short enough for a character-level transformer. A problem chains `steps`
operations left to right with explicit parentheses, e.g.

  problem:  "Compute ((3+4)*2)-5."
  solution: "3+4=7\\n7*2=14\\n14-5=9\\n\\boxed{9}"

The train / held-out split of a problem is a fixed hash of its text, so the
two splits are disjoint for every seed and every size.
"""

import dataclasses
import random
import zlib

from vapo_jax.data import sources

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
        "*": lambda a, b: a * b}


@dataclasses.dataclass(frozen=True)
class ArithmeticSpec:
  """Difficulty of the synthetic task.

  Attributes:
    min_steps: fewest chained operations.
    max_steps: most chained operations.
    max_operand: operands are drawn from [0, max_operand].
    ops: the operators to use, a subset of "+-*".
    heldout_fraction: share of all problems that belong to the held-out
      split (decided per problem by a hash).
  """
  min_steps: int = 2
  max_steps: int = 3
  max_operand: int = 9
  ops: str = "+-*"
  heldout_fraction: float = 0.1

  def __post_init__(self):
    if not 1 <= self.min_steps <= self.max_steps:
      raise ValueError(f"need 1 <= min_steps <= max_steps, got "
                       f"{self.min_steps}, {self.max_steps}")
    if self.max_operand < 1 or not self.ops or set(self.ops) - set(_OPS):
      raise ValueError(f"bad max_operand {self.max_operand} or ops {self.ops!r}")
    if not 0 < self.heldout_fraction < 1:
      raise ValueError("heldout_fraction must be in (0, 1)")


def split_of(problem: str, heldout_fraction: float) -> str:
  """`"test"` for a fixed `heldout_fraction` of problems, else `"train"`."""
  bucket = zlib.crc32(problem.encode("utf-8")) % 10_000
  return "test" if bucket < heldout_fraction * 10_000 else "train"


def make_problem(rng: random.Random, spec: ArithmeticSpec) -> sources.Example:
  """Draws one problem and its worked solution."""
  steps = rng.randint(spec.min_steps, spec.max_steps)
  value = rng.randint(0, spec.max_operand)
  expr = str(value)
  lines = []
  for k in range(steps):
    op = rng.choice(spec.ops)
    operand = rng.randint(0, spec.max_operand)
    new = _OPS[op](value, operand)
    lines.append(f"{value}{op}{operand}={new}")
    expr = f"({expr}{op}{operand})" if k < steps - 1 else f"{expr}{op}{operand}"
    value = new
  problem = f"Compute {expr}."
  solution = "\n".join(lines) + f"\n\\boxed{{{value}}}"
  return sources.Example(problem=problem, answer=str(value), solution=solution)


def arithmetic(num_examples: int, split: str = "train", seed: int = 0,
               spec: ArithmeticSpec = ArithmeticSpec()) -> list[sources.Example]:
  """Generates `num_examples` distinct problems of one split.

  Args:
    num_examples: how many examples.
    split: `"train"` or `"test"` (held out; disjoint from train).
    seed: the same seed and spec give the same examples.
    spec: difficulty.

  Raises:
    ValueError: the spec has fewer distinct problems of that split than
      requested.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  rng = random.Random(f"vapo_jax.synthetic.arithmetic/{seed}")
  seen, out = set(), []
  attempts = 0
  while len(out) < num_examples:
    attempts += 1
    if attempts > 50 * num_examples + 10_000:
      raise ValueError(f"only {len(out)} distinct {split} problems found for "
                       f"{spec}; lower num_examples or raise the difficulty")
    ex = make_problem(rng, spec)
    if ex.problem in seen or split_of(ex.problem, spec.heldout_fraction) != split:
      continue
    seen.add(ex.problem)
    out.append(dataclasses.replace(ex, uid=f"arith/{seed}/{split}/{len(out)}"))
  return out
