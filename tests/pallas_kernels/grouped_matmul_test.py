"""Grouped matmul kernels vs jax.lax.ragged_dot (forward and VJP) and vs dequantize-then-matmul (quantized).

Ragged groups: zero-size groups, sizes that are not multiples of the tiles, padding rows past sum(group_sizes),
one group holding every row, and every group empty. One shape and tile config throughout, so that each
interpreted kernel compiles once per operand format.
"""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.formats import Impl, NVFP4Scaling
from pallas_kernels.grouped_matmul.ops import grouped_matmul, ragged_matmul, transposed_grouped_matmul
from pallas_kernels.quantize.ops import quantize_mxfp8, quantize_nvfp4
from pallas_kernels.grouped_matmul.kernel import gmm_kernel, tgmm_kernel
from pallas_kernels.scaled_matmul.kernel import Operand, OperandFormat, TuningConfig, scaled_matmul_kernel
from tests.pallas_kernels.kernel_case import CompiledOnGpu

pytestmark = pytest.mark.fusion_emitters  # float4 containers: XLA:CPU's element-wise emitters cannot lower them

M, K, N, E = 96, 64, 32, 4
CONFIG = TuningConfig(block_m=32, block_n=32, block_k=32)
GROUPS = {
    # 30 + 0 + 17 + 36 = 83 rows: groups straddle row tiles and 32-row scale blocks; 13 padding rows.
    "ragged": [30, 0, 17, 36],
    "one_group": [0, M, 0, 0],
    "all_empty": [0, 0, 0, 0],
}
_HIGHEST = jax.lax.Precision.HIGHEST


def sqnr_db(ref, got) -> float:
  ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
  return float(10 * np.log10(max(np.sum(ref ** 2), 1e-300) / max(np.sum((ref - got) ** 2), 1e-300)))


def data(seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(k1, (M, K)).at[-1].set(jnp.nan)  # a NaN padding row must not leak into any result
  return x, jax.random.normal(k2, (E, K, N)), jax.random.normal(k3, (M, N))


def used(x, sizes):
  return x[:sum(sizes)]


class GroupedMatmulInterpretTest(parameterized.TestCase):
  interpret = True

  def kw(self):
    return dict(interpret=self.interpret, config=CONFIG)

  @parameterized.parameters(*GROUPS)
  def test_forward_and_vjp_match_ragged_dot(self, groups):
    sizes = GROUPS[groups]
    gs = jnp.array(sizes, jnp.int32)
    x, w, dy = data()
    x = jnp.where(jnp.isnan(x), 0.0, x)  # ragged_dot itself would spread NaN of padding rows into d_rhs
    y_ref, vjp_ref = jax.vjp(lambda x, w: jax.lax.ragged_dot(x, w, gs, precision=_HIGHEST), x, w)
    y, vjp = jax.vjp(lambda x, w: ragged_matmul(x, w, gs, **self.kw()), x, w)
    chex.assert_trees_all_close(y, y_ref, atol=1e-4, rtol=1e-5)
    for got, ref in zip(vjp(dy), vjp_ref(dy)):
      chex.assert_trees_all_close(got, ref, atol=1e-4, rtol=1e-5)

  def test_padding_rows_are_ignored(self):
    gs = jnp.array(GROUPS["ragged"], jnp.int32)
    x, w, dy = data()  # row M - 1 (padding) is NaN
    y = grouped_matmul(x, jnp.swapaxes(w, 1, 2), gs, **self.kw())
    np.testing.assert_array_equal(np.asarray(y[83:]), 0.0)
    dw = transposed_grouped_matmul(x.T, dy.T, gs, **self.kw())
    chex.assert_tree_all_finite((y, dw))

  @parameterized.parameters("mxfp8", "nvfp4")
  def test_quantized_forward_matches_dequantized_reference(self, fmt):
    gs = jnp.array(GROUPS["ragged"], jnp.int32)
    x, w, _ = data()
    if fmt == "mxfp8":  # the weight [E, K, N] quantized along K (axis 1), taken K-major by the op
      qx, qw = quantize_mxfp8(x, impl=Impl.REFERENCE), quantize_mxfp8(w, axis=1, impl=Impl.REFERENCE)
    else:  # NVFP4: per-token x, per-(expert, output channel) w^T [E, N, K]
      qx = quantize_nvfp4(x, NVFP4Scaling.PER_TOKEN, impl=Impl.REFERENCE)
      qw = quantize_nvfp4(jnp.swapaxes(w, 1, 2), NVFP4Scaling.PER_TOKEN, impl=Impl.REFERENCE)
    y = grouped_matmul(qx, qw, gs, **self.kw())
    ref = grouped_matmul(qx, qw, gs, impl=Impl.REFERENCE)
    self.assertGreaterEqual(sqnr_db(used(ref, GROUPS["ragged"]), used(y, GROUPS["ragged"])), 80.0)
    np.testing.assert_array_equal(np.asarray(y[83:]), 0.0)

  def test_quantized_weight_gradient_matches_dequantized_reference(self):
    """d_rhs in MXFP8 with x and dy quantized along the grouped rows (32-row blocks straddle groups)."""
    gs = jnp.array(GROUPS["ragged"], jnp.int32)
    x, _, dy = data()
    x = jnp.where(jnp.isnan(x), 0.0, x)
    qx, qdy = quantize_mxfp8(x, axis=0, impl=Impl.REFERENCE), quantize_mxfp8(dy, axis=0, impl=Impl.REFERENCE)
    dw = transposed_grouped_matmul(qx, qdy, gs, **self.kw())
    ref = transposed_grouped_matmul(qx, qdy, gs, impl=Impl.REFERENCE)
    chex.assert_shape(dw, (E, K, N))
    self.assertGreaterEqual(sqnr_db(ref, dw), 80.0)
    np.testing.assert_array_equal(np.asarray(dw[1]), 0.0)  # the empty group
    exact = jnp.einsum("mk,mn->kn", x[30:47], dy[30:47], precision=_HIGHEST)
    self.assertGreaterEqual(sqnr_db(exact, dw[2]), 25.0)

  def test_bad_group_sizes_raise(self):
    x, w, _ = data()
    with self.assertRaisesRegex(ValueError, "one row count per expert"):
      grouped_matmul(x, jnp.swapaxes(w, 1, 2), jnp.array([M], jnp.int32), **self.kw())


class GroupedMatmulCompiledTest(CompiledOnGpu, GroupedMatmulInterpretTest):
  """The same tests with the kernels compiled (tests/pallas_kernels/kernel_case.py)."""


class GpuLoweringTest(parameterized.TestCase):
  """Every matmul kernel variant lowers for CUDA (Pallas -> Triton IR) on any host, which catches primitives the
  GPU lowering lacks without a GPU; compiling and running them needs one (the *CompiledTest classes)."""

  def test_kernels_lower_for_cuda(self):
    s = jax.ShapeDtypeStruct
    c = TuningConfig(block_m=64, block_n=64, block_k=64)

    def op(fmt, *shape):
      if fmt is OperandFormat.PLAIN:
        return Operand(s(shape, jnp.bfloat16), None, None, fmt)
      if fmt is OperandFormat.MXFP8:
        return Operand(s(shape, jnp.float8_e4m3fn), s(shape[:-1] + (shape[-1] // 32,), jnp.uint8), None, fmt)
      return Operand(s(shape[:-1] + (shape[-1] // 2,), jnp.uint8),
                     s(shape[:-1] + (shape[-1] // 16,), jnp.float8_e4m3fn), s(shape[:-1] + (1,), jnp.float32), fmt)

    gs = s((4,), jnp.int32)
    variants = {}
    for fmt in OperandFormat:
      variants[f"gmm_{fmt.value}"] = (lambda a, b, g: gmm_kernel(a, b, g, config=c),
                                      (op(fmt, 128, 256), op(fmt, 4, 128, 256), gs))
      if fmt is not OperandFormat.PLAIN:
        variants[f"dense_{fmt.value}"] = (lambda a, b: scaled_matmul_kernel(a, b, config=c),
                                          (op(fmt, 128, 256), op(fmt, 64, 256)))
      if fmt is not OperandFormat.NVFP4:
        variants[f"tgmm_{fmt.value}"] = (lambda a, b, g: tgmm_kernel(a, b, g, config=c),
                                         (op(fmt, 128, 256), op(fmt, 64, 256), gs))
    for name, (fn, args) in variants.items():
      text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
      self.assertIn("__gpu$xla.gpu.triton", text, name)


if __name__ == "__main__":
  absltest.main()
