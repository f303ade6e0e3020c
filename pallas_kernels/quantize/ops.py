"""Public quantizers: MXFP8 (E4M3 + E8M0 per 32) and NVFP4 (E2M1 + E4M3 per 16 + FP32 per tensor or token).

`impl=Impl.PALLAS` runs the Pallas kernels (`kernel.py`), `Impl.REFERENCE` the pure-jnp specification
(`reference.py`); the two are bit-identical. `interpret=None` means "compiled when the program runs on a GPU,
interpreted on a CPU, refused on a TPU" (`pallas_kernels.target`).
Quantization is not differentiable by itself (the recipe op that consumes these defines the gradients).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import exact_divide, formats, target
from pallas_kernels.formats import MXFP8_BLOCK, NVFP4_BLOCK, Impl, MXFP8Tensor, NVFP4Scaling, NVFP4Tensor
from pallas_kernels.formats import Rounding, ScaleMode
from pallas_kernels.quantize import kernel, random_bits, reference
from pallas_kernels.quantize.kernel import TuningConfig


def _check_impl(impl: Impl) -> None:
  if not isinstance(impl, Impl):
    raise ValueError(f"Unknown implementation {impl!r}; pass formats.Impl.PALLAS or formats.Impl.REFERENCE.")


def quantize_mxfp8(
    x: jax.Array,
    axis: int = -1,
    scale_mode: ScaleMode = ScaleMode.RCEIL,
    *,
    impl: Impl = Impl.PALLAS,
    interpret: bool | None = None,
    config: TuningConfig = TuningConfig(),
) -> MXFP8Tensor:
  """Quantizes x to MXFP8 with one E8M0 scale per 32 elements along `axis` (OCP MX v1.0).

  Args:
    x: float array of any rank >= 1 (e.g. activations [T, D] with axis=-1, expert weights [E, D, F] with
      axis=-2 for the transposed operand of the backward pass); x.shape[axis] must be a multiple of 32.
    axis: the contraction axis.
    scale_mode: RCEIL (cuBLAS/TransformerEngine) or FLOOR (OCP, saturating).
    impl: PALLAS kernel or REFERENCE.
    interpret: run the kernel in the Pallas interpreter; None: compiled on a GPU, interpreted on a CPU
      (`pallas_kernels.target`).
    config: kernel tile sizes.

  Returns:
    MXFP8Tensor(data f8e4m3 x.shape, scale uint8 with dim `axis` divided by 32, axis >= 0).
  """
  _check_impl(impl)
  if not isinstance(scale_mode, ScaleMode):
    raise ValueError(f"Unknown scale mode {scale_mode!r}; pass formats.ScaleMode.RCEIL or FLOOR.")
  if impl is Impl.REFERENCE:
    return reference.quantize_mxfp8(x, axis, scale_mode)
  return _mxfp8_pallas(x, axis=axis, scale_mode=scale_mode, config=config,
                       interpret=target.resolve_interpret(interpret, "quantize_mxfp8"))


@functools.partial(jax.jit, static_argnames=("axis", "scale_mode", "interpret", "config"))
def _mxfp8_pallas(x, *, axis, scale_mode, interpret, config) -> MXFP8Tensor:
  ax = reference.normalize_axis(axis, x.ndim, MXFP8_BLOCK, x.shape, "quantize_mxfp8")
  lead = int(np.prod(x.shape[:ax], dtype=np.int64))
  trail = int(np.prod(x.shape[ax + 1:], dtype=np.int64))
  g = x.shape[ax] // MXFP8_BLOCK
  if trail == 1:
    data, scale = kernel.mxfp8_last_axis(x.reshape(lead, g, MXFP8_BLOCK), scale_mode=scale_mode, config=config,
                                         interpret=interpret)
  else:
    data, scale = kernel.mxfp8_inner_axis(x.reshape(lead, g, MXFP8_BLOCK, trail), scale_mode=scale_mode,
                                          config=config, interpret=interpret)
  scale_shape = x.shape[:ax] + (g,) + x.shape[ax + 1:]
  return MXFP8Tensor(data=data.reshape(x.shape), scale=scale.reshape(scale_shape), axis=ax)


def dequantize_mxfp8(q: MXFP8Tensor, dtype=jnp.float32) -> jax.Array:
  """data * 2^(scale byte - 127) per 32-block (NaN for byte 0xFF), cast to `dtype`."""
  return reference.dequantize_mxfp8(q, dtype)


def quantize_nvfp4(
    x: jax.Array,
    scaling: NVFP4Scaling = NVFP4Scaling.PER_TOKEN,
    *,
    rounding: Rounding = Rounding.NEAREST,
    key: jax.Array | None = None,
    impl: Impl = Impl.PALLAS,
    interpret: bool | None = None,
    config: TuningConfig = TuningConfig(),
) -> NVFP4Tensor:
  """Quantizes x to NVFP4 along its last axis, with TransformerEngine's arithmetic (see `reference`).

  Args:
    x: [..., K] float array, K a multiple of 16 (rows are tokens; [E, C, K] expert inputs work as well).
    scaling: PER_TOKEN (one FP32 scale per row: a row's codes depend on that row only) or PER_TENSOR.
    rounding: NEAREST (ties to even) or STOCHASTIC (for gradients).
    key: for STOCHASTIC: one PRNG key (element (r, c) draws from (key, global row r, column c)) or one key per
      row with shape x.shape[:-1] (a row's draw then ignores its position in the batch).
    impl: PALLAS kernel or REFERENCE.
    interpret: run the kernel in the Pallas interpreter; None: compiled on a GPU, interpreted on a CPU
      (`pallas_kernels.target`).
    config: kernel tile sizes.

  Returns:
    NVFP4Tensor(data float4_e2m1fn x.shape, block_scale f8e4m3 [..., K // 16], global_scale f32 [] or [..., 1]).
  """
  _check_impl(impl)
  if not isinstance(scaling, NVFP4Scaling):
    raise ValueError(f"Unknown NVFP4 scaling {scaling!r}; pass formats.NVFP4Scaling.PER_TOKEN or PER_TENSOR.")
  if not isinstance(rounding, Rounding):
    raise ValueError(f"Unknown rounding {rounding!r}; pass formats.Rounding.NEAREST or STOCHASTIC.")
  if rounding is Rounding.STOCHASTIC and key is None:
    raise ValueError("quantize_nvfp4: stochastic rounding needs a PRNG key; pass key=jax.random.key(...).")
  if impl is Impl.REFERENCE:
    return reference.quantize_nvfp4(x, scaling, rounding=rounding, key=key)
  return _nvfp4_pallas(x, key, scaling=scaling, rounding=rounding,
                       interpret=target.resolve_interpret(interpret, "quantize_nvfp4"),
                       config=config)


@functools.partial(jax.jit, static_argnames=("scaling", "rounding", "interpret", "config"))
def _nvfp4_pallas(x, key, *, scaling, rounding, interpret, config) -> NVFP4Tensor:
  reference.normalize_axis(-1, x.ndim, NVFP4_BLOCK, x.shape, "quantize_nvfp4")
  rows = int(np.prod(x.shape[:-1], dtype=np.int64))
  g = x.shape[-1] // NVFP4_BLOCK
  # The only cross-row step: the amax behind S_enc (of the row for PER_TOKEN, of the tensor for PER_TENSOR).
  s_enc = reference.global_encode_scale(reference.nvfp4_amax(x, scaling))
  s_enc_rows = jnp.broadcast_to(s_enc, x.shape[:-1] + (1,)).reshape(rows, 1)
  seeds = random_bits.row_seeds(key, rows) if rounding is Rounding.STOCHASTIC else None
  codes, block_scale = kernel.nvfp4(x.reshape(rows, g, NVFP4_BLOCK), s_enc_rows, seeds, config=config,
                                    interpret=interpret)
  return NVFP4Tensor(data=formats.fp4_from_codes(codes.reshape(x.shape)),
                     block_scale=block_scale.reshape(*x.shape[:-1], g),
                     global_scale=exact_divide.reciprocal(s_enc), scaling=scaling)


def dequantize_nvfp4(q: NVFP4Tensor, dtype=jnp.float32) -> jax.Array:
  """(data * block_scale) * global_scale, cast to `dtype`."""
  return reference.dequantize_nvfp4(q, dtype)
