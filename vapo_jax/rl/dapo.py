"""DAPO's two rollout-side changes: overlong reward shaping and dynamic sampling.

Overlong reward shaping (DAPO eq. 13) adds a soft length penalty to each response's score;
dynamic sampling keeps only groups whose responses do not all score the same (a uniform
group has zero group-relative advantage, so it only dilutes the batch) and draws more
prompts until the batch is full. `rl.experience` uses both; these are the pure parts.
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# DAPO's published setting: 20,480 generated tokens at most, the last 4,096 the soft
# punishment cache; configs scale the cache with their max_new_tokens by this fraction.
DAPO_MAX_LEN, DAPO_CACHE_LEN = 20480, 4096


@dataclasses.dataclass(frozen=True)
class Overlong:
  """Overlong shaping's lengths: L_max (sampling.max_new_tokens) and L_cache
  (`Config.overlong_cache_tokens`), as `overlong_penalty` takes them."""
  max_len: int
  cache_len: int


def default_cache_len(max_len: int) -> int:
  """L_cache for a maximum length L_max in DAPO's proportion (4096 / 20480 = 1/5), ≥ 1."""
  return max(1, round(max_len * DAPO_CACHE_LEN / DAPO_MAX_LEN))


def overlong_penalty(lengths_B: jax.Array, max_len: int, cache_len: int) -> jax.Array:
  """DAPO's soft overlong punishment R_length(y), float32 [B]:

      0                                  |y| ≤ L_max − L_cache
      ((L_max − L_cache) − |y|) / L_cache   L_max − L_cache < |y| ≤ L_max   (0 down to −1)
      −1                                 |y| > L_max

  Args:
    lengths_B: int [B] response lengths |y| in tokens.
    max_len: L_max (the sampler's max_new_tokens).
    cache_len: L_cache, 1 ≤ L_cache ≤ L_max.
  """
  if not 1 <= cache_len <= max_len:
    raise ValueError(f"need 1 <= cache_len <= max_len, got {cache_len}, {max_len}")
  length = jnp.asarray(lengths_B, jnp.float32)
  start = float(max_len - cache_len)
  ramp = (start - length) / float(cache_len)
  return jnp.where(length <= start, 0.0, jnp.where(length <= max_len, ramp, -1.0))


def mixed_groups(scores_B: np.ndarray, group_size: int) -> np.ndarray:
  """bool [G]: whether group g (rows g·n … g·n + n − 1) holds two different scores."""
  s = np.asarray(scores_B).reshape(-1, group_size)
  return s.max(axis=1) != s.min(axis=1)


def fill_groups(mixed: Sequence[np.ndarray], num_groups: int) -> tuple[np.ndarray, np.ndarray]:
  """The groups that make a batch of `num_groups`, from the rounds drawn so far.

  Groups are numbered through the rounds in order (round r's group g is
  r·G_r + g for rounds of G_r groups each: the index into `np.concatenate(mixed)`). Mixed
  groups come first, in the order drawn, up to `num_groups`; if there are fewer, the batch
  is filled with the first uniform groups drawn, marked keep=False (the caller masks their
  rows out of every loss, so the batch has its static shape but only mixed groups count).

  Args:
    mixed: per round, bool [G_r] from `mixed_groups`.
    num_groups: groups per batch (≤ the groups drawn).

  Returns:
    (picks int64 [num_groups], keep bool [num_groups]).
  """
  flat = np.concatenate([np.asarray(m, bool) for m in mixed])
  if len(flat) < num_groups:
    raise ValueError(f"{len(flat)} groups drawn, fewer than the batch's {num_groups}")
  good, bad = np.flatnonzero(flat), np.flatnonzero(~flat)
  kept = min(len(good), num_groups)
  picks = np.concatenate([good[:kept], bad[:num_groups - kept]]).astype(np.int64)
  return picks, np.arange(num_groups) < kept


def group_rows(picks: np.ndarray, group_size: int) -> np.ndarray:
  """Row indices of groups `picks` (rows g·n … g·n + n − 1 each), in order: int64 [len·n]."""
  picks = np.asarray(picks, np.int64)
  return (picks[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
