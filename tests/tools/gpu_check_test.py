"""tools/gpu_check.py, the bookkeeping of tools/gpu_check.sh: a failed, timed-out or silent stage is recorded with
its reason, later stages still count, and the summary fails; the import check names what is missing; MFU's peak.
No GPU needed (the stages themselves run only in the script)."""

import json
import os
import shutil
import subprocess
import tempfile

from absl.testing import absltest

from tools import gpu_check

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class GpuCheckTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out, self.work = tempfile.mkdtemp(), tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.out, ignore_errors=True)
    self.addCleanup(shutil.rmtree, self.work, ignore_errors=True)

  def _stage(self, name: str, rc: int, log: str, seconds: float = 1.0, limit: float = 60.0) -> dict:
    with open(os.path.join(self.work, f"{name}.log"), "w") as f:
      f.write(log)
    return gpu_check.record(self.out, self.work, name, rc, seconds, limit)

  def _file(self, name: str) -> dict:
    with open(os.path.join(self.out, name)) as f:
      return json.load(f)

  def test_a_failed_stage_is_recorded_and_fails_the_summary(self):
    ok = self._stage("bench_kernels", 0, 'table\n{"results": {"dense_bf16_jnp_dot": {"tflops": 701.26}}}\n')
    self.assertTrue(ok["ok"])
    self.assertEqual(self._file("bench_kernels.json"), {"results": {"dense_bf16_jnp_dot": {"tflops": 701.26}}})
    crashed = self._stage("train_mfu", 1, "Traceback (most recent call last):\n  ...\n"
                          "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n")
    self.assertFalse(crashed["ok"])
    self.assertIn("RESOURCE_EXHAUSTED", crashed["error"])
    self.assertIn("RESOURCE_EXHAUSTED", self._file("train_mfu.json")["error"])
    timed_out = self._stage("sampler", 124, 'B=64: c2jax_tok_s 10.0\n'
                            '{"partial": {"c2jax_tok_s_by_batch": {"64": 10.0}}}\n'
                            '{"partial": {"c2jax_tok_s_by_batch": {"256": 31.5}}}\n{"partial": {"c2j',
                            seconds=100.0, limit=100.0)
    self.assertTrue(timed_out["timed_out"])
    self.assertIn("timed out after 100 s", timed_out["error"])
    self.assertNotIn("figures", timed_out)
    self.assertEqual(timed_out["partial"], {"c2jax_tok_s_by_batch": {"64": 10.0, "256": 31.5}})  # kept, merged
    silent = self._stage("kernel_tests", 0, "no json here\n")
    self.assertFalse(silent["ok"])
    self.assertIn("no JSON line", silent["error"])

    summary = self._file("gpu_check.json")
    self.assertEqual(summary["failed"], ["train_mfu", "sampler", "kernel_tests"])
    self.assertFalse(summary["ok"])
    self.assertEqual(summary["headline"]["kernel_tflops"], {"dense_bf16_jnp_dot": 701.3})
    self.assertEqual(gpu_check.finish(self.out, 12.0), 1)
    self.assertEqual(self._file("gpu_check.json")["total_s"], 12.0)

  def test_all_stages_ok_pass_and_no_stage_fails(self):
    self.assertEqual(gpu_check.finish(self.out), 1)  # nothing ran
    self._stage("preflight", 0, '{"backend": "gpu", "device_kind": "NVIDIA H200", "missing_sentence": null}\n')
    self._stage("train_mfu", 0, '{"mfu": 0.41, "peak_tflops": 989.0, "batch": 16}\n')
    summary = self._file("gpu_check.json")
    self.assertEqual(summary["device"]["device_kind"], "NVIDIA H200")
    self.assertEqual(summary["headline"]["train_mfu"], 0.41)
    self.assertEqual(gpu_check.finish(self.out), 0)

  def test_the_stage_own_error_is_the_reason(self):
    rec = self._stage("preflight", 2, 'no GPU\n{"backend": "cpu", "error": "no GPU: jax.default_backend() is cpu"}\n')
    self.assertEqual(rec["error"], "exit 2: no GPU: jax.default_backend() is cpu")

  def test_missing_imports_are_named_in_one_sentence(self):
    stages = {"sampler": (("json", "no_such_module_c2jax"), ("no_such_module_c2jax",))}
    missing, errors = gpu_check.check_imports(stages)
    self.assertEqual(missing, {"no_such_module_c2jax": ["sampler"]})
    sentence = gpu_check.missing_sentence({"orbax": ["sampler"]}, {"sampler": "import c2jax.model.hf_export: ..."})
    self.assertIn("orbax-checkpoint (for sampler)", sentence)
    self.assertIn(".whl/", sentence)
    self.assertIsNone(gpu_check.missing_sentence({}, {}))
    self.assertIn("sampler", str(errors))

  def test_mfu_uses_the_published_dense_bf16_peak(self):
    from tools import bench_sampler  # jax; bench_model's flags once
    peak = bench_sampler._bench_model().device_peak_tflops
    self.assertEqual(peak("NVIDIA H200", "bfloat16"), 989.0)
    self.assertEqual(peak("NVIDIA H100 80GB HBM3", "bfloat16"), 989.0)
    self.assertEqual(peak("NVIDIA H100 PCIe", "bfloat16"), 756.0)
    self.assertIsNone(peak("NVIDIA H200", "float32"))
    self.assertIsNone(peak("cpu", "bfloat16"))

  def test_the_script_parses(self):
    subprocess.run(["bash", "-n", os.path.join(_REPO, "tools", "gpu_check.sh")], check=True)


if __name__ == "__main__":
  absltest.main()
