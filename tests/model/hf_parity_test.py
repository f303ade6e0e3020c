"""Parity with HF `transformers.DeepseekV3ForCausalLM` through the checkpoint converter, plus the I/O pieces.

Tiny random HF models are saved with `save_pretrained` (single file, sharded, FP8 block-quantized, with an MTP
layer), converted with `c2jax.model.hf_convert`, reloaded with `c2jax.model.checkpoint`, and our forward's logits
are compared with HF's in float32: max|diff| / max|ref| <= 1e-3. Router weights, correction biases, norms and
biases are randomized (HF initializes them to zeros / ones, which would hide routing, norm and bias bugs and leave
ties in top-k), and linear weights get std 1/sqrt(fan_in) so that attention is far from uniform (which would hide
rope and softmax-scale bugs).
"""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from safetensors.torch import load_file, save_file
import torch
import transformers
import pytest

from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import embedding
from c2jax.model import hf_convert
from c2jax.model import params as params_lib
from c2jax.model import safetensors_io
from c2jax.model import transformer
from c2jax.model.config import ModelConfig, RopeConfig, RopeLayout, RopeType
from c2jax.model.norms import rms_norm

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_RTOL = 1e-3
_BATCH = 2

_BASE = dict(vocab_size=128, d_model=32, n_layers=2, n_heads=2, q_lora_rank=24, kv_lora_rank=16,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=64, moe_intermediate_size=24,
             n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
             max_position_embeddings=256)
_YARN = RopeConfig(type=RopeType.YARN, factor=4.0, original_max_position_embeddings=32, mscale=1.0,
                   mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0)


def _tempdir(test: absltest.TestCase) -> str:
  # tempfile, not absltest's create_tempdir: that needs absl flags, which pytest does not parse.
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _cfg(**kw) -> ModelConfig:
  return ModelConfig(**{**_BASE, **kw})


def _hf_model(cfg: ModelConfig, seed: int = 0) -> transformers.DeepseekV3ForCausalLM:
  """A float32 HF model of `cfg` with every parameter randomized (see the module docstring)."""
  torch.manual_seed(seed)
  model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg.to_hf_dict())).float().eval()
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.numel() == 0:
        continue
      if "norm" in name.split(".")[-2]:
        p.uniform_(0.5, 1.5, generator=g)
      elif name.endswith("mlp.gate.weight"):
        p.normal_(0.0, 0.5, generator=g)
      elif name.endswith(".bias"):
        p.normal_(0.0, 0.1, generator=g)
      elif "embed_tokens" in name:
        p.normal_(0.0, 1.0, generator=g)
      else:
        p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
    for name, b in model.named_buffers():
      if name.endswith("e_score_correction_bias"):
        b.normal_(0.0, 0.1, generator=g)
  return model


def _random_params(cfg: ModelConfig, seed: int = 0):
  # numpy, not params.init_params: jax.random would compile one kernel per leaf shape (seconds each on CPU).
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: rng.normal(size=a.shape).astype(a.dtype), params_lib.abstract_params(cfg))


def _tokens(cfg: ModelConfig, t: int, seed: int = 0) -> np.ndarray:
  toks = np.random.default_rng(seed).integers(0, cfg.vocab_size, (_BATCH, t)).astype(np.int32)
  assert not np.array_equal(toks[0], toks[1])
  return toks


def _hf_logits(model, toks: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(toks, dtype=torch.long)).logits.float().numpy()


def _our_logits(params, cfg: ModelConfig, toks: np.ndarray) -> np.ndarray:
  return np.asarray(jax.jit(lambda p, t: transformer.forward(p, t, cfg=cfg).logits)(params, toks))


def _rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _layer_divergence(model, params, cfg: ModelConfig, toks: np.ndarray) -> str:
  """Best-effort diagnosis for a failed parity check: the first decoder layer whose output disagrees with HF."""
  try:
    with torch.no_grad():
      hs = model(torch.tensor(toks, dtype=torch.long), output_hidden_states=True).hidden_states
    # HF records [embeddings, layer 0, ..., layer n-2, final_norm(layer n-1)].
    hs = [h.numpy() for h in hs][-cfg.n_layers:]
    h = embedding.embed(params, toks, cfg)
    pos = np.broadcast_to(np.arange(toks.shape[1], dtype=np.int32), toks.shape)
    lines = []
    for i in range(cfg.n_layers):
      group, j = ("dense_layers", i) if i < cfg.first_k_dense_replace else ("moe_layers",
                                                                              i - cfg.first_k_dense_replace)
      p = jax.tree.map(lambda a, j=j: a[j], params[group])
      h, _ = transformer.block(p, h, pos, None, cfg)
      ours = rms_norm(h, params["final_norm"], cfg.rms_norm_eps) if i == cfg.n_layers - 1 else h
      lines.append(f"layer {i} ({group}): rel err {_rel_err(np.asarray(ours), hs[i]):.2e}")
    return "; ".join(lines)
  except Exception as e:  # noqa: BLE001
    return f"(per-layer diagnosis failed: {e!r})"


def _convert(hf_dir: str, out_dir: str, **kw):
  summary = hf_convert.convert_hf_checkpoint(hf_dir, out_dir, dtype="float32", progress=False, **kw)
  params, cfg = ckpt_lib.load_checkpoint(out_dir)
  return params, cfg, summary


def _quantize_fp8(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
  """Per-[block, block] absmax FP8 quantization: (w_fp8 [out, in], scale_inv [ceil(out/b), ceil(in/b)])."""
  out, inp = w.shape
  nb0, nb1 = math.ceil(out / block), math.ceil(inp / block)
  padded = torch.zeros(nb0 * block, nb1 * block)
  padded[:out, :inp] = w
  amax = padded.reshape(nb0, block, nb1, block).abs().amax(dim=(1, 3)).clamp(min=1e-12)
  scale = amax / 448.0
  expanded = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out, :inp]
  return (w / expanded).to(torch.float8_e4m3fn), scale.float()


def _dequantize(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
  out, inp = q.shape
  return q.float() * scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out, :inp]


def _write_config(hf_dir: str, **updates):
  path = os.path.join(hf_dir, "config.json")
  with open(path) as f:
    c = json.load(f)
  c.update(updates)
  with open(path, "w") as f:
    json.dump(c, f)


class HfParityTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = _tempdir(self)

  def _check(self, model, params, cfg, toks):
    ref = _hf_logits(model, toks)
    ours = _our_logits(params, cfg, toks)
    chex.assert_shape(ours, ref.shape)
    err = _rel_err(ours, ref)
    if err > _RTOL:
      self.fail(f"logits differ from HF: max|diff|/max|ref| = {err:.2e} > {_RTOL}; "
                f"{_layer_divergence(model, params, cfg, toks)}")

  @parameterized.named_parameters(
      dict(testcase_name="qlora_interleaved_default_rope", cfg=dict(num_mtp_layers=1), t=16),
      dict(testcase_name="no_qlora_halves_no_shared_dense0",
           cfg=dict(q_lora_rank=None, rope=RopeConfig(layout=RopeLayout.HALVES), first_k_dense_replace=0,
                    n_shared_experts=0, norm_topk_prob=False, routed_scaling_factor=2.5), t=24),
      dict(testcase_name="yarn_groups_dense2",
           cfg=dict(n_layers=3, first_k_dense_replace=2, n_group=4, topk_group=2, num_experts_per_tok=3,
                    max_position_embeddings=128, rope=_YARN), t=48),
      dict(testcase_name="yarn_mscale_halves_bias_shared2",
           # theta 100 and 16 rope dims put the YaRN ramp at dims [1, 5] (default betas: [0, 3]).
           cfg=dict(n_layers=3, attention_bias=True, n_group=2, topk_group=1, n_shared_experts=2,
                    routed_scaling_factor=1.5, rms_norm_eps=1e-5, qk_rope_head_dim=16, max_position_embeddings=128,
                    rope=RopeConfig(theta=100.0, type=RopeType.YARN, layout=RopeLayout.HALVES, factor=4.0,
                                    original_max_position_embeddings=32, mscale=0.707, mscale_all_dim=0.0,
                                    beta_fast=2.0, beta_slow=0.5)), t=40),
      # mscale != mscale_all_dim: cos/sin carry the attention factor mscale(0.707) / mscale(1.0) != 1.
      dict(testcase_name="yarn_mscale_ratio_no_qlora_bias",
           cfg=dict(q_lora_rank=None, attention_bias=True, max_position_embeddings=128,
                    rope=dataclasses.replace(_YARN, mscale=0.707)), t=36),
      dict(testcase_name="sharded", cfg=dict(n_layers=3, n_shared_experts=2, n_group=4, topk_group=3,
                                             routed_scaling_factor=2.5), t=32, shard=True),
  )
  def test_logits_match_hf(self, cfg, t, shard=False):
    cfg = _cfg(**cfg)
    model = _hf_model(cfg)
    hf_dir = os.path.join(self.tmp, "hf")
    model.save_pretrained(hf_dir, max_shard_size="16KB" if shard else "10GB")
    self.assertEqual(os.path.exists(os.path.join(hf_dir, safetensors_io.INDEX_FILE)), shard)
    params, got_cfg, summary = _convert(hf_dir, os.path.join(self.tmp, "out"))
    # HF writes num_nextn_predict_layers without MTP weights: the converter must count the layers present.
    self.assertEqual(got_cfg, cfg.replace(num_mtp_layers=0))
    self.assertEqual(bool(summary.notes), cfg.num_mtp_layers > 0)
    self.assertEmpty(summary.warnings)
    self._check(model, params, got_cfg, _tokens(cfg, t))

  @parameterized.named_parameters(
      # Dims that are not multiples of the block (40, 24, 20, 72, ...): edge blocks are cropped.
      dict(testcase_name="block16", block=16,
           cfg=dict(d_model=40, q_lora_rank=24, kv_lora_rank=20, v_head_dim=12, intermediate_size=72)),
      dict(testcase_name="block128", block=128, cfg=dict(d_model=48, intermediate_size=160)),
  )
  def test_fp8_block_quantized(self, block, cfg):
    cfg = _cfg(**cfg)
    model = _hf_model(cfg)
    src = os.path.join(self.tmp, "src")
    model.save_pretrained(src)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    fp8, deq = {}, {}
    for name, w in tensors.items():
      quantize = name.startswith("model.layers.") and name.endswith(".weight") and w.ndim == 2 and not name.endswith(
          "mlp.gate.weight")
      if quantize:
        q, s = _quantize_fp8(w, block)
        fp8[name], fp8[name + "_scale_inv"] = q, s
        deq[name] = _dequantize(q, s, block)
      else:
        fp8[name] = deq[name] = w
    self.assertGreater(len(deq) * 2 - len(fp8), 0)
    q_dir, deq_dir = os.path.join(self.tmp, "fp8"), os.path.join(self.tmp, "deq")
    for d, t in ((q_dir, fp8), (deq_dir, deq)):
      os.makedirs(d)
      save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
      with open(os.path.join(src, "config.json")) as f, open(os.path.join(d, "config.json"), "w") as g:
        g.write(f.read())
    _write_config(q_dir, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                              "weight_block_size": [block, block]})
    ref_model = transformers.DeepseekV3ForCausalLM.from_pretrained(deq_dir, dtype=torch.float32).eval()
    params, got_cfg, summary = _convert(q_dir, os.path.join(self.tmp, "out"))
    self.assertEqual(summary.num_dequantized, len(fp8) - len(deq))
    # The dequantized weights are exact: compare one directly, beyond the logits.
    w = deq["model.layers.1.mlp.experts.3.down_proj.weight"].numpy()
    np.testing.assert_array_equal(np.asarray(params["moe_layers"]["moe"]["experts"]["down"][0, 3]), w.T)
    self._check(ref_model, params, got_cfg, _tokens(cfg, 20))

  def test_mtp_layer(self):
    cfg = _cfg(n_layers=2)
    n, d = cfg.n_layers, cfg.d_model
    model = _hf_model(cfg)
    hf_dir, donor_dir = os.path.join(self.tmp, "hf"), os.path.join(self.tmp, "donor")
    model.save_pretrained(hf_dir)
    # An MoE block for the MTP layer, saved by HF in the checkpoint format, then renumbered to layer n.
    _hf_model(_cfg(n_layers=n + 1), seed=5).save_pretrained(donor_dir)
    donor = load_file(os.path.join(donor_dir, "model.safetensors"))
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    g = torch.Generator().manual_seed(9)
    extra = {k: v for k, v in donor.items() if k.startswith(f"model.layers.{n}.")}
    p = f"model.layers.{n}."
    extra[p + "enorm.weight"] = torch.rand(d, generator=g) + 0.5
    extra[p + "hnorm.weight"] = torch.rand(d, generator=g) + 0.5
    extra[p + "eh_proj.weight"] = torch.randn(d, 2 * d, generator=g)
    extra[p + "shared_head.norm.weight"] = torch.rand(d, generator=g) + 0.5
    extra[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    extra[p + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file({**tensors, **extra}, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    _write_config(hf_dir, num_nextn_predict_layers=1)

    params, got_cfg, summary = _convert(hf_dir, os.path.join(self.tmp, "out"))
    self.assertEqual(got_cfg.num_mtp_layers, 1)
    self.assertEqual(summary.num_mtp_layers, 1)
    self.assertEmpty(summary.warnings)
    self.assertLen([s for s in summary.skipped if "MTP copy" in s], 2)
    mtp = jax.tree.map(lambda a: np.asarray(a[0]), params["mtp"])
    t = {k: v.numpy() for k, v in extra.items()}
    h, nope, rope, v, lq, lkv = (cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                 cfg.q_lora_rank, cfg.kv_lora_rank)
    eq = np.testing.assert_array_equal
    eq(mtp["enorm"], t[p + "enorm.weight"])
    eq(mtp["hnorm"], t[p + "hnorm.weight"])
    eq(mtp["final_norm"], t[p + "shared_head.norm.weight"])
    eq(mtp["eh_proj"], t[p + "eh_proj.weight"].T)  # [2D, D], rows: embedding half first, then hidden half
    blk, a = mtp["block"], mtp["block"]["attn"]
    eq(blk["attn_norm"], t[p + "input_layernorm.weight"])
    eq(blk["mlp_norm"], t[p + "post_attention_layernorm.weight"])
    eq(a["q_a"], t[p + "self_attn.q_a_proj.weight"].T)
    eq(a["q_b"], t[p + "self_attn.q_b_proj.weight"].reshape(h, nope + rope, lq).transpose(2, 0, 1))
    eq(a["kv_a"], t[p + "self_attn.kv_a_proj_with_mqa.weight"].T)
    eq(a["kv_b"], t[p + "self_attn.kv_b_proj.weight"].reshape(h, nope + v, lkv).transpose(2, 0, 1))
    eq(a["o"], t[p + "self_attn.o_proj.weight"].reshape(d, h, v).transpose(1, 2, 0))
    eq(a["kv_a_norm"], t[p + "self_attn.kv_a_layernorm.weight"])
    eq(blk["moe"]["router"], t[p + "mlp.gate.weight"].T)
    eq(blk["moe"]["router_bias"], t[p + "mlp.gate.e_score_correction_bias"])
    for e in range(cfg.n_routed_experts):
      for proj in ("gate", "up", "down"):
        eq(blk["moe"]["experts"][proj][e], t[f"{p}mlp.experts.{e}.{proj}_proj.weight"].T)
    for proj in ("gate", "up", "down"):
      eq(blk["moe"]["shared"][proj], t[f"{p}mlp.shared_experts.{proj}_proj.weight"].T)
    # The main model is unaffected by the extra layer, and the MTP path runs.
    toks = _tokens(cfg, 16)
    out = jax.jit(lambda p, x: transformer.forward(p, x, cfg=got_cfg))(params, toks)
    self.assertLessEqual(_rel_err(np.asarray(out.logits), _hf_logits(model, toks)), _RTOL)
    chex.assert_shape(out.mtp_logits, (1, _BATCH, 16, cfg.vocab_size))
    chex.assert_tree_all_finite(out.mtp_logits)

    # An MTP copy of the embedding that differs from the main one is reported, not silently used.
    extra[p + "embed_tokens.weight"] += 1.0
    save_file({**tensors, **extra}, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    summary = hf_convert.convert_hf_checkpoint(hf_dir, os.path.join(self.tmp, "out2"), progress=False)
    self.assertLen(summary.warnings, 1)
    self.assertIn("embed_tokens", summary.warnings[0])

  @pytest.mark.slow
  def test_tools_end_to_end(self):
    cfg = _cfg(n_layers=2)
    model = _hf_model(cfg)
    hf_dir, out_dir = os.path.join(self.tmp, "hf"), os.path.join(self.tmp, "out")
    model.save_pretrained(hf_dir)
    toks = _tokens(cfg, 16)
    np.save(os.path.join(self.tmp, "ids.npy"), toks)
    env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def run(tool, *flags):
      r = subprocess.run([sys.executable, os.path.join(_REPO, "tools", tool), *flags], env=env, cwd=self.tmp,
                         capture_output=True, text=True, timeout=300, check=False)
      self.assertEqual(r.returncode, 0, f"{tool} failed:\n{r.stdout}\n{r.stderr}")
      return r.stdout

    out = run("convert_hf.py", f"--hf_dir={hf_dir}", f"--out_dir={out_dir}", "--dtype=float32", "--noprogress")
    self.assertIn("HF tensors", out)
    run("logits.py", f"--checkpoint={out_dir}", f"--input_ids={self.tmp}/ids.npy", f"--output={self.tmp}/lg.npy")
    logits = np.load(os.path.join(self.tmp, "lg.npy"))
    self.assertEqual(logits.dtype, np.float32)
    self.assertLessEqual(_rel_err(logits, _hf_logits(model, toks)), _RTOL)


class ConverterErrorsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = _tempdir(self)
    self.cfg = _cfg()
    self.hf_dir = os.path.join(self.tmp, "hf")
    _hf_model(self.cfg).save_pretrained(self.hf_dir)
    self.tensors = load_file(os.path.join(self.hf_dir, "model.safetensors"))

  def test_unexpected_and_missing_tensors_are_listed(self):
    t = dict(self.tensors)
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    del t["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(t, os.path.join(self.hf_dir, "model.safetensors"), metadata={"format": "pt"})
    with self.assertRaisesRegex(ValueError, r"1 unexpected tensors \[model.layers.0.self_attn.rotary_emb.inv_freq\]"
                                r".*1 missing tensors \[model.layers.1.mlp.experts.3.up_proj.weight\]"):
      hf_convert.convert_hf_checkpoint(self.hf_dir, os.path.join(self.tmp, "out"), progress=False)
    self.assertFalse(os.path.exists(os.path.join(self.tmp, "out", ckpt_lib.CONFIG_FILE)))

  def test_shape_contradicting_config(self):
    _write_config(self.hf_dir, moe_intermediate_size=self.cfg.moe_intermediate_size + 8)
    with self.assertRaisesRegex(ValueError, r"shapes that config.json contradicts: .*experts.0.down_proj.weight"):
      hf_convert.convert_hf_checkpoint(self.hf_dir, os.path.join(self.tmp, "out"), progress=False)

  def test_existing_output_is_not_overwritten(self):
    out = os.path.join(self.tmp, "out")
    hf_convert.convert_hf_checkpoint(self.hf_dir, out, progress=False)
    with self.assertRaisesRegex(FileExistsError, "already holds a checkpoint"):
      hf_convert.convert_hf_checkpoint(self.hf_dir, out, progress=False)

  def test_fp8_without_quantization_config(self):
    t = dict(self.tensors)
    name = "model.layers.0.mlp.up_proj.weight"
    t[name], t[name + "_scale_inv"] = _quantize_fp8(t[name], 16)
    save_file(t, os.path.join(self.hf_dir, "model.safetensors"), metadata={"format": "pt"})
    with self.assertRaisesRegex(ValueError, "no quantization_config"):
      hf_convert.convert_hf_checkpoint(self.hf_dir, os.path.join(self.tmp, "out"), progress=False)


class SafetensorsIoTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = _tempdir(self)

  def test_dtypes_round_trip_lazily(self):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g)
    tensors = {"f32": x, "f16": x.half(), "bf16": x.bfloat16(), "f8": x.to(torch.float8_e4m3fn),
               "i64": torch.arange(6).reshape(2, 3), "i32": torch.arange(4, dtype=torch.int32),
               "u8": torch.arange(9, dtype=torch.uint8), "bool": torch.tensor([True, False]),
               "empty": torch.zeros(0, 3)}
    path = os.path.join(self.tmp, "a.safetensors")
    save_file(tensors, path)
    r = safetensors_io.SafetensorsReader(path)
    self.assertCountEqual(r.keys(), tensors)
    as_np = {"bf16": lambda t: t.view(torch.int16).numpy().view(ml_dtypes.bfloat16),
             "f8": lambda t: t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)}
    for k, t in tensors.items():
      want = as_np.get(k, lambda t: t.numpy())(t)
      got = r.get(k)
      self.assertEqual(got.dtype, want.dtype, k)
      np.testing.assert_array_equal(got, want, err_msg=k)
    self.assertIsInstance(r.get("f32"), np.memmap)

  def test_unknown_dtype(self):
    header = json.dumps({"x": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}).encode()
    path = os.path.join(self.tmp, "bad.safetensors")
    with open(path, "wb") as f:
      f.write(len(header).to_bytes(8, "little") + header + b"\0")
    with self.assertRaisesRegex(ValueError, "dtype 'F4'"):
      safetensors_io.SafetensorsReader(path)

  def test_truncated_file(self):
    path = os.path.join(self.tmp, "t.safetensors")
    save_file({"x": torch.ones(100)}, path)
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) - 8)
    with self.assertRaisesRegex(ValueError, "corrupt"):
      safetensors_io.SafetensorsReader(path)

  def test_fp8_dequantization_and_errors(self):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 21, generator=g)
    q, s = _quantize_fp8(w, 8)
    save_file({"a.weight": q, "a.weight_scale_inv": s, "b.weight": q.clone(), "c.weight": q.clone(),
               "c.weight_scale_inv": s[:, :2].contiguous()}, os.path.join(self.tmp, "model.safetensors"))
    weights = safetensors_io.HfWeights(self.tmp, safetensors_io.Fp8BlockQuant((8, 8)))
    self.assertCountEqual(weights.keys(), ["a.weight", "b.weight", "c.weight"])
    got = weights.get("a.weight")
    self.assertEqual(got.dtype, np.float32)
    np.testing.assert_allclose(got, _dequantize(q, s, 8).numpy(), rtol=1e-6)
    np.testing.assert_allclose(got, w.numpy(), rtol=0.07, atol=1e-3)  # FP8 keeps ~3 mantissa bits
    with self.assertRaisesRegex(ValueError, "b.weight_scale_inv is missing"):
      weights.get("b.weight")
    with self.assertRaisesRegex(ValueError, r"c.weight_scale_inv has shape \(5, 2\) .* needs \[5, 3\]"):
      weights.get("c.weight")

  def test_quantization_config(self):
    parse = safetensors_io.Fp8BlockQuant.from_hf_config
    self.assertIsNone(parse({}))
    self.assertEqual(parse({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 32]}}),
                     safetensors_io.Fp8BlockQuant((64, 32)))
    with self.assertRaisesRegex(ValueError, "compressed-tensors"):
      parse({"quantization_config": {"quant_method": "compressed-tensors"}})


class CheckpointTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = _tempdir(self)

  def test_save_load_round_trip_with_dtype_and_sharding(self):
    cfg = _cfg(num_mtp_layers=1)
    params = _random_params(cfg)
    ckpt_lib.save_checkpoint(self.tmp + "/c", params, cfg)
    got, got_cfg = ckpt_lib.load_checkpoint(self.tmp + "/c")
    self.assertEqual(got_cfg, cfg)
    chex.assert_trees_all_equal(got, params)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    got, got_cfg = ckpt_lib.load_checkpoint(self.tmp + "/c", shardings=sharding, dtype="bfloat16")
    self.assertEqual(got_cfg.param_dtype, "bfloat16")
    self.assertEqual(got["embed"].dtype, jax.numpy.bfloat16)
    self.assertEqual(got["moe_layers"]["moe"]["router"].dtype, np.float32)
    self.assertEqual(got["embed"].sharding, sharding)
    with self.assertRaisesRegex(FileExistsError, "already holds"):
      ckpt_lib.save_checkpoint(self.tmp + "/c", params, cfg)
    with self.assertRaisesRegex(ValueError, r"moe_layers/moe/shared/down has shape \(1, 24, 32\), config needs "):
      ckpt_lib.save_checkpoint(self.tmp + "/d", params, cfg.replace(n_shared_experts=2))

  def test_streamed_checkpoint_is_plain_orbax(self):
    cfg = _cfg(n_layers=3)
    params = _random_params(cfg, seed=1)
    with ckpt_lib.StreamingCheckpointWriter(self.tmp + "/s", cfg) as w:
      for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(k.key for k in path)
        stacked = 2 if "experts" in keys else (1 if keys[0] in ("dense_layers", "moe_layers") else 0)
        for idx in np.ndindex(leaf.shape[:stacked]):
          w.write(keys, idx, leaf[idx])
    abstract = params_lib.abstract_params(cfg)
    restored = ocp.StandardCheckpointer().restore(self.tmp + "/s/params", abstract)
    chex.assert_trees_all_equal(restored, params)
    got, _ = ckpt_lib.load_checkpoint(self.tmp + "/s")
    chex.assert_trees_all_equal(got, params)

  def test_streaming_writer_refuses_an_incomplete_checkpoint(self):
    cfg = _cfg()
    with self.assertRaisesRegex(ValueError, r"pieces were never written, e.g. \['dense_layers/attn/kv_a\[0\]'"):
      with ckpt_lib.StreamingCheckpointWriter(self.tmp + "/s", cfg):
        pass
    with self.assertRaisesRegex(FileNotFoundError, "model_config.json is missing"):
      ckpt_lib.load_checkpoint(self.tmp + "/s")


if __name__ == "__main__":
  absltest.main()
