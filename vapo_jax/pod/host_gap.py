"""The rollout engine's host work between decode chunks, timed on this CPU (no device).

The engine's host loop (`sampler.continuous.Engine.__call__`) runs, between two decode
chunks (with `EngineConfig.overlap`, while the next chunk decodes; without it, with the chips
idle):

  1. admit: free slots take pending responses (`slots.Scheduler.admit`);
  2. reserve: pages for one chunk in every running slot (`Scheduler.reserve`), two chunks
     ahead with overlap;
  3. the page table: the entries that changed (`paged.PagePool.changes()`, padded by
     `paged.padded_changes`); the engine sends only those to its device copy (until
     2026-12-04 it rebuilt and uploaded the whole S × M table every chunk);
  4. the slot loop: per slot, its chunk's tokens and log-probs appended with `.tolist()` and
     `Scheduler.advance`.

`measure_chunk` replays exactly these calls, with the engine's own classes at the engine's
sizes, on a pool in steady state (every busy slot holding `live_tokens`, `finishing` responses
ending and as many admitted per chunk), and returns the median seconds per chunk. Not in it:
the changed entries' upload (`make_array_from_callback`, replicated) and their scatter, the
dispatch of the chunk, its `device_get`, the `insert` and `prefill` dispatches of admitted
responses (device work, no CPU to time here). The step model scales it by the chunk count
(`gap_seconds`):

  gap = ⌈decode steps / chunk_steps⌉ · seconds per chunk                  (no overlap)
  exposed = chunks · max(0, seconds per chunk − device seconds per chunk)   (overlap)

(early exits of a chunk only add chunks, so this is a lower bound of the chunk count.)
It is timed as the calling thread's CPU time on whatever CPU runs it (a loaded machine inflates
wall time far more): a modelled term, not a result.
"""

from __future__ import annotations

import functools
import math
import statistics
import time

import numpy as np


def exposed_seconds(per_chunk_s: float, device_chunk_s: float, chunks: int) -> float:
  """Host time the chips wait for when chunk i+1 decodes while the host reads chunk i:
  chunks · max(0, host − device) per chunk."""
  return chunks * max(0.0, per_chunk_s - device_chunk_s)


def gap_seconds(per_chunk_s: float, decode_steps: int, chunk_steps: int) -> float:
  """Host time of a rollout: ⌈decode_steps / chunk_steps⌉ chunks × per_chunk_s."""
  if decode_steps <= 0:
    return 0.0
  return math.ceil(decode_steps / max(1, chunk_steps)) * per_chunk_s


@functools.lru_cache(maxsize=32)
def measure_chunk(slots: int, page_size: int, max_pages: int, num_pages: int,
                  replicas: int = 1, chunk_steps: int = 16, live_tokens: int = 1024,
                  prompt_tokens: int = 256, finishing: int = 0, chunks: int = 8,
                  clock=time.thread_time, overlap: bool = True) -> float:
  """Median seconds of the engine's host work per chunk (steps 1-4 of the module docstring).

  slots S, page_size, max_pages M (pages of one whole response), num_pages N (all replicas),
  replicas R: as `continuous.EngineConfig`. Every slot starts busy with `live_tokens` KV
  tokens (fewer slots if the pool is short, as in the engine); each chunk, `finishing`
  responses end and as many are admitted (prompt_tokens each). clock: the timer (tests pass
  a fake one; default: this thread's CPU time, which load inflates less than wall time).
  overlap: reserve two chunks ahead, as the overlapped engine does.
  """
  from vapo_jax.sampler import paged  # pylint: disable=import-outside-toplevel
  from vapo_jax.sampler import slots as slots_lib  # pylint: disable=import-outside-toplevel
  num_pages -= num_pages % replicas
  pool = paged.PagePool(num_pages, page_size, slots, max_pages, groups=replicas)
  pending = slots * (chunks + 3) + finishing * (chunks + 3)
  sched = slots_lib.Scheduler(pool, range(pending))
  cap = prompt_tokens + max_pages * page_size  # never the binding limit here
  sched.admit(lambda b: prompt_tokens, cap, chunk_steps)
  for s, run in enumerate(sched.running):  # steady state: each slot holds live_tokens
    if run is not None and pool.grow(s, live_tokens):
      run.kv_tokens = live_tokens
  k = chunk_steps
  toks = np.zeros((slots, k), np.int32)
  lps = np.zeros((slots, k), np.float32)
  cur_tok = {r.response: [] for r in sched.running if r is not None}
  cur_lp = {b: [] for b in cur_tok}
  times = []
  nxt = 0
  for c in range(chunks + 1):   # chunk 0 warms up, untimed
    t0 = clock() if c else 0.0
    for _, b in sched.admit(lambda b: prompt_tokens, cap, chunk_steps):
      cur_tok[b], cur_lp[b] = [], []
    sched.reserve((2 if overlap else 1) * chunk_steps)
    table = paged.padded_changes(*pool.changes(), slots)
    busy = sched.busy()
    ended = 0
    for slot in range(slots):
      run = sched.running[slot]
      if run is None:
        continue
      b = run.response
      cur_tok[b] += toks[slot, :k].tolist()
      cur_lp[b] += lps[slot, :k].tolist()
      finished = ended < finishing and (slot - nxt) % max(1, busy // max(1, finishing)) == 0
      sched.advance(slot, k, finished)
      if finished:
        ended += 1
        cur_tok.pop(b)
        cur_lp.pop(b)
    nxt += 1
    if c:
      times.append(clock() - t0)
    del table
  return statistics.median(times)
