"""A projection x @ w whose backward pass is two plain matmuls, no transposes.

Shapes: x [*lead, *in], w [*in, *out], y [*lead, *out]; `n_in` = len(in).

  y  = sum_in x[lead, in] w[in, out]
  dx = sum_out dy[lead, out] w[in, out]      -> [*lead, *in]
  dw = sum_lead x[lead, in] dy[lead, out]    -> [*in, *out]

Both backward products are emitted with their outputs already in the order of
x and w. Autodiff of an einsum emits them with swapped output axes plus a
transpose, and XLA's CPU layout pass then moved that transpose onto an input:
the SwiGLU backward wrote its [tokens, F] gradient as a transposed [F, tokens]
copy before every weight-gradient matmul, and the LM head's backward likewise.
On the `benchmarks/model_bench.py` config those copies were ~20% of the
train step's op time (profile in the benchmark's docstring). The result is the
same as the einsum's up to float32 summation order; TPU and GPU compile the
same dot products either way.
"""

from __future__ import annotations

import functools
from typing import Any

import jax


def _dims(x_ndim: int, n_in: int):
  """dot_general dimension numbers of y = x @ w (in = last n_in axes of x)."""
  return ((tuple(range(x_ndim - n_in, x_ndim)), tuple(range(n_in))), ((), ()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul(x: jax.Array, w: jax.Array, n_in: int = 1,
           preferred_element_type: Any = None) -> jax.Array:
  """y [*lead, *out] = x [*lead, *in] @ w [*in, *out] over the n_in in-axes.

  Inputs are used in their own dtypes (cast before calling); the product
  accumulates in `preferred_element_type` when given (e.g. float32 logits from
  bfloat16 inputs), as `jax.lax.dot_general` does.
  """
  return jax.lax.dot_general(x, w, _dims(x.ndim, n_in),
                             preferred_element_type=preferred_element_type)


def _fwd(x, w, n_in, preferred_element_type):
  return matmul(x, w, n_in, preferred_element_type), (x, w)


def _bwd(n_in, preferred_element_type, res, dy):
  x, w = res
  n_lead, n_out = x.ndim - n_in, w.ndim - n_in
  out_axes_dy = tuple(range(n_lead, n_lead + n_out))
  out_axes_w = tuple(range(n_in, n_in + n_out))
  dx = jax.lax.dot_general(dy, w, ((out_axes_dy, out_axes_w), ((), ())),
                           preferred_element_type=preferred_element_type)
  lead = tuple(range(n_lead))
  dw = jax.lax.dot_general(x, dy, ((lead, lead), ((), ())),
                           preferred_element_type=preferred_element_type)
  return dx.astype(x.dtype), dw.astype(w.dtype)


matmul.defvjp(_fwd, _bwd)
