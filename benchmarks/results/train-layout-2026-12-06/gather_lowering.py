"""How XLA lowers an FSDP weight gather for a v5p-128 slice (AOT on a CPU with libtpu).

Four matmul layers, weights [L, D, F] fp32 sharded over `fsdp`, rows over `fsdp`, each
layer's weight cast to bf16 and constrained to its compute layout; the gradient program
compiled for v5p-128 and its collectives counted by kind. "full": gathered to replicated
(FSDP over every chip); "subgroup": gathered over fsdp but kept split over `tensor`
(FSDP × TP). Run: PYTHONPATH=. python benchmarks/results/train-layout-2026-12-06/gather_lowering.py
"""
import collections
import re

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from vapo_jax.pod import slices

DEVICES = np.array(slices.devices(slices.parse("v5p-128")))
D, F, T, L = 1024, 4096, 2048, 4
KINDS = r" (all-gather-start|all-gather|all-reduce-start|all-reduce|reduce-scatter|" \
        r"collective-permute-start|all-to-all)\("


def kinds(shape, w_spec, use_spec, explicit=False):
  mesh = Mesh(DEVICES.reshape(shape), ("data", "fsdp", "tensor"))

  def gather(w):
    if explicit:   # jax.lax.all_gather in shard_map, not a sharding constraint
      return jax.shard_map(lambda a: jax.lax.all_gather(a, "fsdp", axis=0, tiled=True),
                           mesh=mesh, in_specs=P("fsdp", None), out_specs=P(None, None),
                           check_vma=False)(w)
    return jax.lax.with_sharding_constraint(w, NamedSharding(mesh, use_spec))

  def loss(w, x):
    for i in range(L):
      wi = gather(w[i].astype(jnp.bfloat16))
      x = jnp.tanh(x @ wi) @ wi.T
    return jnp.sum(x.astype(jnp.float32))
  aw = jax.ShapeDtypeStruct((L, D, F), jnp.float32, sharding=NamedSharding(mesh, w_spec))
  ax = jax.ShapeDtypeStruct((64 * T, D), jnp.bfloat16,
                            sharding=NamedSharding(mesh, P("fsdp", None)))
  text = jax.jit(jax.grad(loss)).lower(aw, ax).compile().as_text()
  return dict(collections.Counter(re.findall(KINDS, text)))


if __name__ == "__main__":
  print("jax", jax.__version__)
  print("full gather, mesh 1x64x1:          ",
        kinds((1, 64, 1), P(None, "fsdp", None), P(None, None)))
  print("full gather, explicit all_gather:  ",
        kinds((1, 64, 1), P(None, "fsdp", None), None, explicit=True))
  print("full gather, weight split on F:    ",
        kinds((1, 64, 1), P(None, None, "fsdp"), P(None, None)))
  print("subgroup gather, mesh 1x32x2:      ",
        kinds((1, 32, 2), P(None, "fsdp", "tensor"), P(None, "tensor")))
  print("subgroup gather, mesh 1x16x4:      ",
        kinds((1, 16, 4), P(None, "fsdp", "tensor"), P(None, "tensor")))
