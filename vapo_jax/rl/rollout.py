"""Each host's share of a rollout: prompts in, responses out, scores back in — per host.

The same global list of prompts is known on every host (same iterator, same seed). A host
tokenizes only the prompts whose rows its devices hold, reads back only those rows of the
sampled responses, scores them in its own reward pool, and contributes their scores to the
global `scores_B`. Small per-row facts every host needs for metrics (scores, lengths) are
all-gathered; nothing of size B × L ever crosses hosts through the host.

With one process this is the plain single-host path (the host holds every row).

Row layout (the sampler's): prompt p's n responses are rows p·n … p·n + n − 1, and
prompt rows and response rows are split over the same batch shards, so a host holding prompt
row p holds response rows p·n … p·n + n − 1.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from vapo_jax import distributed as dist
from vapo_jax.sampler import types as rollout_lib
from vapo_jax.sampler import ops as sampling
from vapo_jax.rewards.scorer import BatchScores

_NO_ANSWER = ("no_answer", "malformed_box", "empty_box")


def row_sharding(sampler) -> NamedSharding | None:
  """How the sampler splits rows: over its mesh's batch axes (None without a mesh)."""
  if sampler.mesh is None:
    return None
  return NamedSharding(sampler.mesh, PartitionSpec(sampler.batch_axes or None))


def sample(sampler, params, prompt_ids: Callable[[int], Sequence[int]], num_prompts: int,
           key: jax.Array, *, prompts_per_call: int = 0) -> rollout_lib.Rollout:
  """Samples `sampler.cfg.n_per_prompt` responses for each of the global prompts.

  prompt_ids(i) -> token ids of global prompt i; it is called only for this host's rows.
  Prompts are left-padded to the sampler's largest bucket, one static P on every host.
  prompts_per_call > 0 samples that many prompts per sampler call (call c with key
  fold_in(key, c)) and joins the calls' rollouts in prompt order.
  """
  per = prompts_per_call or num_prompts
  if per >= num_prompts:
    return _sample_once(sampler, params, prompt_ids, num_prompts, key)
  if num_prompts % per:
    raise ValueError(f"{num_prompts} prompts do not split into calls of {per}")
  parts = []
  for c in range(num_prompts // per):
    part = _sample_once(sampler, params, lambda i, o=c * per: prompt_ids(o + i), per,
                        jax.random.fold_in(key, c))
    parts.append(dataclasses.replace(
        part, group_ids_B=part.group_ids_B + c * per))
  sh = row_sharding(sampler)
  join = jax.jit(lambda ps: jax.tree.map(lambda *x: jax.numpy.concatenate(x), *ps),
                 out_shardings=sh)
  return join(parts)


def _sample_once(sampler, params, prompt_ids, num_prompts: int, key) -> rollout_lib.Rollout:
  sh = row_sharding(sampler)
  if sh is None:
    return sampler(params, [prompt_ids(i) for i in range(num_prompts)], key)
  rows = dist.host_rows(sh, num_prompts)
  p = sampling.prompt_bucket(sampler.cfg.max_prompt_len, sampler.cfg)
  tokens, mask = rollout_lib.left_pad([prompt_ids(int(i)) for i in rows], p,
                                      sampler.cfg.pad_id)
  tokens_g = dist.global_array(tokens, rows, (num_prompts, p), sh)
  mask_g = dist.global_array(mask, rows, (num_prompts, p), sh)
  return sampler.generate_padded(params, tokens_g, mask_g, key)


def local_responses(rollout: rollout_lib.Rollout) -> tuple[np.ndarray, list[list[int]]]:
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


def score(scorer, rollout: rollout_lib.Rollout, decode, problems: Sequence[str],
          answers: Sequence[str], n: int) -> Scored:
  """Scores this host's responses; row b answers problem b // n (global lists)."""
  rows, responses = local_responses(rollout)
  texts = [decode(r) for r in responses]
  s = scorer.score_batch([problems[r // n] for r in rows], texts,
                         [answers[r // n] for r in rows])
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
