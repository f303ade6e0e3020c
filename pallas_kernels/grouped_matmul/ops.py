"""Public grouped matmuls for MoE experts (rows sorted by expert, ragged group sizes).

  grouped_matmul(lhs [M, K], rhs [E, N, K], group_sizes [E]) -> [M, N]          row m uses rhs[g(m)]
  transposed_grouped_matmul(lhs_t [K, M], rhs_t [N, M], group_sizes) -> [E, K, N]  contraction over group rows
  ragged_matmul(lhs [M, K], rhs [E, K, N], group_sizes) -> [M, N]               = jax.lax.ragged_dot, with a VJP
                                                                                 made of the two kernels above

Operands are K-major (contraction last) and PLAIN, MXFP8 or NVFP4 (both operands the same format; NVFP4 only in
`grouped_matmul`). MXFP8 operands quantized along another axis are transposed to K-major here, so the weight
[E, K, N] quantized along K (axis 1) serves the forward, and x [M, K] / dy [M, N] quantized along M (axis 0)
serve the weight gradient. Rows past sum(group_sizes) are padding: they produce zero rows and contribute nothing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import target
from pallas_kernels.formats import Impl
from pallas_kernels.grouped_matmul import reference
from pallas_kernels.grouped_matmul.kernel import gmm_kernel, tgmm_kernel
from pallas_kernels.scaled_matmul.kernel import TuningConfig
from pallas_kernels.scaled_matmul.ops import QuantizedOrArray, to_operand


def _check_sizes(group_sizes: jax.Array, groups: int):
  if group_sizes.ndim != 1 or group_sizes.shape[0] != groups:
    raise ValueError(f"group_sizes has shape {group_sizes.shape} but the weights hold {groups} groups; pass one "
                     "row count per expert.")


def grouped_matmul(lhs: QuantizedOrArray, rhs: QuantizedOrArray, group_sizes: jax.Array, *, out_dtype=jnp.float32,
                   impl: Impl = Impl.PALLAS, interpret: bool | None = None,
                   config: TuningConfig = TuningConfig()) -> jax.Array:
  """out [M, N]: row m of lhs [M, K] times rhs[g(m)] [N, K]^T, for rows sorted by group.

  Args:
    lhs: [M, K] plain, MXFP8 or NVFP4 (quantized along K).
    rhs: [E, N, K] in the same format (MXFP8 may be [E, K, N] quantized along axis 1).
    group_sizes: [E] int rows per group, sum <= M.
    out_dtype: output dtype; accumulation is float32.
    impl: PALLAS or REFERENCE.
    interpret: Pallas interpreter; None: compiled on a GPU, interpreted on a CPU
      (`pallas_kernels.target`).
    config: tile sizes.
  Returns:
    [M, N] out_dtype; rows past sum(group_sizes) are zero.
  """
  if impl is Impl.REFERENCE:
    return reference.gmm_reference(lhs, rhs, group_sizes, out_dtype)
  a, b = to_operand(lhs), to_operand(rhs)
  if a.data.ndim != 2 or b.data.ndim != 3:
    raise ValueError(f"grouped_matmul takes lhs [M, K] and rhs [E, N, K], got {a.data.shape} and {b.data.shape}.")
  _check_sizes(group_sizes, b.data.shape[0])
  return gmm_kernel(a, b, group_sizes.astype(jnp.int32), out_dtype=out_dtype, config=config,
                    interpret=target.kernel_interpret(impl, interpret, "grouped_matmul"))


def transposed_grouped_matmul(lhs_t: QuantizedOrArray, rhs_t: QuantizedOrArray, group_sizes: jax.Array, *,
                              out_dtype=jnp.float32, impl: Impl = Impl.PALLAS, interpret: bool | None = None,
                              config: TuningConfig = TuningConfig()) -> jax.Array:
  """out [E, K, N] = per group e, lhs_t[:, rows_e] . rhs_t[:, rows_e]^T (the weight gradient x^T dy per expert).

  Args:
    lhs_t: [K, M] plain or MXFP8 quantized along M (an MXFP8 x [M, K] quantized along axis 0 is accepted).
    rhs_t: [N, M] likewise (e.g. dy [M, N] quantized along axis 0).
    group_sizes: [E] int rows per group, sum <= M.
    out_dtype, impl, interpret, config: as `grouped_matmul`.
  Returns:
    [E, K, N] out_dtype; zero for empty groups.
  """
  if impl is Impl.REFERENCE:
    return reference.tgmm_reference(lhs_t, rhs_t, group_sizes, out_dtype)
  a, b = to_operand(lhs_t), to_operand(rhs_t)
  if a.data.ndim != 2 or b.data.ndim != 2:
    raise ValueError(f"transposed_grouped_matmul takes lhs_t [K, M] and rhs_t [N, M], got {a.data.shape} and "
                     f"{b.data.shape}.")
  return tgmm_kernel(a, b, group_sizes.astype(jnp.int32), out_dtype=out_dtype, config=config,
                     interpret=target.kernel_interpret(impl, interpret, "grouped_matmul"))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _ragged(lhs, rhs, group_sizes, impl, interpret, config):
  return grouped_matmul(lhs, jnp.swapaxes(rhs, 1, 2), group_sizes, out_dtype=lhs.dtype, impl=impl,
                        interpret=interpret, config=config)


def _ragged_fwd(lhs, rhs, group_sizes, impl, interpret, config):
  return _ragged(lhs, rhs, group_sizes, impl, interpret, config), (lhs, rhs, group_sizes)


def _ragged_bwd(impl, interpret, config, res, dy):
  lhs, rhs, group_sizes = res
  kw = dict(impl=impl, interpret=interpret, config=config)
  d_lhs = grouped_matmul(dy, rhs, group_sizes, out_dtype=lhs.dtype, **kw)  # dy [M, N] . rhs[g] [K, N]^T
  d_rhs = transposed_grouped_matmul(lhs.T, dy.T, group_sizes, out_dtype=rhs.dtype, **kw)
  return d_lhs, d_rhs, None


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def ragged_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, impl: Impl = Impl.PALLAS,
                  interpret: bool | None = None, config: TuningConfig = TuningConfig()) -> jax.Array:
  """`jax.lax.ragged_dot(lhs [M, K], rhs [E, K, N], group_sizes)` in high precision, differentiable.

  The forward is `grouped_matmul` against rhs^T; the VJP is d_lhs = grouped_matmul(dy, rhs) (the transposed
  weights) and d_rhs = transposed_grouped_matmul(lhs^T, dy^T). Output dtype = lhs.dtype; accumulation float32.
  """
  _check_sizes(group_sizes, rhs.shape[0])
  return _ragged(lhs, rhs, group_sizes.astype(jnp.int32), impl,
                 target.kernel_interpret(impl, interpret, "grouped_matmul"), config)
