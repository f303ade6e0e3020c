"""Block-scaled low-precision formats: MXFP8 (E4M3 values, E8M0 scales per 32) and NVFP4 (E2M1 values, E4M3
scales per 16, FP32 second-level scale per tensor or per token).

API (stable; the quantizers live in `pallas_kernels.quantize.ops`):
  ScaleMode {RCEIL, FLOOR}; NVFP4Scaling {PER_TOKEN, PER_TENSOR}; Rounding {NEAREST, STOCHASTIC};
  Impl {PALLAS, REFERENCE}
  MXFP8_BLOCK = 32, NVFP4_BLOCK = 16, E4M3_MAX = 448.0, E2M1_MAX = 6.0
  MXFP8Tensor(data f8e4m3 x.shape, scale uint8 E8M0 bytes [x.shape with `axis` // 32], axis)
  NVFP4Tensor(data float4_e2m1fn x.shape (unpacked), block_scale f8e4m3 [..., K // 16],
              global_scale f32 [] (PER_TENSOR) or [..., 1] (PER_TOKEN), scaling)
  e8m0_to_f32(u8) -> f32; pack_fp4(f4 [..., 2n]) -> u8 [..., n]; unpack_fp4(u8 [..., n]) -> f4 [..., 2n]
  The quantized dimension must be divisible by its block (32 or 16): the quantizers raise, they never pad.
  ops: quantize_mxfp8(x, axis=-1, scale_mode=RCEIL, *, impl=PALLAS, interpret=None, config=TuningConfig())
       quantize_nvfp4(x, scaling=PER_TOKEN, *, rounding=NEAREST, key=None, impl=PALLAS, interpret=None, config=...)
       dequantize_mxfp8(q, dtype=f32), dequantize_nvfp4(q, dtype=f32)

Both containers are frozen dataclasses registered as pytrees: the arrays are children, `axis` / `scaling`
static metadata, so they pass through jit, custom_vjp residuals and tree utilities.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect

import jax
import jax.numpy as jnp
import numpy as np

MXFP8_BLOCK = 32
NVFP4_BLOCK = 16
E4M3_MAX = 448.0
E2M1_MAX = 6.0
# E8M0 byte for NaN (OCP MX v1.0 section 5.4.1); bytes 0..254 encode 2^(byte - 127).
E8M0_NAN = 0xFF
E8M0_BIAS = 127


_SDS_FIELDS = frozenset(inspect.signature(jax.ShapeDtypeStruct).parameters)  # read once, not per kernel trace


def out_struct(shape: tuple[int, ...], dtype, *inputs: jax.Array) -> jax.ShapeDtypeStruct:
  """A `pallas_call` output's ShapeDtypeStruct, varying over every manual mesh axis that its inputs vary over.

  Inside `jax.shard_map` with `check_vma=True` (the expert-parallel MoE's region) a Pallas output must say which
  mesh axes it varies over; outside any shard_map that set is empty and this is a plain ShapeDtypeStruct. jax 0.10
  spells the field `manual_axis_type` (a `ManualAxisType`), earlier releases `vma` (a frozenset).
  """
  axes = frozenset()
  for x in inputs:
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    axes |= mat.varying if mat is not None else frozenset(getattr(aval, "vma", ()))
  if "manual_axis_type" in _SDS_FIELDS:
    from jax._src.core import ManualAxisType  # not exported by jax 0.10
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=ManualAxisType(varying=axes))
  if "vma" in _SDS_FIELDS:
    return jax.ShapeDtypeStruct(shape, dtype, vma=axes)
  return jax.ShapeDtypeStruct(shape, dtype)


class ScaleMode(enum.Enum):
  """How the MXFP8 shared (E8M0) exponent of a 32-element block is chosen from the block amax.

  RCEIL: scale = 2^ceil(log2(amax / 448)), as cuBLAS and TransformerEngine do; no value saturates.
  FLOOR: scale = 2^(floor(log2(amax)) - 8), the OCP MX v1.0 rule (section 6.3, emax_elem(E4M3) = 8),
    with a saturating cast: values up to 1.75x past 448 clamp to 448.
  """

  RCEIL = "rceil"
  FLOOR = "floor"


class NVFP4Scaling(enum.Enum):
  """Granularity of the NVFP4 second-level (FP32) scale.

  PER_TENSOR: one amax for the whole tensor (TransformerEngine's default): a token's code depends on every
    other token in the batch, which leaks information across tokens (and, in a causal model, from the future).
  PER_TOKEN: one amax per row (per token): a row's code depends only on that row.
  """

  PER_TOKEN = "per_token"
  PER_TENSOR = "per_tensor"


class Rounding(enum.Enum):
  """Rounding into the E2M1 grid: NEAREST (ties to even) for weights and activations, STOCHASTIC
  (counter-based, unbiased) for gradient casts."""

  NEAREST = "nearest"
  STOCHASTIC = "stochastic"


class Impl(enum.Enum):
  """Which implementation a public quantizer runs: the Pallas kernel or the pure-jnp reference."""

  PALLAS = "pallas"
  REFERENCE = "reference"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MXFP8Tensor:
  """An MXFP8 (OCP MX v1.0) tensor: E4M3 values with one E8M0 scale per 32 elements along `axis`.

  Attributes:
    data: float8_e4m3fn, the shape of the original tensor.
    scale: uint8 E8M0 bytes (2^(byte - 127); 0xFF is NaN), the original shape with dim `axis` divided by 32.
    axis: the (non-negative) quantized axis: the contraction axis of the matmul that consumes the tensor.
  """

  data: jax.Array
  scale: jax.Array
  axis: int = dataclasses.field(metadata=dict(static=True))

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.data.shape)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NVFP4Tensor:
  """An NVFP4 tensor quantized along its last axis: x ~= data * block_scale * global_scale.

  Attributes:
    data: float4_e2m1fn, the shape of the original tensor (unpacked; `pack_fp4` gives the 2-per-byte storage).
    block_scale: float8_e4m3fn decode scale per 16 elements, shape x.shape[:-1] + (K // 16,).
    global_scale: float32 decode scale 1 / S_enc: shape () for PER_TENSOR, x.shape[:-1] + (1,) for PER_TOKEN.
    scaling: which granularity `global_scale` has.
  """

  data: jax.Array
  block_scale: jax.Array
  global_scale: jax.Array
  scaling: NVFP4Scaling = dataclasses.field(metadata=dict(static=True))

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.data.shape)


def pow2(exponent: jax.Array) -> jax.Array:
  """2.0^exponent as float32 for integer exponents in [-126, 127], built from the exponent bits.

  Exact, and never a subnormal, so platforms that flush denormals (XLA on CPU) give the same answer.
  """
  biased = (exponent.astype(jnp.int32) + E8M0_BIAS).astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(biased << 23, jnp.float32)


def mul_pow2(x: jax.Array, exponent: jax.Array) -> jax.Array:
  """x * 2^exponent for integer exponents in [-254, 254], exact unless the true result under/overflows.

  Two normal factors instead of one possibly subnormal 2^exponent (2^-127 is subnormal in float32).
  """
  e = exponent.astype(jnp.int32)
  half = e // 2
  return x * pow2(half) * pow2(e - half)


def e8m0_to_f32(scale_u8: jax.Array) -> jax.Array:
  """Decodes E8M0 bytes: 2^(byte - 127), byte 0 is the subnormal 2^-127, 0xFF is NaN.

  Args:
    scale_u8: uint8 array of E8M0 bytes, any shape.

  Returns:
    float32 array of the same shape.
  """
  b = scale_u8.astype(jnp.uint32)
  bits = jnp.where(b == 0, jnp.uint32(0x00400000), b << 23)
  bits = jnp.where(b == E8M0_NAN, jnp.uint32(0x7FC00000), bits)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def fp4_codes(x: jax.Array) -> jax.Array:
  """The 4-bit E2M1 codes (sign << 3 | magnitude index) of a float4_e2m1fn array, as uint8."""
  return jax.lax.bitcast_convert_type(x, jnp.uint4).astype(jnp.uint8)


def fp4_from_codes(codes: jax.Array) -> jax.Array:
  """float4_e2m1fn values from 4-bit codes held in uint8 (high nibble ignored)."""
  return jax.lax.bitcast_convert_type((codes & 0xF).astype(jnp.uint4), jnp.float4_e2m1fn)


def pack_fp4(x_fp4: jax.Array) -> jax.Array:
  """Packs two E2M1 values per byte along the last axis, element 2i in the low nibble (the cuBLAS/PTX order).

  Args:
    x_fp4: float4_e2m1fn [..., 2n].

  Returns:
    uint8 [..., n].
  """
  if x_fp4.shape[-1] % 2:
    raise ValueError(f"pack_fp4 needs an even last dimension, got shape {x_fp4.shape}; pad the last axis by one.")
  codes = fp4_codes(x_fp4).reshape(*x_fp4.shape[:-1], x_fp4.shape[-1] // 2, 2)
  return codes[..., 0] | (codes[..., 1] << 4)


def unpack_fp4(packed: jax.Array) -> jax.Array:
  """Inverse of `pack_fp4`: uint8 [..., n] -> float4_e2m1fn [..., 2n]."""
  codes = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
  return fp4_from_codes(codes.reshape(*packed.shape[:-1], packed.shape[-1] * 2))


# The E2M1 grid, by magnitude code 0..7.
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
