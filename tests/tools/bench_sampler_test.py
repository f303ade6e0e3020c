"""tools/bench_sampler.py: our params reach HF unchanged (through the converter and back), and a toy-size run of
the whole tool prints a sane JSON line (part 1 only: part 2 compiles three more programs, minutes on 2 cores)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

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

  def test_hf_checkpoint_converts_back_to_the_same_params(self):
    cfg = presets.tiny()
    # numpy, not init_params: jax.random would compile one kernel per leaf shape (seconds each on CPU).
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(a.dtype), params_lib.abstract_params(cfg))
    hf_dir, out_dir = os.path.join(self.tmp, "hf"), os.path.join(self.tmp, "out")
    bench_sampler.write_hf_checkpoint(params, cfg, hf_dir)
    hf_convert.convert_hf_checkpoint(hf_dir, out_dir, dtype="float32", progress=False)
    got, got_cfg = ckpt_lib.load_checkpoint(out_dir)
    self.assertEqual(got_cfg.num_mtp_layers, 0)  # HF's DeepseekV3ForCausalLM has no MTP module
    chex.assert_trees_all_equal(got, {k: v for k, v in params.items() if k != "mtp"})

  @pytest.mark.e2e  # the whole tool in a process of its own
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


if __name__ == "__main__":
  absltest.main()
