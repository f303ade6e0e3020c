"""Correctly rounded float32 division from integer operations alone: the same bits on every backend.

IEEE-754 division rounds the exact quotient to the nearest float32, ties to even. What a backend's `/` gives is
another matter: XLA:GPU compiles every float32 division to PTX `div.full.f32` (2 ulp; it sets
`-nvptx-prec-divf32=1`) and `1 / x` to `rcp.approx`, Triton compiles `arith.divf` to `div.full.f32`, while XLA:CPU
divides exactly. The NVFP4 quantizer's encode scales are reciprocals whose last bit decides E2M1 codes (a 1-ulp
change of a scale flips codes of the block's values that sit on a rounding boundary), so a quantizer that uses `/`
is bit-exact on one backend and off on another. `divide` computes the IEEE quotient by long division on the 24-bit
significands in int32 (compares, subtracts and shifts, which are exact everywhere) and is traceable both in jnp and
inside Pallas kernels (Triton and the interpreter): the kernel and the reference agree with TransformerEngine's CUDA
path (`nvcc` divides exactly by default) on every backend.

Every float32 is handled, subnormals included (as inputs and results, never flushed) and the IEEE special cases:
x / 0 = +-Inf (0 / 0 = NaN), x / Inf = +-0, Inf / Inf = NaN, NaN propagates (as the canonical quiet NaN 0x7FC00000).
Cost: 25 unrolled steps of a few int32 operations per element; the quantizers divide once per block, not per value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_SIGN = 0x80000000
_ABS = 0x7FFFFFFF
_INF = 0x7F800000
_QNAN = 0x7FC00000
_IMPLICIT = 1 << 23  # the hidden significand bit of a normal float32
_QUOTIENT_BITS = 25  # 24 significand bits and the rounding bit; the remainder gives the sticky bit


def _u32(x: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(x, jnp.uint32)


def _unpack(abs_bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(significand m in [2^23, 2^24), exponent e) with |x| = m * 2^e, for finite nonzero |x| given as uint32 bits.

  A subnormal's significand (below 2^23) is normalized by shifting it left in halving steps (16, 8, 4, 2, 1), which
  every backend lowers (no count-leading-zeros needed).
  """
  biased = jax.lax.shift_right_logical(abs_bits, jnp.uint32(23)).astype(jnp.int32)
  frac = (abs_bits & jnp.uint32(_IMPLICIT - 1)).astype(jnp.int32)
  normal = biased > 0
  m = jnp.where(normal, frac | _IMPLICIT, frac)
  e = jnp.where(normal, biased - 150, -149)
  for step in (16, 8, 4, 2, 1):
    short = m < (1 << (24 - step))  # m has at most 24 - step significant bits: it can move left by `step`
    m = jnp.where(short, jax.lax.shift_left(m, jnp.int32(step)), m)
    e = jnp.where(short, e - step, e)
  return m, e


def divide(a: jax.Array, b: jax.Array) -> jax.Array:
  """a / b rounded to the nearest float32, ties to even, computed with int32 operations only.

  Args:
    a, b: float32 arrays of the same shape (broadcast them first).
  Returns:
    float32 [shape of a]: the IEEE-754 quotient, bit for bit (NaN results are the canonical quiet NaN).
  """
  a = jnp.asarray(a, jnp.float32)
  b = jnp.asarray(b, jnp.float32)
  ua, ub = _u32(a), _u32(b)
  sign = (ua ^ ub) & jnp.uint32(_SIGN)
  abs_a, abs_b = ua & jnp.uint32(_ABS), ub & jnp.uint32(_ABS)
  nan_a, nan_b = abs_a > jnp.uint32(_INF), abs_b > jnp.uint32(_INF)
  inf_a, inf_b = abs_a == jnp.uint32(_INF), abs_b == jnp.uint32(_INF)
  zero_a, zero_b = abs_a == jnp.uint32(0), abs_b == jnp.uint32(0)

  ma, ea = _unpack(abs_a)
  mb, eb = _unpack(abs_b)
  # Quotient of significands in [1, 2): when ma < mb, double ma (below 2^25, in int32) and take one from the exponent.
  low = ma < mb
  r = jnp.where(low, jax.lax.shift_left(ma, jnp.int32(1)), ma)

  def step(_, carry):  # restoring long division, one quotient bit per step; r stays below 2 * mb
    r, q = carry
    bit = r >= mb
    r = jnp.where(bit, r - mb, r)
    return jax.lax.shift_left(r, jnp.int32(1)), jax.lax.shift_left(q, jnp.int32(1)) | bit.astype(jnp.int32)

  # A loop, not 25 unrolled steps: XLA:CPU in jax 0.12 did not finish compiling the unrolled chain inside the NVFP4
  # quantizer (minutes, where the loop compiles in a fraction of a second).
  r, q = jax.lax.fori_loop(0, _QUOTIENT_BITS, step, (r, jnp.zeros_like(r)))
  sticky = r != 0
  # |a / b| = (q / 2^24) * 2^x, q in [2^24, 2^25): biased exponent of the result before rounding.
  biased = ea - eb - low.astype(jnp.int32) + 127
  # Subnormal results keep fewer bits: drop `extra` more bits than the rounding bit, all of them into the sticky bit.
  extra = jnp.clip(1 - biased, 0, _QUOTIENT_BITS + 1)
  kept = jax.lax.shift_right_logical(q, extra + 1)
  round_bit = jax.lax.shift_right_logical(q, extra) & 1
  sticky = sticky | ((q & (jax.lax.shift_left(jnp.int32(1), extra) - 1)) != 0)
  up = (round_bit == 1) & (sticky | ((kept & 1) == 1))
  rounded = kept + up.astype(jnp.int32)
  # For a normal result `rounded` holds the hidden bit, which adds one to the exponent field: (biased - 1) << 23;
  # a carry out of the significand (rounded == 2^24) moves to the next binade, or to Inf past the largest float.
  exponent_field = jnp.where(biased > 0, biased - 1, 0)
  finite = jax.lax.shift_left(exponent_field, jnp.int32(23)) + rounded
  magnitude = jnp.where(biased >= 255, jnp.int32(_INF), finite).astype(jnp.uint32)

  magnitude = jnp.where(inf_a | zero_b, jnp.uint32(_INF), magnitude)
  magnitude = jnp.where(zero_a | inf_b, jnp.uint32(0), magnitude)
  out = magnitude | sign
  is_nan = nan_a | nan_b | (zero_a & zero_b) | (inf_a & inf_b)
  out = jnp.where(is_nan, jnp.uint32(_QNAN), out)
  return jax.lax.bitcast_convert_type(out, jnp.float32)


def reciprocal(x: jax.Array) -> jax.Array:
  """1 / x rounded to the nearest float32 (`divide(1, x)`)."""
  x = jnp.asarray(x, jnp.float32)
  return divide(jnp.ones_like(x), x)
