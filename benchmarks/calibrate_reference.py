"""The reference of `benchmarks/calibrate_train.py`: a minimal dense decoder in plain JAX at
the calibration's shapes, with the platform's fused attention.

Shapes: one row of T tokens, P prompt + R = T − P response positions; D width, H query / K
kv heads of Dh, F MLP width, V vocabulary, L layers, the first N = remat_layers of them
rematerialised (`jax.checkpoint` of the whole block, as `model.remat_layers` does), of those
the last S = selective keeping their matmul outputs q, k, v, the attention output, gate and
up (`jax.checkpoint` with `save_only_these_names`, as `model.remat_selective` does; the
attention's own residuals are not kept, so its forward runs again).

  block(x)  = x + Wo · attn(RoPE(Wq n1(x)), RoPE(Wk n1(x)), Wv n1(x));  + down(silu(gate) · up)
  attn      = `jax.nn.dot_product_attention(..., is_causal=True, implementation=IMPL)`,
              IMPL "cudnn" on a GPU (its fused flash kernel), XLA's elsewhere; causal over
              the whole row (the fused kernels take no segment ids: with packed segments the
              reference still attends the row as one sequence, and is counted so)
  heads     "lm": log-softmax of the final hidden states at the R response positions
              [R, V] in float32, loss −mean log p(target); "value": D -> 1, loss mean
              squared error on the R positions
  update    loss, gradients (fp32 master weights, bf16 matmuls), AdamW; state donated
              on TPU and GPU
  forward   the "lm" head's log-probs of the targets, [R]

Executed FLOPs (what `flops` counts; m, down, a, head as `vapo_jax.pod.step.counts.Arch`,
r = N / L, f = (N − S) / L the fully rematerialised share, pairs = T (T + 1) / 2):
  forward   T m + pairs a + R head
  update    T ((3 + f) m − f down) + pairs a (1 + r + 2.5) + 3 R head
(a full recompute skips the block's last matmul, the MLP down projection; a selective block
recomputes no matmul but its attention; the flash backward recomputes the scores: 2.5 a per
pair). The value head's 2 D per position counts as head.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class Dims:
  layers: int
  d: int
  f: int
  h: int
  k: int
  dh: int
  vocab: int
  remat_layers: int
  tokens: int          # T
  prompt: int          # P
  selective: int = 0   # S: the last S of the remat_layers keep their matmul outputs

  @property
  def response(self) -> int:
    return self.tokens - self.prompt


def attention_impl(platform: str) -> str | None:
  """The platform's fused attention for `jax.nn.dot_product_attention`: cuDNN on a GPU."""
  return "cudnn" if platform == "gpu" else None


def flops(dims: Dims, program: str) -> float:
  """Executed FLOPs of one call (module docstring); program "update_lm" | "update_value" |
  "forward_lm"."""
  from vapo_jax.pod.step import counts  # pylint: disable=import-outside-toplevel
  a = counts.Arch(dims.layers, dims.d, dims.f, dims.h, dims.k, dims.dh, dims.vocab, 0.0, 0.0,
                  512, "dense", dims.remat_layers / dims.layers)
  t, r, rr = dims.tokens, dims.response, a.remat
  full = (dims.remat_layers - dims.selective) / dims.layers
  pairs = t * (t + 1) / 2.0
  head = 2.0 * dims.d if program == "update_value" else a.head
  if program == "forward_lm":
    return t * a.matmul + pairs * a.pair + r * head
  return (t * ((3.0 + full) * a.matmul - full * a.down) + pairs * a.pair * (1.0 + rr + 2.5)
          + 3.0 * r * head)


def init(dims: Dims, value: bool, key) -> dict:
  """fp32 parameters (normal, std 0.02; norms 1)."""
  d, f, hd, kd = dims.d, dims.f, dims.h * dims.dh, dims.k * dims.dh
  keys = iter(jax.random.split(key, 8 * dims.layers + 2))

  def w(*shape):
    return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

  layers = [{"n1": jnp.ones((d,)), "wq": w(d, hd), "bq": jnp.zeros((hd,)), "wk": w(d, kd),
             "bk": jnp.zeros((kd,)), "wv": w(d, kd), "bv": jnp.zeros((kd,)), "wo": w(hd, d),
             "n2": jnp.ones((d,)), "gate": w(d, f), "up": w(d, f), "down": w(f, d)}
            for _ in range(dims.layers)]
  return {"embed": w(dims.vocab, d), "layers": layers, "norm": jnp.ones((d,)),
          "head": w(d, 1) if value else w(d, dims.vocab)}


def _last(v, ndim: int):
  """A vector [n] as [1, ..., 1, n] of `ndim` dims (no implicit rank promotion)."""
  return v.reshape((1,) * (ndim - 1) + (-1,))


def _norm(x, g):
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
  return (y * _last(g, y.ndim)).astype(jnp.bfloat16)


def _rope(x, pos):
  """x [1, T, heads, Dh] rotated by positions pos [T] (half-split RoPE, base 1e6)."""
  half = x.shape[-1] // 2
  inv = 1.0 / (1e6 ** (jnp.arange(half, dtype=jnp.float32) / half))
  ang = pos.astype(jnp.float32)[:, None] * inv[None, :]
  cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _block(dims: Dims, impl, p, x):
  bf = lambda a: a.astype(jnp.bfloat16)  # noqa: E731
  t = x.shape[1]
  pos = jnp.arange(t)
  n = _norm(x, p["n1"])
  q = _kept((n @ bf(p["wq"]) + _last(bf(p["bq"]), 3)).reshape(1, t, dims.h, dims.dh))
  k = _kept((n @ bf(p["wk"]) + _last(bf(p["bk"]), 3)).reshape(1, t, dims.k, dims.dh))
  v = _kept((n @ bf(p["wv"]) + _last(bf(p["bv"]), 3)).reshape(1, t, dims.k, dims.dh))
  o = _kept(jax.nn.dot_product_attention(_rope(q, pos), _rope(k, pos), v, is_causal=True,
                                         implementation=impl))
  x = x + o.reshape(1, t, dims.h * dims.dh) @ bf(p["wo"])
  n = _norm(x, p["n2"])
  return x + (jax.nn.silu(_kept(n @ bf(p["gate"]))) * _kept(n @ bf(p["up"]))) @ bf(p["down"])


KEPT = "calibrate_kept"   # the values a selective block keeps


def _kept(x):
  return checkpoint_name(x, KEPT)


def _remat(dims: Dims, i: int, step):
  """Block i's backward: recompute all (the first N − S), keep the matmul outputs (the
  next S), keep everything (the rest)."""
  if i < dims.remat_layers - dims.selective:
    return jax.checkpoint(step)
  if i < dims.remat_layers:
    return jax.checkpoint(step, policy=jax.checkpoint_policies.save_only_these_names(KEPT))
  return step


def hidden(dims: Dims, impl, params, tokens_T):
  """The final normed hidden states at the R positions that predict the response, [R, D]."""
  x = params["embed"].astype(jnp.bfloat16)[tokens_T][None]
  for i, p in enumerate(params["layers"]):
    step = lambda p, x: _block(dims, impl, p, x)  # noqa: E731
    x = _remat(dims, i, step)(p, x)
  return _norm(x[0, dims.prompt - 1:dims.tokens - 1], params["norm"])


def _lm_logp(dims, impl, params, tokens_T):
  h = hidden(dims, impl, params, tokens_T)
  logits = (h @ params["head"].astype(jnp.bfloat16)).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, tokens_T[dims.prompt:, None], axis=-1)[:, 0]


def _loss(dims, impl, value, params, tokens_T, targets_R):
  if value:
    h = hidden(dims, impl, params, tokens_T)
    v = (h @ params["head"].astype(jnp.bfloat16)).astype(jnp.float32)[:, 0]
    return jnp.mean(jnp.square(v - targets_R))
  return -jnp.mean(_lm_logp(dims, impl, params, tokens_T))


def programs(dims: Dims, platform: str, key) -> dict:
  """{name: (jitted fn, args builder)} of the reference's three programs: update_lm,
  update_value (beside the policy and critic steps) and forward_lm (the log-prob pass).
  The builder makes the arguments (parameters, optimizer state) when called."""
  impl = attention_impl(platform)
  tx = optax.adamw(1e-6, weight_decay=0.1)
  donate = () if platform == "cpu" else (0, 1)
  k_tok, k_par, k_val = jax.random.split(key, 3)
  tokens = jax.random.randint(k_tok, (dims.tokens,), 0, dims.vocab, jnp.int32)
  targets = jnp.asarray(np.linspace(-1.0, 1.0, dims.response), jnp.float32)

  def update(value):
    def step(params, opt, tokens_T, targets_R):
      loss, g = jax.value_and_grad(lambda p: _loss(dims, impl, value, p, tokens_T,
                                                   targets_R))(params)
      upd, opt = tx.update(g, opt, params)
      return optax.apply_updates(params, upd), opt, loss

    def args():
      params = init(dims, value, k_val if value else k_par)
      return (params, jax.jit(tx.init)(params), tokens, targets)
    return jax.jit(step, donate_argnums=donate), args

  def forward():
    return (jax.jit(lambda params, tokens_T: _lm_logp(dims, impl, params, tokens_T)),
            lambda: (init(dims, False, k_par), tokens))

  return {"update_lm": update(False), "update_value": update(True), "forward_lm": forward()}
