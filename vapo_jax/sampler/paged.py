"""The host side of the paged KV pool: a free list of pages and one page row per slot.

Pure Python + numpy; no jax. Page ids are 0..N-1; `NO_PAGE(N)` = N marks an empty table
entry (writes to it are dropped, reads of it masked; `models.paged_attention`).

A slot's pages cover its token positions in order: position p lives on its page p // Ps.
`grow(slot, tokens)` makes the slot hold ceil(tokens / Ps) pages; `release(slot)` gives all
of them back. Pages are handed out lowest id first, so a run is deterministic.
"""

from __future__ import annotations

import heapq

import numpy as np


def pages_for(tokens: int, page_size: int) -> int:
  """ceil(tokens / page_size)."""
  return -(-int(tokens) // page_size)


class PagePool:
  """N pages of `page_size` tokens shared by `slots` decode slots of `max_pages` pages each."""

  def __init__(self, num_pages: int, page_size: int, slots: int, max_pages: int):
    if num_pages < 1 or page_size < 1 or slots < 1 or max_pages < 1:
      raise ValueError(f"PagePool needs positive sizes, got num_pages={num_pages}, "
                       f"page_size={page_size}, slots={slots}, max_pages={max_pages}")
    self.num_pages, self.page_size = num_pages, page_size
    self.slots, self.max_pages = slots, max_pages
    self._free = list(range(num_pages))
    heapq.heapify(self._free)
    self._owned: list[list[int]] = [[] for _ in range(slots)]

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def used(self) -> int:
    return self.num_pages - len(self._free)

  def held(self, slot: int) -> int:
    return len(self._owned[slot])

  def shortfall(self, slot: int, tokens: int) -> int:
    """Pages slot still needs to hold `tokens` tokens (0 if it has them)."""
    return max(0, min(pages_for(tokens, self.page_size), self.max_pages) - self.held(slot))

  def grow(self, slot: int, tokens: int) -> bool:
    """Gives slot pages up to `tokens` tokens; False (and nothing taken) if too few free."""
    need = self.shortfall(slot, tokens)
    if need > len(self._free):
      return False
    self._owned[slot] += [heapq.heappop(self._free) for _ in range(need)]
    return True

  def release(self, slot: int) -> None:
    for page in self._owned[slot]:
      heapq.heappush(self._free, page)
    self._owned[slot] = []

  def table(self) -> np.ndarray:
    """int32 [slots, max_pages]: each slot's pages in order, NO_PAGE (= N) after them."""
    out = np.full((self.slots, self.max_pages), self.num_pages, np.int32)
    for s, pages in enumerate(self._owned):
      out[s, :len(pages)] = pages
    return out
