""""Chain or guess": short and long chains, and direct guesses among the SFT targets.

The toy of `configs/chain_or_guess.py`, built so that the paper's value-model rows can act
(review `ablation-2026-12-01.md` §4.2). Problems are the chains of `data.chain` with one-digit
values (so a guessed digit is right 1 time in 10); a share of them are short and the rest
long; and a share of the *training* problems carry a direct guess as their SFT target
instead of the worked solution:

  problem:           "start 7: A+2 B-3 C+1"
  worked solution:   "A:7+2=9\\nB:9-3=6\\nC:6+1=7\\n\\boxed{7}"        (short: 3–6 steps)
  guess (SFT only):  "\\boxed{4}"                                     (a uniform digit)

So the SFT policy answers without reasoning with probability ≈ guess_fraction whatever the
prompt: the short, unreasoned answer that PPO's collapse in the paper goes to. Response
lengths are 10 (guess), 34–58 (short) and 122–170 (long) tokens with EOS, so they vary ~15×,
and the value of the first response token is an easy feature for a critic (≈ 0.1 after `\\`,
the chain's success rate after `A`).

Every example's uid ends in its kind: ".../short", ".../long" or ".../guess" (a train
problem whose target is a guess, whatever its chain's length). Problems
depend on the seed and the spec only; train and held-out problems are disjoint (a fixed hash
of the problem text, as in `data.chain`); held-out problems always carry worked solutions.
"""

import dataclasses
import random

from vapo_jax.data import chain
from vapo_jax.data import sources

KINDS = ("short", "long")


@dataclasses.dataclass(frozen=True)
class MixSpec:
  """The mixture.

  Attributes:
    short, long: the chains of each kind (their min_steps / max_steps differ).
    short_fraction: share of short chains among the problems.
    guess_fraction: share of train problems whose SFT target is a direct guess.
    heldout_fraction: share of all problems in the held-out split.
  """
  short: chain.ChainSpec = chain.ChainSpec(min_steps=3, max_steps=6, max_operand=3,
                                           max_value=9, ops="+-")
  long: chain.ChainSpec = chain.ChainSpec(min_steps=14, max_steps=20, max_operand=3,
                                          max_value=9, ops="+-")
  short_fraction: float = 0.5
  guess_fraction: float = 0.15
  heldout_fraction: float = 0.1

  def __post_init__(self):
    if not 0 <= self.short_fraction <= 1:
      raise ValueError(f"short_fraction must be in [0, 1], got {self.short_fraction}")
    if not 0 <= self.guess_fraction < 1:
      raise ValueError(f"guess_fraction must be in [0, 1), got {self.guess_fraction}")
    if not 0 < self.heldout_fraction < 1:
      raise ValueError("heldout_fraction must be in (0, 1)")
    if self.short.max_steps >= self.long.min_steps:
      raise ValueError(f"short chains ({self.short.min_steps}–{self.short.max_steps} steps) "
                       f"must be shorter than long ones ({self.long.min_steps}–"
                       f"{self.long.max_steps})")
    if max(self.short.max_value, self.long.max_value) > 9:
      raise ValueError("values must stay one digit (max_value <= 9): a guess is a digit")


def guess_solution(rng: random.Random) -> str:
  """A direct answer without reasoning: a uniform digit."""
  return f"\\boxed{{{rng.randint(0, 9)}}}"


def kind_of(example: sources.Example) -> str:
  """"short", "long" or "guess" from the example's uid (see the module docstring)."""
  kind = example.uid.rsplit("/", 1)[-1]
  if kind not in (*KINDS, "guess"):
    raise ValueError(f"{example.uid!r} is not a chain_or_guess example")
  return kind


def chain_or_guess(num_examples: int, split: str = "train", seed: int = 0,
                   spec: MixSpec = MixSpec()) -> list[sources.Example]:
  """`num_examples` distinct problems of one split (`"train"` or `"test"`, disjoint).

  The same seed and spec give the same examples. A problem is short with probability
  short_fraction; a train problem's SFT target is a guess with probability guess_fraction
  (drawn from a stream of its own, so the problems do not depend on guess_fraction).
  """
  rng = random.Random(f"vapo_jax.chain_mix/{seed}")
  guesses = random.Random(f"vapo_jax.chain_mix/{seed}/guesses")

  def draw() -> sources.Example:  # its kind in the uid until the example has its own
    kind = "short" if rng.random() < spec.short_fraction else "long"
    return dataclasses.replace(chain.make_problem(rng, getattr(spec, kind)), uid=kind)

  out = []
  for i, ex in chain.distinct(draw, num_examples, split, spec.heldout_fraction, spec):
    kind = ex.uid
    if split == "train" and guesses.random() < spec.guess_fraction:
      ex, kind = dataclasses.replace(ex, solution=guess_solution(guesses)), "guess"
    out.append(dataclasses.replace(ex, uid=f"chain_or_guess/{seed}/{split}/{i}/{kind}"))
  return out


def dev_set(num_examples: int, num_heldout: int, seed: int = 0, spec: MixSpec = MixSpec()
            ) -> list[sources.Example]:
  """A development set: held-out-split problems after the first `num_heldout` (the test set),
  so it is disjoint from both the training problems and the test set."""
  return chain_or_guess(num_heldout + num_examples, "test", seed, spec)[num_heldout:]
