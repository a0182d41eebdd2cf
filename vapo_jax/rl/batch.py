"""The rollout batch every train step takes, and how its rows are placed and split.

Shapes: B rows (responses), P prompt columns (left-padded), R response columns, L = P + R.
"""

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


# The batch every train step takes: key -> (shape in B, L = P + R, R; dtype).
BATCH_SPEC = {"tokens_BxL": (("B", "L"), jnp.int32), "mask_BxL": (("B", "L"), jnp.float32),
              "old_logp_BxR": (("B", "R"), jnp.float32),
              "advantages_BxR": (("B", "R"), jnp.float32),
              "returns_BxR": (("B", "R"), jnp.float32),
              "old_values_BxR": (("B", "R"), jnp.float32),
              "response_mask_BxR": (("B", "R"), jnp.float32), "scores_B": (("B",), jnp.float32)}
# With GRPO's KL penalty (rl.kl_coef > 0) the batch also holds the reference's log-probs.
REF_SPEC = {"ref_logp_BxR": (("B", "R"), jnp.float32)}


def batch_shapes(rows: int, prompt_len: int, response_len: int, *,
                 reference: bool = False) -> dict[str, tuple]:
  """{key: (shape, dtype)} of a train-step batch of `rows` rows (BATCH_SPEC, and REF_SPEC
  with `reference`)."""
  dims = {"B": rows, "L": prompt_len + response_len, "R": response_len}
  spec = {**BATCH_SPEC, **REF_SPEC} if reference else BATCH_SPEC
  return {k: (tuple(dims[d] for d in axes), dtype) for k, (axes, dtype) in spec.items()}

