"""Public block-scaled matmul: out [M, N] = lhs [M, K] . rhs [N, K]^T on MXFP8 or NVFP4 operands.

Both operands are K-major (the quantized, contraction axis last), the layout of `jax.nn.scaled_matmul` and of
Hopper's fp8 wgmma. An MXFP8 operand quantized along its first axis (rhs [K, N] quantized along K) is accepted
and transposed here; an NVFP4 rhs must be quantized as [N, K] (NVFP4 quantizes along the last axis only).
Accumulation is float32; NVFP4 operands carry per-row (per-token / per-output-channel) or per-tensor
second-level scales, applied in the epilogue.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import target
from pallas_kernels.formats import Impl, MXFP8Tensor, NVFP4Tensor, pack_fp4
from pallas_kernels.scaled_matmul import reference
from pallas_kernels.scaled_matmul.kernel import Operand, OperandFormat, TuningConfig, scaled_matmul_kernel

QuantizedOrArray = MXFP8Tensor | NVFP4Tensor | jax.Array


def to_operand(q: QuantizedOrArray) -> Operand:
  """A K-major kernel operand from an MXFP8 / NVFP4 tensor or a plain float array.

  MXFP8 on a non-last axis is transposed to put that axis last (rank 2 or 3). NVFP4 codes are packed two per
  byte (element 2i in the low nibble) and the global scale broadcast to one per row.
  """
  if isinstance(q, MXFP8Tensor):
    data, scale = q.data, q.scale
    if q.axis != data.ndim - 1:
      data, scale = jnp.moveaxis(data, q.axis, -1), jnp.moveaxis(scale, q.axis, -1)
    return Operand(data, scale, None, OperandFormat.MXFP8)
  if isinstance(q, NVFP4Tensor):
    rows = q.data.shape[:-1] + (1,)
    g = jnp.broadcast_to(q.global_scale.astype(jnp.float32), rows)
    return Operand(pack_fp4(q.data), q.block_scale, g, OperandFormat.NVFP4)
  q = jnp.asarray(q)
  if not jnp.issubdtype(q.dtype, jnp.floating):
    raise ValueError(f"A plain matmul operand must be a float array, got {q.dtype}; quantize it or cast it.")
  return Operand(q, None, None, OperandFormat.PLAIN)


def scaled_matmul(lhs: QuantizedOrArray, rhs: QuantizedOrArray, *, out_dtype=jnp.float32, impl: Impl = Impl.PALLAS,
                  interpret: bool | None = None, config: TuningConfig = TuningConfig()) -> jax.Array:
  """Block-scaled matmul out [M, N] = lhs [M, K] . rhs [N, K]^T (Composer 2 report section 5).

  Args:
    lhs: MXFP8Tensor or NVFP4Tensor [M, K] quantized along K (or a plain float array, with a plain rhs).
    rhs: the same format as lhs, [N, K] quantized along K (MXFP8 may also be [K, N] quantized along axis 0).
    out_dtype: output dtype; accumulation is float32.
    impl: PALLAS (the kernel) or REFERENCE (dequantize, then one float32 matmul).
    interpret: run the kernel with the Pallas interpreter; None: compiled on a GPU, interpreted on a CPU
      (`pallas_kernels.target`).
    config: kernel tile sizes.
  Returns:
    [M, N] out_dtype.
  """
  if impl is Impl.REFERENCE:
    return reference.scaled_matmul_reference(lhs, rhs, out_dtype)
  a, b = to_operand(lhs), to_operand(rhs)
  if a.data.ndim != 2 or b.data.ndim != 2:
    raise ValueError(f"scaled_matmul takes 2-D operands, got {a.data.shape} and {b.data.shape}; use "
                     "pallas_kernels.grouped_matmul for stacked experts.")
  return scaled_matmul_kernel(a, b, out_dtype=out_dtype, config=config,
                              interpret=target.resolve_interpret(interpret, "scaled_matmul"))
