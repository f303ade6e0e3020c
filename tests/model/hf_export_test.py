"""c2jax.model.hf_export: a c2jax checkpoint written as an HF DeepSeek-V3 checkpoint.

Tiny random models are saved as c2jax checkpoints and exported with a tiny shard size (several shards). The
references are independent of the exporter: safetensors' own reader for the files, transformers'
`DeepseekV3ForCausalLM.from_pretrained` for loading (no missing tensors; the only unexpected ones are the MTP
layers, which transformers has no module for) and for the logits (float32 export: max|diff| / max|ref| <= 1e-4),
`hf_convert.convert_hf_checkpoint` for the round trip (bit-exact in float32, MTP included), and transformers'
tokenizer for the copied tokenizer files. Params are randomized at scales that make routing, norms, biases and
attention matter (as in hf_parity_test).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import chex
import huggingface_hub
import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open
import torch
import transformers
import pytest

from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_convert
from c2jax.model import hf_export
from c2jax.model import params as params_lib
from c2jax.model import transformer
from c2jax.model.config import ModelConfig, RopeConfig, RopeLayout
from tests import tiny

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_RTOL = 1e-4
# Our own branches of the plan that tiny.MODEL leaves out: q_proj without LoRA, attention biases, no shared expert
# (written empty, as HF saves it), the halves rope layout, a dense layer only as the first.
_NO_QLORA = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=2, q_lora_rank=None, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, intermediate_size=48,
                        moe_intermediate_size=16, n_routed_experts=4, n_shared_experts=0, num_experts_per_tok=2,
                        first_k_dense_replace=1, attention_bias=True, rope=RopeConfig(layout=RopeLayout.HALVES),
                        max_position_embeddings=128)


def _tempdir(test: absltest.TestCase) -> str:
  # tempfile, not absltest's create_tempdir: that needs absl flags, which pytest does not parse.
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path




def _tokens(cfg: ModelConfig) -> np.ndarray:
  return np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)


def _our_logits(params, cfg: ModelConfig, toks: np.ndarray) -> np.ndarray:
  return np.asarray(tiny.jit(transformer.forward, cfg=cfg, with_mtp=False)(params, toks).logits)


def _hf_logits(model, toks: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(toks, dtype=torch.long)).logits.float().numpy()


def _rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _mtp_prefixes(cfg: ModelConfig) -> tuple[str, ...]:
  return tuple(f"model.layers.{cfg.n_layers + k}." for k in range(cfg.num_mtp_layers))


def _read_all(out_dir: str) -> dict[str, torch.Tensor]:
  tensors = {}
  for name in sorted(os.listdir(out_dir)):
    if name.endswith(".safetensors"):
      with safe_open(os.path.join(out_dir, name), framework="pt") as f:
        tensors.update({k: f.get_tensor(k) for k in f.keys()})
  return tensors


class HfExportTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = _tempdir(self)

  def _check_index(self, out_dir: str, max_bytes: int, summary: hf_export.ExportSummary):
    """The index names every tensor of every shard once, with the right file and total size."""
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
      index = json.load(f)
    shards = sorted(n for n in os.listdir(out_dir) if n.endswith(".safetensors"))
    n = len(shards)
    self.assertEqual(shards, [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)])
    self.assertEqual(sorted(set(index["weight_map"].values())), shards)
    seen, total, params = {}, 0, 0
    for shard in shards:
      with safe_open(os.path.join(out_dir, shard), framework="pt") as f:
        self.assertEqual(f.metadata(), {"format": "pt"})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
      size = sum(t.numel() * t.element_size() for t in tensors.values())
      if len(tensors) > 1:
        self.assertLessEqual(size, max_bytes, shard)
      for k in tensors:
        self.assertNotIn(k, seen)
        seen[k] = shard
      total += size
      params += sum(t.numel() for t in tensors.values())
    self.assertEqual(seen, index["weight_map"])
    self.assertEqual(index["metadata"], {"total_size": total, "total_parameters": params})
    self.assertEqual((summary.num_bytes, summary.num_parameters, summary.num_shards, summary.num_tensors),
                     (total, params, n, len(seen)))

  def _load_hf(self, out_dir: str, cfg: ModelConfig, **kw):
    model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(out_dir, output_loading_info=True, **kw)
    self.assertEqual((info["missing_keys"], info["mismatched_keys"], info["error_msgs"]), (set(), set(), []))
    # transformers has no MTP module: the MTP layers' tensors, and nothing else, are unexpected.
    stray = [k for k in info["unexpected_keys"] if not k.startswith(_mtp_prefixes(cfg))]
    self.assertEqual(stray, [])
    for prefix in _mtp_prefixes(cfg):
      self.assertIn(f"{prefix}eh_proj.weight", info["unexpected_keys"])
    return model.eval()

  @parameterized.named_parameters(
      dict(testcase_name="tiny", cfg=tiny.MODEL),  # q_lora, 1 dense + 1 MoE layer, shared expert, YaRN, groups
      dict(testcase_name="tiny_mtp", cfg=tiny.MODEL_MTP),
      dict(testcase_name="no_qlora_bias_no_shared", cfg=_NO_QLORA),
  )
  def test_float32_export_loads_in_hf_with_our_logits_and_converts_back_exactly(self, cfg):
    params = tiny.random_params(cfg)
    ckpt, out, back = (os.path.join(self.tmp, d) for d in ("ckpt", "hf", "back"))
    ckpt_lib.save_checkpoint(ckpt, params, cfg)
    max_bytes = 48_000
    summary = hf_export.export_checkpoint(ckpt, out, dtype="float32", max_shard_size="48KB")
    self.assertGreaterEqual(summary.num_shards, 3)
    self._check_index(out, max_bytes, summary)
    with open(os.path.join(out, "config.json")) as f:
      hf = json.load(f)
    self.assertEqual({k: hf[k] for k in ("architectures", "model_type", "topk_method", "scoring_func", "dtype",
                                         "torch_dtype", "num_nextn_predict_layers")},
                     dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", topk_method="noaux_tc",
                          scoring_func="sigmoid", dtype="float32", torch_dtype="float32",
                          num_nextn_predict_layers=cfg.num_mtp_layers))
    self.assertEqual(ModelConfig.from_hf_dict(hf).to_hf_dict(), cfg.to_hf_dict())

    model = self._load_hf(out, cfg, dtype=torch.float32)
    toks = _tokens(cfg)
    ref, ours = _hf_logits(model, toks), _our_logits(params, cfg, toks)
    chex.assert_shape(ours, ref.shape)
    self.assertLessEqual(_rel_err(ours, ref), _RTOL)

    conv = hf_convert.convert_hf_checkpoint(out, back, dtype="float32", progress=False)
    self.assertEqual(conv.warnings, [])  # the MTP copies of the embedding and head equal the main ones
    got, got_cfg = ckpt_lib.load_checkpoint(back)
    self.assertEqual(got_cfg.to_hf_dict(), cfg.to_hf_dict())
    chex.assert_trees_all_equal(jax.device_get(got), params)

    # The converted checkpoint (StreamingCheckpointWriter's layout: no OCDBT, a chunk per piece) exports the same.
    again = os.path.join(self.tmp, "again")
    hf_export.export_checkpoint(back, again, dtype="float32", max_shard_size="48KB")
    first, second = _read_all(out), _read_all(again)
    self.assertEqual(sorted(first), sorted(second))
    for k, v in first.items():
      self.assertTrue(torch.equal(v, second[k]), k)

  def test_sharded_checkpoint_and_any_read_budget_export_the_same_tensors(self):
    cfg = tiny.MODEL
    params = tiny.random_params(cfg, seed=3)
    # Experts sharded over 8 devices: orbax stores a chunk per device shard ([1, 2, D, F] of [1, 16, D, F]), so
    # slabs span two experts; a 1-byte budget reads every piece alone (decompressing its chunk again).
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    def place(path, a):
      spec = (None, "x") if "experts" in [k.key for k in path] else ()
      return jax.device_put(a, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))
    ckpt = os.path.join(self.tmp, "ckpt")
    ckpt_lib.save_checkpoint(ckpt, jax.tree_util.tree_map_with_path(place, params), cfg)
    ref = os.path.join(self.tmp, "ref")
    hf_export.export_params(params, cfg, ref, dtype="float32")
    want = _read_all(ref)
    for budget in (1, 1 << 30):
      out = os.path.join(self.tmp, f"budget{budget}")
      hf_export.export_checkpoint(ckpt, out, dtype="float32", read_budget_bytes=budget)
      got = _read_all(out)
      self.assertEqual(sorted(got), sorted(want))
      for k, v in want.items():
        self.assertTrue(torch.equal(v, got[k]), k)

  def test_bfloat16_export_is_the_rounded_params_with_a_float32_router(self):
    cfg = tiny.MODEL_MTP
    params = tiny.random_params(cfg, seed=2)
    out, back = os.path.join(self.tmp, "hf"), os.path.join(self.tmp, "back")
    summary = hf_export.export_params(params, cfg, out)  # the defaults: bfloat16, 5GB shards
    self.assertEqual(summary.num_shards, 1)
    self.assertEqual(sorted(os.listdir(out)), ["config.json", "model.safetensors"])  # one file: no index
    for name, t in _read_all(out).items():
      want = torch.float32 if name.endswith(("mlp.gate.weight", "e_score_correction_bias")) else torch.bfloat16
      self.assertEqual(t.dtype, want, name)
    with open(os.path.join(out, "config.json")) as f:
      self.assertEqual(json.load(f)["dtype"], "bfloat16")

    # What a server does (dtype from config.json): bf16 weights, the router kept in float32.
    served = self._load_hf(out, cfg, dtype="auto")
    self.assertEqual(served.dtype, torch.bfloat16)
    self.assertEqual(served.model.layers[1].mlp.gate.weight.dtype, torch.float32)

    # The export holds exactly the params rounded to bf16 (router exact): the converter gives them back ...
    hf_convert.convert_hf_checkpoint(out, back, dtype="float32", progress=False)
    got, _ = ckpt_lib.load_checkpoint(back)
    specs = params_lib.param_specs(cfg)
    is_float32 = jax.tree.map(lambda s: s.dtype == "float32", specs,
                              is_leaf=lambda x: isinstance(x, params_lib.ParamSpec))
    rounded = jax.tree.map(lambda p, f: p if f else p.astype(ml_dtypes.bfloat16).astype(np.float32), params,
                           is_float32)
    chex.assert_trees_all_equal(jax.device_get(got), rounded)
    # ... and HF computes our logits of them (float32 compute), within bf16 rounding of the unrounded model's.
    model = self._load_hf(out, cfg, dtype=torch.float32)
    toks = _tokens(cfg)
    ref = _hf_logits(model, toks)
    self.assertLessEqual(_rel_err(_our_logits(rounded, cfg, toks), ref), _RTOL)
    self.assertLessEqual(_rel_err(_our_logits(params, cfg, toks), ref), 3e-2)

  def _tokenizer_dir(self, n_tokens: int) -> str:
    """An HF tokenizer directory (tokenizer.json, tokenizer_config.json with a chat template) of n_tokens tokens."""
    import tokenizers

    d = os.path.join(self.tmp, f"tok{n_tokens}")
    os.makedirs(d)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, n_tokens)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
      json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                 "unk_token": "<unk>",
                 "chat_template": "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"}, f)
    with open(os.path.join(d, "README.md"), "w") as f:
      f.write("not a tokenizer file\n")
    return d

  def test_tokenizer_files_are_copied_and_name_the_special_tokens(self):
    cfg = tiny.MODEL
    tok_dir = self._tokenizer_dir(40)
    out = os.path.join(self.tmp, "hf")
    summary = hf_export.export_params(tiny.random_params(cfg), cfg, out, tokenizer_dir=tok_dir)
    self.assertEqual(sorted(os.listdir(out)), ["config.json", "model.safetensors", "tokenizer.json",
                                               "tokenizer_config.json"])
    self.assertEqual(sorted(summary.files), sorted(os.listdir(out)))
    with open(os.path.join(out, "config.json")) as f:
      hf = json.load(f)
    self.assertEqual((hf["bos_token_id"], hf["eos_token_id"]), (1, 2))
    messages = [{"role": "user", "content": "w3 w4"}]
    ref = transformers.AutoTokenizer.from_pretrained(tok_dir).apply_chat_template(messages, tokenize=False)
    got = transformers.AutoTokenizer.from_pretrained(out).apply_chat_template(messages, tokenize=False)
    self.assertEqual(got, ref)

  def test_export_without_a_tokenizer_names_no_special_tokens(self):
    out = os.path.join(self.tmp, "hf")
    hf_export.export_params(tiny.random_params(_NO_QLORA), _NO_QLORA, out)
    with open(os.path.join(out, "config.json")) as f:
      hf = json.load(f)
    self.assertIsNone(hf["bos_token_id"])  # not DeepseekV3Config's defaults 0 / 1, which would name random tokens
    self.assertIsNone(hf["eos_token_id"])
    self.assertIsNone(hf["rope_scaling"])
    self.assertEqual(hf["rope_theta"], _NO_QLORA.rope.theta)

  def test_yarn_config_carries_the_v4_rope_keys(self):
    out = os.path.join(self.tmp, "hf")
    hf_export.export_params(tiny.random_params(tiny.MODEL), tiny.MODEL, out)
    with open(os.path.join(out, "config.json")) as f:
      hf = json.load(f)
    r = tiny.MODEL.rope
    self.assertEqual(hf["rope_theta"], r.theta)
    self.assertEqual({k: hf["rope_scaling"][k] for k in ("type", "rope_type", "factor", "mscale", "mscale_all_dim",
                                                         "original_max_position_embeddings", "beta_fast",
                                                         "beta_slow")},
                     dict(type="yarn", rope_type="yarn", factor=r.factor, mscale=r.mscale,
                          mscale_all_dim=r.mscale_all_dim,
                          original_max_position_embeddings=r.original_max_position_embeddings,
                          beta_fast=r.beta_fast, beta_slow=r.beta_slow))
    # The v4 keys do not change what transformers 5 reads.
    self.assertEqual(ModelConfig.from_hf_dict({k: v for k, v in hf.items() if k != "rope_parameters"}).rope,
                     tiny.MODEL.rope)
    loaded = transformers.AutoConfig.from_pretrained(out)
    self.assertEqual({k: loaded.rope_parameters[k] for k in hf["rope_parameters"]}, hf["rope_parameters"])

  def test_refusals(self):
    cfg = _NO_QLORA
    params = tiny.random_params(cfg)
    full = os.path.join(self.tmp, "full")
    os.makedirs(full)
    with open(os.path.join(full, "x"), "w") as f:
      f.write("x")
    with self.assertRaisesRegex(FileExistsError, "is not empty"):
      hf_export.export_params(params, cfg, full)
    with self.assertRaisesRegex(FileNotFoundError, "does not exist"):
      hf_export.export_checkpoint(os.path.join(self.tmp, "nowhere"), os.path.join(self.tmp, "a"))
    with self.assertRaisesRegex(FileNotFoundError, "model_config.json is missing"):
      hf_export.export_checkpoint(full, os.path.join(self.tmp, "b"))
    with self.assertRaisesRegex(ValueError, "float16"):
      hf_export.export_params(params, cfg, os.path.join(self.tmp, "c"), dtype="float16")
    with self.assertRaisesRegex(ValueError, "is not a size"):
      hf_export.export_params(params, cfg, os.path.join(self.tmp, "d"), max_shard_size="5 parsecs")
    with self.assertRaisesRegex(ValueError, "unexpected mtp"):
      hf_export.export_params(tiny.random_params(tiny.MODEL_MTP), tiny.MODEL, os.path.join(self.tmp, "e"))
    with self.assertRaisesRegex(ValueError, "has 200 tokens but the model's vocab_size is 96"):
      hf_export.export_params(params, cfg, os.path.join(self.tmp, "f"), tokenizer_dir=self._tokenizer_dir(200))
    with self.assertRaisesRegex(FileNotFoundError, "is not a directory"):
      hf_export.export_params(params, cfg, os.path.join(self.tmp, "g"), tokenizer_dir=os.path.join(self.tmp, "no"))
    # A damaged checkpoint: a leaf of another shape than model_config.json implies.
    ckpt = os.path.join(self.tmp, "ckpt")
    ckpt_lib.save_checkpoint(ckpt, params, cfg)
    with open(os.path.join(ckpt, ckpt_lib.CONFIG_FILE)) as f:
      stored = json.load(f)
    with open(os.path.join(ckpt, ckpt_lib.CONFIG_FILE), "w") as f:
      json.dump({**stored, "vocab_size": 100}, f)
    with self.assertRaisesRegex(ValueError, "the checkpoint is damaged"):
      hf_export.export_checkpoint(ckpt, os.path.join(self.tmp, "h"))
    # Nothing was written by a refused export.
    self.assertEqual([d for d in "abcdefgh" if os.path.exists(os.path.join(self.tmp, d))], [])

  @pytest.mark.slow
  def test_tool_end_to_end(self):
    cfg = tiny.MODEL_MTP
    ckpt, out = os.path.join(self.tmp, "ckpt"), os.path.join(self.tmp, "hf")
    ckpt_lib.save_checkpoint(ckpt, tiny.random_params(cfg), cfg)
    env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def run(*flags):
      return subprocess.run([sys.executable, os.path.join(_REPO, "tools", "export_hf.py"), *flags], env=env,
                            cwd=self.tmp, capture_output=True, text=True, timeout=300, check=False)

    r = run(f"--checkpoint={ckpt}", f"--out_dir={out}", "--max_shard_size=200KB", "--noprogress")
    self.assertEqual(r.returncode, 0, f"export_hf failed:\n{r.stdout}\n{r.stderr}")
    self.assertRegex(r.stdout, r"wrote .*: 145 tensors, [0-9,]+ parameters \(bfloat16; router float32\), including "
                     r"1 MTP layer\(s\) .* in [2-9] safetensors shard\(s\)")
    self._load_hf(out, cfg)
    # Refusals: one sentence, no traceback, nothing written.
    for flags, message in (((f"--checkpoint={ckpt}", f"--out_dir={out}"), "is not empty"),
                           ((f"--checkpoint={self.tmp}/nowhere", f"--out_dir={self.tmp}/new"), "does not exist")):
      r = run(*flags)
      self.assertNotEqual(r.returncode, 0)
      self.assertIn(message, r.stderr)
      self.assertNotIn("Traceback", r.stderr)
    self.assertFalse(os.path.exists(os.path.join(self.tmp, "new")))

  @parameterized.parameters(("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("1.5KB", 1500),
                            (" 64kib ", 65536), ("123", 123), (77, 77))
  def test_parse_size(self, text, want):
    self.assertEqual(hf_export.parse_size(text), want)

  def test_shards_split_as_huggingface_hub_does(self):
    sizes = {"a": 10, "b": 10, "big": 100, "c": 15, "d": 5, "e": 20, "f": 1}
    tensors = [hf_export._Tensor(k, None, (), None, (n,), np.dtype("<f4"))
               for k, n in sizes.items()]
    ours = hf_export._shards(tensors, 80)
    ref = huggingface_hub.split_torch_state_dict_into_shards({k: torch.zeros(n) for k, n in sizes.items()},
                                                             max_shard_size=80)
    self.assertEqual([[t.name for t in s] for s in ours], list(ref.filename_to_tensors.values()))
    self.assertLen(ours, 5)  # a shard may fill to exactly max_shard_size (e: 80 bytes)

if __name__ == "__main__":
  absltest.main()
