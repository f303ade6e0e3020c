"""Reference block-scaled matmul: dequantize both operands to float32, then one float32 matmul.

The kernels of `scaled_matmul.kernel` and `grouped_matmul.kernel` must equal these on the same quantized inputs
up to float32 summation order (tests require >= 80 dB SQNR).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.formats import MXFP8Tensor, NVFP4Tensor
from pallas_kernels.quantize.reference import dequantize_mxfp8, dequantize_nvfp4

QuantizedOrArray = MXFP8Tensor | NVFP4Tensor | jax.Array


def dequantize(q: QuantizedOrArray) -> jax.Array:
  """float32 values of an MXFP8 / NVFP4 tensor, or of a plain array."""
  if isinstance(q, MXFP8Tensor):
    return dequantize_mxfp8(q, jnp.float32)
  if isinstance(q, NVFP4Tensor):
    return dequantize_nvfp4(q, jnp.float32)
  return jnp.asarray(q).astype(jnp.float32)


def k_major(x: jax.Array, q: QuantizedOrArray) -> jax.Array:
  """x (q's dequantized values) with q's quantized axis moved last, where q is an MXFP8 tensor on another axis."""
  if isinstance(q, MXFP8Tensor) and q.axis != x.ndim - 1:
    return jnp.moveaxis(x, q.axis, -1)
  return x


def scaled_matmul_reference(lhs: QuantizedOrArray, rhs: QuantizedOrArray, out_dtype=jnp.float32) -> jax.Array:
  """[M, N] = dequant(lhs) [M, K] . dequant(rhs) [N, K]^T in float32 (HIGHEST precision), cast to out_dtype.

  An MXFP8 operand quantized along its first axis (e.g. rhs [K, N] quantized along K) is taken K-major.
  """
  a = k_major(dequantize(lhs), lhs)
  b = k_major(dequantize(rhs), rhs)
  out = jnp.einsum("mk,nk->mn", a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return out.astype(out_dtype)
