"""The scheduler of the rollout engine: which response runs in which decode slot.

Pure Python; no jax. Responses are ids 0..B-1 (row b answers prompt b // n). The pending
queue is served in its given order; a free slot takes the next response whose first chunk
of pages fits the pool (`admit`). Before each decode chunk every running slot must hold
pages for the tokens that chunk can write (`reserve`); if the pool runs short, the most
recently admitted running responses are evicted (pages back, response to the front of the
queue, restarted from its prompt later). Eviction never changes a response: its tokens are
a function of its key, prompt and weights only (per-response PRNG), so the restart
regenerates them. The oldest running response is never evicted for a younger one, and the
pool holds at least one whole response, so the oldest always finishes: no starvation.

With replicas (`PagePool(groups=R)`) a slot takes pages of its own group only: admission
passes over the slots of a group that is short, and eviction, the oldest-first order and
the no-starvation argument hold within each group (each holds one whole response).

`chunk_rows` picks a decode chunk's rows: the smallest row bucket that holds every occupied
slot, padded with idle ones.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Iterable, Sequence

from vapo_jax.sampler import paged


@dataclasses.dataclass
class Running:
  """A response in a slot: its id, admission sequence number and tokens in its KV."""

  response: int
  seq: int
  kv_tokens: int
  cap_tokens: int  # prompt + max_new_tokens - 1: the most KV it ever holds


class Scheduler:
  """Slot assignment and page reservation over one `paged.PagePool`."""

  def __init__(self, pool: paged.PagePool, order: Iterable[int]):
    self.pool = pool
    self.pending = collections.deque(order)
    self.running: list[Running | None] = [None] * pool.slots
    self._seq = 0
    self.evictions = 0

  def free_slots(self) -> list[int]:
    return [s for s, r in enumerate(self.running) if r is None]

  def busy(self) -> int:
    return sum(r is not None for r in self.running)

  def done(self) -> bool:
    return not self.pending and not self.busy()

  def admit(self, prompt_tokens: Callable[[int], int], max_new: int, chunk: int
            ) -> list[tuple[int, int]]:
    """Fills free slots from the queue: [(slot, response)] in admission order.

    A response is admitted if pages for its prompt plus one chunk of tokens are free.
    """
    out = []
    full = set()  # groups (replicas) whose pages ran short for the queue's head
    for s in self.free_slots():
      if not self.pending:
        break
      if self.pool.group(s) in full:
        continue
      b = self.pending[0]
      plen = prompt_tokens(b)
      cap = plen + max_new - 1
      if not self.pool.grow(s, min(plen + chunk, cap)):
        full.add(self.pool.group(s))
        continue
      self.pending.popleft()
      self.running[s] = Running(b, self._seq, plen, cap)
      self._seq += 1
      out.append((s, b))
    return out

  def reserve(self, chunk: int) -> list[tuple[int, int]]:
    """Pages for the next chunk in every running slot, oldest first; evicts if short.

    Returns the evicted [(slot, response)].
    """
    evicted = []
    order = sorted((r.seq, s) for s, r in enumerate(self.running) if r is not None)
    oldest = {}  # per group (replica): its oldest running response's seq
    for seq, s in order:
      oldest.setdefault(self.pool.group(s), seq)
    for _, s in order:
      r = self.running[s]
      if r is None:  # evicted below for an older slot
        continue
      g = self.pool.group(s)
      want = min(r.kv_tokens + chunk, r.cap_tokens)
      while not self.pool.grow(s, want):
        victims = [(v.seq, t) for t, v in enumerate(self.running)
                   if v is not None and v.seq > r.seq and self.pool.group(t) == g]
        # The youngest younger response of the group gives way; with none, this one does
        # (an older one holds the pages). The group's oldest always has a younger one or
        # the group's whole pool.
        victim = max(victims)[1] if victims else s
        if victim == s and r.seq == oldest[g]:
          raise RuntimeError("the KV pool cannot hold one response; "
                             "config validation should have caught this")
        evicted.append((victim, self.running[victim].response))
        self.pending.appendleft(self.running[victim].response)
        self.pool.release(victim)
        self.running[victim] = None
        self.evictions += 1
        if victim == s:
          break
    return evicted

  def advance(self, slot: int, new_tokens: int, finished: bool) -> None:
    """Records a chunk's result for a slot; a finished response frees it and its pages."""
    r = self.running[slot]
    r.kv_tokens += new_tokens
    if finished:
      self.pool.release(slot)
      self.running[slot] = None


def chunk_rows(occupied: Sequence[bool], replicas: int, buckets: Sequence[int]
               ) -> list[int]:
  """The slots a decode chunk runs (`continuous.decode_chunk`'s rows_Sb).

  occupied: per slot (S of them), whether the host holds a response in it (admitted, not
  yet seen freed): a superset of the slots active on the device, which the host sees one
  chunk late. buckets: the bucket sizes in rows, largest (S) first, each a multiple of
  `replicas`. Returns the smallest bucket's rows whose Sb/R rows per replica hold the most
  occupied slots of any replica: per replica block (slots r S/R .. (r+1) S/R - 1, in
  replica order) its occupied slots and then its lowest idle ones, ascending. The full
  bucket is every slot in order.
  """
  per = len(occupied) // replicas
  blocks = [range(r * per, (r + 1) * per) for r in range(replicas)]
  need = max(sum(bool(occupied[i]) for i in block) for block in blocks)
  fits = [b for b in buckets if b // replicas >= need]
  take = min(fits) // replicas if fits else per
  rows = []
  for block in blocks:
    busy = [i for i in block if occupied[i]]
    idle = [i for i in block if not occupied[i]]
    rows += sorted(busy + idle[:take - len(busy)])
  return rows
