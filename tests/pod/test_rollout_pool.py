"""The engine's rollout in the step model (`pod.step.rollout`): the KV pool's hold on live
slots (admission, eviction of the youngest, tokens decoded again), the fixed-shape step's
compute over every slot, and the prefill's replicas per prompt, on cases counted by hand."""

import math

import numpy as np
import pytest

from vapo_jax.pod import step as step_model
from vapo_jax.pod.step import rollout
from vapo_jax.pod.step import terms as step_terms

from test_step_terms import _setup  # pylint: disable=wrong-import-order


def _sim(lens, ps, **kw):
  base = dict(cap=20.0, max_live=2, a_=1.0, b_=0.0, per_row=0.0, lat=0.0, row_ar=0.0,
              pad=0.0, prefill_tok=0.0, reserve=0.0)
  return rollout.simulate_replica(np.array(lens), np.array(ps), **{**base, **kw})


def test_a_full_pool_evicts_the_youngest_and_it_decodes_again():
  # Two responses of 10 tokens after 2-token prompts, a pool of 20 tokens: both admitted
  # (KV 4); after 8 steps they hold 20, so the younger (10 tokens) is evicted; the older
  # ends at step 10, then the younger restarts and ends at step 20. One step costs a_ = 1.
  rep = _sim([10, 10], [2, 2])
  assert (rep.steps, rep.evictions, rep.redone) == (20, 1, 8)
  assert rep.cost == pytest.approx(20.0) and rep.weights == pytest.approx(20.0)
  assert rep.slot_steps == 2 * 8 + 2 + 10
  # The mutant that ignores the pool's growth (admission only, reserve=None): both run side
  # by side in 10 steps, holding 24 tokens in a pool of 20.
  blind = _sim([10, 10], [2, 2], reserve=None)
  assert (blind.steps, blind.evictions) == (10, 0)
  # A pool holding both whole responses never evicts.
  assert _sim([10, 10], [2, 2], cap=24.0).evictions == 0
  # Reserved pages count: 3 tokens ahead per slot leave room for 5 steps, not 8.
  ahead = _sim([10, 10], [2, 2], reserve=3.0)
  assert (ahead.evictions, ahead.redone) == (1, 5)


def test_the_fixed_shape_step_computes_every_slot():
  # One live response of 5 tokens in a replica of 4 slots: each step's matmuls run over all
  # 4 rows (per_row = 1 s each, weights free); the unbuilt engine's (max_live None) over 1.
  assert _sim([5], [1], a_=0.0, per_row=1.0, max_live=4, cap=100.0).cost == 20.0
  assert _sim([5], [1], a_=0.0, per_row=1.0, max_live=None, cap=100.0,
              reserve=None).cost == 5.0


def test_the_built_rollout_counts_evictions_when_the_pool_binds():
  st = _setup(host_chunk_ms=1.0)
  resp, prompts = np.array([8, 8, 8, 8]), np.array([4, 4, 4, 4])

  def run(kv_tokens):
    eng = step_model.EngineShape(slots=4, page_size=4, kv_tokens=kv_tokens, chunk_steps=1,
                                 replicas=1, kernel="jax", overlap=False)
    return step_model.continuous_rollout(st, resp, prompts, floor=False, engine=eng)

  big, small = run(1024), run(32)
  line = [x for x in small.lines if x.startswith("KV pool")][0]
  assert "0 evictions" in [x for x in big.lines if x.startswith("KV pool")][0]
  assert "0 evictions" not in line and "decoded again" in line
  assert big.steps == 8 and small.steps > big.steps


def test_replicas_per_prompt_under_the_engines_admission():
  assert step_terms.replicas_per_prompt(512, 16, 2048, 1) == 1.0
  assert step_terms.replicas_per_prompt(8, 16, 2048, 16) == 1.0    # all in the first fill
  # None in the first fill: R (1 − (1 − 1/R)^n); R = 2, n = 2: 1.5.
  assert step_terms.replicas_per_prompt(4, 2, 0, 2) == pytest.approx(1.5)
  # qwen32b: 128 of 512 prompts in the first fill of 2,048 slots, the rest on ~10.3 of 16.
  spread = 16 * (1 - (15 / 16) ** 16)
  assert step_terms.replicas_per_prompt(512, 16, 2048, 16) == pytest.approx(
      (128 + 384 * spread) / 512)
  assert math.isclose(spread, 10.30, abs_tol=0.01)


def test_row_buckets_halve_the_slots_per_replica_while_whole():
  def eng(slots, replicas, b):
    return step_model.EngineShape(slots=slots, page_size=16, kv_tokens=1 << 20, chunk_steps=8,
                                  replicas=replicas, decode_buckets=b)
  assert eng(48, 1, 4).row_buckets() == (48, 24, 12, 6)
  assert eng(48, 1, 1).row_buckets() == (48,)
  assert eng(48, 16, 4).row_buckets() == (3,)            # 3 / 2 is no whole row
  assert eng(2048, 16, 4).row_buckets() == (128, 64, 32, 16)
  assert eng(12, 1, 8).row_buckets() == (12, 6, 3)
  assert [rollout.bucket_rows(n, (8, 4, 2)) for n in (0, 1, 2, 3, 4, 5, 8, 9)] == [
      2, 2, 2, 4, 4, 8, 8, 8]


def _stepwise_rows(lens, slots, buckets):
  """Σ over decode steps of the rows run, one step at a time (FIFO admission, no pool)."""
  queue, left, total = list(lens), [], 0
  while queue or left:
    while queue and len(left) < slots:
      left.append(queue.pop(0))
    live = len(left)
    total += min((b for b in buckets if b >= live), default=buckets[0])
    left = [x - 1 for x in left if x > 1]
  return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucketed_decode_rows_match_a_step_by_step_count(seed):
  # Rows per step = the smallest bucket holding the live slots, else every slot: the event
  # simulation's intervals against one step at a time, on long-tailed lengths.
  rng = np.random.default_rng(seed)
  lens = np.maximum(1, rng.lognormal(3.0, 1.0, size=40).astype(int))
  for buckets in ((8,), (8, 4, 2, 1), (8, 4)):
    rep = _sim(lens, np.ones_like(lens), a_=0.0, per_row=1.0, max_live=8, cap=1e9,
               reserve=None, buckets=buckets)
    assert rep.cost == pytest.approx(_stepwise_rows(list(lens), 8, buckets))
    assert sum(rep.rows_steps.values()) == (rep.steps if len(buckets) > 1 else 0)
  # By hand: one response of 5 tokens and three of 1 in 4 slots: the first step runs 4 rows,
  # the next 4 steps 1 row each (buckets 4, 2, 1): 8 row-steps, against 20 at one shape.
  assert _sim([5, 1, 1, 1], [1] * 4, a_=0.0, per_row=1.0, max_live=4, cap=100.0,
              buckets=(4, 2, 1)).cost == 8.0
  assert _sim([5, 1, 1, 1], [1] * 4, a_=0.0, per_row=1.0, max_live=4, cap=100.0,
              buckets=(4,)).cost == 20.0


def test_the_built_rollout_runs_its_tail_on_smaller_buckets():
  st = _setup(host_chunk_ms=1.0)
  resp = np.array([64] + [4] * 7)
  prompts = np.full(8, 4)

  def run(b):
    eng = step_model.EngineShape(slots=8, page_size=4, kv_tokens=4096, chunk_steps=1,
                                 replicas=1, kernel="jax", overlap=False, decode_buckets=b)
    return step_model.continuous_rollout(st, resp, prompts, floor=False, engine=eng)

  one, four = run(1), run(4)
  assert one.steps == four.steps == 64
  assert four.terms["decode all-reduce bytes"] < one.terms["decode all-reduce bytes"]
  assert "by bucket: 8 rows 6%, 4 rows 0%, 2 rows 0%, 1 rows 94%" in four.note
  assert "by bucket" not in one.note
