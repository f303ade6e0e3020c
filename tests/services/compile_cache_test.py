"""The runs' compilation cache (`c2jax.services.compile_cache`): where it is (the config's, else
$JAX_COMPILATION_CACHE_DIR, else the user's cache under $C2JAX_CACHE_DIR), and that a second process running the same
program through it compiles nothing, while a changed program is compiled anew."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest

from c2jax.services import compile_cache
from c2jax.services import pool

# A process that points jax at the cache as a run does, compiles one program (`SCALE` changes it) and prints how many
# compiles the persistent cache answered and how many it did not.
_PROBE = """
import json, sys
import jax, jax.numpy as jnp
from c2jax.services import compile_cache
from c2jax.services import pool
hits, misses = [], []
jax.monitoring.register_event_listener(
    lambda event, **kw: (hits if event == "/jax/compilation_cache/cache_hits" else
                         misses if event == "/jax/compilation_cache/cache_misses" else []).append(event))
where = compile_cache.use()
scale = float(sys.argv[1])
f = jax.jit(lambda x: jnp.tanh(x @ x.T) * scale + jnp.cumsum(x, axis=0).sum())
f(jnp.ones((64, 64))).block_until_ready()
print(json.dumps({"where": where, "hits": len(hits), "misses": len(misses)}))
"""


class DirectoryTest(absltest.TestCase):

  def test_the_config_then_jax_s_variable_then_the_user_s_cache(self):
    with mock.patch.dict(os.environ, {"JAX_COMPILATION_CACHE_DIR": "/shared/jax", "C2JAX_CACHE_DIR": "/home/c"}):
      self.assertEqual(compile_cache.directory("/run/cache"), "/run/cache")
      self.assertEqual(compile_cache.directory(), "/shared/jax")
      del os.environ["JAX_COMPILATION_CACHE_DIR"]
      self.assertEqual(compile_cache.directory(), "/home/c/jax")


def _probe(env: dict, scale: float = 2.0) -> dict:
  """`_PROBE` run in a process of its own with `env`."""
  out = subprocess.run([sys.executable, "-c", _PROBE, str(scale)], capture_output=True, text=True, env=env,
                       timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


class SecondRunTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.home = tempfile.mkdtemp(prefix="c2jax-compile-cache-")
    self.addCleanup(shutil.rmtree, self.home, ignore_errors=True)
    # No floor set: compile_cache's own keeps this tiny program, which compiles in milliseconds.
    self.env = {k: v for k, v in os.environ.items()
                if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    self.env.update(C2JAX_CACHE_DIR=self.home, JAX_PLATFORMS="cpu")

  def test_a_second_process_compiles_nothing_a_changed_program_compiles(self):
    first, second, changed = _probe(self.env, 2.0), _probe(self.env, 2.0), _probe(self.env, 3.0)
    self.assertEqual(first["where"], os.path.join(self.home, "jax"))
    self.assertTrue(os.listdir(first["where"]))  # written under the user's cache
    self.assertEqual((first["hits"], first["misses"] > 0), (0, True))
    self.assertEqual((second["hits"] > 0, second["misses"]), (True, 0))  # nothing compiled again
    self.assertGreater(changed["misses"], 0)  # another program (a constant changed): compiled, never the old one

  def test_an_actor_reads_the_programs_its_trainer_compiled(self):
    # A trainer with XLA flags of its own (a test's fake devices among them): an actor started by the pool keeps all
    # but the fake devices.
    trainer = dict(self.env, XLA_FLAGS="--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=1")
    with mock.patch.dict(os.environ, trainer, clear=True):
      actor = pool.child_env()
    self.assertGreater(_probe(trainer)["misses"], 0)  # compiled and written
    self.assertEqual(actor["XLA_FLAGS"], "--xla_backend_optimization_level=0")
    got = _probe(actor)
    self.assertEqual((got["hits"] > 0, got["misses"]), (True, 0))  # read, nothing compiled


if __name__ == "__main__":
  absltest.main()
