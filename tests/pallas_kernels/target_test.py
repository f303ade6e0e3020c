"""`pallas_kernels.target`: which platform a program is traced for, and the refusals it gives (the model's use of it:
tests/model/platform_test.py)."""

from absl.testing import absltest
import jax
from jax.sharding import AbstractMesh

from pallas_kernels import target
from pallas_kernels.formats import Impl
from pallas_kernels.target import Platform

_AbstractDevice = getattr(jax.sharding, "AbstractDevice", None) or jax._src.mesh.AbstractDevice


def abstract_device(platform: str, device_kind: str | None = None, num_cores: int | None = None):
  """An abstract mesh's device description (no device needed)."""
  return _AbstractDevice(device_kind=device_kind or f"a {platform}", num_cores=num_cores, platform=platform)


def abstract_mesh(platform: str) -> AbstractMesh:
  """A 2-device abstract mesh whose devices are of `platform`."""
  device = abstract_device(platform)
  return AbstractMesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)


class TargetTest(absltest.TestCase):

  def test_names(self):
    self.assertIs(target.of_name("cuda"), Platform.GPU)
    self.assertIs(target.of_name("rocm"), Platform.GPU)
    self.assertIs(target.of_name("TPU"), Platform.TPU)
    with self.assertRaisesRegex(ValueError, "unknown platform 'metal'; known: cpu, cuda, gpu, rocm, tpu"):
      target.of_name("metal")

  def test_explicit_beats_mesh_beats_context_beats_default_device(self):
    self.assertIs(target.resolve(), Platform.CPU)  # this host's default device
    with jax.sharding.use_abstract_mesh(abstract_mesh("gpu")):
      self.assertIs(target.resolve(), Platform.GPU)
      self.assertIs(target.resolve(Platform.AUTO, abstract_mesh("tpu")), Platform.TPU)
      self.assertIs(target.resolve(Platform.CPU, abstract_mesh("tpu")), Platform.CPU)
    self.assertIs(target.resolve(Platform.AUTO, jax.make_mesh((1,), ("x",))), Platform.CPU)
    with self.assertRaisesRegex(ValueError, "pass a pallas_kernels.target.Platform"):
      target.resolve("gpu")

  def test_interpret(self):
    self.assertTrue(target.resolve_interpret(None, "k"))  # a CPU interprets
    self.assertFalse(target.resolve_interpret(False, "k"))
    with jax.sharding.use_abstract_mesh(abstract_mesh("gpu")):
      self.assertFalse(target.resolve_interpret(None, "k"))
    with jax.sharding.use_abstract_mesh(abstract_mesh("tpu")):
      with self.assertRaisesRegex(ValueError, r"^quantize_nvfp4: the Pallas kernels compile for GPUs only \(Triton\); "
                                  r"on a TPU pass impl=Impl.REFERENCE"):
        target.resolve_interpret(None, "quantize_nvfp4")
      self.assertIsNone(target.kernel_interpret(Impl.REFERENCE, None, "k"))  # the reference runs anywhere


if __name__ == "__main__":
  absltest.main()
