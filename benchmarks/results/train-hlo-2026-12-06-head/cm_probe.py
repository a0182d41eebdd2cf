"""Does a hand-written collective matmul hide the TP traffic on v5p?

The 4-layer toy of chunk_probe.py (qwen32b's widths, the 16 x 4 mesh, a token-mixing join per
block), written per shard under `jax.shard_map`: the residual stream split over `tensor` on
positions (sequence parallelism), each column-parallel projection an all-gather matmul and
each row-parallel one a matmul reduce-scatter, both as ring loops of `ppermute` (one block
of positions moves while the previous one multiplies): `vapo_jax.models.collective_matmul`,
whose functions began as this script's own copies. The FSDP weights are gathered with
`all_gather` inside, as the partitioner would. Prints the gradient program's exposed and
overlapped collectives (`pod.train_hlo.split`) beside the plain-TP toy's.
Run: PYTHONPATH=. python benchmarks/results/train-hlo-2026-12-06-head/cm_probe.py [0 1]
"""
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from vapo_jax.models.collective_matmul import all_gather_matmul, matmul_reduce_scatter
from vapo_jax.pod import slices, train_hlo

DEVICES = np.array(slices.devices(slices.parse("v5p-128")))
D, QKV, F, T, L, B = 5120, 7168, 27648, 4096, 4, 16
TP = 4
mesh = Mesh(DEVICES.reshape((1, 16, TP)), ("data", "fsdp", "tensor"))
BATCH = ("data", "fsdp")
ALL = ("data", "fsdp", "tensor")


def norm(x):
  x32 = x.astype(jnp.float32)
  return (x32 * lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype)


def mix(q):  # the join: every position reads all before it
  n = jnp.arange(1, q.shape[1] + 1, dtype=jnp.float32)[None, :, None]
  return (jnp.cumsum(q.astype(jnp.float32), axis=1) / n).astype(q.dtype)


def run(cm):
  def block(x, w):
    wqkv, wo, wg, wd = w
    g0 = functools.partial(lax.all_gather, axis_name="fsdp", tiled=True)
    wqkv = g0(wqkv.astype(jnp.bfloat16), axis=0)     # [D, QKV/4]
    wo = g0(wo.astype(jnp.bfloat16), axis=1)         # [D/4, D]
    wg = g0(wg.astype(jnp.bfloat16), axis=0)         # [D, F/4]
    wd = g0(wd.astype(jnp.bfloat16), axis=1)         # [F/4, D]
    if cm:
      ag = functools.partial(all_gather_matmul, axis_name="tensor", n=TP)
      rs = functools.partial(matmul_reduce_scatter, axis_name="tensor", n=TP)
      q = ag(norm(x), wqkv)
      x = x + rs(mix(q[..., :D // TP]), wo)
      g = ag(norm(x), wg)
      return x + rs(jax.nn.silu(g), wd)
    # the same per shard with the collectives whole (all_gather, psum_scatter)
    ag = functools.partial(lax.all_gather, axis_name="tensor", axis=1, tiled=True)
    rs = functools.partial(lax.psum_scatter, axis_name="tensor", scatter_dimension=1,
                           tiled=True)
    q = ag(norm(x)) @ wqkv
    x = x + rs(mix(q[..., :D // TP]) @ wo)
    g = ag(norm(x)) @ wg
    return x + rs(jax.nn.silu(g) @ wd)

  def local_loss(ws, x):
    for i in range(L):
      x = block(x, [w[i] for w in ws])
    return lax.psum(jnp.sum(x.astype(jnp.float32) ** 2), ALL)

  wspecs = [P(None, "fsdp", "tensor"), P(None, "tensor", "fsdp"), P(None, "fsdp", "tensor"),
            P(None, "tensor", "fsdp")]
  xspec = P(BATCH, "tensor", None)
  loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(wspecs, xspec), out_specs=P())
  shapes = [(L, D, QKV), (L, D, D), (L, D, F), (L, F, D)]
  aw = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
        for s, p in zip(shapes, wspecs)]
  ax = jax.ShapeDtypeStruct((B, T, D), jnp.bfloat16, sharding=NamedSharding(mesh, xspec))
  t0 = time.time()
  text = jax.jit(jax.grad(loss)).lower(aw, ax).compile().as_text()
  s = train_hlo.split(text)
  pc = s.per_call
  print(f"collective_matmul={cm}: exposed {pc.exposed:.0f} ({pc.exposed_wire/1e9:.2f} GB "
        f"sent), overlapped {pc.overlapped:.0f} ({pc.overlapped_wire/1e9:.2f} GB); kinds "
        f"{s.kinds}; compile {time.time() - t0:.0f} s", flush=True)
  return text


if __name__ == "__main__":
  for cm in ([c == "1" for c in sys.argv[1:]] or (False, True)):
    txt = run(cm)
    with open(f"cm_{int(cm)}.hlo", "w") as f:
      f.write(txt)
