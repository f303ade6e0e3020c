"""The NVFP4-forward / MXFP8-backward expert matmul: accuracy against float32, the per-token causality property
(with a per-tensor negative control), and equality of the kernel and reference implementations.

Measured on CPU at these shapes (SQNR vs the float32 matmul and its exact gradients; thresholds in the asserts):
MXFP8 forward / d_input / d_weight ~ 28.5 dB each; NVFP4 forward ~ 17.6 dB (its backward is MXFP8: ~ 28.5 dB).
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model.config import Precision
from pallas_kernels.formats import Impl, NVFP4Scaling
from pallas_kernels.grouped_matmul.ops import grouped_matmul
from pallas_kernels.quantize.ops import quantize_nvfp4
from pallas_kernels.recipe.ops import dense_matmul, expert_matmul
from pallas_kernels.scaled_matmul.kernel import TuningConfig
from tests.pallas_kernels.kernel_case import CompiledOnGpu

pytestmark = pytest.mark.fusion_emitters  # float4 containers: XLA:CPU's element-wise emitters cannot lower them

M, K, N, E = 96, 64, 32, 4
SIZES = [30, 0, 17, 36]  # 13 padding rows
CONFIG = TuningConfig(block_m=32, block_n=32, block_k=32)
# (forward, d_input, d_weight) SQNR floors in dB. NVFP4 keeps 2 significant bits per value: ~15-18 dB.
FLOORS = {Precision.MXFP8: (25.0, 25.0, 25.0), Precision.NVFP4_FWD_MXFP8_BWD: (15.0, 25.0, 25.0)}


def sqnr_db(ref, got) -> float:
  ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
  return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-300)))


def data(seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(k1, (M, K)), jax.random.normal(k2, (E, K, N)) / 8, jax.random.normal(k3, (M, N)))


class RecipeInterpretTest(parameterized.TestCase):
  interpret = True

  def op(self, precision, impl=Impl.PALLAS):
    gs = jnp.array(SIZES, jnp.int32)
    return lambda x, w: expert_matmul(x, w, gs, precision, impl=impl, interpret=self.interpret, config=CONFIG)

  @parameterized.parameters(Precision.MXFP8, Precision.NVFP4_FWD_MXFP8_BWD)
  @pytest.mark.slow
  def test_forward_and_gradients_track_float32(self, precision):
    x, w, dy = data()
    gs = jnp.array(SIZES, jnp.int32)
    y32, vjp32 = jax.vjp(lambda x, w: jax.lax.ragged_dot(x, w, gs, precision=jax.lax.Precision.HIGHEST), x, w)
    dx32, dw32 = vjp32(dy)
    y, vjp = jax.vjp(self.op(precision), x, w)
    dx, dw = vjp(dy)
    n = sum(SIZES)
    got = (sqnr_db(y32[:n], y[:n]), sqnr_db(dx32[:n], dx[:n]), sqnr_db(dw32, dw))
    for name, value, floor in zip(("forward", "d_input", "d_weight"), got, FLOORS[precision]):
      self.assertGreaterEqual(value, floor, f"{precision.value} {name}: {value:.1f} dB")
    # Padding rows: zero output and zero input gradient.
    np.testing.assert_array_equal(np.asarray(y[n:]), 0.0)
    np.testing.assert_array_equal(np.asarray(dx[n:]), 0.0)
    # The reference implementation (bit-identical quantizers, dequantize-then-matmul) agrees with the kernels.
    yr, vjpr = jax.vjp(self.op(precision, Impl.REFERENCE), x, w)
    for ref_value, value in zip((yr, *vjpr(dy)), (y, dx, dw)):
      self.assertGreaterEqual(sqnr_db(ref_value, value), 80.0)

  def test_bf16_is_plain_ragged_dot(self):
    x, w, _ = data()
    gs = jnp.array(SIZES, jnp.int32)
    np.testing.assert_array_equal(np.asarray(self.op(Precision.BF16)(x, w)),
                                  np.asarray(jax.lax.ragged_dot(x, w, gs)))

  @pytest.mark.slow
  def test_per_token_forward_is_causal_and_per_tensor_leaks(self):
    """Report section 5: output row i must not depend on other tokens. Perturbing, permuting or appending the
    rows after i leaves row i bitwise identical with per-token NVFP4; the same check on per-tensor NVFP4 (built
    from the same kernels) must see row i move: a negative control showing the leak."""
    x, w, _ = data(1)
    w = w[0]  # one dense weight [K, N]: the order of rows has no group meaning
    i = 40
    later = np.arange(i + 1, M)
    variants = {
        "perturbed": x.at[later].multiply(100.0),  # raises the tensor amax
        # A permutation alone keeps the tensor amax; scaled as well, so that the per-tensor control can see it.
        "permuted": x.at[later].set(x[later[::-1]] * 100.0),
        "appended": jnp.concatenate([x, 300.0 * jnp.ones((32, K))]),
    }

    def per_tensor(x):
      xq = quantize_nvfp4(x, NVFP4Scaling.PER_TENSOR, interpret=self.interpret)
      wq = quantize_nvfp4(w.T[None], NVFP4Scaling.PER_TOKEN, interpret=self.interpret)
      return grouped_matmul(xq, wq, jnp.array([x.shape[0]], jnp.int32), interpret=self.interpret, config=CONFIG)

    per_token = lambda x: dense_matmul(x, w, Precision.NVFP4_FWD_MXFP8_BWD, interpret=self.interpret,
                                       config=CONFIG)
    for name, xv in variants.items():
      for fn, leaks in ((per_token, False), (per_tensor, True)):
        base, changed = np.asarray(fn(x)[:i + 1]), np.asarray(fn(xv)[:i + 1])
        same = np.array_equal(base, changed)
        self.assertEqual(same, not leaks, f"{name}: rows <= {i} {'changed' if not same else 'unchanged'}")


class RecipeCompiledTest(CompiledOnGpu, RecipeInterpretTest):
  """The same tests with the kernels compiled (tests/pallas_kernels/kernel_case.py)."""


class RecipeGpuLoweringTest(parameterized.TestCase):
  """The whole recipe, forward and VJP with the kernels compiled, lowers for CUDA on any host: every quantizer and
  matmul becomes a Triton kernel call. Running it needs a GPU (RecipeCompiledTest)."""

  @parameterized.parameters(Precision.MXFP8, Precision.NVFP4_FWD_MXFP8_BWD)
  def test_recipe_lowers_for_cuda(self, precision):
    s = jax.ShapeDtypeStruct

    def f(x, w, gs, dy):
      y, vjp = jax.vjp(lambda x, w: expert_matmul(x, w, gs, precision, interpret=False), x, w)
      return y, vjp(dy)

    args = (s((256, 128), jnp.bfloat16), s((4, 128, 64), jnp.bfloat16), s((4,), jnp.int32),
            s((256, 64), jnp.bfloat16))
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    self.assertIn("__gpu$xla.gpu.triton", text)


if __name__ == "__main__":
  absltest.main()
