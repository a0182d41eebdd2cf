"""A deterministic, shuffled, resumable iterator over epochs, sharded by host.

Epoch `e` visits the examples in the order `permutation(seed, e)` (the same
on every host); host `p` of `P` takes positions `p, p + P, p + 2P, ...` of
that order, so hosts' shares are disjoint and together cover the epoch.
With `drop_remainder=True`, the order is first cut to a multiple of
`P * batch_size` so every host yields the same number of full batches (hosts
step in lockstep); with `False` nothing is dropped and the last batch of an
epoch may be short.

The state is `{"epoch", "position", "seed", ...}`: plain ints that go into a
training checkpoint as JSON; restoring it continues with exactly the batch
that would have come next.
"""

from typing import Any, Sequence

import numpy as np

from vapo_jax.data import sources


class PromptIterator:
  """Yields per-host batches (lists of `Example`) forever or for N epochs."""

  def __init__(self, examples: Sequence[sources.Example], batch_size: int,
               seed: int = 0, shuffle: bool = True, process_index: int = 0,
               process_count: int = 1, drop_remainder: bool = True,
               num_epochs: int | None = None):
    """Creates the iterator at epoch 0, position 0.

    Args:
      examples: the whole dataset (every host passes the same list).
      batch_size: examples per batch on this host.
      seed: shuffling seed; epochs use `(seed, epoch)`.
      shuffle: False keeps the file order in every epoch.
      process_index: this host's index (`jax.process_index()`).
      process_count: number of hosts (`jax.process_count()`).
      drop_remainder: cut each epoch so all batches are full and all hosts
        get the same number of them.
      num_epochs: stop after this many epochs (None: never stop).
    """
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in "
                       f"[0, {process_count})")
    self._examples = list(examples)
    self.batch_size = batch_size
    self.seed = int(seed)
    self.shuffle = shuffle
    self.process_index = process_index
    self.process_count = process_count
    self.drop_remainder = drop_remainder
    self.num_epochs = num_epochs
    if drop_remainder and len(self._examples) < batch_size * process_count:
      raise ValueError(f"{len(self._examples)} examples are fewer than one "
                       f"batch of {batch_size} on each of {process_count} hosts")
    if not self._examples:
      raise ValueError("no examples")
    self.epoch = 0
    self.position = 0  # Index into this host's share of the current epoch.
    self._share_epoch = None
    self._share = None

  # -- order ----------------------------------------------------------------
  def epoch_order(self, epoch: int) -> np.ndarray:
    """All example indices of `epoch` in visiting order (every host)."""
    n = len(self._examples)
    if not self.shuffle:
      order = np.arange(n)
    else:
      order = np.random.default_rng([self.seed, epoch]).permutation(n)
    if self.drop_remainder:
      order = order[:n - n % (self.batch_size * self.process_count)]
    return order

  def host_indices(self, epoch: int) -> np.ndarray:
    """This host's share of `epoch`, in visiting order."""
    if self._share_epoch != epoch:
      self._share = self.epoch_order(epoch)[self.process_index::self.process_count]
      self._share_epoch = epoch
    return self._share

  @property
  def batches_per_epoch(self) -> int:
    n = len(self.host_indices(self.epoch))
    return -(-n // self.batch_size)

  # -- iteration ------------------------------------------------------------
  def __iter__(self):
    return self

  def __next__(self) -> list[sources.Example]:
    share = self.host_indices(self.epoch)
    if self.position >= len(share):
      self.epoch += 1
      self.position = 0
      share = self.host_indices(self.epoch)
    if self.num_epochs is not None and self.epoch >= self.num_epochs:
      raise StopIteration
    idx = share[self.position:self.position + self.batch_size]
    self.position += len(idx)
    return [self._examples[i] for i in idx]

  # -- checkpointing --------------------------------------------------------
  def get_state(self) -> dict[str, Any]:
    """A JSON-serialisable state for the training checkpoint."""
    return {"epoch": int(self.epoch), "position": int(self.position),
            "seed": self.seed, "num_examples": len(self._examples),
            "batch_size": self.batch_size, "process_count": self.process_count,
            "shuffle": self.shuffle, "drop_remainder": self.drop_remainder}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues from `state`; the data and sharding must be the same.

    Raises:
      ValueError: the state was saved for different data or settings.
    """
    mine = self.get_state()
    for key in ("seed", "num_examples", "batch_size", "process_count",
                "shuffle", "drop_remainder"):
      if key in state and state[key] != mine[key]:
        raise ValueError(f"iterator state has {key}={state[key]!r} but this "
                         f"iterator has {mine[key]!r}")
    self.epoch = int(state["epoch"])
    self.position = int(state["position"])

  @classmethod
  def from_state(cls, examples, state: dict[str, Any], process_index: int = 0,
                 num_epochs: int | None = None) -> "PromptIterator":
    it = cls(examples, state["batch_size"], seed=state["seed"],
             shuffle=state.get("shuffle", True), process_index=process_index,
             process_count=state.get("process_count", 1),
             drop_remainder=state.get("drop_remainder", True),
             num_epochs=num_epochs)
    it.set_state(state)
    return it
