"""Does sequence parallelism turn the TP all-reduces into overlapped collectives on v5p?

A 4-layer toy at qwen32b's widths (attention as one projection pair, the MLP), rows over the
16 FSDP chips, weights FSDP x TP; plain TP (the residual replicated over `tensor`) against
sequence parallelism (the residual split over `tensor` on positions between blocks). Prints
the gradient program's exposed and overlapped collectives (`pod.train_hlo.split`).
Run: PYTHONPATH=. python benchmarks/results/train-hlo-2026-12-06-head/sp_probe.py TAG
(with LIBTPU_INIT_ARGS set for the flags' variant)."""
import sys
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

def run(sp, remat):
  row = (BATCH, "tensor", None) if sp else (BATCH, None, None)
  def block(x, w):
    wqkv, wo, wg, wd = [c(a.astype(jnp.bfloat16), None, "tensor") if i != 1 and i != 3
                        else c(a.astype(jnp.bfloat16), "tensor", None) for i, a in enumerate(w)]
    h = c(norm(x), BATCH, None, None)
    q = c(h @ wqkv, BATCH, None, "tensor")
    y = jnp.tanh(q[..., :D]) @ wo
    x = c(x + y, *row)
    h = c(norm(x), BATCH, None, None)
    g = c(h @ wg, BATCH, None, "tensor")
    x = c(x + jax.nn.silu(g) @ wd, *row)
    return x
  if remat:
    block = jax.checkpoint(block)
  def loss(ws, x):
    x = c(x, *row)
    for i in range(L):
      x = block(x, [w[i] for w in ws])
    return jnp.sum(x.astype(jnp.float32) ** 2)
  shapes = [((L, D, QKV), P(None, "fsdp", "tensor")), ((L, D, D), P(None, "tensor", "fsdp")),
            ((L, D, F), P(None, "fsdp", "tensor")), ((L, F, D), P(None, "tensor", "fsdp"))]
  aw = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p)) for s, p in shapes]
  ax = jax.ShapeDtypeStruct((B, T, D), jnp.bfloat16, sharding=NamedSharding(mesh, P(*row)))
  text = jax.jit(jax.grad(loss)).lower(aw, ax).compile().as_text()
  s = train_hlo.split(text)
  pc = s.per_call
  print(f"sp={sp} remat={remat}: exposed {pc.exposed:.0f} ({pc.exposed_wire/1e9:.2f} GB sent), "
        f"overlapped {pc.overlapped:.0f} ({pc.overlapped_wire/1e9:.2f} GB); kinds {s.kinds}",
        flush=True)
  return text

if __name__ == "__main__":
  print("tag", sys.argv[1:])
  for sp in (False, True):
    run(sp, False)
