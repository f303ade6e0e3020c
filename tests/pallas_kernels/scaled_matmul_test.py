"""Block-scaled matmul kernel vs dequantize-then-matmul, vs jax.nn.scaled_matmul, and its edge cases.

Every kernel call here uses one shape and one tile config per format, so the interpreted kernels compile once.
"""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.formats import Impl, NVFP4Scaling
from pallas_kernels.quantize.ops import quantize_mxfp8, quantize_nvfp4
from pallas_kernels.scaled_matmul.kernel import TuningConfig
from pallas_kernels.scaled_matmul.ops import scaled_matmul
from tests.pallas_kernels.kernel_case import CompiledOnGpu

pytestmark = pytest.mark.fusion_emitters  # float4 containers: XLA:CPU's element-wise emitters cannot lower them

# M and N are not multiples of the row tile (the kernel pads them); K spans two block_k chunks.
M, N, K = 40, 48, 128
CONFIG = TuningConfig(block_m=32, block_n=32, block_k=64)
FORMATS = ("mxfp8", "nvfp4_per_token", "nvfp4_per_tensor")


def sqnr_db(ref, got) -> float:
  ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
  return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-300)))


def quantize(x, fmt):
  kw = dict(impl=Impl.REFERENCE)
  if fmt == "mxfp8":
    return quantize_mxfp8(x, **kw)
  scaling = NVFP4Scaling.PER_TOKEN if fmt == "nvfp4_per_token" else NVFP4Scaling.PER_TENSOR
  return quantize_nvfp4(x, scaling, **kw)


def operands(fmt, seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  # Rows with very different magnitudes, so that per-row and per-block scales matter.
  a = jax.random.normal(k1, (M, K)) * jnp.exp2(jnp.arange(M) % 7 - 3.0)[:, None]
  b = jax.random.normal(k2, (N, K))
  return a, b, quantize(a, fmt), quantize(b, fmt)


class ScaledMatmulInterpretTest(parameterized.TestCase):
  interpret = True

  def matmul(self, lhs, rhs, **kw):
    return scaled_matmul(lhs, rhs, interpret=self.interpret, config=CONFIG, **kw)

  @parameterized.parameters(*FORMATS)
  def test_kernel_matches_dequantize_then_matmul(self, fmt):
    a, b, qa, qb = operands(fmt)
    got = self.matmul(qa, qb)
    ref = scaled_matmul(qa, qb, impl=Impl.REFERENCE)
    chex.assert_shape(got, (M, N))
    self.assertGreaterEqual(sqnr_db(ref, got), 80.0)
    # And the quantized product is a sane approximation of the float one (format error, not a kernel bug).
    self.assertGreaterEqual(sqnr_db(a @ b.T, got), 15.0 if fmt.startswith("nvfp4") else 25.0)

  def test_rhs_quantized_along_its_first_axis_equals_k_major(self):
    _, b, qa, qb = operands("mxfp8")
    got = self.matmul(qa, quantize_mxfp8(b.T, axis=0, impl=Impl.REFERENCE))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(self.matmul(qa, qb)))

  def test_nan_block_poisons_only_its_rows(self):
    a, b, _, qb = operands("mxfp8")
    qa = quantize_mxfp8(a.at[3, 70].set(jnp.nan), impl=Impl.REFERENCE)
    got = np.asarray(self.matmul(qa, qb))
    self.assertTrue(np.all(np.isnan(got[3])))
    self.assertTrue(np.all(np.isfinite(np.delete(got, 3, axis=0))))

  @parameterized.parameters("mxfp8", "nvfp4_per_token")
  def test_peer_jax_scaled_matmul(self, fmt):
    """JAX's own block-scaled matmul on the same codes: equal up to summation order.

    `jax.nn.scaled_matmul` lowers on CUDA/ROCm only; elsewhere `jax.lax.scaled_dot` (the XLA composite it
    lowers to on ROCm) is the peer. Both take E8M0 / E4M3 block scales but no second-level scale, so the NVFP4
    per-row scales are applied after.
    """
    _, _, qa, qb = operands(fmt)
    if fmt == "mxfp8":
      sa, sb = (jax.lax.bitcast_convert_type(q.scale, jnp.float8_e8m0fnu) for q in (qa, qb))
    else:
      sa, sb = qa.block_scale, qb.block_scale
    if jax.default_backend() == "gpu":
      peer = jax.nn.scaled_matmul(qa.data[None], qb.data[None], sa[None], sb[None])[0]
    else:
      peer = jax.lax.scaled_dot(qa.data, qb.data, lhs_scale=sa, rhs_scale=sb,
                                dimension_numbers=(((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if fmt != "mxfp8":
      peer = peer * qa.global_scale * qb.global_scale.reshape(1, -1)
    self.assertGreaterEqual(sqnr_db(peer, self.matmul(qa, qb)), 80.0)

  def test_mismatched_formats_and_bad_k_raise(self):
    _, _, qa, _ = operands("mxfp8")
    _, _, _, qb = operands("nvfp4_per_token")
    with self.assertRaisesRegex(ValueError, "same format"):
      self.matmul(qa, qb)
    bad = quantize_mxfp8(jnp.ones((8, 32)), impl=Impl.REFERENCE)
    with self.assertRaisesRegex(ValueError, "same K"):
      self.matmul(qa, bad)


class ScaledMatmulCompiledTest(CompiledOnGpu, ScaledMatmulInterpretTest):
  """The same tests with the kernels compiled (tests/pallas_kernels/kernel_case.py)."""


if __name__ == "__main__":
  absltest.main()
