"""The kernel tests' one convention for interpreted and compiled runs.

A kernel test class reads `self.interpret` and is named `<Kernel>InterpretTest` (`interpret = True`: Pallas
interprets the kernels, on any host, which is what CI runs). Its compiled twin is
`class <Kernel>CompiledTest(CompiledOnGpu, <Kernel>InterpretTest)`: the same tests with the kernels compiled, skipped
where the backend is not a GPU (tools/gpu_check.sh runs them on one, leaving out the `*InterpretTest` classes).
"""

import jax


class CompiledOnGpu:
  """Mixin placed before an interpret test class: its tests with compiled kernels, skipped off a GPU."""

  interpret = False

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "gpu":
      self.skipTest("compiled Pallas kernels target GPUs; this backend is " + jax.default_backend() +
                    " (the InterpretTest twin runs these tests interpreted)")
