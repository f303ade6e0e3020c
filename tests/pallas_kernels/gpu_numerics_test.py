"""What the compiled GPU kernels compute that the interpreter does not show: float32 dot precision and division.

On a GPU, Pallas' Triton lowering turns a DEFAULT-precision float32 dot into TF32 (10-bit mantissas) and a float32
`/` into PTX `div.full.f32` (2 ulp); on a CPU the interpreter computes both exactly, so the interpret tests cannot
see either. These tests pin, on the CPU, what the GPU program asks for (the kernels' own jaxprs: HIGHEST-precision
dots, no float division in the NVFP4 quantizer) and show why it matters (TF32-rounded inputs miss the grouped
matmul tests' tolerance; a 1-ulp-off encode scale changes NVFP4 codes). The deviceless GPU compile tier
(tests/gpu_compile) checks the same in the PTX that ptxas assembles.
"""

from absl.testing import absltest
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import formats
from pallas_kernels.formats import NVFP4Scaling, Rounding
from pallas_kernels.grouped_matmul.ops import ragged_matmul
from pallas_kernels.quantize import reference
from pallas_kernels.quantize.ops import quantize_nvfp4
from tests.pallas_kernels import grouped_matmul_test as gmm_test

pytestmark = pytest.mark.fusion_emitters  # float4 containers: XLA:CPU's element-wise emitters cannot lower them


def _eqns(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it (pallas_call kernels, jit, custom_vjp, loops)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
          yield from _eqns(sub)


def _tf32(x: jax.Array) -> jax.Array:
  """x rounded to TF32 (float32 with a 10-bit mantissa, round to nearest even): what a TF32 mma reads."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  keep = ~jnp.uint32((1 << 13) - 1)
  half = jnp.uint32(1 << 12) - 1 + ((bits >> 13) & 1)  # ties to even
  return jax.lax.bitcast_convert_type((bits + half) & keep, jnp.float32)


class GpuNumericsTest(absltest.TestCase):

  def test_kernel_dots_ask_for_full_float32(self):
    x, w, _ = gmm_test.data()
    gs = jnp.array(gmm_test.GROUPS["ragged"], jnp.int32)
    jaxpr = jax.make_jaxpr(lambda x, w: ragged_matmul(x, w, gs, interpret=False, config=gmm_test.CONFIG))(x, w)
    dots = [e for e in _eqns(jaxpr) if e.primitive.name == "dot_general" and e.invars[0].aval.dtype == jnp.float32]
    self.assertNotEmpty(dots)
    for eqn in dots:
      self.assertEqual(eqn.params["precision"], (jax.lax.Precision.HIGHEST,) * 2,
                       "a DEFAULT float32 dot lowers to TF32 on a GPU")

  def test_tf32_inputs_miss_the_grouped_matmul_tolerance(self):
    # Why the precision matters: the grouped matmul tests hold the kernel to atol 1e-4 / rtol 1e-5 of ragged_dot.
    x, w, _ = gmm_test.data()
    x = jnp.where(jnp.isnan(x), 0.0, x)
    gs = jnp.array(gmm_test.GROUPS["ragged"], jnp.int32)
    exact = jax.lax.ragged_dot(x, w, gs, precision=jax.lax.Precision.HIGHEST)
    tf32 = jax.lax.ragged_dot(_tf32(x), _tf32(w), gs, precision=jax.lax.Precision.HIGHEST)
    err = np.abs(np.asarray(tf32) - np.asarray(exact)) - 1e-5 * np.abs(np.asarray(exact))
    self.assertGreater(float(err.max()), 10 * 1e-4)

  def test_nvfp4_quantizer_has_no_float_division(self):
    x = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
    key = jax.random.key(0)
    programs = {"reference": lambda x: reference.quantize_nvfp4(x, NVFP4Scaling.PER_TOKEN),
                "kernel": lambda x: quantize_nvfp4(x, NVFP4Scaling.PER_TOKEN, interpret=False),
                "kernel_sr": lambda x: quantize_nvfp4(x, NVFP4Scaling.PER_TENSOR, rounding=Rounding.STOCHASTIC,
                                                      key=key, interpret=False)}
    for name, fn in programs.items():
      divisions = [e for e in _eqns(jax.make_jaxpr(fn)(x)) if e.primitive.name == "div"
                   and jnp.issubdtype(e.outvars[0].aval.dtype, jnp.floating)]
      self.assertEmpty(divisions, f"{name}: a float division is 2 ulp on a GPU (exact_divide.divide is exact)")

  def test_one_ulp_off_encode_scales_change_codes(self):
    # Why the division must be exact: values on E2M1 rounding midpoints (0.25, 0.75, ... 5 times the block's step,
    # which data made of small multiples of a power of two hits) round by the last bit of the encode scale, so the
    # reference's x * enc with enc 1 ulp off (what `div.full.f32` may return) gives other codes.
    mid = np.array([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2, np.float32)
    x = jnp.asarray(np.stack([mid * np.float32(2.0 ** j) for j in range(-20, 20)]))  # [40, 16]: one block a row
    q = reference.quantize_nvfp4(x, NVFP4Scaling.PER_TOKEN)
    enc = jnp.minimum(1.0 / (q.block_scale.astype(jnp.float32) * q.global_scale), reference.F32_MAX)[..., 0]
    codes = lambda e: reference.e2m1_round_nearest(jnp.clip(x * e[:, None], -6.0, 6.0))
    np.testing.assert_array_equal(codes(enc), formats.fp4_codes(q.data))  # the reference's own codes
    flipped = sum(int(jnp.sum(codes(jnp.nextafter(enc, d * jnp.inf)) != codes(enc))) for d in (-1, 1))
    self.assertGreater(flipped, 0)

if __name__ == "__main__":
  absltest.main()
