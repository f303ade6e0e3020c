"""Pure-jnp reference quantizers for MXFP8 and NVFP4: the specification the Pallas kernels match bit for bit.

MXFP8 (OCP Microscaling Formats v1.0, section 6.3): a block of 32 elements along the contraction axis shares one
E8M0 scale 2^e; values are cast(x / 2^e) to E4M3, saturating at +-448.
  RCEIL: e = ceil(log2(amax / 448)), the cuBLAS / TransformerEngine rule (TE `float_to_e8m0` on amax * (1/448);
    jax.nn's `cast_to_e8m0_with_rounding_up`). Here e is computed exactly from amax's exponent and mantissa,
    which equals the f32-division form whenever amax / 448 is a normal float (amax >= 2^-117.2).
  FLOOR: e = floor(log2(amax)) - 8 (emax of E4M3 is 8), the OCP rule; values in [448, 512) saturate to 448.
  e is clamped to the E8M0 range [-127, 127]. A block holding NaN or +-Inf gets the NaN scale byte 0xFF, and its
  data is the saturating cast of x itself (e = 0); an all-zero block gets byte 0 (2^-127) and zero data.

NVFP4 follows TransformerEngine's arithmetic (transformer_engine/common/cast/nvfp4/core_nvfp4.cuh:
`compute_global_encode_scaling_factor_FP4`, `compute_decoding_scaling_factor`, `compute_scaling_coefficient<float>`;
and the PyTorch reference `NVFP4QuantizerRef._quantize_blockwise_reference`, whose `row_scaled_nvfp4` is our
PER_TOKEN), in float32:
  S_enc = min(448 * 6 / amax, f32 max), and 1 when amax == 0 or S_enc == 0 (amax = Inf); S_dec = 1 / S_enc.
  block decode scale s_b = e4m3_saturating(block_amax * (S_enc * (1/6))), rounded once to E4M3.
  block encode scale = min(1 / (f32(s_b) * S_dec), f32 max) (a zero block gives 1/0 -> f32 max; its values are 0).
  values = E2M1 round-to-nearest-even of clip(x * encode, -6, 6), with -0.0 coded as +0 as TE's `cast_to_fp4x2`.
  amax is that of the tensor (PER_TENSOR) or of the row (PER_TOKEN). TE's per-token PyTorch reference floors the
  row amax at 1e-12 and encodes with S_enc / s_b; we follow the CUDA kernels' float path (1 / (s_b * S_dec), no
  floor) for both scalings, so PER_TOKEN and PER_TENSOR differ in the amax only.
  NaN poisons its scaling group: TE's fmaxf reductions drop NaN, whereas here a NaN makes the amax, hence S_enc
  and every block scale of its row (PER_TOKEN) or tensor (PER_TENSOR), NaN, so the dequantized group is NaN;
  NaN elements are coded +0. Inf saturates (S_enc = 1, block scale 448, value +-6), as in TE.

Every division is `exact_divide.divide` (IEEE round-to-nearest-even from integer operations), which gives TE's
CUDA results (nvcc divides exactly by default) on every backend: a GPU's own float32 `/` is approximate.

Float32 subnormal inputs (|x| < 2^-126) may be flushed to zero by the platform (XLA on CPU does); every other
intermediate here stays normal (powers of two are applied as two normal factors), so the codes do not depend on it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import exact_divide, formats
from pallas_kernels.formats import MXFP8_BLOCK, NVFP4_BLOCK, E2M1_MAX, E4M3_MAX, MXFP8Tensor, NVFP4Tensor
from pallas_kernels.formats import NVFP4Scaling, Rounding, ScaleMode
from pallas_kernels.quantize import random_bits

F32_MAX = float(np.finfo(np.float32).max)
# 1.0f / 6.0f as the CUDA compiler folds it: the float nearest 1/6.
INV_E2M1_MAX = np.float32(1.0) / np.float32(E2M1_MAX)
_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def normalize_axis(axis: int, ndim: int, block: int, shape: tuple[int, ...], what: str) -> int:
  """Checks the quantized axis and its divisibility by the block; returns the non-negative axis."""
  if not -ndim <= axis < ndim:
    raise ValueError(f"{what}: axis {axis} is out of range for a rank-{ndim} input; pass an axis in [-{ndim}, {ndim}).")
  axis %= ndim
  if shape[axis] % block:
    raise ValueError(
        f"{what}: dimension {axis} of shape {shape} is {shape[axis]}, not a multiple of the block size {block};"
        f" pad that axis to a multiple of {block}.")
  return axis


# ------------------------------------------------------------------------------------------------------------ MXFP8


def mxfp8_exponent(amax: jax.Array, scale_mode: ScaleMode) -> jax.Array:
  """The unclamped shared exponent e of blocks with (finite) absolute maximum `amax`, via frexp.

  amax = m * 2^p with m in [0.5, 1): floor(log2(amax)) = p - 1, and amax / 448 = (m / 0.875) * 2^(p - 9) with
  m / 0.875 in (0.57, 1.15), so ceil(log2(amax / 448)) = p - 9 + [m > 0.875].
  """
  m, p = jnp.frexp(jnp.maximum(amax, _SMALLEST_NORMAL))
  if scale_mode is ScaleMode.RCEIL:
    e = p - 9 + (m > 0.875).astype(p.dtype)
  elif scale_mode is ScaleMode.FLOOR:
    e = p - 1 - 8
  else:
    raise ValueError(f"Unknown scale mode {scale_mode!r}; pass a formats.ScaleMode.")
  # Below the smallest normal float the exponent is under -126 - 8: the clamp below makes it -127 either way.
  return jnp.where(amax < _SMALLEST_NORMAL, -127, e)


@functools.partial(jax.jit, static_argnames=("axis", "scale_mode"))
def quantize_mxfp8(x: jax.Array, axis: int = -1, scale_mode: ScaleMode = ScaleMode.RCEIL) -> MXFP8Tensor:
  """Reference MXFP8 quantizer (see the module docstring for the rules).

  Args:
    x: [..., K, ...] float array; the dimension `axis` (K, the contraction axis) must be a multiple of 32.
    axis: the axis along which blocks of 32 share a scale (-1 for the lhs layout, -2 for the transposed one).
    scale_mode: RCEIL or FLOOR.

  Returns:
    MXFP8Tensor with data f8e4m3 x.shape and scale uint8 x.shape[:axis] + (K // 32,) + x.shape[axis+1:].
  """
  axis = normalize_axis(axis, x.ndim, MXFP8_BLOCK, x.shape, "quantize_mxfp8")
  blocks = x.astype(jnp.float32).reshape(*x.shape[:axis], x.shape[axis] // MXFP8_BLOCK, MXFP8_BLOCK,
                                          *x.shape[axis + 1:])
  red = axis + 1
  amax = jnp.max(jnp.abs(blocks), axis=red, keepdims=True)
  finite = jnp.all(jnp.isfinite(blocks), axis=red, keepdims=True)
  e = jnp.clip(mxfp8_exponent(amax, scale_mode), -127, 127)
  e = jnp.where(finite, e, 0)
  data = jnp.clip(formats.mul_pow2(blocks, -e), -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
  scale = jnp.where(finite, e + formats.E8M0_BIAS, formats.E8M0_NAN).astype(jnp.uint8)
  return MXFP8Tensor(data=data.reshape(x.shape), scale=jnp.squeeze(scale, red), axis=axis)


@functools.partial(jax.jit, static_argnames=("dtype",))
def dequantize_mxfp8(q: MXFP8Tensor, dtype=jnp.float32) -> jax.Array:
  """data * 2^(scale - 127) per block (NaN where the scale byte is 0xFF), in `dtype`."""
  axis = q.axis
  byte = jnp.repeat(q.scale, MXFP8_BLOCK, axis=axis).astype(jnp.int32)
  x = formats.mul_pow2(q.data.astype(jnp.float32), byte - formats.E8M0_BIAS)
  return jnp.where(byte == formats.E8M0_NAN, jnp.nan, x).astype(dtype)


# ------------------------------------------------------------------------------------------------------------ NVFP4


def nvfp4_amax(x: jax.Array, scaling: NVFP4Scaling) -> jax.Array:
  """float32 amax of the whole tensor (shape ()) or of each row (shape x.shape[:-1] + (1,)); NaN propagates."""
  a = jnp.abs(x.astype(jnp.float32))
  if scaling is NVFP4Scaling.PER_TENSOR:
    return jnp.max(a)
  if scaling is NVFP4Scaling.PER_TOKEN:
    return jnp.max(a, axis=-1, keepdims=True)
  raise ValueError(f"Unknown NVFP4 scaling {scaling!r}; pass a formats.NVFP4Scaling.")


def global_encode_scale(amax: jax.Array) -> jax.Array:
  """TE's `compute_global_encode_scaling_factor_FP4`: S_enc = min(448 * 6 / amax, f32 max), 1 for amax 0 or Inf."""
  s = jnp.minimum(exact_divide.divide(jnp.full_like(amax, E4M3_MAX * E2M1_MAX, jnp.float32), amax),
                  jnp.float32(F32_MAX))
  return jnp.where((amax == 0) | (s == 0), jnp.float32(1.0), s)


def e2m1_round_nearest(v: jax.Array) -> jax.Array:
  """E2M1 codes (uint8, 0..15) of v in [-6, 6] by round-to-nearest-even; -0.0 and NaN give code 0 (+0)."""
  v = jnp.where(jnp.isnan(v) | (v == 0), jnp.float32(0.0), v)
  return formats.fp4_codes(v.astype(jnp.float4_e2m1fn))


def e2m1_round_stochastic(v: jax.Array, bits: jax.Array) -> jax.Array:
  """E2M1 codes of v in [-6, 6], rounding |v| up to the next grid point with probability (|v| - lo) / (hi - lo).

  u = top 24 bits of `bits` / 2^24; round up iff u < frac. Unbiased up to the 2^-24 grid of u; never off the
  grid; at most one grid step from round-to-nearest. NaN gives code 0.
  """
  grid = jnp.asarray(formats.E2M1_GRID)
  a = jnp.abs(v)
  lo_idx = jnp.sum(a[..., None] >= grid[1:], axis=-1)  # 0..7: the largest grid point <= a
  lo = grid[lo_idx]
  hi = grid[jnp.minimum(lo_idx + 1, 7)]
  step = jnp.where(hi > lo, hi - lo, jnp.float32(1.0))
  frac = (a - lo) * jnp.where(step == 2.0, 0.5, jnp.where(step == 1.0, 1.0, 2.0))  # steps are 0.5, 1 or 2
  up = (random_bits.uniform_from_bits(bits) < frac) & (lo_idx < 7)
  mag = (lo_idx + up.astype(lo_idx.dtype)).astype(jnp.uint8)
  sign = jnp.where(v < 0, jnp.uint8(8), jnp.uint8(0))
  return jnp.where(jnp.isnan(v), jnp.uint8(0), mag | sign)


@functools.partial(jax.jit, static_argnames=("scaling", "rounding"))
def quantize_nvfp4(
    x: jax.Array,
    scaling: NVFP4Scaling = NVFP4Scaling.PER_TOKEN,
    *,
    rounding: Rounding = Rounding.NEAREST,
    key: jax.Array | None = None,
) -> NVFP4Tensor:
  """Reference NVFP4 quantizer along the last axis (see the module docstring for TE's arithmetic).

  Args:
    x: [..., K] float array, K a multiple of 16.
    scaling: PER_TOKEN (row amax) or PER_TENSOR (tensor amax).
    rounding: NEAREST, or STOCHASTIC (needs `key`: one key, drawing by global row index, or one key per row
      with shape x.shape[:-1]).
    key: PRNG key(s) for STOCHASTIC rounding.

  Returns:
    NVFP4Tensor: data float4_e2m1fn x.shape, block_scale f8e4m3 [..., K // 16], global_scale f32.
  """
  normalize_axis(-1, x.ndim, NVFP4_BLOCK, x.shape, "quantize_nvfp4")
  k = x.shape[-1]
  x32 = x.astype(jnp.float32)
  amax = nvfp4_amax(x32, scaling)
  s_enc = global_encode_scale(amax)
  s_dec = exact_divide.reciprocal(s_enc)
  blocks = x32.reshape(*x.shape[:-1], k // NVFP4_BLOCK, NVFP4_BLOCK)
  block_amax = jnp.max(jnp.abs(blocks), axis=-1)
  # s_enc is [] or [..., 1]: either broadcasts over the [..., K // 16] blocks.
  dec = block_amax * (s_enc * INV_E2M1_MAX)
  block_scale = jnp.minimum(dec, jnp.float32(E4M3_MAX)).astype(jnp.float8_e4m3fn)
  enc = jnp.minimum(exact_divide.reciprocal(block_scale.astype(jnp.float32) * s_dec), jnp.float32(F32_MAX))
  v = jnp.clip(blocks * enc[..., None], -E2M1_MAX, E2M1_MAX)
  if rounding is Rounding.NEAREST:
    codes = e2m1_round_nearest(v)
  elif rounding is Rounding.STOCHASTIC:
    if key is None:
      raise ValueError("quantize_nvfp4: stochastic rounding needs a PRNG key; pass key=jax.random.key(...).")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    seeds = random_bits.row_seeds(key, rows).reshape(*x.shape[:-1], 1, 1, 2)
    col = jnp.arange(k, dtype=jnp.uint32).reshape(k // NVFP4_BLOCK, NVFP4_BLOCK)
    codes = e2m1_round_stochastic(v, random_bits.element_bits(seeds[..., 0], seeds[..., 1], col))
  else:
    raise ValueError(f"Unknown rounding {rounding!r}; pass a formats.Rounding.")
  return NVFP4Tensor(data=formats.fp4_from_codes(codes.reshape(x.shape)), block_scale=block_scale,
                     global_scale=s_dec, scaling=scaling)


@functools.partial(jax.jit, static_argnames=("dtype",))
def dequantize_nvfp4(q: NVFP4Tensor, dtype=jnp.float32) -> jax.Array:
  """(data * block_scale) * global_scale in float32, returned in `dtype`."""
  data = q.data.astype(jnp.float32)
  blocks = data.reshape(*data.shape[:-1], data.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
  x = blocks * q.block_scale.astype(jnp.float32)[..., None]
  x = x.reshape(data.shape) * q.global_scale
  return x.astype(dtype)
