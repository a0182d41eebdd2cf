"""reasoning-gym tasks as a prompt source (`data.source="reasoning_gym"`), with worked solutions.

Why: SmolLM2-135M cannot do graded reasoning tasks from its instruct weights (0 of 256 samples,
review real-model-2026-12-07 §3), so RL needs a cold-start SFT on short worked solutions first,
on tasks with graded difficulty and locally checkable steps. reasoning-gym (Apache-2.0,
`pip install "reasoning-gym>=0.1.25"`) generates such tasks; this module draws a mixture of
named *arms* (a task and its generator config, `ARMS`) into train and held-out `Example`s and
writes each item's worked solution from the generator's own metadata:

  arm "chain_sum_l3", problem: "State the final answer to the following arithmetic problem:
                                17 + 61 - 12 + 62 ="
  answer: "128"
  solution: "17 + 61 = 78\\n78 - 12 = 66\\n66 + 62 = 128\\nThe answer is \\boxed{128}."

Solutions (tens of tokens, one checkable step a line, then `The answer is \\boxed{N}.`):
  chain_sum, products     running totals, left to right ("17 + 61 = 78")
  basic_arithmetic        parentheses first, then products, then sums left to right
  leg_counting            one line per kind ("2 snakes x 0 legs = 0"), then running totals
  simple_equations        a·v + b = c: "12*y = 121 - 1 = 120", then "y = 120 / 12 = 10"
An inline arm of another task has no solution (None; the SFT stage then refuses it).

Seeds (reasoning-gym draws item i of a dataset of seed s from `random.Random(s + i)`, so two
datasets whose seed ranges overlap share items): arm k (its position in the arm list) of split
p (0 = held-out, 1 = train) at data seed d owns the block of seeds

  [BLOCK·j, BLOCK·(j + 1)),   j = (2·d + p)·MAX_ARMS + k,   BLOCK = 10⁵, MAX_ARMS = 16,

so different (split, arm, data seed) never share a drawn item, and every seed stays below 2³²
(a task that seeds numpy needs that): d ≤ `max_data_seed()` (1,341). An arm's items are its
block's indices 0, 1, 2, ... in order, skipping an item that a filter drops (the arm's own, a
shortcut under `drop_shortcuts`, a degenerate equation) or whose question the split already
holds (de-duplication across all arms of the split) or, for train, that the held-out split
holds. So the result is a function of (arms, weights, sizes, data seed, split) only, and the
held-out and train splits are two draws from the same mixture and filters. The example's uid
`rg:<arm>:<seed>:<index>` regenerates its entry (`entry_of`).

Scoring: reasoning-gym's `score_answer` gives partial credit (len(ref)/len(answer) when the
reference is a substring) and expects an extracted answer; the trainer rewards with the
repository's binary math checker instead. tests/data/test_data_reasoning_gym.py compares them
over generated entries of every arm (reasoning-gym as the oracle, `score >= 1` on the answer
`rewards.extract` finds): they agree, except that the checker also accepts numerically equal
forms ("+7", "7.0", "07", "1,152", "x = 7", "7 legs") that the exact-string scorers of
leg_counting, simple_equations and basic_arithmetic refuse (chain_sum and products compare
decimals and take the first three).

The package is imported only inside functions (`load()`), so vapo_jax imports without it.
"""

import dataclasses
import json
import math
import re
from typing import Any, Mapping

from vapo_jax.data import shortcuts
from vapo_jax.data import sources

BLOCK = 10**5       # seeds (and so draws) per (split, arm, data seed)
MAX_ARMS = 16       # arms per mixture
SPLITS = ("test", "train")
INSTALL = ('data.source="reasoning_gym" needs reasoning-gym: pip install '
           '"reasoning-gym>=0.1.25" (or pip install -e ".[reasoning-gym]")')


@dataclasses.dataclass(frozen=True)
class Arm:
  """One generator of the mixture.

  Attributes:
    task: the reasoning-gym dataset name (`reasoning_gym.create_dataset(task, ...)`).
    config: keyword arguments of the task's config dataclass (seed and size excluded).
    mixed_signs: keep only expressions with both a binary + and a binary − (chain sums:
      without it "a + b + c" is the sum shortcut, review §3).
  """
  task: str
  config: Mapping[str, Any]
  mixed_signs: bool = False


# Review real-model-2026-12-07 §3's candidates. Config field names are reasoning-gym 0.1.25's.
ARMS: dict[str, Arm] = {
    # 3 terms of 1-2 digits (one digit count per item), both + and −: "29 + 83 - 93 ="
    "chain_sum_l2": Arm("chain_sum", {"min_terms": 3, "max_terms": 3, "min_digits": 1,
                                      "max_digits": 2}, mixed_signs=True),
    # 4-5 terms of 2 digits, both + and −: "17 + 61 - 12 + 62 ="
    "chain_sum_l3": Arm("chain_sum", {"min_terms": 4, "max_terms": 5, "min_digits": 2,
                                      "max_digits": 2}, mixed_signs=True),
    # 2-3 kinds of animal, 1-4 of each: "2 snakes, 2 crickets" -> 12
    "leg_counting_l2": Arm("leg_counting", {"min_animals": 2, "max_animals": 3,
                                            "min_instances": 1, "max_instances": 4}),
    # 4-5 kinds, 1-6 of each
    "leg_counting_l3": Arm("leg_counting", {"min_animals": 4, "max_animals": 5,
                                            "min_instances": 1, "max_instances": 6}),
    # a·v + b = c, 2 terms, values 1-12: "12*y + 1 = 121" -> 10
    "simple_equations_l1": Arm("simple_equations", {"min_terms": 2, "max_terms": 2,
                                                    "min_value": 1, "max_value": 12}),
    # 3 terms, values 1-50: "-15*s - 16 = -121" -> 7
    "simple_equations_l2": Arm("simple_equations", {"min_terms": 3, "max_terms": 3,
                                                    "min_value": 1, "max_value": 50}),
    # 3-4 one-digit terms (signed), + − × with parentheses: "-9 - 6 - 5 * 8" -> -55.
    # allow_parentheses=True on purpose: 0.1.25 computes allow_parentheses=False expressions
    # left to right ("4 + 2 - 2 * 10" -> 40), against precedence; with parentheses allowed
    # it evaluates the written expression.
    "basic_arithmetic_l2": Arm("basic_arithmetic", {
        "min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 1,
        "operators": ["+", "-", "*"], "allow_parentheses": True, "allow_negation": False}),
    # times tables: "4 * 3" -> 12 (a calibration arm: 100 distinct problems)
    "products_l1": Arm("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                    "max_digits": 1}),
}


@dataclasses.dataclass(frozen=True)
class RGSpec:
  """A mixture: named arms, their shares and the shortcut filter.

  Attributes:
    arms: (name, Arm) pairs, in the config's order (the order fixes the seed blocks).
    weights: one positive weight per arm; arm k gets ≈ n·w_k / Σw of a split's n items.
    drop_shortcuts: drop, from both splits, every item an op-ignoring shortcut answers.
  """
  arms: tuple[tuple[str, Arm], ...]
  weights: tuple[float, ...]
  drop_shortcuts: bool = False

  def __post_init__(self):
    if not 1 <= len(self.arms) <= MAX_ARMS:
      raise ValueError(f"a mixture has 1 to {MAX_ARMS} arms, got {len(self.arms)}")
    names = [name for name, _ in self.arms]
    if len(set(names)) != len(names):
      raise ValueError(f"an arm is listed twice: {names}")
    if len(self.weights) != len(self.arms) or not all(w > 0 for w in self.weights):
      raise ValueError(f"need one positive weight per arm ({len(self.arms)}), "
                       f"got {list(self.weights)}")

  @classmethod
  def parse(cls, arms: str, weights: str = "", drop_shortcuts: bool = False) -> "RGSpec":
    """From the config's strings (`data.rg_arms`, `data.rg_weights`); ValueError if bad."""
    parsed = parse_arms(arms)
    return cls(tuple(parsed), parse_weights(weights, len(parsed)), drop_shortcuts)


# ---------------------------------------------------------------------------- parsing


def split_top(text: str) -> list[str]:
  """`text` cut at the commas outside braces and brackets, each part stripped."""
  parts, depth, start = [], 0, 0
  for i, c in enumerate(text):
    depth += (c in "{[") - (c in "}]")
    if c == "," and depth == 0:
      parts.append(text[start:i].strip())
      start = i + 1
  parts.append(text[start:].strip())
  return parts


def parse_arm(text: str) -> tuple[str, Arm]:
  """A name of `ARMS`, or an inline arm `task{json config}` (its name: the canonical text,
  `chain_sum{"max_terms":2,"min_terms":2}`)."""
  if text in ARMS:
    return text, ARMS[text]
  m = re.fullmatch(r"([a-z][a-z0-9_]*)\s*(\{.*\})", text, re.S)
  if m is None:
    raise ValueError(f"unknown arm {text!r}: not one of {', '.join(ARMS)}, nor an inline "
                     'task{json config} such as chain_sum{"min_terms": 2, "max_terms": 2}')
  try:
    config = json.loads(m.group(2))
  except json.JSONDecodeError as e:
    raise ValueError(f"inline arm {text!r}: its config is not JSON ({e})") from None
  if not isinstance(config, dict) or {"seed", "size"} & set(config):
    raise ValueError(f"inline arm {text!r}: the config must be a JSON object without "
                     '"seed" or "size" (the mixture sets both)')
  name = m.group(1) + json.dumps(config, sort_keys=True, separators=(",", ":"))
  return name, Arm(m.group(1), config)


def parse_arms(text: str) -> list[tuple[str, Arm]]:
  """Comma-separated arms (see `parse_arm`); ValueError if empty or unknown."""
  if not text.strip():
    raise ValueError(f"no arms: name some of {', '.join(ARMS)}")
  return [parse_arm(part) for part in split_top(text)]


def parse_weights(text: str, n: int) -> tuple[float, ...]:
  """"" -> n equal weights; else n comma-separated positive numbers."""
  if not text.strip():
    return (1.0,) * n
  try:
    out = tuple(float(w) for w in text.split(","))
  except ValueError:
    raise ValueError(f"weights {text!r} are not comma-separated numbers") from None
  if len(out) != n or not all(w > 0 and math.isfinite(w) for w in out):
    raise ValueError(f"weights {text!r}: need {n} positive numbers, one per arm")
  return out


def shares(n: int, weights) -> list[int]:
  """Items per arm: ⌊n·w_k/Σw⌋, plus one each for the largest remainders (ties: the earlier
  arm) until they sum to n."""
  total = sum(weights)
  raw = [n * w / total for w in weights]
  out = [math.floor(r) for r in raw]
  order = sorted(range(len(raw)), key=lambda k: (-(raw[k] - out[k]), k))
  for k in order[:n - sum(out)]:
    out[k] += 1
  return out


def max_data_seed() -> int:
  """The largest data seed whose seed blocks stay below 2³²."""
  return (2**32 // BLOCK - MAX_ARMS * 2) // (2 * MAX_ARMS)


def block_seed(split: str, arm_index: int, data_seed: int) -> int:
  """The first seed of the block of (split, arm, data seed) (see the module docstring)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if not 0 <= arm_index < MAX_ARMS:
    raise ValueError(f"arm index {arm_index} not in [0, {MAX_ARMS})")
  if not 0 <= data_seed <= max_data_seed():
    raise ValueError(f"data seed {data_seed} not in [0, {max_data_seed()}] (reasoning_gym "
                     "seed blocks must stay below 2**32)")
  return BLOCK * ((2 * data_seed + SPLITS.index(split)) * MAX_ARMS + arm_index)


# ------------------------------------------------------------------------- the package


def load():
  """The `reasoning_gym` package, or ImportError with the one line that says what to install."""
  try:
    import reasoning_gym  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError(INSTALL) from None
  return reasoning_gym


def dataset(arm: Arm, seed: int, size: int = BLOCK):
  """The arm's reasoning-gym dataset at `seed` (item i: `random.Random(seed + i)`)."""
  rg = load()
  try:
    return rg.create_dataset(arm.task, seed=seed, size=size, **dict(arm.config))
  except (TypeError, AssertionError, ValueError) as e:
    raise ValueError(f"reasoning_gym task {arm.task!r} with config {dict(arm.config)}: "
                     f"{type(e).__name__}: {e}") from None


def arm_of(example: sources.Example) -> str:
  """The arm of an example this module made (uid `rg:<arm>:<seed>:<index>`)."""
  return example.uid.rsplit(":", 2)[0][len("rg:"):]


def entry_of(uid: str, spec: RGSpec | None = None) -> tuple[Any, dict]:
  """(dataset, entry) of an example's uid `rg:<arm>:<seed>:<index>`; an inline arm's name
  parses by itself, a table name looks in `ARMS` (or in `spec`'s arms)."""
  head, seed, index = uid.rsplit(":", 2)
  name = head.removeprefix("rg:")
  arms = dict(spec.arms) if spec is not None else {}
  arm = arms.get(name) or parse_arm(name)[1]
  ds = dataset(arm, int(seed))
  return ds, ds[int(index)]


# ------------------------------------------------------------------- expressions and steps

_TOKEN = re.compile(r"\s*(\d+|[a-z]|[-+*/()])")


def tokens(expr: str) -> list[str]:
  """Numbers, one-letter variables, operators and parentheses; ValueError on anything else."""
  out, pos, expr = [], 0, expr.strip()
  while pos < len(expr):
    m = _TOKEN.match(expr, pos)
    if m is None:
      raise ValueError(f"cannot read {expr!r} at {pos}")
    out.append(m.group(1))
    pos = m.end()
  return out


def parse(expr: str):
  """An expression tree: an int, ("var", v), ("neg", node), ("sum", [node, ...], [op, ...])
  (ops "+"/"-" between the nodes) or ("prod", [node, ...], [op, ...]) (ops "*"/"/"). A "-"
  after nothing, an operator or "(" is unary (reasoning-gym writes negative literals as
  "-4": "5 + -4 * 3")."""
  toks = tokens(expr)
  pos = 0

  def peek():
    return toks[pos] if pos < len(toks) else None

  def take(expected=None):
    nonlocal pos
    tok = peek()
    if tok is None or (expected is not None and tok != expected):
      raise ValueError(f"cannot parse {expr!r}: expected {expected or 'more'} at token {pos}")
    pos += 1
    return tok

  def factor():
    tok = take()
    if tok == "-":
      inner = factor()
      return -inner if isinstance(inner, int) else ("neg", inner)
    if tok == "(":
      inner = total()
      take(")")
      return inner
    if tok.isdigit():
      return int(tok)
    if tok.isalpha():
      return ("var", tok)
    raise ValueError(f"cannot parse {expr!r}: unexpected {tok!r}")

  def product():
    nodes, ops = [factor()], []
    while peek() in ("*", "/"):
      ops.append(take())
      nodes.append(factor())
    return nodes[0] if len(nodes) == 1 else ("prod", nodes, ops)

  def total():
    nodes, ops = [product()], []
    while peek() in ("+", "-"):
      ops.append(take())
      nodes.append(product())
    return nodes[0] if len(nodes) == 1 else ("sum", nodes, ops)

  tree = total()
  if pos != len(toks):
    raise ValueError(f"cannot parse {expr!r}: {toks[pos]!r} left over")
  return tree


def _apply(op: str, a: int, b: int) -> int:
  """a op b; "/" only where it is exact (ValueError otherwise)."""
  if op == "/":
    if b == 0 or a % b:
      raise ValueError(f"{a} / {b} is not an integer")
    return a // b
  return a + b if op == "+" else a - b if op == "-" else a * b


def value(node, env: Mapping[str, int] | None = None) -> int:
  """The integer value of a tree (variables from `env`)."""
  if isinstance(node, int):
    return node
  kind = node[0]
  if kind == "var":
    return (env or {})[node[1]]
  if kind == "neg":
    return -value(node[1], env)
  out = value(node[1][0], env)
  for op, n in zip(node[2], node[1][1:]):
    out = _apply(op, out, value(n, env))
  return out


def steps(node, lines: list[str]) -> int:
  """The value of a variable-free tree, appending one line `a op b = c` per operation:
  inside an operation the non-literal operands first (parentheses, products), left to
  right, then the operation folded left to right."""
  if isinstance(node, int):
    return node
  kind = node[0]
  if kind == "neg":
    v = steps(node[1], lines)
    lines.append(f"-1 * {v} = {-v}")
    return -v
  if kind == "var":
    raise ValueError("steps() takes no variables")
  operands = [steps(n, lines) for n in node[1]]
  acc = operands[0]
  for op, v in zip(node[2], operands[1:]):
    new = _apply(op, acc, v)
    lines.append(f"{acc} {op} {v} = {new}")
    acc = new
  return acc


def _boxed(lines: list[str], answer) -> str:
  return "\n".join(lines + [f"The answer is \\boxed{{{answer}}}."])


def solve_expression(expr: str) -> tuple[str, int]:
  """(worked solution, value) of an arithmetic expression (see `steps`)."""
  lines: list[str] = []
  v = steps(parse(expr), lines)
  return _boxed(lines, v), v


def solve_legs(animals: Mapping[str, int], legs: Mapping[str, int]) -> tuple[str, int]:
  """One line per kind, "2 snakes x 0 legs = 0" (reasoning-gym's plural), then the running
  total; (solution, total)."""
  lines, parts = [], []
  for animal, count in animals.items():
    parts.append(count * legs[animal])
    lines.append(f"{count} {animal}{'s' if count > 1 else ''} x {legs[animal]} legs = "
                 f"{parts[-1]}")
  total = parts[0]
  for p in parts[1:]:
    lines.append(f"{total} + {p} = {total + p}")
    total += p
  return _boxed(lines, total), total


def linear(equation: str) -> tuple[str, int, int, int] | None:
  """`lhs = c` with lhs = a·v + b in one variable v -> (v, a, b, c); None when the equation
  has no variable or a = 0 (reasoning-gym 0.1.25 writes "0 = 0" for (t − t)·v)."""
  left, _, right = equation.partition("=")
  variables = sorted(set(re.findall(r"[a-z]", left)))
  if len(variables) != 1 or not right.strip():
    return None
  v, tree = variables[0], parse(left)
  b = value(tree, {v: 0})
  a = value(tree, {v: 1}) - b
  if a == 0 or value(tree, {v: 2}) != 2 * a + b:
    return None
  return v, a, b, value(parse(right))


def solve_equation(equation: str) -> tuple[str, int] | None:
  """The two moves of a·v + b = c: "a*v = c - b = d", then "v = d / a = x"; None if the
  equation is not linear in one variable with an integer root."""
  lin = linear(equation)
  if lin is None:
    return None
  v, a, b, c = lin
  d = c - b
  if d % a:
    return None
  term = v if a == 1 else f"-{v}" if a == -1 else f"{a}*{v}"
  lines = [equation.strip()]
  if b:
    lines.append(f"{term} = {c} {'-' if b > 0 else '+'} {abs(b)} = {d}")
  if a != 1:
    lines.append(f"{v} = {d} / {a} = {d // a}")
  return _boxed(lines, d // a), d // a


def solution(task: str, entry: dict) -> str | None:
  """The worked solution of a reasoning-gym entry, from its metadata; None for a task this
  module has no solver for. ValueError if the solver's value is not the entry's answer."""
  meta = entry["metadata"]
  if task in ("chain_sum", "products", "basic_arithmetic"):
    if "/" in meta["expression"]:
      return None  # floor division: not solved here
    text, v = solve_expression(meta["expression"])
  elif task == "leg_counting":
    text, v = solve_legs(meta["animals"], load().arithmetic.leg_counting.ANIMALS)
  elif task == "simple_equations":
    solved = solve_equation(meta["equation"])
    if solved is None:
      return None
    text, v = solved
  else:
    return None
  if str(v) != entry["answer"]:
    raise ValueError(f"reasoning_gym {task} item {entry['question']!r}: the reference "
                     f"{entry['answer']} is not the value of its expression ({v}); "
                     "basic_arithmetic needs allow_parentheses=True (see ARMS)")
  return text


# -------------------------------------------------------------------------- filters

# Shortcuts that follow a task's own operation are not op-ignoring (a product is a product).
_OWN_OP = {"products": ("product",)}


def numbers(task: str, entry: dict) -> list[int]:
  """The integers a problem states, signed as written ("5 + -4" -> 5, -4): leg counts for
  leg_counting, else those of the expression / equation / question."""
  meta = entry["metadata"]
  if task == "leg_counting":
    return list(meta["animals"].values())
  text = meta.get("expression") or meta.get("equation") or entry["question"]
  return [int(x) for x in re.findall(r"-?\d+", text)]


def shortcut_hits(task: str, entry: dict) -> list[str]:
  """The op-ignoring shortcuts that give the entry's answer: `data.shortcuts.SHORTCUTS` over
  the signed numbers, |sum|, and for leg_counting 2 and 4 legs each (2·Σn, 4·Σn)."""
  nums = numbers(task, entry)
  try:
    ref = int(entry["answer"])
  except ValueError:
    return []
  if not nums:
    return []
  fns = {k: f for k, f in shortcuts.SHORTCUTS.items() if k not in _OWN_OP.get(task, ())}
  fns["abs_sum"] = lambda n: abs(sum(n))
  if task == "leg_counting":
    fns["legs_2_each"] = lambda n: 2 * sum(n)
    fns["legs_4_each"] = lambda n: 4 * sum(n)
  return [name for name, fn in fns.items() if fn(nums) == ref]


def mixed_signs(expression: str) -> bool:
  """Whether an expression has both a binary + and a binary − (" + " and " - ")."""
  return " + " in expression and " - " in expression


def keep(arm: Arm, entry: dict, drop_shortcuts: bool) -> bool:
  """Whether an item enters the mixture: the arm's filter, a solvable equation, and (with
  drop_shortcuts) no op-ignoring shortcut right."""
  meta = entry["metadata"]
  if arm.mixed_signs and not mixed_signs(meta.get("expression", "")):
    return False
  if arm.task == "simple_equations" and linear(meta["equation"]) is None:
    return False
  return not (drop_shortcuts and shortcut_hits(arm.task, entry))


# -------------------------------------------------------------------------- the splits


def interleave(groups: list[list]) -> list:
  """The groups' items in one list whose every prefix keeps each group's share to within
  one item: item j of a group of m sorts at (j + ½)/m (ties: the earlier group)."""
  keyed = [((j + 0.5) / len(g), k, j) for k, g in enumerate(groups) for j in range(len(g))]
  return [groups[k][j] for _, k, j in sorted(keyed)]


def examples(n: int, split: str, data_seed: int, spec: RGSpec,
             exclude: frozenset[str] = frozenset()) -> list[sources.Example]:
  """n examples of one split (arm k: `shares(n, weights)[k]` of them), interleaved.

  Arm k's items are the kept items of its seed block (`block_seed`) in index order, with no
  question twice in the split and none in `exclude` (train passes the held-out questions).
  ValueError when an arm's block has too few such items.
  """
  if n > BLOCK:
    raise ValueError(f"{n} items of one split: more than a seed block ({BLOCK})")
  seen = set(exclude)
  groups = []
  for k, ((name, arm), m) in enumerate(zip(spec.arms, shares(n, spec.weights))):
    seed = block_seed(split, k, data_seed)
    ds = dataset(arm, seed)
    got = []
    for i in range(BLOCK):
      if len(got) == m:
        break
      entry = ds[i]
      question = entry["question"].strip()
      if question in seen or not keep(arm, entry, spec.drop_shortcuts):
        continue
      seen.add(question)
      got.append(sources.Example(problem=question, answer=str(entry["answer"]),
                                 solution=solution(arm.task, entry),
                                 uid=f"rg:{name}:{seed}:{i}"))
    if len(got) < m:
      raise ValueError(f"reasoning_gym arm {name!r} ({split}): only {len(got)} distinct kept "
                       f"items of the {m} asked in {BLOCK} draws; give it a smaller weight "
                       "or a larger config")
    groups.append(got)
  return interleave(groups)


def splits(num_train: int, num_eval: int, data_seed: int,
           spec: RGSpec) -> tuple[list[sources.Example], list[sources.Example]]:
  """(train, held-out): the held-out split first, then train without its questions."""
  test = examples(num_eval, "test", data_seed, spec)
  train = examples(num_train, "train", data_seed, spec, frozenset(e.problem for e in test))
  return train, test
