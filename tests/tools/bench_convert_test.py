"""tools/bench_convert.py: its INT4 packer is compressed-tensors' (the reference, called here directly), its Kimi
K2.5 source holds the BF16 source's model, a run is measured on its own (not with the benchmark's memory), and a
tiny run of the whole tool prints the JSON fields (one conversion per source, ~10 s on 2 cores)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams
import ml_dtypes
import numpy as np
import pytest
import torch

from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_convert
from c2jax.model.safetensors_io import SafetensorsReader
from tools import bench_convert

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BF16 = np.dtype(ml_dtypes.bfloat16)
# Tiny: 2 MoE layers of 4 experts after a dense layer; widths multiples of the INT4 group (32).
_TINY = dict(d_model=64, n_layers=3, n_routed_experts=4, moe_intermediate_size=32, vocab_size=256)


def _ct_compress(w: np.ndarray) -> dict[str, np.ndarray]:
  """compressed-tensors' pack-quantization of a BF16 w [out, in] with group 32, as the releases were made."""
  scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
      num_bits=4, type="int", symmetric=True, strategy="group", group_size=32))
  t = torch.from_numpy(w.view(np.int16).copy()).view(torch.bfloat16)
  groups = t.float().reshape(t.shape[0], -1, 32)
  scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
  out = PackedQuantizationCompressor.compress({"weight": t, "weight_scale": scale.bfloat16()}, scheme)
  return {"packed": out["weight_packed"].numpy(), "scale": out["weight_scale"].view(torch.int16).numpy()}


class PackingTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="expert_gate", shape=(32, 64)),
      dict(testcase_name="expert_down", shape=(64, 96)),
      dict(testcase_name="one_row", shape=(1, 256)),
  )
  def test_quantize_int4_is_compressed_tensors_bit_for_bit(self, shape):
    rng = np.random.default_rng(sum(shape))
    # Heavy-tailed rows (very different group scales) and one all-zero group (the eps scale).
    w = (rng.standard_normal(shape, dtype=np.float32) * np.exp(2 * rng.standard_normal((shape[0], 1)))).astype(_BF16)
    w[0, :32] = 0
    packed, scale = bench_convert.quantize_int4(w)
    ref = _ct_compress(w)
    chex.assert_shape(packed, (shape[0], shape[1] // 8))
    self.assertEqual(packed.dtype, np.int32)
    np.testing.assert_array_equal(packed, ref["packed"])
    np.testing.assert_array_equal(scale.view(np.int16), ref["scale"])
    bench_convert.check_packing_against_compressed_tensors(w)  # the tool's own check agrees

  def test_pack_int4_is_pack_to_int32(self):
    rng = np.random.default_rng(0)
    for shape in ((4, 64), (3, 36)):  # 36 columns: the last word of a row is padded with zero nibbles
      q = rng.integers(-8, 8, shape, dtype=np.int8)
      np.testing.assert_array_equal(bench_convert.pack_int4(q), pack_to_int32(torch.from_numpy(q), 4).numpy())

  def test_check_refuses_a_packer_that_differs(self):
    w = np.random.default_rng(1).standard_normal((8, 64), dtype=np.float32).astype(_BF16)
    good = bench_convert.quantize_int4

    def flipped(x):
      packed, scale = good(x)
      packed = packed.copy()
      packed[3, 5] ^= 1
      return packed, scale

    with mock.patch.object(bench_convert, "quantize_int4", flipped):
      with self.assertRaisesRegex(AssertionError, "differs from compressed-tensors"):
        bench_convert.check_packing_against_compressed_tensors(w)


class SourcesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    # tempfile, not absltest's create_tempdir: that needs absl flags, which pytest does not parse.
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def test_kimi_k25_source_converts_to_the_bf16_model_with_int4_experts(self):
    cfg = bench_convert.model_config(**_TINY)
    bf16, k25 = os.path.join(self.tmp, "bf16"), os.path.join(self.tmp, "k25")
    bench_convert.write_bf16_source(bench_convert.random_params(cfg), cfg, bf16, "5GB")
    # A shard limit below the model's size: several shards and an index, as the releases have.
    n_int4 = bench_convert.write_int4_source(bf16, k25, "kimi_k25", "100KB")
    self.assertEqual(n_int4, cfg.n_moe_layers * cfg.n_routed_experts * 3)
    self.assertGreater(len([n for n in os.listdir(k25) if n.endswith(".safetensors")]), 1)
    config = hf_convert.read_hf_config(k25)
    self.assertEqual(hf_convert.layout_of(config).name, "kimi_k25")
    self.assertEqual(config["text_config"]["quantization_config"]["ignore"], bench_convert.K25_IGNORE)
    names = SafetensorsReader(k25).keys()
    self.assertTrue(all(n.startswith("language_model.") for n in names))
    self.assertLen([n for n in names if n.endswith("_packed")], n_int4)

    summaries = {}
    for name, src in (("bf16", bf16), ("k25", k25)):
      summaries[name] = hf_convert.convert_hf_checkpoint(src, os.path.join(self.tmp, f"out_{name}"), progress=False)
    self.assertEqual((summaries["bf16"].num_dequantized_int4, summaries["k25"].num_dequantized_int4), (0, n_int4))
    got, got_cfg = ckpt_lib.load_checkpoint(os.path.join(self.tmp, "out_k25"))
    want, want_cfg = ckpt_lib.load_checkpoint(os.path.join(self.tmp, "out_bf16"))
    self.assertEqual(got_cfg, want_cfg)
    self.assertEqual(got_cfg.param_dtype, "bfloat16")
    experts_got = got["moe_layers"]["moe"].pop("experts")
    experts_want = want["moe_layers"]["moe"].pop("experts")
    chex.assert_trees_all_equal(got, want)  # everything but the routed experts is copied unchanged
    for k in ("gate", "up", "down"):
      a = np.asarray(experts_got[k], np.float32)
      b = np.asarray(experts_want[k], np.float32)
      # INT4 with a scale of absmax / 7.5 per 32 inputs: within half a step (+ BF16 rounding) of the original.
      bound = np.abs(b).max() / 7.5 * 0.51
      self.assertLessEqual(np.abs(a - b).max(), bound, k)
      self.assertGreater(np.abs(a - b).max(), 0, f"{k}: the experts were not quantized")


class RunMeasuredTest(absltest.TestCase):

  def test_peak_rss_is_the_childs_own(self):
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    ballast = np.ones(300 * 2**20, np.uint8)  # this process grows by 300 MB; a child forked from it would start so
    small = bench_convert.run_measured([sys.executable, "-c", "pass"], os.path.join(tmp, "small.log"))
    big = bench_convert.run_measured(
        [sys.executable, "-c", "import numpy as np; a = np.ones(200 * 2**20, np.uint8); print(a.sum())"],
        os.path.join(tmp, "big.log"))
    del ballast
    self.assertLess(small["peak_rss_gb"], 0.1)
    self.assertGreater(big["peak_rss_gb"], 0.2)
    self.assertLess(big["peak_rss_gb"], 0.3)
    with open(os.path.join(tmp, "big.log")) as f:
      self.assertEqual(f.read().strip(), str(200 * 2**20))
    with self.assertRaisesRegex(RuntimeError, "exited with 3"):
      bench_convert.run_measured([sys.executable, "-c", "raise SystemExit(3)"], os.path.join(tmp, "fail.log"))


class ToolTest(absltest.TestCase):

  @pytest.mark.e2e  # the whole tool and its conversions, processes of their own
  @pytest.mark.slow
  def test_tiny_run_prints_json(self):
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    size = [f"--{k}={v}" for k, v in _TINY.items()]
    r = subprocess.run([sys.executable, os.path.join(_REPO, "tools", "bench_convert.py"), *size, "--repeats=1",
                        "--nocheck_packing", f"--workdir={tmp}"], cwd=tmp, capture_output=True, text=True,
                       timeout=300, check=False)
    self.assertEqual(r.returncode, 0, f"bench_convert failed:\n{r.stdout}\n{r.stderr}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    n_int4 = 2 * _TINY["n_routed_experts"] * 3
    self.assertEqual(result["model"]["n_moe_layers"], 2)
    self.assertEqual((result["repeats"], result["dtype_flag"], result["experts_dtype"]), (1, None, "bfloat16"))
    bf16, k25 = result["sources"]["bf16"], result["sources"]["kimi_k25"]
    self.assertEqual((bf16["int4_tensors"], k25["int4_tensors"]), (0, n_int4))
    self.assertEqual((bf16["dtype"], k25["dtype"]), ("bfloat16", "bfloat16"))
    self.assertEqual(bf16["bytes"], sum(os.path.getsize(os.path.join(tmp, "src_bf16", n))
                                        for n in os.listdir(os.path.join(tmp, "src_bf16"))))
    for s in (bf16, k25, result["imports"]):
      self.assertLen(s["seconds"], 1)
      self.assertGreater(s["median_s"], 0)
      self.assertGreater(s["median_peak_rss_gb"], 0.05)  # python + jax + orbax at least
    q = result["ratios"]["kimi_k25"]
    self.assertAlmostEqual(q["time"], k25["median_s"] / bf16["median_s"], delta=0.01)
    self.assertAlmostEqual(q["peak_rss"], k25["median_peak_rss_gb"] / bf16["median_peak_rss_gb"], delta=0.01)
    self.assertLess(q["bytes"], 1.0)  # INT4 experts: a smaller source
    self.assertGreater(result["int4_dequantize_s"]["kimi_k25"], 0)


if __name__ == "__main__":
  absltest.main()
