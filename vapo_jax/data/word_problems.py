"""Word problems in plain English: 1-3 operations on small integers, several phrasings.

For a real pretrained model on a CPU (`configs/smollm2_135m.py`): a story about one person and
one kind of thing, each sentence one operation, and a question at the end, e.g.

  problem: "Maya has 7 pencils. She buys 4 more pencils. Then she gives 3 pencils to her
            friend. How many pencils does Maya have now?"
  answer:  "8"
  solution: "7 + 4 = 11\\n11 - 3 = 8\\nThe answer is \\boxed{8}."

Operations: add ("buys 4 more", "finds 4 more", ...), subtract ("gives 3 to ...", "eats 3",
...; never below zero), multiply ("buys 3 boxes with 5 pencils in each" as the start, or "the
number of pencils doubles / triples"). Every operation has several phrasings, so a policy cannot
learn one surface form. The train / held-out split of a problem is a fixed hash of its text
(`synthetic.split_of`), so the splits are disjoint for every seed and every size.

The two splits are drawn differently. Training problems take their operation count and kinds
at random (a one-operation problem is often "add the two numbers"). The held-out split cycles
through `structures(spec)`: every order of operations that mixes at least two kinds (a
multiplying start counts as "*"), each equally often, so that no answer that ignores the
operations (`data.shortcuts`: the sum, the product, the last number, ...) is right on more
than a few held-out problems; and a held-out answer is never a number its story states (no
"gets 4, gives 4 away": the first, last, largest or smallest number would be right). The
i-th held-out problem has structure i mod the count.
"""

import dataclasses
import itertools
import random

from vapo_jax.data import shortcuts
from vapo_jax.data import sources
from vapo_jax.data import synthetic

NAMES = (("Maya", "she", "her"), ("Tom", "he", "his"), ("Lena", "she", "her"),
         ("Omar", "he", "his"), ("Sara", "she", "her"), ("Ben", "he", "his"),
         ("Ivy", "she", "her"), ("Leo", "he", "his"), ("Nora", "she", "her"),
         ("Sam", "he", "his"), ("Ada", "she", "her"), ("Raj", "he", "his"))
THINGS = ("apples", "pencils", "marbles", "stickers", "cookies", "books", "stamps", "shells",
          "cards", "coins", "eggs", "flowers", "balloons", "candies")
CONTAINERS = ("boxes", "bags", "packs", "jars", "baskets")
FRIENDS = ("friend", "brother", "sister", "neighbor", "teacher", "cousin")

_START = (
    "{N} has {a} {X}.",
    "{N} starts with {a} {X}.",
    "There are {a} {X} in {N}'s room.",
    "{N} owns {a} {X}.",
)
_START_MUL = (
    "{N} has {a} {C} with {b} {X} in each.",
    "{N} buys {a} {C} of {X}, and each one holds {b} {X}.",
)
_ADD = (
    "{P} buys {b} more {X}.",
    "Then {p} finds {b} more {X}.",
    "{F_cap} gives {O} {b} {X}.",
    "Later {p} gets {b} more {X}.",
)
_SUB = (
    "{P} gives {b} {X} to {o} {f}.",
    "Then {p} loses {b} {X}.",
    "{P} uses {b} of the {X}.",
    "After that, {p} sells {b} {X}.",
)
_MUL = (
    "Then the number of {X} {p} has doubles.",  # b = 2
    "{P} ends up with three times as many {X}.",  # b = 3
)
_QUESTION = (
    "How many {X} does {N} have now?",
    "How many {X} does {N} have in the end?",
    "How many {X} are left with {N}?",
    "What is the number of {X} {N} has now?",
)


@dataclasses.dataclass(frozen=True)
class WordSpec:
  """Difficulty of the word problems.

  Attributes:
    min_ops: fewest operations (a multiplying start counts as one).
    max_ops: most operations.
    max_operand: numbers in the text are drawn from [1, max_operand].
    ops: the operations to use, a subset of "+-*".
    heldout_fraction: share of all problems in the held-out split (by a hash of the text).
  """
  min_ops: int = 1
  max_ops: int = 3
  max_operand: int = 12
  ops: str = "+-*"
  heldout_fraction: float = 0.1

  def __post_init__(self):
    if not 1 <= self.min_ops <= self.max_ops:
      raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
    if self.max_operand < 2 or not self.ops or set(self.ops) - set("+-*"):
      raise ValueError(f"bad max_operand {self.max_operand} or ops {self.ops!r}")
    if not 0 < self.heldout_fraction < 1:
      raise ValueError("heldout_fraction must be in (0, 1)")


def structures(spec: WordSpec) -> list[tuple[str, ...]]:
  """The held-out split's operation sequences, in a fixed order.

  Every sequence of min_ops..max_ops operations over `spec.ops` ("x" first: a multiplying
  start, "x, b boxes of c"; it counts as one operation and as the kind "*") that mixes at
  least two kinds; if the spec allows no such sequence (one kind, or one operation), all of
  its sequences.
  """
  out = []
  for n in range(spec.min_ops, spec.max_ops + 1):
    for ops in itertools.product(spec.ops, repeat=n):
      out.append(ops)
      if "*" in spec.ops:
        out.append(("x",) + ops[1:])
  out = list(dict.fromkeys(out))
  mixed = [s for s in out if len({"*" if o == "x" else o for o in s}) >= 2]
  return mixed or out


def make_problem(rng: random.Random, spec: WordSpec,
                 structure: tuple[str, ...] | None = None) -> sources.Example | None:
  """Draws one problem, its answer and a worked solution.

  Args:
    structure: the operations in order (see `structures`); None: drawn at random (the
      training split's way). A structure whose subtraction would reach zero gives None.
  """
  name, pron, poss = rng.choice(NAMES)
  things = rng.choice(THINGS)
  words = dict(N=name, p=pron, P=pron.capitalize(), o=poss, X=things,
               C=rng.choice(CONTAINERS), f=rng.choice(FRIENDS),
               O="him" if pron == "he" else "her")
  words["F_cap"] = f"{poss.capitalize()} {rng.choice(FRIENDS)}"
  n_ops = rng.randint(spec.min_ops, spec.max_ops) if structure is None else len(structure)
  hi = spec.max_operand
  sentences, lines = [], []
  if (structure[0] == "x" if structure is not None
      else "*" in spec.ops and rng.random() < 0.3):
    a, b = rng.randint(2, min(hi, 6)), rng.randint(2, hi)
    sentences.append(rng.choice(_START_MUL).format(a=a, b=b, **words))
    value = a * b
    lines.append(f"{a} * {b} = {value}")
    n_ops -= 1
  else:
    value = rng.randint(2, hi)
    sentences.append(rng.choice(_START).format(a=value, **words))
  for j in range(n_ops):
    if structure is not None:
      op = structure[len(structure) - n_ops + j]
      if op == "-" and value <= 1:
        return None
    else:
      choices = [o for o in spec.ops if o != "-" or value > 1]
      if not choices:  # only "-" allowed and nothing left to take away
        break
      op = rng.choice(choices)
    if op == "+":
      b = rng.randint(1, hi)
      sentences.append(rng.choice(_ADD).format(b=b, **words))
      new = value + b
    elif op == "-":
      b = rng.randint(1, min(hi, value - 1))
      sentences.append(rng.choice(_SUB).format(b=b, **words))
      new = value - b
    else:
      k = rng.randrange(len(_MUL))
      b = 2 + k
      sentences.append(_MUL[k].format(**words))
      new = value * b
    lines.append(f"{value} {op} {b} = {new}")
    value = new
  sentences.append(rng.choice(_QUESTION).format(**words))
  problem = " ".join(sentences)
  solution = "\n".join(lines) + f"\nThe answer is \\boxed{{{value}}}."
  return sources.Example(problem=problem, answer=str(value), solution=solution)


def word_problems(num_examples: int, split: str = "train", seed: int = 0,
                  spec: WordSpec = WordSpec()) -> list[sources.Example]:
  """`num_examples` distinct problems of one split (`"train"` or `"test"`, disjoint).

  Raises:
    ValueError: a bad split, or fewer distinct problems of that split than requested.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  rng = random.Random(f"vapo_jax.word_problems/{seed}")
  shapes = structures(spec) if split == "test" else None
  seen, out = set(), []
  attempts = 0
  while len(out) < num_examples:
    attempts += 1
    if attempts > 50 * num_examples + 10_000:
      raise ValueError(f"only {len(out)} distinct {split} word problems for {spec}; "
                       "lower num_examples or widen the spec")
    ex = make_problem(rng, spec, shapes[len(out) % len(shapes)] if shapes else None)
    if (ex is None or ex.problem in seen
        or synthetic.split_of(ex.problem, spec.heldout_fraction) != split
        or (shapes and int(ex.answer) in shortcuts.numbers(ex.problem))):
      continue
    seen.add(ex.problem)
    out.append(dataclasses.replace(ex, uid=f"word/{seed}/{split}/{len(out)}"))
  return out
