"""Long chain-of-thought arithmetic: a labelled chain of operations, one line per step.

The toy task of `configs/longcot.py`, where responses are long enough (≈ 100–230 characters,
one token each under the character tokenizer) for length-adaptive and decoupled GAE to
matter, and the reward is sparse (the checker reads only the final `\\boxed{}`):

  problem:  "start 7: A+3 B*2 C-5"
  solution: "A:7+3=10\\nB:10*2=20\\nC:20-5=15\\n\\boxed{15}"

Each step's label (A, B, C, ...) points at its operation in the prompt, so a small model can
copy it (an induction pattern) and spends its capacity on the arithmetic. The running value
stays in [0, max_value]: an operation is drawn only among those that keep it there. One
wrong step anywhere makes the final answer wrong, so accuracy falls with the chain length.

The train / held-out split of a problem is a fixed hash of its text (as in `synthetic`).
"""

import dataclasses
import random
import string
from typing import Callable, Iterator

from vapo_jax.data import sources
from vapo_jax.data import synthetic

LABELS = string.ascii_uppercase


@dataclasses.dataclass(frozen=True)
class ChainSpec:
  """Difficulty of the chain task.

  Attributes:
    min_steps, max_steps: the chain length is drawn from [min_steps, max_steps] (≤ 26).
    max_operand: operands of + and - are drawn from [1, max_operand].
    max_factor: operands of * are drawn from [2, max_factor].
    max_value: the running value stays in [0, max_value]; the start is drawn from it.
    ops: the operators, "+" and "-" and optionally "*".
    heldout_fraction: share of all problems in the held-out split.
  """
  min_steps: int = 12
  max_steps: int = 20
  max_operand: int = 9
  max_factor: int = 3
  max_value: int = 99
  ops: str = "+-*"
  heldout_fraction: float = 0.1

  def __post_init__(self):
    if not 1 <= self.min_steps <= self.max_steps <= len(LABELS):
      raise ValueError(f"need 1 <= min_steps <= max_steps <= {len(LABELS)}, got "
                       f"{self.min_steps}, {self.max_steps}")
    if not {"+", "-"} <= set(self.ops) <= {"+", "-", "*"}:
      raise ValueError(f"ops must hold + and - (and may hold *), got {self.ops!r}")
    if self.max_operand < 1 or self.max_factor < 2 or self.max_value < 1:
      raise ValueError(f"need max_operand >= 1, max_factor >= 2, max_value >= 1; got "
                       f"{self.max_operand}, {self.max_factor}, {self.max_value}")
    if not 0 < self.heldout_fraction < 1:
      raise ValueError("heldout_fraction must be in (0, 1)")


def operand_range(op: str, value: int, spec: ChainSpec) -> range:
  """The operands of `op` that keep `value op operand` in [0, max_value] (may be empty)."""
  if op == "+":
    return range(1, min(spec.max_operand, spec.max_value - value) + 1)
  if op == "-":
    return range(1, min(spec.max_operand, value) + 1)
  return range(2, min(spec.max_factor, spec.max_value // value if value else 0) + 1)


def apply(op: str, a: int, b: int) -> int:
  return {"+": a + b, "-": a - b, "*": a * b}[op]


def make_problem(rng: random.Random, spec: ChainSpec) -> sources.Example:
  """Draws one chain and its worked solution."""
  steps = rng.randint(spec.min_steps, spec.max_steps)
  value = start = rng.randint(0, spec.max_value)
  ops, lines = [], []
  for label in LABELS[:steps]:
    op = rng.choice([o for o in spec.ops if operand_range(o, value, spec)])
    operand = rng.choice(operand_range(op, value, spec))
    new = apply(op, value, operand)
    ops.append(f"{label}{op}{operand}")
    lines.append(f"{label}:{value}{op}{operand}={new}")
    value = new
  problem = f"start {start}: " + " ".join(ops)
  solution = "\n".join(lines) + f"\n\\boxed{{{value}}}"
  return sources.Example(problem=problem, answer=str(value), solution=solution)


def chains(num_examples: int, split: str = "train", seed: int = 0,
           spec: ChainSpec = ChainSpec()) -> list[sources.Example]:
  """`num_examples` distinct problems of one split (`"train"` or `"test"`, disjoint).

  The same seed and spec give the same examples.
  """
  rng = random.Random(f"vapo_jax.chain/{seed}")
  return [dataclasses.replace(ex, uid=f"chain/{seed}/{split}/{i}")
          for i, ex in distinct(lambda: make_problem(rng, spec), num_examples, split,
                                spec.heldout_fraction, spec)]


def distinct(draw: Callable[[], sources.Example], num_examples: int, split: str,
             heldout_fraction: float, spec) -> Iterator[tuple[int, sources.Example]]:
  """(index, example) for the first `num_examples` distinct problems of `split` among
  `draw()`'s, in order (`synthetic.split_of` decides a problem's split).

  Raises:
    ValueError: a split other than "train" or "test", or fewer such problems within
      `50 * num_examples + 10_000` draws (`spec` names what was drawn from).
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  seen, attempts = set(), 0
  while len(seen) < num_examples:
    attempts += 1
    if attempts > 50 * num_examples + 10_000:
      raise ValueError(f"only {len(seen)} distinct {split} problems found for {spec}")
    ex = draw()
    if ex.problem in seen or synthetic.split_of(ex.problem, heldout_fraction) != split:
      continue
    seen.add(ex.problem)
    yield len(seen) - 1, ex
