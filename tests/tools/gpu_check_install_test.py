"""tools/gpu_check.sh's install path, as a dry run on this CPU: `--venv` makes a clean venv from the package registry
with the tested jax and only what the stages import, the stages run from it (the machine check and the compiled
kernel tests, which skip without a GPU), and a second call reuses the venv. The GPU run differs in one requirement
(`jax[cuda12]` instead of `jax`)."""

import json
import os
import shutil
import subprocess
import tempfile

from absl.testing import absltest
import pytest

pytestmark = [
    pytest.mark.e2e,  # a pip install into a fresh venv (`make test-unit` leaves it out)
    pytest.mark.fusion_emitters,  # its child runs the NVFP4 kernel tests (float4 containers), with this process's flags
]

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class GpuCheckInstallTest(absltest.TestCase):

  def test_cpu_dry_run_makes_its_own_venv_and_runs_the_stages(self):
    tmp = tempfile.mkdtemp(prefix="c2jax-gpu-check-")
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    venv, out = os.path.join(tmp, "venv"), os.path.join(tmp, "out")
    env = {**os.environ, "OUT": out, "GPU_CHECK_STAGES": "preflight,kernel_tests",
           "GPU_CHECK_XLA_CACHE": os.path.join(tmp, "xla")}
    env.pop("XLA_FLAGS", None)  # the stages run as on a GPU machine, not under the suite's 8 fake devices
    run = lambda env: subprocess.run(["bash", "tools/gpu_check.sh", "--cpu_smoke", "--venv", venv], cwd=_REPO,
                                     env=env, capture_output=True, text=True, timeout=1200, check=False)
    first = run(env)
    self.assertEqual(first.returncode, 0, first.stdout[-3000:] + first.stderr[-3000:])
    self.assertIn(f"making {venv}", first.stdout)

    pip = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "list", "--format=json"],
                         capture_output=True, text=True, check=True)
    installed = {p["name"].lower(): p["version"] for p in json.loads(pip.stdout)}
    with open(os.path.join(_REPO, "tools", "gpu_check_requirements.txt")) as f:
      pin = next(line.split("==")[1].strip() for line in f if line.startswith("jax=="))
    self.assertEqual(installed.get("jax"), pin)
    self.assertEqual(installed.get("jaxlib"), pin)
    for absent in ("torch", "transformers", "google-tunix", "grain", "ml-collections", "c2jax"):
      self.assertNotIn(absent, installed)

    with open(os.path.join(out, "gpu_check.json")) as f:
      summary = json.load(f)
    self.assertEqual(sorted(summary["stages"]), ["kernel_tests", "preflight"])
    self.assertTrue(summary["ok"], summary)
    self.assertEqual(summary["device"]["python_executable"], os.path.join(venv, "bin", "python"))
    kernels = summary["stages"]["kernel_tests"]["figures"]
    self.assertGreater(kernels["passed"] + kernels["skipped"], 0)
    self.assertEqual(kernels["failed"] + kernels["errors"], 0)

    # The second call only has to show the venv reused: the machine check alone (the kernel tests ran above).
    second = run({**env, "GPU_CHECK_STAGES": "preflight"})
    self.assertEqual(second.returncode, 0, second.stdout[-3000:])
    self.assertNotIn("making", second.stdout)


if __name__ == "__main__":
  absltest.main()
