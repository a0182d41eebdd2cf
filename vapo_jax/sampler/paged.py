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

The table is kept, not rebuilt: `grow` and `release` write the entries they change and mark
them, and `changes()` hands out the marked entries once (about one per running slot per
chunk), so the engine updates its device copy with those alone instead of uploading all
S × M entries every chunk.
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
    self._table = np.full((slots, max_pages), self.group_pages, np.int32)
    self._dirty: dict[int, tuple[int, int]] = {}  # slot -> columns [lo, hi) changed

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
    if need:
      held = len(self._owned[slot])
      self._owned[slot] += [heapq.heappop(heap) for _ in range(need)]
      self._table[slot, held:held + need] = self._owned[slot][held:]
      self._mark(slot, held, held + need)
    return True

  def release(self, slot: int) -> None:
    heap = self._free[self.group(slot)]
    for page in self._owned[slot]:
      heapq.heappush(heap, page)
    if self._owned[slot]:
      self._table[slot, :len(self._owned[slot])] = self.group_pages
      self._mark(slot, 0, len(self._owned[slot]))
    self._owned[slot] = []

  def row(self, slot: int) -> np.ndarray:
    """int32 [max_pages]: `table()[slot]` without building the whole table."""
    return self._table[slot].copy()

  def table(self) -> np.ndarray:
    """int32 [slots, max_pages]: each slot's pages in order (ids local to its group),
    NO_PAGE (= N / groups) after them."""
    return self._table.copy()

  def _mark(self, slot: int, lo: int, hi: int) -> None:
    # A slot's changes since the last `changes()` are one run of columns: a release covers
    # [0, held) and a grow [held, held + need), which starts where the last one ended.
    old = self._dirty.get(slot)
    self._dirty[slot] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

  def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot_E, column_E, page_E), int32: every table entry written since the last call,
    each once, with its value now; then forgets them. Set into the table as it was at the
    last call (`table[slot_E, column_E] = page_E`), they give `table()`."""
    if not self._dirty:
      empty = np.zeros(0, np.int32)
      return empty, empty, empty
    slots = sorted(self._dirty)
    cols = [np.arange(*self._dirty[s], dtype=np.int32) for s in slots]
    rows = np.repeat(np.asarray(slots, np.int32), [len(c) for c in cols])
    cols = np.concatenate(cols)
    self._dirty.clear()
    return rows, cols, self._table[rows, cols]

  def global_row(self, slot: int, row: np.ndarray) -> np.ndarray:
    """A slot's table row as ids of the whole pool (group g's page i is g N/R + i),
    NO_PAGE (= N) where the row has none."""
    row = np.asarray(row, np.int32)
    base = self.group(slot) * self.group_pages
    return np.where(row < self.group_pages, row + base, self.num_pages).astype(np.int32)


def padded_changes(slot_E, column_E, page_E, slots: int, min_width: int = 64
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`PagePool.changes()` padded to W = the power of two >= E (at least `min_width`), so
  that a few scatter programs serve every chunk: slot `slots` (out of range: dropped by a
  scatter with mode="drop"), column and page 0 on the padding."""
  e = len(slot_E)
  width = max(min_width, 1 << max(e - 1, 0).bit_length())
  out = (np.full(width, slots, np.int32), np.zeros(width, np.int32), np.zeros(width, np.int32))
  for o, x in zip(out, (slot_E, column_E, page_E)):
    o[:e] = x
  return out
