"""The rollout batch every train step takes, and how its rows are placed and split.

Shapes: B rows (responses), P prompt columns (left-padded), R response columns, L = P + R.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def micro_split(batch: Any, n: int):
  """[B, ...] -> [n, B/n, ...] with micro-batch i = rows i, i + n, i + 2n, …"""

  def split(x):
    b = x.shape[0]
    if b % n:
      raise ValueError(f"batch of {b} rows does not split into {n} micro-batches")
    return jnp.swapaxes(x.reshape((b // n, n) + x.shape[1:]), 0, 1)

  return jax.tree.map(split, batch)


def batch_sharding(mesh, batch_axes) -> NamedSharding:
  """Rows split over the mesh's batch axes; everything else replicated."""
  return NamedSharding(mesh, PartitionSpec(batch_axes or None))


def shard_batch(batch: Any, mesh, batch_axes) -> Any:
  """Puts a global batch (the same on every host) on the mesh, rows split over the batch axes.

  Each process copies only the slices its own devices hold, so the result, and the training
  step that consumes it, are the same for any number of processes.
  """
  sh = batch_sharding(mesh, batch_axes)
  return jax.tree.map(
      lambda v: jax.make_array_from_callback(np.shape(v), sh,
                                             lambda idx, v=np.asarray(v): v[idx]), batch)


def _field(axes: tuple[str, ...], dtype, doc: str):
  return dataclasses.field(default=None, metadata={"axes": axes, "dtype": dtype, "doc": doc})


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutBatch:
  """The batch every train step takes, [B, ...] arrays (a pytree: None fields hold no leaf).

  Which fields a batch holds depends on who made it: a rollout (`rl.experience`) fills all
  but `ref_logp_BxR`, which comes with GRPO's KL penalty (rl.kl_coef > 0); the reward-model
  stage's batch holds tokens_BxL, mask_BxL, response_mask_BxR and scores_B; SFT's the first
  three. The fields are in alphabetical order, the leaf order of the dict this type
  replaced, so the compiled programs' arguments did not change with it.
  """
  advantages_BxR: jax.Array | None = _field(("B", "R"), jnp.float32, "A_t (step 3)")
  mask_BxL: jax.Array | None = _field(("B", "L"), jnp.float32, "1 on real prompt+response")
  old_logp_BxR: jax.Array | None = _field(("B", "R"), jnp.float32, "log π_old of the tokens")
  old_values_BxR: jax.Array | None = _field(("B", "R"), jnp.float32,
                                            "V_old(s_t) (zeros without a critic)")
  ref_logp_BxR: jax.Array | None = _field(("B", "R"), jnp.float32,
                                          "log π_ref (with the KL penalty only)")
  response_mask_BxR: jax.Array | None = _field(("B", "R"), jnp.float32,
                                               "1 on real response tokens")
  returns_BxR: jax.Array | None = _field(("B", "R"), jnp.float32, "the critic's targets")
  scores_B: jax.Array | None = _field(("B",), jnp.float32, "the checker's score")
  tokens_BxL: jax.Array | None = _field(("B", "L"), jnp.int32,
                                        "prompt (left-padded) + response ids")

  @property
  def prompt_len(self) -> int:
    """P = L − R (static: from the shapes)."""
    return self.tokens_BxL.shape[1] - self.response_mask_BxR.shape[1]

  @property
  def rows(self) -> int:
    return self.tokens_BxL.shape[0]


# The fields a rollout batch holds (RolloutBatch's docstring); REFERENCE with the KL penalty.
ROLLOUT = ("advantages_BxR", "mask_BxL", "old_logp_BxR", "old_values_BxR",
           "response_mask_BxR", "returns_BxR", "scores_B", "tokens_BxL")
REFERENCE = ("ref_logp_BxR",)


def abstract(rows: int, prompt_len: int, response_len: int, sharding=None, *,
             reference: bool = False) -> RolloutBatch:
  """A rollout batch of `rows` rows as `jax.ShapeDtypeStruct`s (the compile check's), from
  RolloutBatch's own field shapes and dtypes."""
  dims = {"B": rows, "L": prompt_len + response_len, "R": response_len}
  names = ROLLOUT + REFERENCE * reference
  fields = {f.name: f for f in dataclasses.fields(RolloutBatch)}
  return RolloutBatch(**{
      n: jax.ShapeDtypeStruct(tuple(dims[d] for d in fields[n].metadata["axes"]),
                              fields[n].metadata["dtype"], sharding=sharding) for n in names})
