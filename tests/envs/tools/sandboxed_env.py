"""A test case whose tests drive a real `CodingEnv` on one task in the sandbox (skipped, with the sandbox's reason,
where bubblewrap is unavailable)."""

from absl.testing import absltest

from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig


class SandboxedEnvTest(absltest.TestCase):
  """Subclasses set `task`; `self.env(**config)` is a `CodingEnv` reset on it, closed after the test."""

  task: CodingTask

  def setUp(self):
    super().setUp()
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))

  def env(self, **config) -> CodingEnv:
    env = CodingEnv(EnvConfig(**config))
    self.addCleanup(env.close)
    env.reset(self.task)
    return env
