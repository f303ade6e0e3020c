"""MXFP8 / NVFP4 quantizers: Pallas kernels vs the jnp reference (bit for bit), the reference vs an independent
scalar numpy computation, round-trip SQNR, the per-token property (with PER_TENSOR as the negative control),
stochastic rounding, the random Hadamard transform, and jax.nn's quantizer as a peer."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels import formats
from pallas_kernels.formats import Impl, NVFP4Scaling, Rounding, ScaleMode
from pallas_kernels.quantize import hadamard, kernel, ops, reference
from tests.pallas_kernels.kernel_case import CompiledOnGpu

pytestmark = pytest.mark.fusion_emitters  # float4 containers: XLA:CPU's element-wise emitters cannot lower them

F32 = np.float32
E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _bits(a) -> np.ndarray:
  a = np.atleast_1d(np.asarray(a))
  if a.dtype == ml_dtypes.float4_e2m1fn:
    return np.asarray(formats.fp4_codes(jnp.asarray(a)))
  return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _assert_bitwise(test, a, b):
  """Every leaf of two pytrees (e.g. MXFP8Tensor / NVFP4Tensor) identical bit for bit."""
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  test.assertEqual(len(la), len(lb))
  test.assertEqual(jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(la, lb):
    test.assertEqual(np.asarray(x).dtype, np.asarray(y).dtype)
    test.assertEqual(np.shape(x), np.shape(y))
    np.testing.assert_array_equal(_bits(x), _bits(y))


def _assert_same_values(test, actual, expected):
  """Equal values with NaN == NaN (NaN sign/payload bits differ between numpy and XLA)."""
  a = np.asarray(actual).astype(np.float64)
  e = np.asarray(expected).astype(np.float64)
  test.assertEqual(a.shape, e.shape)
  np.testing.assert_array_equal(np.isnan(a), np.isnan(e))
  ok = ~np.isnan(e)
  np.testing.assert_array_equal(a[ok], e[ok])
  # -0 and +0 are different codes: compare signs too.
  np.testing.assert_array_equal(np.signbit(a[ok]), np.signbit(e[ok]))


def _normal(seed: int, shape) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def _sqnr_db(x, y) -> float:
  x = np.asarray(x, np.float64)
  return float(10 * np.log10(np.sum(x**2) / np.sum((x - np.asarray(y, np.float64))**2)))


# ------------------------------------------------------------------------------ independent scalar numpy references


def np_mxfp8(x: np.ndarray, mode: ScaleMode) -> tuple[np.ndarray, np.ndarray]:
  """MXFP8 of a [R, K] float32 matrix along K, one block at a time in float64 (math.log2, exact power scaling)."""
  r, k = x.shape
  data = np.zeros((r, k), ml_dtypes.float8_e4m3fn)
  scale = np.zeros((r, k // 32), np.uint8)
  for i in range(r):
    for b in range(k // 32):
      v = x[i, 32 * b:32 * (b + 1)].astype(np.float64)
      if not np.all(np.isfinite(v)):
        scale[i, b] = 0xFF
        data[i, 32 * b:32 * (b + 1)] = np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        continue
      amax = float(np.max(np.abs(v)))
      if amax == 0:
        e = -127
      elif mode is ScaleMode.RCEIL:
        e = math.ceil(math.log2(amax / 448.0))
      else:
        e = math.floor(math.log2(amax)) - 8
      e = min(max(e, -127), 127)
      scale[i, b] = e + 127
      data[i, 32 * b:32 * (b + 1)] = np.clip(v / 2.0**e, -448, 448).astype(ml_dtypes.float8_e4m3fn)
  return data, scale


def _e2m1_nearest_even(v: float) -> int:
  """Code of the E2M1 value nearest to v (|v| <= 6), ties to the even code; -0.0 and NaN give +0."""
  if math.isnan(v) or v == 0:
    return 0
  a = abs(v)
  d = [abs(a - g) for g in E2M1_GRID]
  best = min(d)
  idx = [i for i, di in enumerate(d) if di == best]
  mag = idx[0] if len(idx) == 1 else [i for i in idx if i % 2 == 0][0]
  return mag + (8 if v < 0 else 0)


def np_nvfp4(x: np.ndarray, scaling: NVFP4Scaling):
  """TransformerEngine's NVFP4 arithmetic written with numpy float32 scalars, row by row, block by block."""
  r, k = x.shape
  codes = np.zeros((r, k), np.uint8)
  block_scale = np.zeros((r, k // 16), ml_dtypes.float8_e4m3fn)
  s_decs = np.zeros((r, 1), F32)
  f32max = F32(np.finfo(F32).max)
  with np.errstate(all="ignore"):
    tensor_amax = F32(np.max(np.abs(x)))
    for i in range(r):
      amax = F32(np.max(np.abs(x[i]))) if scaling is NVFP4Scaling.PER_TOKEN else tensor_amax
      s_enc = np.minimum(F32(2688.0) / amax, f32max)
      if amax == 0 or s_enc == 0:
        s_enc = F32(1.0)
      s_dec = F32(1.0) / s_enc
      s_decs[i, 0] = s_dec
      for b in range(k // 16):
        blk = x[i, 16 * b:16 * (b + 1)].astype(F32)
        bamax = F32(np.max(np.abs(blk)))
        dec = bamax * (s_enc * (F32(1.0) / F32(6.0)))
        sb = np.array(np.minimum(dec, F32(448.0))).astype(ml_dtypes.float8_e4m3fn)
        block_scale[i, b] = sb
        enc = np.minimum(F32(1.0) / (F32(sb.astype(F32)) * s_dec), f32max)
        v = np.clip(blk * enc, F32(-6.0), F32(6.0))
        codes[i, 16 * b:16 * (b + 1)] = [_e2m1_nearest_even(float(t)) for t in v]
  if scaling is NVFP4Scaling.PER_TENSOR:
    s_decs = s_decs[0, 0]
  return codes, block_scale, s_decs


# --------------------------------------------------------------------------------------------------- edge inputs


def mxfp8_edge_rows() -> np.ndarray:
  """[8, 64] float32: two 32-blocks per row covering the MXFP8 corner cases."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((8, 64)).astype(F32)
  x[0, :32] = 0.0  # all-zero block
  # amax exactly 448 (e = 0 in both modes): E4M3 smallest normal 2^-6, subnormals 2^-7..2^-9, RNE ties.
  x[1, :16] = [448, 2**-6, 2**-7, 2**-9, 2**-10, 3 * 2**-10, 1 + 2**-4, 1 + 3 * 2**-4, -448, -2**-6, 2**-11,
               5 * 2**-10, 240 + 8, 256 + 16, 100.5, -7.0625]
  x[1, 16:32] = 0.5
  # Past 448: RCEIL scales by 2; FLOOR keeps e = 0 and saturates 449..500 to 448.
  x[1, 32:48] = [500, 449, 464, 480, 1.0, -500, -449, 447, 2**-8, 3.0, 0.0, 12.5, 300, 400, -464, 1e-3]
  x[2, 5], x[2, 40] = np.inf, np.nan  # non-finite blocks: NaN scale
  x[3, 7], x[3, 32:] = -np.inf, 1e38 * rng.uniform(0.5, 3.0, 32)  # huge but finite block
  # Tiny block: the exponent clamps at -127 (no float32 subnormals: XLA on CPU flushes them, see reference.py).
  x[4, :32] = np.sign(x[4, :32]) * rng.uniform(0.25, 2.0, 32) * 2.0**-120
  x[4, 32:] = 2.0**-126 * rng.uniform(1.0, 2.0, 32)  # smallest normal floats
  x[5, :32] = 2.0**-126 * 448 * rng.uniform(0.2, 0.9, 32)  # RCEIL at the bottom of the E8M0 range
  x[5, 0] = 2.0**-126 * 448 * (1 + 2**-20)
  x[5, 32:] = rng.uniform(-1, 1, 32) * 448 * 2.0**10
  x[5, 33] = 448 * 2.0**10  # amax exactly 448 * 2^k: e = k, not k + 1
  x[6, 32:] *= 1e5
  return x


def nvfp4_edge_rows() -> np.ndarray:
  """[8, 64] float32: four 16-blocks per row covering the NVFP4 corner cases (rows 6-7 are non-finite)."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 64)).astype(F32)
  x[0] = 0.0  # all-zero row: S_enc = 1
  # Row amax 2688 gives S_enc = 1 and block 1 (amax 6) an encode scale of 1: the E2M1 midpoints land exactly.
  x[1, 0] = 2688.0
  x[1, 16:32] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 6.0, -0.0]
  x[1, 32:48] = [6.3, -6.3, 0.1, 5.5, 5.0000005, -4.9999995, 0.7499999, 0.2500001, 1.0, 2.0, 3.0, 4.0, -6.0, 0.0,
                 1e-9, 2.9999998]  # amax 6.3: block scale rounds down to 1, so +-6.3 saturate to +-6
  x[1, 48:] = 0.0  # zero block inside a non-zero row
  x[2, :16] = 1.0
  x[2, 16:32] *= 1e-5 / np.max(np.abs(x[2, 16:32]))  # E4M3 subnormal block scale
  x[2, 32:48] *= 1e-8  # block scale underflows to 0: the codes saturate but dequantize to +-0
  x[2, 48:] *= (2.0**-6 / 448) / np.max(np.abs(x[2, 48:]))  # block scale at the smallest E4M3 normal
  x[3] *= 1e3
  x[3, 3] = 1e-3
  x[4] = 3e38 * rng.uniform(-1, 1, 64)  # near the float32 maximum
  x[5] *= 1e-30
  x[6, 9], x[6, 40] = np.inf, -np.inf  # Inf saturates
  x[7, 20] = np.nan  # NaN poisons its scaling group
  return x


# --------------------------------------------------------------------------------------------------------- formats


class FormatsTest(parameterized.TestCase):

  def test_e8m0_decoding(self):
    got = np.asarray(formats.e8m0_to_f32(jnp.array([0, 1, 126, 127, 128, 254, 255], jnp.uint8)))
    np.testing.assert_array_equal(got[:6], [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127])
    self.assertTrue(np.isnan(got[6]))

  def test_pack_unpack_round_trip_and_nibble_order(self):
    codes = jnp.arange(32, dtype=jnp.uint8).reshape(2, 16) % 16
    x = formats.fp4_from_codes(codes)
    packed = formats.pack_fp4(x)
    chex.assert_shape(packed, (2, 8))
    self.assertEqual(int(packed[0, 0]), 0x10)  # element 0 in the low nibble, element 1 in the high one
    _assert_bitwise(self, formats.unpack_fp4(packed), x)
    with self.assertRaisesRegex(ValueError, "even last dimension"):
      formats.pack_fp4(formats.fp4_from_codes(jnp.zeros((3,), jnp.uint8)))

  def test_containers_are_pytrees_through_jit(self):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 64)), jnp.float32)
    q = jax.jit(lambda x: reference.quantize_mxfp8(x, axis=0))(x[:, :32].T)
    self.assertIsInstance(q, formats.MXFP8Tensor)
    self.assertEqual(q.axis, 0)
    chex.assert_shape(q.scale, (1, 4))
    n = jax.jit(lambda x: reference.quantize_nvfp4(x, NVFP4Scaling.PER_TENSOR))(x)
    self.assertIs(n.scaling, NVFP4Scaling.PER_TENSOR)
    chex.assert_shape([n.block_scale, n.global_scale], [(4, 4), ()])
    self.assertEqual(n.data.dtype, jnp.float4_e2m1fn)


class ReferenceTest(parameterized.TestCase):
  """The reference against independent scalar numpy code and the error checks (no kernels here)."""

  @parameterized.parameters(ScaleMode.RCEIL, ScaleMode.FLOOR)
  def test_mxfp8_reference_matches_numpy(self, mode):
    x = mxfp8_edge_rows()
    q = reference.quantize_mxfp8(jnp.asarray(x), -1, mode)
    data, scale = np_mxfp8(x, mode)
    np.testing.assert_array_equal(np.asarray(q.scale), scale)
    _assert_same_values(self, q.data, data)
    # Spot checks written out by hand.
    if mode is ScaleMode.FLOOR:
      np.testing.assert_array_equal(np.asarray(q.data[1, 32:36]).astype(F32), [448, 448, 448, 448])
      self.assertEqual(int(q.scale[1, 1]), 127)
    else:
      self.assertEqual(int(q.scale[1, 1]), 128)  # 500 / 448 > 1: scale 2
      self.assertEqual(int(q.scale[5, 1]), 127 + 10)  # amax exactly 448 * 2^10
      self.assertEqual(int(q.scale[5, 0]), 127 - 125)  # 448 * 2^-126 * (1 + 2^-20): e = -125
    self.assertEqual(int(q.scale[0, 0]), 0)
    self.assertEqual([int(q.scale[2, 0]), int(q.scale[2, 1]), int(q.scale[3, 0])], [255, 255, 255])
    self.assertEqual(int(q.scale[4, 0]), 0)  # clamped at 2^-127
    np.testing.assert_array_equal(np.asarray(q.data[1, :6]).astype(F32), [448, 2**-6, 2**-7, 2**-9, 0, 2**-8])

  def test_mxfp8_inner_axis_equals_transposed_last_axis(self):
    x = jnp.asarray(mxfp8_edge_rows())
    a = reference.quantize_mxfp8(x.T, axis=0)
    b = reference.quantize_mxfp8(x, axis=-1)
    _assert_bitwise(self, (a.data.T, a.scale.T), (b.data, b.scale))

  @parameterized.parameters(NVFP4Scaling.PER_TOKEN, NVFP4Scaling.PER_TENSOR)
  def test_nvfp4_reference_matches_numpy(self, scaling):
    full = nvfp4_edge_rows()
    # PER_TENSOR: rows 0-5 (finite), then the non-finite rows alone, since one NaN poisons the whole tensor.
    parts = [full] if scaling is NVFP4Scaling.PER_TOKEN else [full[:6], full[6:]]
    for x in parts:
      q = reference.quantize_nvfp4(jnp.asarray(x), scaling)
      codes, block_scale, s_dec = np_nvfp4(x, scaling)
      np.testing.assert_array_equal(np.asarray(formats.fp4_codes(q.data)), codes)
      _assert_same_values(self, q.block_scale, block_scale)
      _assert_same_values(self, q.global_scale, s_dec)
    if scaling is NVFP4Scaling.PER_TOKEN:
      q = reference.quantize_nvfp4(jnp.asarray(full), scaling)
      mid = np.asarray(q.data[1, 16:32]).astype(F32)  # ties to even, -0.0 coded as +0
      np.testing.assert_array_equal(mid, [0, 1, 1, 2, 2, 4, 4, -0, -1, -1, -2, -2, -4, -4, 6, 0])
      self.assertFalse(np.signbit(mid[15]))
      np.testing.assert_array_equal(np.asarray(q.data[1, 32:34]).astype(F32), [6, -6])
      self.assertEqual(float(q.global_scale[0, 0]), 1.0)  # amax 0 -> S_enc = 1
      self.assertLess(float(q.block_scale[2, 1].astype(F32)), 2.0**-6)  # E4M3 subnormal scale
      self.assertEqual(float(q.block_scale[2, 2].astype(F32)), 0.0)
      self.assertTrue(np.all(np.isnan(np.asarray(reference.dequantize_nvfp4(q))[7])))
      self.assertTrue(np.all(np.isfinite(np.asarray(reference.dequantize_nvfp4(q))[:7])))

  def test_divisibility_and_argument_errors(self):
    with self.assertRaisesRegex(ValueError, "not a multiple of the block size 32"):
      ops.quantize_mxfp8(jnp.zeros((4, 48)))
    with self.assertRaisesRegex(ValueError, "not a multiple of the block size 16"):
      ops.quantize_nvfp4(jnp.zeros((4, 24)))
    with self.assertRaisesRegex(ValueError, "out of range"):
      ops.quantize_mxfp8(jnp.zeros((4, 32)), axis=2)
    with self.assertRaisesRegex(ValueError, "needs a PRNG key"):
      ops.quantize_nvfp4(jnp.zeros((4, 32)), rounding=Rounding.STOCHASTIC)
    with self.assertRaisesRegex(ValueError, "scale mode"):
      ops.quantize_mxfp8(jnp.zeros((4, 32)), -1, "rceil")

  def test_round_trip_sqnr(self):
    x = jnp.asarray(_normal(0, (128, 256)))
    sq = {
        "mxfp8_rceil": _sqnr_db(x, reference.dequantize_mxfp8(reference.quantize_mxfp8(x))),
        "mxfp8_floor": _sqnr_db(x, reference.dequantize_mxfp8(reference.quantize_mxfp8(x, -1, ScaleMode.FLOOR))),
        "mxfp8_rceil_axis0": _sqnr_db(x, reference.dequantize_mxfp8(reference.quantize_mxfp8(x, 0))),
        "nvfp4_per_token": _sqnr_db(x, reference.dequantize_nvfp4(reference.quantize_nvfp4(x))),
        "nvfp4_per_tensor": _sqnr_db(
            x, reference.dequantize_nvfp4(reference.quantize_nvfp4(x, NVFP4Scaling.PER_TENSOR))),
    }
    print("round-trip SQNR on N(0,1) [128, 256] (dB):", {k: round(v, 2) for k, v in sq.items()})
    for k in ("mxfp8_rceil", "mxfp8_floor", "mxfp8_rceil_axis0"):
      self.assertGreaterEqual(sq[k], 18.0, k)
    self.assertGreaterEqual(sq["nvfp4_per_token"], 20.0)
    self.assertGreaterEqual(sq["nvfp4_per_tensor"], 20.0)

  def test_jax_nn_quantizer_peer(self):
    """jax.nn.scaled_dot_general's decomposed-path quantizer (jax._src.cudnn.scaled_matmul_stablehlo.quantize).

    MXFP8: the same RCEIL rule (E8M0 round-up of amax / 448, divide, clip, RNE), so codes match bit for bit on
    finite blocks; it differs on NaN blocks (its round-up overflows the NaN exponent to byte 0).
    NVFP4: it takes a caller-supplied global scale and computes the block scale as amax / 6 of x / global_scale
    with division (TE and we multiply by S_enc * (1/6) and by an encode scale), so with our S_dec as its global
    scale the codes agree except at rounding boundaries.
    """
    try:
      from jax._src.cudnn import scaled_matmul_stablehlo as peer
      config_fn = jax.nn.get_scaled_dot_general_config
    except (ImportError, AttributeError) as e:
      self.skipTest(f"this jax has no scaled_dot_general quantizer to compare against ({e})")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 128)) * np.exp(rng.uniform(-20, 20, (16, 1)))).astype(F32)
    data, scale = jax.jit(lambda x: peer.quantize(x, config_fn("mxfp8")))(jnp.asarray(x))
    ours = reference.quantize_mxfp8(jnp.asarray(x))
    np.testing.assert_array_equal(_bits(data), _bits(ours.data))
    np.testing.assert_array_equal(_bits(scale), _bits(ours.scale))

    x = rng.standard_normal((64, 128)).astype(F32)
    ours = reference.quantize_nvfp4(jnp.asarray(x), NVFP4Scaling.PER_TENSOR)
    data, scale = jax.jit(lambda x, g: peer.quantize(x, config_fn("nvfp4", g)))(
        jnp.asarray(x), ours.global_scale.reshape(1))
    agree = float(np.mean(_bits(data) == _bits(ours.data)))
    print(f"NVFP4 codes equal to jax.nn's quantizer: {agree:.4%}")
    self.assertGreater(agree, 0.99)


# ------------------------------------------------------------------------------------------------ stochastic / RHT


class StochasticRoundingTest(parameterized.TestCase):

  def test_unbiased_on_grid_within_one_step_and_deterministic(self):
    rows = 2048
    # One row of values between grid points (after the encode scale, which is 1 here: row amax 2688, block amax 6).
    v = np.array([0.1, 0.3, 0.6, 1.1, 1.4, 1.9, 2.2, 2.7, 3.3, 3.9, 4.5, 5.2, 5.9, -0.4, -2.9, 6.0], F32)
    row = np.concatenate([v, np.full(16, 6.0, F32), np.zeros(32, F32)])
    row[16] = 2688.0
    x = jnp.asarray(np.tile(row, (rows, 1)))
    key = jax.random.key(7)
    q = reference.quantize_nvfp4(x, rounding=Rounding.STOCHASTIC, key=key)
    np.testing.assert_array_equal(np.asarray(q.block_scale[:, 0]).astype(F32), 1.0)
    got = np.asarray(q.data[:, :16]).astype(F32)
    rne = np.asarray(reference.quantize_nvfp4(x[:1]).data[0, :16]).astype(F32)
    grid = np.array(E2M1_GRID)
    a = np.abs(v)
    lo = np.array([grid[grid <= t].max() for t in a])
    hi = np.array([grid[grid >= t].min() for t in a])
    step = np.where(hi > lo, hi - lo, 1.0)
    # Every draw is one of the two neighbours, hence at most one grid step from round-to-nearest.
    self.assertTrue(np.all((np.abs(got) == lo) | (np.abs(got) == hi)))
    self.assertTrue(np.all(np.abs(got - rne) <= step))
    self.assertTrue(np.all(np.sign(got) * np.sign(v) >= 0))
    # Unbiased: the mean over rows is within 5 standard errors of v; round-to-nearest is not.
    tol = 5 * step / 2 / np.sqrt(rows)
    np.testing.assert_array_less(np.abs(got.mean(0) - v), tol + 1e-7)
    self.assertTrue(np.any(np.abs(rne - v) > tol))
    # Deterministic per key; another key draws differently.
    again = reference.quantize_nvfp4(x, rounding=Rounding.STOCHASTIC, key=key)
    _assert_bitwise(self, again, q)
    other = reference.quantize_nvfp4(x, rounding=Rounding.STOCHASTIC, key=jax.random.key(8))
    self.assertFalse(np.array_equal(_bits(other.data), _bits(q.data)))

  def test_independent_of_batch_composition(self):
    x = jnp.asarray(_normal(0, (6, 64)))
    key = jax.random.key(3)
    full = reference.quantize_nvfp4(x, rounding=Rounding.STOCHASTIC, key=key)
    # One key: a row draws from (key, global row index): appending rows leaves the earlier rows unchanged.
    prefix = reference.quantize_nvfp4(x[:4], rounding=Rounding.STOCHASTIC, key=key)
    _assert_bitwise(self, prefix.data, full.data[:4])
    # One key per row: a row's draw ignores its position, so permuting rows permutes the codes.
    keys = jax.random.split(jax.random.key(4), 6)
    perm = np.array([3, 0, 5, 1, 4, 2])
    a = reference.quantize_nvfp4(x, rounding=Rounding.STOCHASTIC, key=keys)
    b = reference.quantize_nvfp4(x[perm], rounding=Rounding.STOCHASTIC, key=keys[perm])
    _assert_bitwise(self, (b.data, b.block_scale, b.global_scale), (a.data[perm], a.block_scale[perm],
                                                                   a.global_scale[perm]))


class HadamardTest(parameterized.TestCase):

  def test_orthonormal_and_seeded(self):
    m = hadamard.hadamard_matrix(5).astype(np.float64)
    np.testing.assert_allclose(m @ m.T, np.eye(16), atol=1e-12)
    self.assertTrue(set(np.unique(np.abs(m))) == {0.25})
    np.testing.assert_array_equal(hadamard.hadamard_signs(5), hadamard.hadamard_signs(5))
    self.assertFalse(np.array_equal(hadamard.hadamard_signs(5), hadamard.hadamard_signs(6)))

  @parameterized.parameters(-1, 0)
  def test_inverse_norm_and_matmul_invariance(self, axis):
    a = jnp.asarray(_normal(0, (8, 64)))
    b = jnp.asarray(_normal(1, (64, 24)))
    x = a if axis == -1 else b
    y = hadamard.random_hadamard(x, axis=axis, seed=11)
    chex.assert_trees_all_close(hadamard.inverse_random_hadamard(y, axis=axis, seed=11), x, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(y), np.linalg.norm(x), rtol=1e-5)
    self.assertGreater(float(jnp.max(jnp.abs(y - x))), 0.1)
    if axis == -1:  # the contraction axis of both operands: the product is unchanged
      ab = hadamard.random_hadamard(a, -1, seed=11) @ hadamard.random_hadamard(b, 0, seed=11)
      chex.assert_trees_all_close(ab, a @ b, atol=1e-4)
    with self.assertRaisesRegex(ValueError, "multiple of 16"):
      hadamard.random_hadamard(jnp.zeros((4, 24)), axis=-1)


# ------------------------------------------------------------------------------------------------------- kernels


class QuantizeKernelInterpretTest(parameterized.TestCase):
  """Pallas kernels against the reference, interpreted (tests/pallas_kernels/kernel_case.py)."""

  interpret = True

  def _mx(self, x, axis=-1, mode=ScaleMode.RCEIL, config=kernel.TuningConfig()):
    return ops.quantize_mxfp8(x, axis, mode, impl=Impl.PALLAS, interpret=self.interpret, config=config)

  def _nv(self, x, scaling=NVFP4Scaling.PER_TOKEN, config=kernel.TuningConfig(), **kw):
    return ops.quantize_nvfp4(x, scaling, impl=Impl.PALLAS, interpret=self.interpret, config=config, **kw)

  @parameterized.parameters(ScaleMode.RCEIL, ScaleMode.FLOOR)
  def test_mxfp8_bitexact_edge_rows_both_layouts(self, mode):
    x = jnp.asarray(mxfp8_edge_rows())
    _assert_bitwise(self, self._mx(x, -1, mode), reference.quantize_mxfp8(x, -1, mode))
    # The transposed operand: blocks along axis 0 of [64, 8], i.e. the same blocks read column-wise.
    _assert_bitwise(self, self._mx(x.T, 0, mode), reference.quantize_mxfp8(x.T, 0, mode))

  def test_mxfp8_bitexact_3d_experts_bf16_small_tiles(self):
    w = jnp.asarray(_normal(1, (2, 64, 16)) * np.exp(np.random.default_rng(2).uniform(-8, 8, (2, 1, 16))),
                    jnp.bfloat16)
    want = reference.quantize_mxfp8(w, -2)
    chex.assert_shape(want.scale, (2, 2, 16))
    # [E, K, N] along K, several programs along each grid axis (the default tiles run in the edge-row test).
    _assert_bitwise(self, self._mx(w, -2, config=kernel.TuningConfig(block_groups=1, block_cols=8)), want)
    a = w.reshape(4, 16, 32)  # [E, C, K] along K
    _assert_bitwise(self, self._mx(a, -1, config=kernel.TuningConfig(block_rows=2)), reference.quantize_mxfp8(a))

  @parameterized.parameters(NVFP4Scaling.PER_TOKEN, NVFP4Scaling.PER_TENSOR)
  def test_nvfp4_bitexact_edge_rows(self, scaling):
    full = nvfp4_edge_rows()
    parts = [full] if scaling is NVFP4Scaling.PER_TOKEN else [full[:6], full[6:]]
    for x in parts:
      x = jnp.asarray(x)
      _assert_bitwise(self, self._nv(x, scaling), reference.quantize_nvfp4(x, scaling))

  def test_nvfp4_bitexact_3d_bf16_and_stochastic_any_tiling(self):
    x = jnp.asarray(_normal(3, (2, 8, 64)) * 5, jnp.bfloat16)
    _assert_bitwise(self, self._nv(x), reference.quantize_nvfp4(x))  # PER_TENSOR: in the edge-row test
    key = jax.random.key(9)
    want = reference.quantize_nvfp4(x, rounding=Rounding.STOCHASTIC, key=key)
    # The same draws whatever the tiling: the bits hang on global (row, column) indices.
    for config in (kernel.TuningConfig(), kernel.TuningConfig(block_rows=4, block_groups=2)):
      _assert_bitwise(self, self._nv(x, rounding=Rounding.STOCHASTIC, key=key, config=config), want)

  @parameterized.parameters(NVFP4Scaling.PER_TOKEN, NVFP4Scaling.PER_TENSOR)
  def test_per_token_row_independence(self, scaling):
    """The report's finding: with PER_TOKEN, row i's codes do not move when other (e.g. later) rows are
    perturbed, permuted or appended; with PER_TENSOR the same check detects the dependence."""
    x = jnp.asarray(_normal(5, (8, 64)))
    i = 2
    base = self._nv(x, scaling)
    perturbed = x.at[5].multiply(100.0)  # a later token with an outlier
    perm = np.array([2, 7, 0, 1, 6, 5, 3, 4])  # row i moves to position 0
    appended = jnp.asarray(np.concatenate([np.asarray(x), 50.0 * _normal(6, (8, 64))]))

    def row(q, r):
      gs = q.global_scale[r] if scaling is NVFP4Scaling.PER_TOKEN else q.global_scale
      return (q.data[r], q.block_scale[r], gs)

    variants = [row(self._nv(perturbed, scaling), i), row(self._nv(x[perm], scaling), 0),
                row(self._nv(appended, scaling), i)]
    same = [all(np.array_equal(_bits(u), _bits(v)) for u, v in zip(row(base, i), var)) for var in variants]
    if scaling is NVFP4Scaling.PER_TOKEN:
      self.assertEqual(same, [True, True, True])
    else:  # the leak: another token's outlier changes row i's codes
      self.assertFalse(same[0])
      self.assertFalse(same[2])
      self.assertTrue(same[1])  # permuting alone keeps the tensor amax


class QuantizeKernelCompiledTest(CompiledOnGpu, QuantizeKernelInterpretTest):
  """The same tests with the kernels compiled (tests/pallas_kernels/kernel_case.py)."""


class GpuLoweringTest(absltest.TestCase):
  """Every kernel variant lowers for CUDA (Pallas -> Triton IR) on any host: catches primitives the GPU lowering
  lacks without a GPU. Compiling and running them needs one (QuantizeKernelCompiledTest)."""

  def test_kernels_lower_for_cuda(self):
    x3 = jax.ShapeDtypeStruct((128, 8, 32), jnp.bfloat16)
    x4 = jax.ShapeDtypeStruct((2, 4, 32, 256), jnp.bfloat16)
    n3 = jax.ShapeDtypeStruct((128, 16, 16), jnp.bfloat16)
    s = jax.ShapeDtypeStruct((128, 1), jnp.float32)
    seeds = jax.ShapeDtypeStruct((128, 2), jnp.uint32)
    variants = {
        "mxfp8_rows": (lambda x: kernel.mxfp8_last_axis(x, scale_mode=ScaleMode.RCEIL), (x3,)),
        "mxfp8_cols": (lambda x: kernel.mxfp8_inner_axis(x, scale_mode=ScaleMode.FLOOR), (x4,)),
        "nvfp4": (lambda x, s: kernel.nvfp4(x, s), (n3, s)),
        "nvfp4_sr": (lambda x, s, k: kernel.nvfp4(x, s, k), (n3, s, seeds)),
    }
    for name, (fn, args) in variants.items():
      text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
      self.assertIn("__gpu$xla.gpu.triton", text, name)


if __name__ == "__main__":
  absltest.main()
