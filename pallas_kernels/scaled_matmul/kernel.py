"""Pallas block-scaled matmul: quantized operands in, float32 accumulation, scales applied in the accumulator.

Both operands are K-major (the contraction axis last), as Hopper's fp8 wgmma requires and as
`jax.nn.scaled_matmul` takes them: out [M, N] = lhs [M, K] . rhs [N, K]^T.

How the scales enter (Composer 2 report section 5, the MXFP8 / NVFP4 recipe; issue 10 "Kernels"):
  MXFP8: for every 32-wide K-step s, partial = dot(a[:, s], b[:, s]) on the raw E4M3 values (an fp8 dot with an
    f32 result), then acc += partial * 2^ea[:, s] * 2^eb[:, s]^T. Hopper has fp8 MMA but no block-scaled MMA, so
    the E8M0 scales are applied to the partial product in the float32 accumulator, never to the fp8 inputs.
  NVFP4: the packed E2M1 codes are unpacked in-kernel (two per byte, element 2i in the low nibble) and multiplied
    by their E4M3 block scale; e2m1 x e4m3 has at most 6 significant bits (1.5 x 1.875), so this product is exact
    in bf16 and the dot runs on bf16 values. Packed bytes hold even elements in the low and odd elements in the high
    nibble: instead of interleaving them back, the kernel contracts evens with evens and odds with odds (the contraction
    is a sum, so the order of k does not matter). The FP32 second-level scales (per row of lhs, per row of rhs:
    per token and per output channel) multiply the tile once, in the epilogue.
  PLAIN: unscaled float operands (bf16 / f32), for the high-precision grouped matmul.

Every kernel here reads its inputs as whole arrays (memory space ANY) and slices them with `pl.ds`, so the same
source serves the dense kernel and the grouped kernels of `pallas_kernels.grouped_matmul`, whose row ranges are
data-dependent. It runs under `interpret=True` on CPU; compiled, it uses Pallas' Triton lowering (scalar loads,
dynamic slices and masked dots lower there, while Mosaic GPU's layout inference rejects this portable body; a
Mosaic GPU / wgmma version with TMA pipelining is the next step for speed).
"""

from __future__ import annotations

import dataclasses
import enum
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels.formats import E8M0_NAN, MXFP8_BLOCK, NVFP4_BLOCK, out_struct


class OperandFormat(enum.Enum):
  """Encoding of one kernel operand (arrays listed in `Operand`)."""

  PLAIN = "plain"
  MXFP8 = "mxfp8"
  NVFP4 = "nvfp4"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Operand:
  """A K-major kernel operand: rows [..., R] by contraction [C], optionally with leading group dims.

  Attributes:
    data: PLAIN float [..., R, C]; MXFP8 float8_e4m3fn [..., R, C]; NVFP4 packed uint8 [..., R, C // 2].
    block_scale: MXFP8 uint8 E8M0 [..., R, C // 32]; NVFP4 float8_e4m3fn [..., R, C // 16]; PLAIN None.
    global_scale: NVFP4 float32 [..., R, 1] (per row: per token, or per output channel); otherwise None.
    format: the encoding.
  """

  data: jax.Array
  block_scale: jax.Array | None
  global_scale: jax.Array | None
  format: OperandFormat = dataclasses.field(metadata=dict(static=True))

  @property
  def rows(self) -> int:
    return self.data.shape[-2]

  @property
  def contraction(self) -> int:
    c = self.data.shape[-1]
    return 2 * c if self.format is OperandFormat.NVFP4 else c

  def arrays(self) -> tuple[jax.Array, ...]:
    return tuple(a for a in (self.data, self.block_scale, self.global_scale) if a is not None)


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """Tile sizes. block_m x block_n is one program's output tile; block_k the contraction chunk per loop step.

  Tiles larger than the problem shrink to it; block_k shrinks to a divisor of K that is a multiple of 32
  (the MXFP8 scale block) for quantized operands.
  """

  # 64 x 64 x 64 on 4 warps: no register spill in any operand format on an H100 (ptxas -v; docs/benchmarks.md,
  # "tools/gpu_compile.py"), where 64 x 64 x 128 spilled for NVFP4 and 128-wide tiles need 8 warps.
  block_m: int = 64
  block_n: int = 64
  block_k: int = 64
  num_warps: int = 4

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_k", "num_warps"):
      v = getattr(self, name)
      low = 1 if name == "num_warps" else 8
      if v < low or v & (v - 1):
        raise ValueError(f"TuningConfig.{name}={v} must be a power of two >= {low}.")

  def for_operand(self, op: Operand) -> TuningConfig:
    """These tiles, at most 32 x 32 x 32 for float32 PLAIN operands: their dots run at IEEE float32 (`_dot_nt`; no
    tensor cores), whose per-thread partial products spill registers at larger tiles."""
    if op.format is OperandFormat.PLAIN and op.data.dtype == jnp.float32:
      return dataclasses.replace(self, block_m=min(self.block_m, 32), block_n=min(self.block_n, 32),
                                 block_k=min(self.block_k, 32))
    return self


def next_pow2(n: int) -> int:
  """The smallest power of two >= n (1 for n <= 1)."""
  return 1 << max(0, int(n) - 1).bit_length()


def row_block(block: int, rows: int) -> int:
  """The row tile for `rows` rows: `block`, or the next power of two >= rows (>= 8) when smaller."""
  return min(block, max(8, next_pow2(rows)))


def contraction_block(block_k: int, k: int, fmt: OperandFormat) -> int:
  """The contraction chunk for K = k: the largest power of two <= block_k dividing k, at least the format's
  quantum (32 for quantized operands, which Triton's power-of-two tiles need); a PLAIN K without a power-of-two
  divisor >= 16 falls back to its largest divisor <= block_k (interpreter only)."""
  quantum = 1 if fmt is OperandFormat.PLAIN else MXFP8_BLOCK
  if k % quantum:
    raise ValueError(f"The contraction dim {k} of a {fmt.value} matmul must be a multiple of {quantum}; pad K.")
  b = min(block_k, next_pow2(k))
  while k % b:
    b //= 2
  if b >= max(quantum, 16):
    return b
  b = min(block_k, k)
  while k % b:
    b -= 1
  return b


def check_pair(lhs: Operand, rhs: Operand):
  """Raises ValueError, naming the fix, when two operands cannot be contracted together."""
  if lhs.format is not rhs.format:
    raise ValueError(f"Operands are {lhs.format.value} and {rhs.format.value}; quantize both operands to the same "
                     "format (the recipe pairs NVFP4 with NVFP4 forward and MXFP8 with MXFP8 backward).")
  if lhs.contraction != rhs.contraction:
    raise ValueError(f"Contraction dims differ: lhs {lhs.contraction}, rhs {rhs.contraction}; both operands must be "
                     "K-major with the same K (rhs is [N, K]).")


# ----------------------------------------------------------------------------------------------------------------
# In-kernel tile arithmetic (shared with pallas_kernels.grouped_matmul.kernel)
# ----------------------------------------------------------------------------------------------------------------


def _dot_nt(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [r, c] . b [s, c]^T -> [r, s] in float32.

  HIGHEST: Pallas' Triton lowering turns a DEFAULT-precision float32 dot into a TF32 `mma` (10-bit mantissas,
  errors ~1e-3 relative), so PLAIN float32 operands would silently lose precision on a GPU and nowhere else;
  HIGHEST asks for IEEE float32 inputs there. For bf16, fp8 and the dequantized operands it changes nothing.
  """
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=jax.lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32)


def _e8m0(byte: jax.Array) -> jax.Array:
  """E8M0 bytes -> float32 2^(byte - 127) (byte 0: the subnormal 2^-127; 0xFF: NaN), from the exponent bits."""
  b = byte.astype(jnp.int32)
  bits = jnp.where(b == 0, jnp.int32(0x00400000), b << 23)
  bits = jnp.where(b == E8M0_NAN, jnp.int32(0x7FC00000), bits)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _e2m1(code: jax.Array) -> jax.Array:
  """4-bit E2M1 codes (uint8, high nibble zero) -> float32 values: sign, 2 exponent bits, 1 mantissa bit."""
  c = code.astype(jnp.int32)
  e = (c >> 1) & 3
  m = (c & 1).astype(jnp.float32)
  mag = jnp.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * jnp.where(e == 1, 1.0, jnp.where(e == 2, 2.0, 4.0)))
  return jnp.where((c & 8) != 0, -mag, mag)


def _masked(x: jax.Array, k0, krange) -> jax.Array:
  """x [r, w] (contraction positions k0 .. k0 + w) with positions outside krange = (start, end) zeroed."""
  if krange is None:
    return x
  ids = k0 + jax.lax.broadcasted_iota(jnp.int32, (1, x.shape[1]), 1)  # built per step: Triton cannot slice a mask
  return jnp.where((ids >= krange[0]) & (ids < krange[1]), x, jnp.zeros((), x.dtype))


@dataclasses.dataclass(frozen=True)
class TileRefs:
  """One operand's refs inside a kernel, and the leading index (e.g. the group) that selects its matrix."""

  format: OperandFormat
  data: object
  block_scale: object = None
  global_scale: object = None
  lead: tuple = ()

  def _get(self, ref, rows, cols):
    return ref[(*self.lead, rows, cols)]

  def plain(self, rows, k0, width, krange):
    return _masked(self._get(self.data, rows, pl.ds(k0, width)), k0, krange)

  def mxfp8_step(self, rows, k0, krange):
    """E4M3 values [r, 32] of the 32-wide step at k0 and their float32 scale [r, 1]."""
    vals = _masked(self._get(self.data, rows, pl.ds(k0, MXFP8_BLOCK)), k0, krange)
    return vals, _e8m0(self._get(self.block_scale, rows, pl.ds(k0 // MXFP8_BLOCK, 1)))

  def nvfp4_halves(self, rows, k0, width):
    """(even, odd) elements of the chunk [k0, k0 + width), each [r, width // 2] bf16, block scales folded in."""
    packed = self._get(self.data, rows, pl.ds(k0 // 2, width // 2))
    scale = self._get(self.block_scale, rows, pl.ds(k0 // NVFP4_BLOCK, width // NVFP4_BLOCK)).astype(jnp.float32)
    # Element 2j or 2j + 1 of the chunk lies in its block j // 8 (16 elements = 8 bytes per block).
    scale = jnp.repeat(scale, NVFP4_BLOCK // 2, axis=1)
    lo = (_e2m1(packed & 0xF) * scale).astype(jnp.bfloat16)
    hi = (_e2m1(packed >> 4) * scale).astype(jnp.bfloat16)
    return lo, hi

  def row_global(self, rows):
    return self._get(self.global_scale, rows, pl.ds(0, 1))


def chunk_product(a: TileRefs, a_rows, b: TileRefs, b_rows, k0, width: int, krange=None) -> jax.Array:
  """sum over k in [k0, k0 + width) of a[r, k] b[s, k] with block scales applied: float32 [r, s].

  krange = (start, end) keeps only contraction positions in [start, end) (grouped contractions; masking one
  operand would do, both are masked so that NaN in padding cannot leak); NVFP4 global scales are NOT applied
  here (see `epilogue`), so a caller can sum chunks first.
  """
  fmt = a.format
  if fmt is OperandFormat.PLAIN:
    return _dot_nt(a.plain(a_rows, k0, width, krange), b.plain(b_rows, k0, width, krange))
  if fmt is OperandFormat.MXFP8:
    acc = None
    for s in range(width // MXFP8_BLOCK):  # static unroll over the 32-wide scale steps of this chunk
      va, sa = a.mxfp8_step(a_rows, k0 + s * MXFP8_BLOCK, krange)
      vb, sb = b.mxfp8_step(b_rows, k0 + s * MXFP8_BLOCK, krange)
      part = _dot_nt(va, vb) * sa * sb.reshape(1, -1)
      acc = part if acc is None else acc + part
    return acc
  if krange is not None:
    raise NotImplementedError("Masked contraction of NVFP4 operands is not implemented (the recipe's grouped "
                              "contraction runs in MXFP8).")
  a_lo, a_hi = a.nvfp4_halves(a_rows, k0, width)
  b_lo, b_hi = b.nvfp4_halves(b_rows, k0, width)
  return _dot_nt(a_lo, b_lo) + _dot_nt(a_hi, b_hi)


def epilogue(acc: jax.Array, a: TileRefs, a_rows, b: TileRefs, b_rows) -> jax.Array:
  """Applies the NVFP4 per-row second-level scales of both operands to a float32 tile."""
  if a.format is not OperandFormat.NVFP4:
    return acc
  return acc * a.row_global(a_rows) * b.row_global(b_rows).reshape(1, -1)


def tile_refs(op: Operand, refs: list, lead: tuple = ()) -> TileRefs:
  """Pops op's refs (in `Operand.arrays` order) from the front of `refs`."""
  n = len(op.arrays())
  got, refs[:n] = refs[:n], []
  return TileRefs(op.format, *got, *([None] * (3 - n)), lead=lead)


ANY = pl.BlockSpec(memory_space=pl.ANY)


def compiler_params(config: TuningConfig, interpret: bool):
  """The Triton lowering when compiled for GPU (scalar loads, dynamic slices and masked dots lower there; Mosaic
  GPU's layout inference rejects them); nothing when interpreted."""
  return None if interpret else plt.CompilerParams(num_warps=config.num_warps)


# ----------------------------------------------------------------------------------------------------------------
# Dense kernel
# ----------------------------------------------------------------------------------------------------------------


def _dense_kernel(*refs, lhs: Operand, rhs: Operand, bm: int, bn: int, bk: int, out_dtype):
  refs = list(refs)
  out_ref = refs.pop()
  a = tile_refs(lhs, refs)
  b = tile_refs(rhs, refs)
  i, j = pl.program_id(0), pl.program_id(1)
  a_rows, b_rows = pl.ds(i * bm, bm), pl.ds(j * bn, bn)

  def step(kk, acc):
    return acc + chunk_product(a, a_rows, b, b_rows, kk * bk, bk)

  acc = jax.lax.fori_loop(0, lhs.contraction // bk, step, jnp.zeros((bm, bn), jnp.float32))
  out_ref[...] = epilogue(acc, a, a_rows, b, b_rows).astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("out_dtype", "config", "interpret"))
def scaled_matmul_kernel(lhs: Operand, rhs: Operand, *, out_dtype=jnp.float32, config: TuningConfig = TuningConfig(),
                         interpret: bool = False) -> jax.Array:
  """out [M, N] = lhs [M, K] . rhs [N, K]^T with both operands' scales applied (see module docstring).

  M and N are padded up to the row tiles here (pad rows are zero and sliced off).
  """
  check_pair(lhs, rhs)
  m, n, k = lhs.rows, rhs.rows, lhs.contraction
  config = config.for_operand(lhs)
  bm, bn = row_block(config.block_m, m), row_block(config.block_n, n)
  bk = contraction_block(config.block_k, k, lhs.format)
  lhs, rhs = pad_rows(lhs, bm), pad_rows(rhs, bn)
  mp, np_ = lhs.rows, rhs.rows
  kernel = functools.partial(_dense_kernel, lhs=lhs, rhs=rhs, bm=bm, bn=bn, bk=bk, out_dtype=out_dtype)
  args = (*lhs.arrays(), *rhs.arrays())
  out = pl.pallas_call(
      kernel, out_shape=out_struct((mp, np_), out_dtype, *args), grid=(mp // bm, np_ // bn),
      in_specs=[ANY] * len(args), out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      interpret=interpret, compiler_params=compiler_params(config, interpret), name="scaled_matmul")(*args)
  return out[:m, :n]


def pad_contraction(op: Operand, multiple: int) -> Operand:
  """Pads the contraction (last) dim of op with zeros (zero values, zero scale bytes) up to a multiple of
  `multiple` (a multiple of the scale block for quantized operands)."""
  pad = -op.contraction % multiple
  if not pad:
    return op
  per = {OperandFormat.PLAIN: (1, None), OperandFormat.MXFP8: (1, MXFP8_BLOCK), OperandFormat.NVFP4: (2, NVFP4_BLOCK)}
  data_div, block = per[op.format]

  def p(a, n):
    return None if a is None else jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, n)])

  return Operand(p(op.data, pad // data_div), p(op.block_scale, pad // block if block else 0), op.global_scale,
                 op.format)


def pad_rows(op: Operand, multiple: int) -> Operand:
  """Pads the row dim (-2) of every array of op with zeros up to a multiple of `multiple`."""
  r = op.rows
  pad = -r % multiple
  if not pad:
    return op

  def p(a):
    if a is None:
      return None
    widths = [(0, 0)] * a.ndim
    widths[-2] = (0, pad)
    return jnp.pad(a, widths)

  return Operand(p(op.data), p(op.block_scale), p(op.global_scale), op.format)
