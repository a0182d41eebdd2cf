"""Do the TP all-reduces hide when a block runs its tokens in two independent halves?

A 4-layer toy at qwen32b's widths on the 16 x 4 mesh (as sp_probe.py): per block a norm, a
column-parallel qkv projection, a token-mixing "attention" that needs the whole row (a causal
cumulative mean over positions, per head shard: the join), a row-parallel o projection (TP
all-reduce), a norm, a column-parallel gate and a row-parallel down projection (TP
all-reduce). With chunks=2 everything but the join runs on the row's two halves of positions
as separate chains, so one half's all-reduce can run beside the other half's matmuls;
`barrier` orders half B's matmul after half A's (optimization_barrier) so that XLA cannot
merge the two dots back into one (DotMerger). Prints the gradient program's exposed and
overlapped collectives (`pod.train_hlo.split`).
Run: PYTHONPATH=. python benchmarks/results/train-hlo-2026-12-06-head/chunk_probe.py [1 2 2b]
(with LIBTPU_INIT_ARGS set for the flags' variant)
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from vapo_jax.pod import slices, train_hlo

DEVICES = np.array(slices.devices(slices.parse("v5p-128")))
D, QKV, F, T, L, B = 5120, 7168, 27648, 4096, 4, 16
mesh = Mesh(DEVICES.reshape((1, 16, 4)), ("data", "fsdp", "tensor"))
BATCH = ("data", "fsdp")


def c(x, *spec):
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))


def norm(x):
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype)


def mix(q):  # the join: every position reads all before it (per feature, sharded over tensor)
  n = jnp.arange(1, q.shape[1] + 1, dtype=jnp.float32)[None, :, None]
  return (jnp.cumsum(q.astype(jnp.float32), axis=1) / n).astype(q.dtype)


def run(chunks, barrier, remat):
  row = (BATCH, None, None)

  def mm(xs, w, out_spec):
    outs = []
    for i, x in enumerate(xs):
      if barrier and i:
        x, _ = jax.lax.optimization_barrier((x, outs[-1]))
      outs.append(c(x @ w, *out_spec))
    return outs

  def block(xs, w):
    wqkv, wo, wg, wd = [c(a.astype(jnp.bfloat16), None, "tensor") if i in (0, 2)
                        else c(a.astype(jnp.bfloat16), "tensor", None) for i, a in enumerate(w)]
    hs = [c(norm(x), *row) for x in xs]
    qs = mm(hs, wqkv, (BATCH, None, "tensor"))
    q = jnp.concatenate([q[..., :D] for q in qs], axis=1) if len(qs) > 1 else qs[0][..., :D]
    a = mix(q)
    a_s = jnp.split(a, len(xs), axis=1) if len(xs) > 1 else [a]
    ys = mm(a_s, wo, row)
    xs = [c(x + y, *row) for x, y in zip(xs, ys)]
    hs = [c(norm(x), *row) for x in xs]
    gs = mm(hs, wg, (BATCH, None, "tensor"))
    ds = mm([jax.nn.silu(g) for g in gs], wd, row)
    return [c(x + d, *row) for x, d in zip(xs, ds)]

  if remat:
    block = jax.checkpoint(block)

  def loss(ws, x):
    x = c(x, *row)
    xs = jnp.split(x, chunks, axis=1) if chunks > 1 else [x]
    for i in range(L):
      xs = block(xs, [w[i] for w in ws])
    return sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in xs)

  shapes = [((L, D, QKV), P(None, "fsdp", "tensor")), ((L, D, D), P(None, "tensor", "fsdp")),
            ((L, D, F), P(None, "fsdp", "tensor")), ((L, F, D), P(None, "tensor", "fsdp"))]
  aw = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p)) for s, p in shapes]
  ax = jax.ShapeDtypeStruct((B, T, D), jnp.bfloat16, sharding=NamedSharding(mesh, P(*row)))
  t0 = time.time()
  text = jax.jit(jax.grad(loss)).lower(aw, ax).compile().as_text()
  s = train_hlo.split(text)
  pc = s.per_call
  print(f"chunks={chunks} barrier={barrier} remat={remat}: exposed {pc.exposed:.0f} "
        f"({pc.exposed_wire/1e9:.2f} GB sent), overlapped {pc.overlapped:.0f} "
        f"({pc.overlapped_wire/1e9:.2f} GB); kinds {s.kinds}; dots {text.count(' dot(')}; "
        f"compile {time.time() - t0:.0f} s", flush=True)
  return text


if __name__ == "__main__":
  variants = [(1, False), (2, False), (2, True)]
  only = sys.argv[1:]
  for ch, bar in variants:
    if only and f"{ch}{'b' if bar else ''}" not in only:
      continue
    txt = run(ch, bar, False)
    with open(f"chunk_{ch}{'b' if bar else ''}.hlo", "w") as f:
      f.write(txt)
