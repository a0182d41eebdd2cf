"""The host side of the paged KV pool: a free list of pages and one page row per slot.

Pure Python + numpy; no jax. Page ids are 0..N-1; `NO_PAGE(N)` = N marks an empty table
entry (writes to it are dropped, reads of it masked; `models.paged_attention`).

A slot's pages cover its token positions in order: position p lives on its page p // Ps.
`grow(slot, tokens)` makes the slot hold ceil(tokens / Ps) pages; `release(slot)` gives all
of them back. Pages are handed out lowest id first, so a run is deterministic.

Replicas (`groups` = R > 1, the engine's decode replicas on a mesh): slots and pages split
into R equal groups, slot s in group s // (S / R), and a slot takes pages of its own group
only. Page ids in `table()` are then local to the group (0..N/R - 1, NO_PAGE = N/R), which
is how each replica's shard of the device pool indexes them; `global_row` maps a row back
to ids of the whole pool.
"""

from __future__ import annotations

import heapq

import numpy as np


def pages_for(tokens: int, page_size: int) -> int:
  """ceil(tokens / page_size)."""
  return -(-int(tokens) // page_size)


class PagePool:
  """N pages of `page_size` tokens shared by `slots` decode slots of `max_pages` pages each,
  in `groups` equal groups of slots and pages (a slot takes pages of its own group only)."""

  def __init__(self, num_pages: int, page_size: int, slots: int, max_pages: int,
               groups: int = 1):
    if (num_pages < 1 or page_size < 1 or slots < 1 or max_pages < 1 or groups < 1):
      raise ValueError(f"PagePool needs positive sizes, got num_pages={num_pages}, "
                       f"page_size={page_size}, slots={slots}, max_pages={max_pages}, "
                       f"groups={groups}")
    if slots % groups or num_pages % groups:
      raise ValueError(f"PagePool: groups={groups} must divide slots={slots} and "
                       f"num_pages={num_pages}")
    self.num_pages, self.page_size = num_pages, page_size
    self.slots, self.max_pages, self.groups = slots, max_pages, groups
    self.group_pages = num_pages // groups
    self.group_slots = slots // groups
    self._free = [list(range(self.group_pages)) for _ in range(groups)]
    for heap in self._free:
      heapq.heapify(heap)
    self._owned: list[list[int]] = [[] for _ in range(slots)]

  def group(self, slot: int) -> int:
    return slot // self.group_slots

  @property
  def free(self) -> int:
    return sum(len(h) for h in self._free)

  @property
  def used(self) -> int:
    return self.num_pages - self.free

  def held(self, slot: int) -> int:
    return len(self._owned[slot])

  def shortfall(self, slot: int, tokens: int) -> int:
    """Pages slot still needs to hold `tokens` tokens (0 if it has them)."""
    return max(0, min(pages_for(tokens, self.page_size), self.max_pages) - self.held(slot))

  def grow(self, slot: int, tokens: int) -> bool:
    """Gives slot pages up to `tokens` tokens; False (and nothing taken) if too few free
    in its group."""
    need = self.shortfall(slot, tokens)
    heap = self._free[self.group(slot)]
    if need > len(heap):
      return False
    self._owned[slot] += [heapq.heappop(heap) for _ in range(need)]
    return True

  def release(self, slot: int) -> None:
    heap = self._free[self.group(slot)]
    for page in self._owned[slot]:
      heapq.heappush(heap, page)
    self._owned[slot] = []

  def row(self, slot: int) -> np.ndarray:
    """int32 [max_pages]: `table()[slot]` without building the whole table."""
    out = np.full(self.max_pages, self.group_pages, np.int32)
    out[:len(self._owned[slot])] = self._owned[slot]
    return out

  def table(self) -> np.ndarray:
    """int32 [slots, max_pages]: each slot's pages in order (ids local to its group),
    NO_PAGE (= N / groups) after them."""
    out = np.full((self.slots, self.max_pages), self.group_pages, np.int32)
    for s, pages in enumerate(self._owned):
      out[s, :len(pages)] = pages
    return out

  def global_row(self, slot: int, row: np.ndarray) -> np.ndarray:
    """A slot's table row as ids of the whole pool (group g's page i is g N/R + i),
    NO_PAGE (= N) where the row has none."""
    row = np.asarray(row, np.int32)
    base = self.group(slot) * self.group_pages
    return np.where(row < self.group_pages, row + base, self.num_pages).astype(np.int32)
