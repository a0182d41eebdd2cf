"""Step 1 of an RL step, the rollout: each host's share of the prompts in, responses out.

The same global list of prompts is known on every host (same iterator, same seed). A host
tokenizes only the prompts whose rows its devices hold and feeds them to the sampler; the
rollout comes back as global arrays, sharded by rows. Its scoring is step 2 (`rl.reward`).

With one process this is the plain single-host path (the host holds every row).

Row layout (the sampler's): prompt p's n responses are rows p·n … p·n + n − 1, and
prompt rows and response rows are split over the same batch shards, so a host holding prompt
row p holds response rows p·n … p·n + n − 1.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from vapo_jax import distributed as dist
from vapo_jax.sampler import ops
from vapo_jax.sampler import types


def row_sharding(sampler: types.RolloutSampler) -> NamedSharding | None:
  """How the sampler splits rows: over its mesh's batch axes (None without a mesh)."""
  if sampler.mesh is None:
    return None
  return NamedSharding(sampler.mesh, PartitionSpec(sampler.batch_axes or None))


def sample(sampler: types.RolloutSampler, params, prompt_ids: Callable[[int], Sequence[int]],
           num_prompts: int, key: jax.Array, *, prompts_per_call: int = 0) -> types.Rollout:
  """Samples `sampler.cfg.n_per_prompt` responses for each of the global prompts.

  prompt_ids(i) -> token ids of global prompt i; it is called only for this host's rows.
  Prompts are left-padded to the sampler's largest bucket, one static P on every host.
  prompts_per_call > 0 samples that many prompts per sampler call (call c with key
  fold_in(key, c)) and joins the calls' rollouts in prompt order. The rollout engine
  (`sampler.continuous`) ignores prompts_per_call: it samples all prompts in one call, with
  per-response keys (response b: fold_in(key, b)).
  """
  if sampler.continuous:
    # The rollout engine takes the whole step at once (its slots bound the memory, not
    # the prompt count), every host the same prompts; rows come back sharded as below.
    # Prompts are left-padded to the largest bucket: one static P for the train steps.
    p = ops.prompt_bucket(sampler.cfg.max_prompt_len, sampler.cfg)
    return sampler(params, [prompt_ids(i) for i in range(num_prompts)], key, prompt_len=p)
  per = prompts_per_call or num_prompts
  if per >= num_prompts:
    return _sample_once(sampler, params, prompt_ids, num_prompts, key)
  if num_prompts % per:
    raise ValueError(f"{num_prompts} prompts do not split into calls of {per}")
  parts = []
  for c in range(num_prompts // per):
    part = dist.pace(_sample_once(sampler, params, lambda i, o=c * per: prompt_ids(o + i),
                                  per, jax.random.fold_in(key, c)))
    parts.append(dataclasses.replace(
        part, group_ids_B=part.group_ids_B + c * per))
  sh = row_sharding(sampler)
  join = jax.jit(lambda ps: jax.tree.map(lambda *x: jax.numpy.concatenate(x), *ps),
                 out_shardings=sh)
  return join(parts)


def _sample_once(sampler: types.RolloutSampler, params, prompt_ids, num_prompts: int,
                 key) -> types.Rollout:
  sh = row_sharding(sampler)
  if sh is None:
    return sampler(params, [prompt_ids(i) for i in range(num_prompts)], key)
  rows = dist.host_rows(sh, num_prompts)
  p = ops.prompt_bucket(sampler.cfg.max_prompt_len, sampler.cfg)
  tokens, mask = types.left_pad([prompt_ids(int(i)) for i in rows], p,
                                      sampler.cfg.pad_id)
  tokens_g = dist.global_array(tokens, rows, (num_prompts, p), sh)
  mask_g = dist.global_array(mask, rows, (num_prompts, p), sh)
  return sampler.generate_padded(params, tokens_g, mask_g, key)  # the static sampler's
