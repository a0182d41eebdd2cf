"""How big the rollout engine's KV pool is: a token budget from the memory the train state leaves.

Per chip, for an engine of S slots, pages of Ps tokens and responses of at most
W = max_prompt_len + max_new_tokens - 1 KV tokens (M = ceil(W / Ps) pages per slot):

  free   = (1 - headroom) HBM - resident        resident: what stays in HBM while the engine
                                                runs (both TrainStates, the reference policy,
                                                the rollout batch, the decode copy)
  tokens = Ps floor(free / (Ps b))              b: KV bytes per token per chip (L layers x
                                                2K heads x Dh x itemsize / the kv_heads shards)
  tokens = min(tokens, S M Ps)                  no slot ever holds more than M pages: more
                                                pages could never be used
  tokens >= M Ps                                one whole response, else a ValueError before
                                                any compile (the scheduler evicts the youngest
                                                response when pages run short, so one response
                                                is the least that always finishes)

Decode replicas (R = the mesh's batch shards, `EngineConfig.replicas`): a chip holds one
replica's part of the pool, so the figures above are per replica, with S / R slots in the
cap, and the pool has R times as many pages in all.

The headroom is for the engine programs' temporaries (the decode step's activations and
[S, V] logits, one prompt's prefill cache); the compile check measures them and says whether
resident + pool + temporaries fit. Without an HBM figure (CPU, or a device that reports none)
the pool is the cap S M Ps, as many tokens as the static sampler's cache. An explicit
`sampling.kv_tokens` wins over all of this (whole pages, and still at least one response).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from vapo_jax import sharding as shd
from vapo_jax.sampler import paged

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-chip memory the pool is sized from (bytes)."""
  hbm: float | None          # HBM per chip; None: unknown (CPU)
  resident: float = 0.0      # held while the engine runs, besides its pool
  headroom: float = 0.1      # fraction of HBM kept for the programs' temporaries


@dataclasses.dataclass(frozen=True)
class Pool:
  """A sized KV pool (per chip where it says so)."""
  tokens: int                # num_pages x page_size
  num_pages: int
  page_size: int
  slots: int
  token_bytes: float         # KV bytes per token per chip
  limited_by: str            # "memory", "slots" (the cap S M Ps), "explicit" or "no HBM figure"
  free_bytes: float | None = None  # (1 - headroom) HBM - resident; None without HBM
  replicas: int = 1          # decode replicas; a chip holds tokens / replicas of the pool

  @property
  def bytes_per_chip(self) -> float:
    return self.tokens / self.replicas * self.token_bytes

  def describe(self) -> str:
    free = "" if self.free_bytes is None else f" of {fmt_bytes(self.free_bytes)} free"
    reps = "" if self.replicas == 1 else (
        f" in {self.replicas} replicas of {self.num_pages // self.replicas} pages")
    return (f"{self.num_pages} pages x {self.page_size} = {self.tokens} tokens{reps} "
            f"({self.tokens / self.slots:.0f} per slot over {self.slots} slots), "
            f"{fmt_bytes(self.bytes_per_chip)}/chip{free}; sized by {self.limited_by}")


def fmt_bytes(x: float) -> str:
  return f"{x / GB:.2f} GB" if abs(x) >= 0.1 * GB else f"{x / 1e6:.2f} MB"


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a pytree of (sharded) arrays or ShapeDtypeStructs."""
  total = 0
  for x in jax.tree.leaves(tree):
    sh = getattr(x, "sharding", None)
    shape = sh.shard_shape(x.shape) if sh is not None else x.shape
    total += int(np.prod(shape)) * np.dtype(x.dtype).itemsize
  return total


def token_bytes(model_cfg, dtype: Any, mesh=None, rules: shd.Rules = shd.DEFAULT_RULES
                ) -> float:
  """KV bytes per token per chip of the engine's pool ([N, Ps, 2K, Dh] per layer, the
  combined kv_heads axis split like the engine splits it)."""
  c = model_cfg
  per = c.num_layers * 2 * c.num_kv_heads * c.head_dim * np.dtype(dtype).itemsize
  if mesh is None:
    return float(per)
  spec = shd.logical_to_spec((None, None, "kv_heads", "head_dim"), rules, mesh,
                             (1, 1, 2 * c.num_kv_heads, c.head_dim))
  shards = 1
  for axes in spec:
    for a in ((axes,) if isinstance(axes, str) else tuple(axes or ())):
      shards *= mesh.shape[a]
  return per / shards


def size(*, slots: int, page_size: int, whole_tokens: int, token_bytes_: float,
         memory: Memory | None = None, explicit: int = 0, replicas: int = 1) -> Pool:
  """The pool of an engine (see the module docstring); ValueError if it (each replica's
  part, with `replicas` > 1) cannot hold one response of `whole_tokens` KV tokens.
  `explicit` is the whole pool's tokens, split evenly over the replicas."""
  if replicas < 1 or slots % replicas:
    raise ValueError(f"replicas={replicas} must divide slots={slots}")
  max_pages = paged.pages_for(whole_tokens, page_size)
  cap = slots // replicas * max_pages  # per replica
  free = None
  if explicit:
    pages = paged.pages_for(paged.pages_for(explicit, page_size), replicas)
    why = "explicit"
  elif memory is None or memory.hbm is None:
    pages, why = cap, "no HBM figure"
  else:
    free = (1.0 - memory.headroom) * memory.hbm - memory.resident
    fit = int(max(free, 0.0) // (page_size * token_bytes_))
    pages, why = (fit, "memory") if fit < cap else (cap, "slots")
  total = pages * replicas
  pool = Pool(total * page_size, total, page_size, slots, token_bytes_, why, free, replicas)
  if pages < max_pages:
    if why == "explicit":
      per = "" if replicas == 1 else f" per replica of {replicas}"
      raise ValueError(
          f"sampling.kv_tokens={explicit} holds {pages} pages{per} of {page_size} tokens, "
          f"fewer than one whole response needs ({whole_tokens} tokens, {max_pages} pages)")
    raise ValueError(
        f"the KV pool gets only {pages} pages of {page_size} tokens "
        f"({(free or 0) / GB:.2f} GB free per chip: (1 - {memory.headroom}) x "
        f"{memory.hbm / GB:.1f} GB HBM less {memory.resident / GB:.2f} GB resident train "
        f"state and decode copy, at {token_bytes_ / 1e3:.1f} kB per token), fewer than one "
        f"whole response needs ({whole_tokens} tokens, {max_pages} pages). Use more chips, "
        "more tensor sharding, shorter data.max_prompt_tokens / sampling.max_new_tokens, "
        "or a smaller sampling.kv_headroom")
  return pool
