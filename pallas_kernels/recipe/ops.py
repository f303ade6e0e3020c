"""The experts' low-precision recipe as one differentiable op (Composer 2 report section 5).

  expert_matmul(x [M, K], w [E, K, N], group_sizes [E], precision) -> [M, N]   (rows of x sorted by expert)
  dense_matmul(x [M, K], w [K, N], precision) -> [M, N]

NVFP4_FWD_MXFP8_BWD (the report's recipe):
  forward   y = Q4(x) . Q4(w^T)^T: x in NVFP4 with PER_TOKEN second-level scales (one per row of x: a token's code
            depends on that token only, the property the report found per-tensor scaling breaks), w^T [E, N, K]
            in NVFP4 with one second-level scale per (expert, output channel) (`NVFP4Scaling.PER_TOKEN` applied to
            w^T's rows), both quantized along K with round-to-nearest-even; the scales meet in the epilogue.
  backward  re-quantized from the saved high-precision x, w and the incoming dy, in MXFP8 (RCEIL scales):
            dx [M, K] = Q8_N(dy) . Q8_N(w)^T             (dy and w quantized along N, the new contraction axis)
            dw [E, K, N] = sum_{m in e} Q8_M(x)_m Q8_M(dy)_m   (x and dy quantized along the rows M)
            M is padded with zero rows to a multiple of 32 for the row-wise quantization; a 32-row scale block may
            straddle two experts, which is exact (a block scale factors out of every product it touches).
MXFP8: the forward quantizes x along K and w along K (axis 1) in MXFP8; the backward is the one above.
BF16: `jax.lax.ragged_dot` in the inputs' dtype, no quantization.

The output has x's dtype; accumulation is float32. The gradients are those of the high-precision function
evaluated through quantized products (a straight-through estimator for the quantizers).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import target
from pallas_kernels.formats import MXFP8_BLOCK, Impl, NVFP4Scaling
from pallas_kernels.grouped_matmul.ops import grouped_matmul, transposed_grouped_matmul
from pallas_kernels.quantize.ops import quantize_mxfp8, quantize_nvfp4
from pallas_kernels.recipe.precision import Precision
from pallas_kernels.scaled_matmul.kernel import TuningConfig


def _forward(x, w, group_sizes, precision, impl, interpret, config):
  q = dict(impl=impl, interpret=interpret)
  if precision is Precision.NVFP4_FWD_MXFP8_BWD:
    xq = quantize_nvfp4(x, NVFP4Scaling.PER_TOKEN, **q)
    wq = quantize_nvfp4(jnp.swapaxes(w, 1, 2), NVFP4Scaling.PER_TOKEN, **q)
  else:
    xq = quantize_mxfp8(x, axis=-1, **q)
    wq = quantize_mxfp8(w, axis=1, **q)
  return grouped_matmul(xq, wq, group_sizes, out_dtype=x.dtype, config=config, **q)


def _pad_rows(a: jax.Array, multiple: int) -> jax.Array:
  return jnp.pad(a, ((0, -a.shape[0] % multiple), (0, 0)))


def _backward(x, w, group_sizes, dy, impl, interpret, config):
  q = dict(impl=impl, interpret=interpret)
  dy = dy.astype(jnp.float32)
  dx = grouped_matmul(quantize_mxfp8(dy, axis=-1, **q), quantize_mxfp8(w, axis=-1, **q), group_sizes,
                      out_dtype=x.dtype, config=config, **q)
  xm, dym = _pad_rows(x, MXFP8_BLOCK), _pad_rows(dy, MXFP8_BLOCK)
  dw = transposed_grouped_matmul(quantize_mxfp8(xm, axis=0, **q), quantize_mxfp8(dym, axis=0, **q), group_sizes,
                                 out_dtype=w.dtype, config=config, **q)
  return dx, dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _quantized(x, w, group_sizes, precision, impl, interpret, config):
  return _forward(x, w, group_sizes, precision, impl, interpret, config)


def _quantized_fwd(x, w, group_sizes, precision, impl, interpret, config):
  return _forward(x, w, group_sizes, precision, impl, interpret, config), (x, w, group_sizes)


def _quantized_bwd(precision, impl, interpret, config, res, dy):
  del precision  # both quantized recipes run the backward in MXFP8
  x, w, group_sizes = res
  dx, dw = _backward(x, w, group_sizes, dy, impl, interpret, config)
  return dx, dw, None


_quantized.defvjp(_quantized_fwd, _quantized_bwd)


def expert_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, precision: Precision, *,
                  impl: Impl = Impl.PALLAS, interpret: bool | None = None,
                  config: TuningConfig = TuningConfig()) -> jax.Array:
  """Grouped expert matmul y [M, N] (row m times w[g(m)]) in the given precision recipe, differentiable.

  Args:
    x: [M, K] float rows sorted by expert; K a multiple of 32 for quantized precisions (and N too: the
      backward quantizes along N).
    w: [E, K, N] float expert weights.
    group_sizes: [E] int rows per expert (sum <= M; later rows are padding and get zero output and gradient).
    precision: BF16, MXFP8 or NVFP4_FWD_MXFP8_BWD (see the module docstring).
    impl: PALLAS kernels or REFERENCE (pure jnp) for the quantizers and the matmuls.
    interpret: Pallas interpreter; None: compiled on a GPU, interpreted on a CPU
      (`pallas_kernels.target`).
    config: matmul tile sizes.
  Returns:
    [M, N] in x.dtype.
  """
  if x.ndim != 2 or w.ndim != 3 or w.shape[1] != x.shape[1]:
    raise ValueError(f"expert_matmul takes x [M, K] and w [E, K, N], got {x.shape} and {w.shape}.")
  if precision is Precision.BF16:
    return jax.lax.ragged_dot(x, w.astype(x.dtype), group_sizes.astype(jnp.int32))
  k, n = w.shape[1:]
  if k % MXFP8_BLOCK or n % MXFP8_BLOCK:
    raise ValueError(f"{precision.value} needs both matmul dims divisible by {MXFP8_BLOCK}, got K={k}, N={n}; "
                     "choose model widths that are multiples of 32.")
  return _quantized(x, w.astype(x.dtype), group_sizes.astype(jnp.int32), precision, impl,
                    target.kernel_interpret(impl, interpret, "expert_matmul"), config)


def dense_matmul(x: jax.Array, w: jax.Array, precision: Precision, **kw) -> jax.Array:
  """y [M, N] = x [M, K] . w [K, N] in the given precision recipe (one group: `expert_matmul` with E = 1)."""
  return expert_matmul(x, w[None], jnp.array([x.shape[0]], jnp.int32), precision, **kw)
