"""tools/bench_sampler.py: our params reach HF unchanged (exported by c2jax.model.hf_export, saved back by HF and
converted), and a toy-size run of the whole tool prints a sane JSON line (part 1 only: part 2 compiles three more
programs, minutes on 2 cores)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import chex
import jax
import numpy as np
import pytest

from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_convert
from c2jax.model import params as params_lib
from c2jax.model import presets
from tools import bench_sampler

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BenchSamplerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    # tempfile, not absltest's create_tempdir: that needs absl flags, which pytest does not parse.
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def test_hf_model_carries_our_params(self):
    cfg = presets.tiny()
    # numpy, not init_params: jax.random would compile one kernel per leaf shape (seconds each on CPU).
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(a.dtype), params_lib.abstract_params(cfg))
    model = bench_sampler.load_hf_model(params, cfg)  # raises unless HF loads every tensor and no stray one
    # HF's own writer is the reference: what the model holds, saved by HF and converted, is our params.
    hf_dir, out_dir = os.path.join(self.tmp, "hf"), os.path.join(self.tmp, "out")
    model.save_pretrained(hf_dir)
    hf_convert.convert_hf_checkpoint(hf_dir, out_dir, dtype="float32", progress=False)
    got, got_cfg = ckpt_lib.load_checkpoint(out_dir)
    self.assertEqual(got_cfg.num_mtp_layers, 0)  # HF's DeepseekV3ForCausalLM has no MTP module
    chex.assert_trees_all_equal(got, {k: v for k, v in params.items() if k != "mtp"})

  def test_vllm_peer_runs_only_where_it_can(self):
    tiny = presets.tiny()
    v3_width = tiny.replace(kv_lora_rank=512, qk_rope_head_dim=64)
    fake = os.path.join(self.tmp, "python")
    with open(fake, "w") as f:
      f.write("#!/bin/sh\n")
    os.chmod(fake, 0o755)
    args = lambda *flags: bench_sampler.parse_args(["--skip_spec", *flags])
    self.assertEqual(bench_sampler.vllm_python(args("--vllm_python=none"), v3_width)[0], None)
    # An explicit python is tried at any width (vLLM's own error then says what it refuses).
    self.assertEqual(bench_sampler.vllm_python(args(f"--vllm_python={fake}"), tiny), (fake, "--vllm_python"))
    with self.assertRaises(SystemExit):
      args(f"--vllm_python={os.path.join(self.tmp, 'missing')}")
    with mock.patch.object(bench_sampler, "_VLLM_VENV_PYTHON", os.path.join(self.tmp, "missing")):
      py, why = bench_sampler.vllm_python(args(), v3_width)
      self.assertIsNone(py)
      self.assertIn("make peer-vllm", why)
    with mock.patch.object(bench_sampler, "_VLLM_VENV_PYTHON", fake):
      self.assertEqual(bench_sampler.vllm_python(args(), v3_width), (fake, "auto"))
      py, why = bench_sampler.vllm_python(args(), tiny)  # vLLM-CPU's MLA kernel takes only a 576-wide latent head
      self.assertIsNone(py)
      self.assertIn("576", why)

  def test_width_flags_reach_the_model(self):
    args = bench_sampler.parse_args(["--skip_spec", "--kv_lora_rank=512", "--qk_rope_head_dim=64"])
    self.assertEqual((args.kv_lora_rank, args.qk_rope_head_dim), (512, 64))
    self.assertEqual(bench_sampler.model_config(args), presets.tiny().replace(
        kv_lora_rank=512, qk_rope_head_dim=64, dtype="float32", param_dtype="float32"))

  def test_bf16_times_c2jax_alone(self):
    args = bench_sampler.parse_args(["--skip_spec", "--skip_hf", "--dtype=bfloat16"])
    self.assertEqual(bench_sampler.model_config(args), presets.tiny().replace(dtype="bfloat16",
                                                                              param_dtype="bfloat16"))
    self.assertEqual(bench_sampler.vllm_python(args, presets.tiny())[0], None)
    with mock.patch("sys.stderr"), self.assertRaises(SystemExit):  # the HF side runs float32 only
      bench_sampler.parse_args(["--skip_spec", "--dtype=bfloat16"])

  @pytest.mark.e2e  # the whole tool in a process of its own
  @pytest.mark.slow
  def test_toy_run_prints_json_with_matching_greedy_outputs(self):
    env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # One HF thread: two threads on a shared 2-core machine can stall for minutes (see the tool's --hf_threads).
    r = subprocess.run([sys.executable, os.path.join(_REPO, "tools", "bench_sampler.py"), "--batches=2",
                        "--prompt_len=4", "--new_tokens=4", "--repeats=1", "--hf_threads=1", "--skip_spec"],
                       env=env, cwd=self.tmp, capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(r.returncode, 0, f"bench_sampler failed:\n{r.stdout}\n{r.stderr}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    self.assertGreater(result["c2jax_tok_s"], 0)
    self.assertGreater(result["hf_tok_s"], 0)
    self.assertAlmostEqual(result["ratio"], result["c2jax_tok_s"] / result["hf_tok_s"], delta=0.01 * result["ratio"])
    # Same weights: greedy outputs agree (a flipped near-tie could cost a token or two, never most of them).
    self.assertGreaterEqual(result["greedy_agreement"]["identical"], 0.75)
    self.assertEqual(result["machine"]["hf_threads"], [1])
    # tiny's latent head (32 + 8) is not one vLLM-CPU takes (nor may .venv-vllm exist): skipped, and the JSON says why.
    self.assertEqual(result["peers"], ["hf_1t"])
    self.assertIsInstance(result["vllm_skipped"], str)


if __name__ == "__main__":
  absltest.main()
