"""The Kimi K2.5 and K2 Thinking releases through the HF converter: INT4 pack-quantized experts, the K2.5 layout.

References, all independent of c2jax: compressed-tensors (the library the releases were written with) packs the
INT4 weights, decompresses them and decides which modules a quantization_config quantizes
(`match_named_modules` on a module tree with the release's names and classes); HF transformers computes the
reference logits, loading the release layout with every weight replaced by compressed-tensors' decompression
(`KimiK25ForConditionalGeneration.from_pretrained` for K2.5, `DeepseekV3ForCausalLM` for the flat layout).

The tiny releases follow the real ones: BF16 tensors, a float32 `e_score_correction_bias`, routed experts INT4 with
BF16 scales per 32 input columns, YaRN written the older way (`rope_scaling` + `rope_theta`), model_type kimi_k2
in the text config, no MTP layers, and for K2.5 a MoonViT vision tower and projector saved by HF's own
`KimiK25ForConditionalGeneration`.
"""

import copy
import json
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import chex
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams
from compressed_tensors.utils import match_named_modules
import ml_dtypes
import numpy as np
from safetensors.torch import load_file, save_file
import torch
import transformers
from transformers.models.kimi_k25 import Kimi_K25Config, Kimi_K25ForConditionalGeneration
import pytest

from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_convert
from c2jax.model import int4_pack
from c2jax.model import safetensors_io
from c2jax.model.config import RopeConfig, RopeType
from tests.model import hf_parity_test as parity

# The releases' ignore lists (Kimi K2.5 / K2.6 and Kimi K2 Thinking config.json).
K25_IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
              "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"]
K2_THINKING_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                      r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]
GROUP = 32
# Tiny Kimi K2: 8 experts of width 32 (a multiple of the group), two MoE layers after one dense layer, YaRN.
CFG = parity._cfg(d_model=64, n_layers=3, n_heads=2, moe_intermediate_size=32, n_routed_experts=8,
                  routed_scaling_factor=2.827, rms_norm_eps=1e-5, max_position_embeddings=128,
                  rope=RopeConfig(theta=50000.0, type=RopeType.YARN, factor=4.0, original_max_position_embeddings=32,
                                  beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
TINY_VISION = dict(patch_size=2, pos_emb_height=4, pos_emb_width=4, pos_emb_time=2, num_attention_heads=2,
                   num_hidden_layers=2, hidden_size=16, intermediate_size=32)
# Module classes of the releases' modeling code (DeepSeek-V3 text model, MoonViT): these are torch.nn.Linear.
_LINEAR = {"q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj",
           "down_proj", "lm_head", "eh_proj", "wqkv", "wo", "fc0", "fc1"}


def _scheme(group_size: int = GROUP) -> QuantizationScheme:
  return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
      num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size))


def _quantization_config(ignore, targets=("Linear",), group_size: int = GROUP) -> dict:
  """The release's quantization_config, serialized by compressed-tensors itself."""
  scheme = _scheme(group_size).model_copy(update={"targets": list(targets)})
  return QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized", ignore=list(ignore),
                            quantization_status="compressed").model_dump(mode="json")


def _pack(w: torch.Tensor, group_size: int = GROUP) -> dict[str, torch.Tensor]:
  """compressed-tensors' INT4 pack-quantization of w [out, in]: weight_packed, weight_scale (BF16), weight_shape."""
  scheme = _scheme(group_size)
  groups = w.float().reshape(w.shape[0], -1, group_size)
  scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
  return PackedQuantizationCompressor.compress({"weight": w.bfloat16(), "weight_scale": scale.bfloat16()}, scheme)


def _decompress(packed: dict[str, torch.Tensor], group_size: int = GROUP, scale_dtype=None) -> torch.Tensor:
  """compressed-tensors' decompression (in the scale's dtype, or in `scale_dtype` when given)."""
  sd = dict(packed)
  if scale_dtype is not None:
    sd["weight_scale"] = sd["weight_scale"].to(scale_dtype)
  return PackedQuantizationCompressor.decompress(sd, _scheme(group_size))["weight"]


def _np(t: torch.Tensor) -> np.ndarray:
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return t.numpy()


def _module_tree(names) -> torch.nn.Module:
  """Modules named as the checkpoint's tensors' modules, of the releases' classes (Linear, Embedding, others)."""
  root = torch.nn.Module()
  for name in names:
    parts = name.split(".")[:-1]
    parent = root
    for i, part in enumerate(parts):
      if not hasattr(parent, part):
        leaf = i == len(parts) - 1
        if leaf and (part in _LINEAR or parts[-2:-1] == ["proj"] and parts[0] == "mm_projector"):
          child = torch.nn.Linear(1, 1, bias=False, device="meta")
        elif leaf and part == "embed_tokens":
          child = torch.nn.Embedding(1, 1, device="meta")
        else:
          child = torch.nn.Module()
        parent.add_module(part, child)
      parent = getattr(parent, part)
  return root


def _ct_quantized(names, quantization_config: dict) -> set[str]:
  """Module names compressed-tensors quantizes: it attaches a scheme to the matched Linear and Embedding modules."""
  targets = [t for g in quantization_config["config_groups"].values() for t in g["targets"]]
  return {n for n, m in match_named_modules(_module_tree(names), targets, quantization_config["ignore"])
          if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}


def _text_config(quantization_config: dict | None) -> dict:
  """The K2 text config as the releases write it (model_type kimi_k2, YaRN as rope_scaling + rope_theta)."""
  c = CFG.to_hf_dict()
  rp = c.pop("rope_parameters")
  c.pop("rope_interleave")  # the releases leave it to the default (interleaved)
  c.update(model_type="kimi_k2", rope_theta=rp.pop("rope_theta"), torch_dtype="bfloat16", topk_method="noaux_tc",
           scoring_func="sigmoid", moe_layer_freq=1, num_nextn_predict_layers=0, tie_word_embeddings=False,
           rope_scaling={"type": rp.pop("rope_type"), **{k: rp[k] for k in (
               "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")}})
  if quantization_config is not None:
    c["quantization_config"] = quantization_config
  return c


def _write(directory: str, tensors: dict[str, torch.Tensor], config: dict):
  os.makedirs(directory)
  save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "model.safetensors"),
            metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=1)


class Int4PackTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="expert_32", shape=(48, 64), group_size=32),
      dict(testcase_name="down_32", shape=(64, 96), group_size=32),
      dict(testcase_name="group_128", shape=(16, 256), group_size=128),
      # in = 36 is not a multiple of 8: the last int32 of each row holds 4 values and 4 zero nibbles.
      dict(testcase_name="group_12_padded_word", shape=(7, 36), group_size=12),
      dict(testcase_name="group_8", shape=(5, 40), group_size=8),
  )
  def test_dequantize_equals_compressed_tensors(self, shape, group_size):
    g = torch.Generator().manual_seed(sum(shape) + group_size)
    # Heavy-tailed rows, so that groups get very different scales.
    w = torch.randn(*shape, generator=g) * torch.exp(torch.randn(shape[0], 1, generator=g))
    packed = _pack(w, group_size)
    chex.assert_shape(packed["weight_packed"], (shape[0], -(-shape[1] // 8)))
    ours = int4_pack.dequantize(_np(packed["weight_packed"]), _np(packed["weight_scale"]),
                                _np(packed["weight_shape"]), group_size)
    self.assertEqual(ours.dtype, np.float32)
    # With the stored BF16 scale compressed-tensors rounds q * scale to BF16: ours is exact, and rounds to it.
    ref_bf16 = _np(_decompress(packed, group_size))
    np.testing.assert_array_equal(ours.astype(ml_dtypes.bfloat16).view(np.int16), ref_bf16.view(np.int16))
    self.assertFalse(np.array_equal(ours, ref_bf16.astype(np.float32)),
                     "no product needed rounding to BF16: the test would not tell exact from rounded")
    # In float32 (the scale upcast) compressed-tensors' product is exact too: equal bit for bit.
    ref_f32 = _np(_decompress(packed, group_size, torch.float32))
    np.testing.assert_array_equal(ours.view(np.int32), ref_f32.view(np.int32))
    # The integers themselves, against compressed-tensors' packer.
    q = torch.randint(-8, 8, shape, generator=g, dtype=torch.int8)
    np.testing.assert_array_equal(int4_pack.unpack(pack_to_int32(q, 4).numpy(), shape), q.numpy())

  def test_refuses_inconsistent_shapes(self):
    packed = np.zeros((4, 8), np.int32)
    with self.assertRaisesRegex(ValueError, r"packed INT4 weight has shape \[4, 8\], but weight_shape \[4, 72\] "
                                r"needs \[4, 9\]"):
      int4_pack.dequantize(packed, np.ones((4, 2), np.float32), (4, 72), 36)
    with self.assertRaisesRegex(ValueError, r"weight_scale has shape \[4, 1\], but weight_shape \[4, 64\] with "
                                r"group_size 32 needs \[4, 2\]"):
      int4_pack.dequantize(packed, np.ones((4, 1), np.float32), (4, 64), 32)
    with self.assertRaisesRegex(ValueError, "not a multiple of group_size 24"):
      int4_pack.dequantize(packed, np.ones((4, 2), np.float32), (4, 64), 24)

  @parameterized.named_parameters(
      dict(testcase_name="k25_release", targets=["Linear"], ignore=K25_IGNORE, prefix="language_model."),
      dict(testcase_name="k2_thinking_release", targets=["Linear"], ignore=K2_THINKING_IGNORE, prefix=""),
      # re: patterns are anchored at the start only: "re:self_attn" ignores nothing, "re:.*self_attn" everything.
      dict(testcase_name="anchored_regex", targets=["Linear"], ignore=["re:self_attn", "re:.*o_proj"], prefix=""),
      dict(testcase_name="class_and_exact_names", prefix="",
           targets=["Embedding", "re:.*experts\\.[0-3]\\.", "model.layers.1.self_attn.q_b_proj"],
           ignore=["model.layers.2.mlp.experts.1.up_proj", "Embedding"]),
      dict(testcase_name="regex_targets", prefix="language_model.",
           targets=["re:.*layers\\.[12]\\.", "re:.*norm", "Embedding"], ignore=["re:.*experts\\.[4-7]\\."]),
  )
  def test_matching_follows_compressed_tensors(self, targets, ignore, prefix):
    names = [prefix + n for n in hf_convert.conversion_plan(CFG)]
    qc = _quantization_config(ignore, targets)
    scheme = safetensors_io.quantization_from_hf_config({"quantization_config": qc})
    tree = _module_tree(names)
    ours = {n for n, m in tree.named_modules() if n and scheme.quantizes(n, [c.__name__ for c in type(m).__mro__])}
    self.assertSetEqual(ours, _ct_quantized(names, qc))
    self.assertNotEmpty(ours)
    # The converter's own classes of the modules (from the plan) give the same answer.
    plan = hf_convert.conversion_plan(CFG)
    conv = {prefix + p.rsplit(".", 1)[0] for p in plan
            if scheme.quantizes(prefix + p.rsplit(".", 1)[0], hf_convert._module_classes(p, plan))}
    self.assertSetEqual(conv, ours)

  def test_quantization_config_location(self):
    qc = _quantization_config(K25_IGNORE)
    want = int4_pack.PackQuantizedInt4(group_size=32, targets=("Linear",), ignore=tuple(K25_IGNORE))
    parse = safetensors_io.quantization_from_hf_config
    self.assertEqual(parse({"quantization_config": qc}), want)
    self.assertEqual(parse({"text_config": {"quantization_config": qc}}), want)
    reordered = {k: qc[k] for k in reversed(list(qc))} | {"version": "0.12.2"}  # same scheme, written differently
    self.assertEqual(parse({"quantization_config": qc, "text_config": {"quantization_config": reordered}}), want)
    other = copy.deepcopy(qc)
    other["ignore"] = other["ignore"][:-1]
    with self.assertRaisesRegex(ValueError, "one quantization_config at the top level and a different one in "
                                "text_config"):
      parse({"quantization_config": qc, "text_config": {"quantization_config": other}})
    self.assertIsNone(parse({"text_config": {}}))

  @parameterized.named_parameters(
      dict(testcase_name="int8", change={"num_bits": 8}, match="stores int 8-bit weights"),
      dict(testcase_name="asymmetric", change={"symmetric": False}, match="asymmetric"),
      dict(testcase_name="channel", change={"strategy": "channel", "group_size": None}, match="strategy 'channel'"),
      dict(testcase_name="activations", change=None, match="quantizes activations"),
      dict(testcase_name="float_format", change={"format": "float-quantized"}, match="format 'float-quantized'"),
  )
  def test_refuses_other_schemes(self, change, match):
    qc = _quantization_config(K25_IGNORE)
    group = qc["config_groups"]["group_0"]
    if change is None:
      group["input_activations"] = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token"}
    elif "format" in change:
      qc.update(change)
    else:
      group["weights"].update(change)
    with self.assertRaisesRegex(ValueError, f"quantization_config: .*{match}.*; c2jax reads compressed-tensors "
                                "checkpoints whose quantized weights are all weight-only symmetric INT4"):
      safetensors_io.quantization_from_hf_config({"quantization_config": qc})


class KimiReleaseTest(parameterized.TestCase):
  """Tiny Kimi K2.5 and K2 Thinking releases, converted, against HF transformers."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
    model = parity._hf_model(CFG)
    with torch.no_grad():  # the releases are BF16: round, so the stored tensors are the model's values
      for p in model.parameters():
        p.copy_(p.bfloat16().float())
    model.save_pretrained(os.path.join(cls.tmp, "src"))
    cls.text = load_file(os.path.join(cls.tmp, "src", "model.safetensors"))  # the flat names, per-expert
    # HF's own K2.5 model saves the vision tower and projector under the release's names (two renames aside).
    vision = Kimi_K25ForConditionalGeneration(Kimi_K25Config(
        text_config=CFG.to_hf_dict(), vision_config=TINY_VISION, projection_hidden_size=16,
        tie_word_embeddings=False))
    vision.save_pretrained(os.path.join(cls.tmp, "k25"))
    with open(os.path.join(cls.tmp, "k25", "config.json")) as f:
      cls.vision_config = json.load(f)["vision_config"]
    cls.vision = {}
    for n, t in load_file(os.path.join(cls.tmp, "k25", "model.safetensors")).items():
      n = n.replace("model.mm_projector.", "mm_projector.").replace("vision_tower.encoder.patch_embed.",
                                                                    "vision_tower.patch_embed.")
      if n.startswith(("vision_tower.", "mm_projector.")):
        cls.vision[n] = t.bfloat16()
    assert any(n.startswith("vision_tower.encoder.blocks.1.wqkv") for n in cls.vision), sorted(cls.vision)

  def setUp(self):
    super().setUp()
    self.tmp = parity._tempdir(self)

  def _release(self, prefix: str, qc: dict, with_vision: bool, scale_dtype=None):
    """(stored tensors, compressed-tensors' decompression of them, packed module names) of a tiny release."""
    tensors = {prefix + n: t for n, t in self.text.items()}
    if with_vision:
      tensors.update(self.vision)
    quantized = _ct_quantized(tensors, qc)
    stored, deq = {}, {}
    for name, t in tensors.items():
      module = name.rsplit(".", 1)[0]
      if module in quantized and name.endswith(".weight"):
        packed = _pack(t)
        stored.update({f"{name}{k[len('weight'):]}": v for k, v in packed.items()})
        deq[name] = _decompress(packed, scale_dtype=scale_dtype)
      else:
        stored[name] = deq[name] = t if name.endswith("e_score_correction_bias") else t.bfloat16()
    return stored, deq, quantized

  def _check_logits(self, ref_model, params, cfg):
    toks = parity._tokens(CFG, 24)
    ref = parity._hf_logits(ref_model, toks)
    ours = parity._our_logits(params, cfg, toks)
    err = parity._rel_err(ours, ref)
    self.assertLessEqual(err, parity._RTOL, f"logits differ from HF: {err:.2e}; "
                         f"{parity._layer_divergence(ref_model, params, cfg, toks)}")

  @parameterized.named_parameters(
      dict(testcase_name="in_text_config", where=("text_config",)),
      dict(testcase_name="at_top_level", where=("top",)),
      dict(testcase_name="in_both", where=("text_config", "top")),
  )
  @pytest.mark.slow
  def test_kimi_k25_release(self, where):
    qc = _quantization_config(K25_IGNORE)
    stored, deq, quantized = self._release("language_model.", qc, with_vision=True)
    n_routed = CFG.n_moe_layers * CFG.n_routed_experts * 3
    # The release's config quantizes the routed experts and nothing else.
    self.assertLen(quantized, n_routed)
    self.assertTrue(all(".mlp.experts." in m for m in quantized))
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "text_config": _text_config(qc if "text_config" in where else None),
              "vision_config": self.vision_config, "projection_hidden_size": 16, "tie_word_embeddings": False,
              **({"quantization_config": qc} if "top" in where else {})}
    release, reference = os.path.join(self.tmp, "release"), os.path.join(self.tmp, "reference")
    _write(release, stored, config)
    _write(reference, deq, {k: v for k, v in config.items() if k != "quantization_config"}
           | {"text_config": _text_config(None)})
    ref_model, info = Kimi_K25ForConditionalGeneration.from_pretrained(reference, dtype=torch.float32,
                                                                       output_loading_info=True)
    # HF reads this layout as Kimi K2.5's: every tensor has its place.
    self.assertEmpty(info["missing_keys"] | info["unexpected_keys"])

    # Default dtype: the release's bfloat16.
    summary = hf_convert.convert_hf_checkpoint(release, os.path.join(self.tmp, "out"), progress=False)
    params, cfg = ckpt_lib.load_checkpoint(os.path.join(self.tmp, "out"))
    self.assertEqual(cfg, CFG.replace(param_dtype="bfloat16"))
    self.assertEqual((summary.num_dequantized_int4, summary.num_dequantized_fp8), (n_routed, 0))
    self.assertLen([s for s in summary.skipped if "vision tower" in s], len(self.vision))
    text = str(summary)
    self.assertIn(f"{n_routed} dequantized from INT4 and 0 from FP8", text)
    self.assertIn(f"skipped {len(self.vision)} tensors of the MoonViT vision tower (vision_tower.*) and its "
                  "projector (mm_projector.*)", text)
    for skipped in summary.skipped[:20]:  # named, with why, not only counted
      self.assertIn(f"\n  skipped {skipped}\n", text)
    self.assertIn("stored as bfloat16, rounded to nearest even: the values compressed-tensors' own BF16 "
                  "decompression gives", text)
    # The experts are compressed-tensors' BF16 decompression, bit for bit.
    up = params["moe_layers"]["moe"]["experts"]["up"]
    self.assertEqual(up.dtype, np.dtype(ml_dtypes.bfloat16))
    for layer, e in ((0, 0), (1, 5)):
      want = _np(deq[f"language_model.model.layers.{layer + 1}.mlp.experts.{e}.up_proj.weight"]).T
      np.testing.assert_array_equal(np.asarray(up[layer, e]).view(np.int16), want.view(np.int16))
    self._check_logits(ref_model, params, cfg)

  def test_kimi_k2_thinking_flat_release(self):
    qc = _quantization_config(K2_THINKING_IGNORE)
    stored, deq, quantized = self._release("", qc, with_vision=False, scale_dtype=torch.float32)
    self.assertLen(quantized, CFG.n_moe_layers * CFG.n_routed_experts * 3)
    config = _text_config(None) | {"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": qc}
    release, reference = os.path.join(self.tmp, "release"), os.path.join(self.tmp, "reference")
    _write(release, stored, config)
    # HF keys its weight renames by model_type: the reference says deepseek_v3 (which kimi_k2 is) to get them.
    _write(reference, deq, _text_config(None) | {"architectures": ["DeepseekV3ForCausalLM"],
                                                  "model_type": "deepseek_v3"})
    ref_model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(reference, dtype=torch.float32,
                                                                         output_loading_info=True)
    self.assertEmpty(info["missing_keys"] | info["unexpected_keys"])

    summary = hf_convert.convert_hf_checkpoint(release, os.path.join(self.tmp, "out"), dtype="float32",
                                               progress=False)
    params, cfg = ckpt_lib.load_checkpoint(os.path.join(self.tmp, "out"))
    self.assertEqual(cfg, CFG)
    self.assertEqual(summary.num_dequantized_int4, len(quantized))
    self.assertIn("stored as float32, exactly", str(summary))
    # float32: the exact products, which compressed-tensors gives with the scales in float32.
    down = np.asarray(params["moe_layers"]["moe"]["experts"]["down"][1, 7])
    np.testing.assert_array_equal(down, deq["model.layers.2.mlp.experts.7.down_proj.weight"].numpy().T)
    self._check_logits(ref_model, params, cfg)

  def _refusal(self, edit, match: str, config_edit=None):
    qc = _quantization_config(K2_THINKING_IGNORE)
    stored, _, _ = self._release("", qc, with_vision=False)
    config = _text_config(None) | {"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": qc}
    edit(stored)
    if config_edit:
      config_edit(config)
    release = os.path.join(self.tmp, "release")
    _write(release, stored, config)
    with self.assertRaisesRegex(ValueError, match):
      hf_convert.convert_hf_checkpoint(release, os.path.join(self.tmp, "out"), progress=False)
    self.assertFalse(os.path.exists(os.path.join(self.tmp, "out", ckpt_lib.CONFIG_FILE)))

  def test_refuses_missing_scale(self):
    name = "model.layers.1.mlp.experts.3.gate_proj.weight"
    self._refusal(lambda t: t.pop(name + "_scale"),
                  f"^{name}_packed has no {name}_scale; the INT4 checkpoint is incomplete, so re-download the shard "
                  "that should hold it.$")

  def test_refuses_missing_shape(self):
    name = "model.layers.2.mlp.experts.0.down_proj.weight"
    self._refusal(lambda t: t.pop(name + "_shape"),
                  f"^{name}_packed has no {name}_shape; the INT4 checkpoint is incomplete")

  def test_refuses_packed_shape_contradicting_weight_shape(self):
    name = "model.layers.1.mlp.experts.6.up_proj.weight"

    def edit(t):
      t[name + "_shape"] = torch.tensor([CFG.moe_intermediate_size, CFG.d_model + 32])

    self._refusal(edit, rf"^{name}_packed is \[32, 8\] but {name}_shape says \[32, 96\], which needs \[32, 12\] "
                  r"\(eight 4-bit values per int32\); the checkpoint is inconsistent.$")

  def test_refuses_int4_weights_the_config_leaves_unquantized(self):
    name = "model.layers.1.mlp.experts.2.down_proj.weight"

    def ignore_one(config):
      config["quantization_config"]["ignore"].append(name[:-len(".weight")])

    self._refusal(lambda t: None, rf"^1 weights disagree with quantization_config: {name} is stored INT4, but "
                  r"quantization_config's targets and ignore list leave it unquantized\. Fix", ignore_one)

  def test_refuses_plain_weights_the_config_quantizes(self):
    def quantize_shared(config):
      config["quantization_config"]["ignore"].remove("re:.*shared_experts.*")

    self._refusal(lambda t: None, r"^6 weights disagree with quantization_config: model.layers.1.mlp.shared_experts"
                  r".down_proj.weight is stored as a plain tensor, but quantization_config quantizes it;",
                  quantize_shared)

  def test_refuses_int4_without_its_config(self):
    self._refusal(lambda t: None, "model.layers.1.mlp.experts.0.down_proj.weight_packed is INT4 pack-quantized but "
                  "config.json has no compressed-tensors quantization_config",
                  lambda config: config.pop("quantization_config"))


if __name__ == "__main__":
  absltest.main()
