"""Step 2 of an RL step, the reward: each host scores its own rows of a rollout.

A host reads back only the rows of the sampled responses its devices hold, scores them in
its own reward pool, and contributes their scores to the global `scores_B`. Small per-row
facts every host needs for metrics (scores, reasons) are all-gathered; nothing of size
B × L ever crosses hosts through the host. Row b answers prompt `rollout.group_ids_B[b]`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from vapo_jax import distributed as dist
from vapo_jax.rewards.scorer import BatchScores
from vapo_jax.sampler import types

_NO_ANSWER = ("no_answer", "malformed_box", "empty_box")


def local_responses(rollout: types.Rollout) -> tuple[np.ndarray, list[list[int]]]:
  """(rows, token lists) of this host's responses, real tokens only."""
  rows, resp = dist.local_rows(rollout.response_BxR)
  rows_l, lengths = dist.local_rows(rollout.lengths_B)
  assert np.array_equal(rows, rows_l)
  return rows, [resp[i, :lengths[i]].tolist() for i in range(len(rows))]


@dataclasses.dataclass(frozen=True)
class Scored:
  """Scores of one rollout: the global device array and the host-side summary.

  scores_B: float32 [B] global array, sharded like the rollout's rows.
  all_scores: BatchScores of all B rows (identical on every host; reasons reduced to the
    categories the metrics count).
  """
  scores_B: jax.Array
  all_scores: BatchScores


def score(scorer, rollout: types.Rollout, decode, problems: Sequence[str],
          answers: Sequence[str]) -> Scored:
  """Scores this host's responses; row b answers problem `group_ids_B[b]` (global lists)."""
  rows, responses = local_responses(rollout)
  rows_g, groups = dist.local_rows(rollout.group_ids_B)
  assert np.array_equal(rows, rows_g)
  texts = [decode(r) for r in responses]
  s = scorer.score_batch([problems[g] for g in groups], texts, [answers[g] for g in groups])
  flags = np.asarray([(x == "timeout") | (x.startswith("error:") << 1)
                      | ((x in _NO_ANSWER) << 2) for x in s.reasons], np.int32)
  b = rollout.lengths_B.shape[0]
  sh = rollout.lengths_B.sharding
  scores_B = dist.global_array(s.rewards.astype(np.float32), rows, (b,), sh)
  if jax.process_count() == 1:
    return Scored(scores_B, s)
  correct_B = dist.global_array(s.correct.astype(np.int32), rows, (b,), sh)
  flags_B = dist.global_array(flags, rows, (b,), sh)
  rewards, correct, flags = dist.to_host((scores_B, correct_B, flags_B))
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  slowest = float(np.max(multihost_utils.process_allgather(np.float32(s.max_seconds))))
  reasons = ["timeout" if f & 1 else "error:" if f & 2 else "no_answer" if f & 4 else ""
             for f in flags]
  return Scored(scores_B, BatchScores(
      rewards=rewards, correct=correct.astype(bool), reasons=reasons,
      timeouts=int(np.sum(flags & 1 > 0)), errors=int(np.sum(flags & 2 > 0)),
      max_seconds=slowest))
