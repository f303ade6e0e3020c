"""Reference grouped matmuls: dequantize to float32, then `jax.lax.ragged_dot` / a masked einsum.

Shapes as in `grouped_matmul.kernel` (K-major operands): gmm lhs [M, K], rhs [E, N, K] -> [M, N];
tgmm lhs_t [K, M], rhs_t [N, M] -> [E, K, N]. Rows past sum(group_sizes) contribute nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.scaled_matmul.reference import QuantizedOrArray, dequantize, k_major

_HIGHEST = jax.lax.Precision.HIGHEST


def gmm_reference(lhs: QuantizedOrArray, rhs: QuantizedOrArray, group_sizes: jax.Array,
                  out_dtype=jnp.float32) -> jax.Array:
  """out [M, N]: dequant(lhs)[m] . dequant(rhs)[g(m)]^T for rhs [E, N, K]."""
  a = k_major(dequantize(lhs), lhs)
  b = k_major(dequantize(rhs), rhs)
  out = jax.lax.ragged_dot(a, jnp.swapaxes(b, 1, 2), group_sizes.astype(jnp.int32), precision=_HIGHEST,
                           preferred_element_type=jnp.float32)
  return out.astype(out_dtype)


def group_mask(group_sizes: jax.Array, m: int) -> jax.Array:
  """[E, M] float32: 1 where row m belongs to group e."""
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))
  rows = jnp.arange(m, dtype=jnp.int32)
  return ((rows[None, :] >= (ends - group_sizes)[:, None]) & (rows[None, :] < ends[:, None])).astype(jnp.float32)


def tgmm_reference(lhs_t: QuantizedOrArray, rhs_t: QuantizedOrArray, group_sizes: jax.Array,
                   out_dtype=jnp.float32) -> jax.Array:
  """out [E, K, N] = per group e, dequant(lhs_t)[:, rows_e] . dequant(rhs_t)[:, rows_e]^T."""
  a = k_major(dequantize(lhs_t), lhs_t)
  b = k_major(dequantize(rhs_t), rhs_t)
  mask = group_mask(group_sizes, a.shape[-1])
  out = jnp.einsum("km,nm,em->ekn", a, b, mask, precision=_HIGHEST, preferred_element_type=jnp.float32)
  return out.astype(out_dtype)
