"""`exact_divide.divide` against IEEE division (numpy) bit for bit, in jnp and inside a Pallas kernel."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from pallas_kernels import exact_divide

_F32 = np.finfo(np.float32)
_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.0, 7.0, 0.1, _F32.max, -_F32.max, _F32.tiny,
                     _F32.tiny / 2, 1e-45, -1e-45, 2.0 ** -149 * 3, 2688.0, 448.0], np.float32)


def _pairs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Every kind of operand: random bit patterns (NaN payloads, subnormals, huge and tiny exponents), nearby
  magnitudes (quotients near 1, where rounding decides the last bit), subnormals alone, and every special pair."""
  rng = np.random.default_rng(seed)
  bits = lambda: rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
  near = lambda: (rng.standard_normal(n) * 10).astype(np.float32)
  sub = (rng.integers(0, 2**23, n, dtype=np.uint64).astype(np.uint32)
         | (rng.integers(0, 2, n).astype(np.uint32) << 31)).view(np.float32)
  sa, sb = np.meshgrid(_SPECIAL, _SPECIAL)
  return (np.concatenate([bits(), near(), sub, near(), sa.ravel()]),
          np.concatenate([bits(), near(), near(), sub, sb.ravel()]))


def _assert_ieee(test, a, b, got):
  with np.errstate(all="ignore"):
    want = a / b
  got = np.asarray(got)
  same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
  bad = np.flatnonzero(~same)
  test.assertEqual(bad.size, 0, f"{bad.size} quotients differ, e.g. {a[bad[:3]]} / {b[bad[:3]]} = "
                                f"{got[bad[:3]]}, IEEE {want[bad[:3]]}")


class ExactDivideTest(absltest.TestCase):

  def test_matches_ieee_division_bit_for_bit(self):
    a, b = _pairs(250_000)
    _assert_ieee(self, a, b, jax.jit(exact_divide.divide)(a, b))

  def test_reciprocal_of_every_e4m3_scale_times_a_global_scale(self):
    # The NVFP4 encode scale 1 / (s_b * S_dec): every positive E4M3 block scale against a spread of global scales.
    scales = np.unique(np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float32))
    scales = scales[np.isfinite(scales) & (scales > 0)]
    s_dec = np.float32(1.0) / (np.float32(2688.0) / np.geomspace(1e-30, 1e30, 301).astype(np.float32))
    y = (scales[:, None] * s_dec[None, :]).astype(np.float32).ravel()
    _assert_ieee(self, np.ones_like(y), y, jax.jit(exact_divide.reciprocal)(y))

  def test_inside_a_pallas_kernel(self):
    a, b = _pairs(2_048, seed=1)
    a, b = a[:8 * 1024].reshape(8, 1024), b[:8 * 1024].reshape(8, 1024)

    def kernel(a_ref, b_ref, o_ref):
      o_ref[...] = exact_divide.divide(a_ref[...], b_ref[...])

    got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(a.shape, jnp.float32), interpret=True)(a, b)
    _assert_ieee(self, a.ravel(), b.ravel(), np.asarray(got).ravel())


if __name__ == "__main__":
  absltest.main()
