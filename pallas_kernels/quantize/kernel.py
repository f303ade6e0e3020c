"""Pallas quantize kernels for MXFP8 and NVFP4, bit-identical to `reference.py`.

One kernel body per format, written with elementwise math, reductions over one block axis and integer bit
manipulation only (no gathers, no reshapes in the body), so the same source runs under `interpret=True` on CPU
and lowers for GPU. The inputs arrive pre-blocked by free reshapes in the wrapper:
  MXFP8 along the last axis:    x [R, G, 32]      -> data [R, G, 32] f8e4m3, scale [R, G] uint8
  MXFP8 along an inner axis:    x [P, G, 32, Q]   -> data [P, G, 32, Q],     scale [P, G, Q]
  NVFP4 (last axis):            x [R, G, 16], S_enc [R, 1] -> codes [R, G, 16] uint8, block scale [R, G] f8e4m3
NVFP4 takes its global encode scale per row as an input: PER_TENSOR broadcasts one value, PER_TOKEN passes each
row's, so the body is the same and a row's codes are a function of that row and its S_enc only. The amax
reduction that yields S_enc is a separate XLA pass (as TransformerEngine's K1/K2 split), which is the only
cross-row step. E2M1 codes are produced arithmetically (threshold counts), since FP4 types do not exist in the
kernel languages; the wrapper bitcasts them to float4_e2m1fn.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels import exact_divide, formats
from pallas_kernels.formats import MXFP8_BLOCK, NVFP4_BLOCK, E2M1_MAX, E4M3_MAX, ScaleMode, out_struct
from pallas_kernels.quantize import random_bits

_F32_MAX = float(np.finfo(np.float32).max)
_INV_E2M1_MAX = float(np.float32(1.0) / np.float32(E2M1_MAX))


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """Tile sizes of the quantize kernels (each clipped to the array and rounded to a divisor of its dimension).

  Attributes:
    block_rows: rows (tokens) per program for last-axis quantization.
    block_groups: scale blocks (of 32 or 16 elements) per program along the quantized axis.
    block_cols: columns per program along the trailing (non-quantized) axis for inner-axis MXFP8.
  """

  # No register spill on an H100 at these defaults (ptxas -v; docs/benchmarks.md, "tools/gpu_compile.py"): the
  # inner-axis MXFP8 kernel spilled at 8 groups x 64 columns, 128 values a thread.
  block_rows: int = 64
  block_groups: int = 4
  block_cols: int = 32


def _tile(n: int, want: int) -> int:
  """The largest power of two <= want that divides n: whole tiles only (no masked edges to get wrong), and
  power-of-two block shapes as the Triton lowering requires."""
  t = 1
  while t * 2 <= want and n % (t * 2) == 0:
    t *= 2
  return t


def _compiler_params(interpret: bool):
  """The Triton lowering on GPU (axis reductions, fp8 casts and bit casts lower there; Mosaic GPU's default
  layouts only reduce whole arrays); nothing when interpreted."""
  return None if interpret else plt.CompilerParams(num_warps=4)


# ------------------------------------------------------------------------------------------------------------ MXFP8


def _mxfp8_body(x: jax.Array, red: int, scale_mode: ScaleMode) -> tuple[jax.Array, jax.Array]:
  """MXFP8 of a tile whose axis `red` is the 32-element block axis; returns (f8 data, uint8 scale without red)."""
  x = x.astype(jnp.float32)
  amax = jnp.max(jnp.abs(x), axis=red, keepdims=True)
  # Explicit non-finite flag: max reductions on some backends drop NaN.
  bad = jnp.max(jnp.where(jnp.isfinite(x), 0, 1).astype(jnp.int32), axis=red, keepdims=True) > 0
  bits = jax.lax.bitcast_convert_type(amax, jnp.uint32)
  exp_field = ((bits >> 23) & 0xFF).astype(jnp.int32)  # 0 for zero and subnormal amax: clamps to -127 below
  e = exp_field - formats.E8M0_BIAS - 8  # floor(log2(amax)) - emax_elem(E4M3)
  if scale_mode is ScaleMode.RCEIL:
    # amax = 1.m * 2^E; amax / 448 = (1.m / 1.75) * 2^(E - 8): one more when 1.m > 1.75 (mantissa > 0x600000).
    e = e + ((bits & 0x7FFFFF) > 0x600000).astype(jnp.int32)
  e = jnp.clip(e, -127, 127)
  e = jnp.where(bad, 0, e)
  data = jnp.clip(formats.mul_pow2(x, -e), -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
  scale = jnp.where(bad, formats.E8M0_NAN, e + formats.E8M0_BIAS).astype(jnp.uint8)
  return data, jnp.squeeze(scale, red)


def _mxfp8_kernel(x_ref, data_ref, scale_ref, *, red: int, scale_mode: ScaleMode):
  data, scale = _mxfp8_body(x_ref[...], red, scale_mode)
  data_ref[...] = data
  scale_ref[...] = scale


@functools.partial(jax.jit, static_argnames=("scale_mode", "config", "interpret"))
def mxfp8_last_axis(x: jax.Array, *, scale_mode: ScaleMode, config: TuningConfig = TuningConfig(),
                    interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """MXFP8 along the last axis of x [R, G, 32] (blocked); returns (data [R, G, 32] f8e4m3, scale [R, G] u8)."""
  r, g, _ = x.shape
  br, bg = _tile(r, config.block_rows), _tile(g, config.block_groups)
  return pl.pallas_call(
      functools.partial(_mxfp8_kernel, red=2, scale_mode=scale_mode),
      out_shape=(out_struct((r, g, MXFP8_BLOCK), jnp.float8_e4m3fn, x), out_struct((r, g), jnp.uint8, x)),
      grid=(r // br, g // bg),
      in_specs=[pl.BlockSpec((br, bg, MXFP8_BLOCK), lambda i, j: (i, j, 0))],
      out_specs=(pl.BlockSpec((br, bg, MXFP8_BLOCK), lambda i, j: (i, j, 0)),
                 pl.BlockSpec((br, bg), lambda i, j: (i, j))),
      interpret=interpret,
      compiler_params=_compiler_params(interpret),
      name="quantize_mxfp8_rows",
  )(x)


@functools.partial(jax.jit, static_argnames=("scale_mode", "config", "interpret"))
def mxfp8_inner_axis(x: jax.Array, *, scale_mode: ScaleMode, config: TuningConfig = TuningConfig(),
                     interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """MXFP8 along axis 1 of x [P, G, 32, Q] (blocked): the transposed-operand layout, no transpose needed.

  Returns:
    (data [P, G, 32, Q] f8e4m3, scale [P, G, Q] uint8).
  """
  p, g, _, q = x.shape
  bg, bq = _tile(g, config.block_groups), _tile(q, config.block_cols)
  return pl.pallas_call(
      functools.partial(_mxfp8_kernel, red=1, scale_mode=scale_mode),
      out_shape=(out_struct((p, g, MXFP8_BLOCK, q), jnp.float8_e4m3fn, x), out_struct((p, g, q), jnp.uint8, x)),
      grid=(p, g // bg, q // bq),
      in_specs=[pl.BlockSpec((None, bg, MXFP8_BLOCK, bq), lambda b, i, j: (b, i, 0, j))],
      out_specs=(pl.BlockSpec((None, bg, MXFP8_BLOCK, bq), lambda b, i, j: (b, i, 0, j)),
                 pl.BlockSpec((None, bg, bq), lambda b, i, j: (b, i, j))),
      interpret=interpret,
      compiler_params=_compiler_params(interpret),
      name="quantize_mxfp8_cols",
  )(x)


# ------------------------------------------------------------------------------------------------------------ NVFP4


def _e2m1_nearest_codes(v: jax.Array) -> jax.Array:
  """RNE E2M1 codes of v in [-6, 6] by counting thresholds: midpoints tie to the even code (0, 1.0, 2, 4)."""
  a = jnp.abs(v)
  mag = ((a > 0.25).astype(jnp.int32) + (a >= 0.75).astype(jnp.int32) + (a > 1.25).astype(jnp.int32)
         + (a >= 1.75).astype(jnp.int32) + (a > 2.5).astype(jnp.int32) + (a >= 3.5).astype(jnp.int32)
         + (a > 5.0).astype(jnp.int32))
  sign = jnp.where(v < 0, 8, 0)  # NaN compares false everywhere: code 0
  return (mag + sign).astype(jnp.uint8)


def _e2m1_stochastic_codes(v: jax.Array, bits: jax.Array) -> jax.Array:
  """Stochastic E2M1 codes (see `reference.e2m1_round_stochastic`) without gathers: lo and step from thresholds."""
  a = jnp.abs(v)
  ge = lambda t: (a >= t).astype(jnp.int32)
  lo_idx = ge(0.5) + ge(1.0) + ge(1.5) + ge(2.0) + ge(3.0) + ge(4.0) + ge(6.0)
  # Grid by index 0..7: 0 .5 1 1.5 2 3 4 6; steps up from index i: 0.5 for i < 4, 1 for i = 4, 5, 2 for i = 6.
  # 1 / step, so that the fraction is a product (exact: steps are powers of two) rather than a division.
  inv_step = jnp.where(lo_idx < 4, 2.0, jnp.where(lo_idx < 6, 1.0, 0.5)).astype(jnp.float32)
  lo = jnp.where(lo_idx < 4, lo_idx.astype(jnp.float32) * 0.5,
                 jnp.where(lo_idx < 7, (lo_idx - 2).astype(jnp.float32), jnp.float32(6.0)))
  frac = (a - lo) * inv_step
  up = ((random_bits.uniform_from_bits(bits) < frac) & (lo_idx < 7)).astype(jnp.int32)
  sign = jnp.where(v < 0, 8, 0)
  codes = jnp.where(jnp.isnan(v), 0, lo_idx + up + sign)
  return codes.astype(jnp.uint8)


def _nvfp4_kernel(*refs, stochastic: bool, block_groups: int):
  if stochastic:
    x_ref, s_enc_ref, seed0_ref, seed1_ref, codes_ref, scale_ref = refs
  else:
    x_ref, s_enc_ref, codes_ref, scale_ref = refs
  x = x_ref[...].astype(jnp.float32)  # [br, bg, 16]
  s_enc = s_enc_ref[...]  # [br, 1]
  s_dec = exact_divide.reciprocal(s_enc)  # IEEE-exact on every backend (a GPU's `/` is not; exact_divide.py)
  block_amax = jnp.max(jnp.abs(x), axis=2)  # [br, bg]
  has_nan = jnp.max(jnp.where(jnp.isnan(x), 1, 0).astype(jnp.int32), axis=2) > 0
  block_amax = jnp.where(has_nan, jnp.float32(jnp.nan), block_amax)
  dec = block_amax * (s_enc * jnp.float32(_INV_E2M1_MAX))
  block_scale = jnp.minimum(dec, jnp.float32(E4M3_MAX)).astype(jnp.float8_e4m3fn)
  enc = jnp.minimum(exact_divide.reciprocal(block_scale.astype(jnp.float32) * s_dec), jnp.float32(_F32_MAX))
  v = jnp.clip(x * enc[:, :, None], -E2M1_MAX, E2M1_MAX)
  if stochastic:
    shape = x.shape
    group = jax.lax.broadcasted_iota(jnp.int32, shape, 1) + pl.program_id(1) * block_groups
    col = (group * NVFP4_BLOCK + jax.lax.broadcasted_iota(jnp.int32, shape, 2)).astype(jnp.uint32)
    bits = random_bits.element_bits(seed0_ref[...][:, :, None], seed1_ref[...][:, :, None], col)
    codes_ref[...] = _e2m1_stochastic_codes(v, bits)
  else:
    codes_ref[...] = _e2m1_nearest_codes(v)
  scale_ref[...] = block_scale


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def nvfp4(x: jax.Array, s_enc: jax.Array, seeds: jax.Array | None = None, *, config: TuningConfig = TuningConfig(),
          interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """NVFP4 of x [R, G, 16] (blocked) given each row's global encode scale.

  Args:
    x: [R, G, 16] float.
    s_enc: [R, 1] float32 global encode scale S_enc per row.
    seeds: None for round-to-nearest-even, or [R, 2] uint32 row seeds (`random_bits.row_seeds`) for
      stochastic rounding.
    config: tile sizes.
    interpret: run the kernel body in the Pallas interpreter (CPU).

  Returns:
    (codes [R, G, 16] uint8 E2M1 codes, block_scale [R, G] f8e4m3).
  """
  r, g, _ = x.shape
  br, bg = _tile(r, config.block_rows), _tile(g, config.block_groups)
  stochastic = seeds is not None
  in_specs = [pl.BlockSpec((br, bg, NVFP4_BLOCK), lambda i, j: (i, j, 0)),
              pl.BlockSpec((br, 1), lambda i, j: (i, 0))]
  args = [x, s_enc.astype(jnp.float32)]
  if stochastic:
    # Two [R, 1] columns rather than one [R, 2]: the Triton lowering has no slice.
    in_specs += [pl.BlockSpec((br, 1), lambda i, j: (i, 0))] * 2
    seeds = seeds.astype(jnp.uint32)
    args += [seeds[:, :1], seeds[:, 1:]]
  return pl.pallas_call(
      functools.partial(_nvfp4_kernel, stochastic=stochastic, block_groups=bg),
      out_shape=(out_struct((r, g, NVFP4_BLOCK), jnp.uint8, *args), out_struct((r, g), jnp.float8_e4m3fn, *args)),
      grid=(r // br, g // bg),
      in_specs=in_specs,
      out_specs=(pl.BlockSpec((br, bg, NVFP4_BLOCK), lambda i, j: (i, j, 0)),
                 pl.BlockSpec((br, bg), lambda i, j: (i, j))),
      interpret=interpret,
      compiler_params=_compiler_params(interpret),
      name="quantize_nvfp4_sr" if stochastic else "quantize_nvfp4",
  )(*args)
