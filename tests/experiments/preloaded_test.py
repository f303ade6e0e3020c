"""tests/experiments/preloaded.py's launcher: a child runs a script or a module as `__main__` in its own cwd and
environment, with its exit code, stdout and stderr (a traceback included) handed back; a child past its timeout is
ended; a preload that prints is refused."""

import os
import pathlib
import shutil
import tempfile

from absl.testing import absltest

from tests.experiments import preloaded

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(_ROOT)}

_SCRIPT = """import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("C2JAX_PRELOADED_TEST"))
if sys.argv[1:] == ["fail"]:
  raise ValueError("planted")
if sys.argv[1:] == ["exit"]:
  sys.exit(3)
if sys.argv[1:] == ["sleep"]:
  import time
  time.sleep(30)
"""


class LauncherTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix="c2jax-preloaded-test-"))
    cls.script = cls.tmp / "script.py"
    cls.script.write_text(_SCRIPT)
    cls.launcher = preloaded.Launcher(_ENV, ("json",))

  @classmethod
  def tearDownClass(cls):
    cls.launcher.close()
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def test_a_script_runs_in_its_cwd_and_environment(self):
    proc = self.launcher.run([str(self.script), "a", "b"], cwd=str(self.tmp),
                             env={**_ENV, "C2JAX_PRELOADED_TEST": "yes"})
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stdout, f"argv ['a', 'b'] cwd {self.tmp} env yes\n")
    self.assertEqual(proc.stderr, "")

  def test_exit_codes_and_tracebacks_come_back(self):
    failed = self.launcher.run([str(self.script), "fail"], cwd="/")
    self.assertEqual(failed.returncode, 1)
    self.assertIn("ValueError: planted", failed.stderr)
    self.assertEqual(self.launcher.run([str(self.script), "exit"], cwd="/").returncode, 3)

  def test_a_module_runs_as_main(self):
    proc = self.launcher.run(["-m", "json.tool", "/nonexistent/c2jax-input"], cwd="/")
    self.assertEqual(proc.returncode, 2)
    self.assertIn("can't open '/nonexistent/c2jax-input'", proc.stderr)

  def test_a_child_past_its_timeout_is_ended(self):
    proc = self.launcher.run([str(self.script), "sleep"], cwd="/", timeout=1)
    self.assertEqual(proc.returncode, -14)  # SIGALRM
    # The launcher still serves the next run.
    self.assertEqual(self.launcher.run([str(self.script), "exit"], cwd="/").returncode, 3)

  def test_a_preload_that_prints_is_refused(self):
    with self.assertRaisesRegex(RuntimeError, "the preloading process printed while importing"):
      preloaded.Launcher(_ENV, ("this_module_does_not_exist_c2jax",))


if __name__ == "__main__":
  absltest.main()
