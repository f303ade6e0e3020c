"""Streams an HF DeepSeek-V3 / Kimi-K2 safetensors checkpoint into a c2jax checkpoint (`c2jax.model.checkpoint`).

Every HF tensor has one place in the c2jax layout (`c2jax.model.params`), given by `conversion_plan`:

  HF name (per layer i: dense if i < first_k_dense_replace)      c2jax leaf [index]             how
  model.embed_tokens.weight [V, D]                                embed                          copy
  model.norm.weight, lm_head.weight [V, D]                        final_norm, lm_head [D, V]     copy, transpose
  model.layers.i.input_layernorm / post_attention_layernorm       {dense,moe}_layers/attn_norm / mlp_norm [l]
  model.layers.i.self_attn.q_proj [N*H, D]                        .../attn/q [l] [D, N, H]       linear
    q_a_proj [Lq, D] (+ .bias), q_a_layernorm, q_b_proj [N*H, Lq]  attn/q_a, q_a_bias, q_a_norm, q_b [Lq, N, H]
    kv_a_proj_with_mqa [Lkv+R, D] (+ .bias), kv_a_layernorm        attn/kv_a [D, Lkv+R], kv_a_bias, kv_a_norm
    kv_b_proj [N*(Hn+Hv), Lkv], o_proj [D, N*Hv] (+ .bias)         attn/kv_b [Lkv, N, Hn+Hv], o [N, Hv, D], o_bias
  model.layers.i.mlp.{gate,up,down}_proj (dense layers)           dense_layers/mlp/{gate,up,down} [l]
  model.layers.i.mlp.gate.weight [E, D], .e_score_correction_bias moe_layers/moe/router [l] [D, E], router_bias
  model.layers.i.mlp.experts.e.{gate,up,down}_proj                moe_layers/moe/experts/* [l, e]
  model.layers.i.mlp.shared_experts.{gate,up,down}_proj           moe_layers/moe/shared/* [l]
  model.layers.(n_layers + m).*  (MTP module m, DeepSeek-V3 release layout)
    enorm, hnorm, eh_proj [D, 2D], shared_head.norm                mtp/enorm, hnorm, eh_proj [2D, D], final_norm [m]
    the decoder block's tensors as above                          mtp/block/... [m] (and [m, e] for experts)
    embed_tokens, shared_head.head                                copies of the main embedding / head: checked, skipped

"linear": an HF Linear weight [out, in] becomes [in..., out...] (transposed, then split into the layout's dims).
The number of MTP modules is the number present in the checkpoint (HF `save_pretrained` writes
`num_nextn_predict_layers: 1` without any MTP weights).

These are the names of the flat DeepSeek-V3 layout (DeepSeek-V3, Kimi K2, Kimi K2 Thinking). A release may store
the same text model under other names: a `CheckpointLayout` (`LAYOUTS`, chosen from config.json by `layout_of`)
maps the checkpoint's names onto the plan's and names the towers c2jax does not convert. The Kimi K2.5 release
(`KimiK25ForConditionalGeneration`, model_type kimi_k25) holds the DeepSeek-V3 text model under `text_config`
and its tensors under `language_model.` (`language_model.model.layers.N...`, `language_model.lm_head.weight`),
beside a MoonViT vision tower (`vision_tower.*`) and its projector (`mm_projector.*`), which are skipped.

Quantized weights are dequantized on the fly, tensor by tensor (`c2jax.model.safetensors_io`): DeepSeek-V3's block
FP8, and the INT4 pack-quantized Linears of the Kimi K2 Thinking / K2.5 releases (`c2jax.model.int4_pack`: which
Linears are INT4 follows quantization_config's targets and ignore lists, matched as compressed-tensors matches
them, and the converter refuses a checkpoint whose stored tensors disagree with them). A dequantized INT4 weight
is exact in float32 (q * scale); stored as bfloat16 it is rounded to nearest even, which is exactly what
compressed-tensors' own BF16 decompression gives. Tensors are read one at a time, in file order, and written as
pieces by `StreamingCheckpointWriter`, so host memory stays around a few HF tensors whatever the model size.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from typing import Any, Iterator, Mapping

from absl import logging
import jax
import numpy as np
import tqdm

from c2jax.input_errors import MissingInput
from c2jax.model import checkpoint_files
from c2jax.model import int4_pack
from c2jax.model.checkpoint import StreamingCheckpointWriter, check_new_checkpoint
from c2jax.model.checkpoint_files import CheckpointFormatError
from c2jax.model.config import ModelConfig
from c2jax.model.params import ParamSpec, param_specs
from c2jax.model.safetensors_io import HfWeights, quantization_from_hf_config
from c2jax.registry import Registry

# Layer and expert indices as HF writes them (ASCII, no leading zero, at most 9 digits): any other spelling is no
# plan name, so the tensor is reported as unexpected, and no index can be too long for int().
_INDEX = r"(0|[1-9][0-9]{0,8})"
_LAYER_RE = re.compile(rf"^model\.layers\.{_INDEX}\.")
_EXPERT_RE = re.compile(rf"^model\.layers\.{_INDEX}\.mlp\.experts\.{_INDEX}\.")
# Rows compared at a time when checking MTP's copies of the embedding / head (bounds the temporary memory).
_COMPARE_ROWS = 4096


@dataclasses.dataclass(frozen=True)
class Target:
  """Where one HF tensor goes.

  Attributes:
    path: key path of the c2jax leaf.
    index: leading index into the stacked leaf ((layer,), (layer, expert) or ()).
    n_in: None to copy as is; else the HF tensor is a Linear weight [prod(out dims), prod(in dims)] and the
      layout piece is [in dims..., out dims...] with `n_in` input dims.
  """

  path: tuple[str, ...]
  index: tuple[int, ...] = ()
  n_in: int | None = None


_SKIPPED_SHOWN = 20  # skipped tensors named one per line by a summary; a vision tower's hundreds are counted


@dataclasses.dataclass
class ConversionSummary:
  """What a conversion did."""

  cfg: ModelConfig
  out_dir: str
  num_tensors: int = 0  # HF tensors written (scales not counted)
  num_elements: int = 0  # parameters written
  num_dequantized_fp8: int = 0  # tensors dequantized from block FP8
  num_dequantized_int4: int = 0  # tensors dequantized from INT4 pack-quantized
  num_mtp_layers: int = 0
  skipped: list[str] = dataclasses.field(default_factory=list)  # read but not written, with the reason
  notes: list[str] = dataclasses.field(default_factory=list)
  warnings: list[str] = dataclasses.field(default_factory=list)

  @property
  def num_dequantized(self) -> int:
    """Tensors dequantized, whatever the scheme."""
    return self.num_dequantized_fp8 + self.num_dequantized_int4

  def __str__(self) -> str:
    lines = [f"wrote {self.out_dir}: {self.num_tensors} HF tensors, {self.num_elements:,} parameters "
             f"({self.cfg.param_dtype}), {self.num_dequantized_int4} dequantized from INT4 and "
             f"{self.num_dequantized_fp8} from FP8, {self.num_mtp_layers} MTP layer(s); skipped "
             f"{len(self.skipped)} tensors" + (":" if self.skipped else ".")]
    lines += [f"  skipped {s}" for s in self.skipped[:_SKIPPED_SHOWN]]  # each with why
    if len(self.skipped) > _SKIPPED_SHOWN:
      lines.append(f"  ... and {len(self.skipped) - _SKIPPED_SHOWN} more (ConversionSummary.skipped lists them all)")
    lines += [f"note: {n}" for n in self.notes]
    lines += [f"WARNING: {w}" for w in self.warnings]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
  """Where a release keeps the text model's tensors, relative to `conversion_plan`'s flat DeepSeek-V3 names.

  Attributes:
    name: the layout's name in `LAYOUTS`.
    prefix: put before every plan name to get the checkpoint's name ("" for the flat layout).
    skipped_prefixes: tensors under these prefixes belong to parts c2jax does not convert (read, not written).
    skipped_what: those parts in words, for the summary.
  """

  name: str
  prefix: str = ""
  skipped_prefixes: tuple[str, ...] = ()
  skipped_what: str = ""

  def checkpoint_name(self, plan_name: str) -> str:
    return self.prefix + plan_name

  def plan_name(self, checkpoint_name: str) -> str | None:
    """The plan name of a text-model tensor; None for a name outside the text model's prefix."""
    return checkpoint_name[len(self.prefix):] if checkpoint_name.startswith(self.prefix) else None

  def is_skipped(self, checkpoint_name: str) -> bool:
    return checkpoint_name.startswith(self.skipped_prefixes) if self.skipped_prefixes else False


LAYOUTS: Registry[CheckpointLayout] = Registry("HF checkpoint layout")
LAYOUTS.register("deepseek_v3")(CheckpointLayout("deepseek_v3"))
LAYOUTS.register("kimi_k25")(CheckpointLayout(
    "kimi_k25", prefix="language_model.", skipped_prefixes=("vision_tower.", "mm_projector."),
    skipped_what="the MoonViT vision tower (vision_tower.*) and its projector (mm_projector.*)"))

_KIMI_K25_ARCHITECTURES = ("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration")


def layout_of(hf: Mapping[str, Any]) -> CheckpointLayout:
  """The layout of a checkpoint from its config.json: Kimi K2.5 (model_type kimi_k25) or flat DeepSeek-V3."""
  if hf.get("model_type") == "kimi_k25" or any(a in _KIMI_K25_ARCHITECTURES for a in hf.get("architectures") or ()):
    return LAYOUTS.get("kimi_k25")
  return LAYOUTS.get("deepseek_v3")


def _linear_pieces(prefix: str, path: tuple[str, ...], index: tuple[int, ...]) -> dict[str, Target]:
  return {f"{prefix}.{hf}": Target(path + (ours,), index, 1)
          for hf, ours in (("gate_proj.weight", "gate"), ("up_proj.weight", "up"), ("down_proj.weight", "down"))}


def _block_plan(prefix: str, path: tuple[str, ...], index: tuple[int, ...], moe: bool,
                cfg: ModelConfig) -> dict[str, Target]:
  """HF names of one decoder block under `prefix` (e.g. 'model.layers.3') -> targets under `path`."""
  a = path + ("attn",)
  plan = {
      f"{prefix}.input_layernorm.weight": Target(path + ("attn_norm",), index),
      f"{prefix}.post_attention_layernorm.weight": Target(path + ("mlp_norm",), index),
      f"{prefix}.self_attn.kv_a_proj_with_mqa.weight": Target(a + ("kv_a",), index, 1),
      f"{prefix}.self_attn.kv_a_layernorm.weight": Target(a + ("kv_a_norm",), index),
      f"{prefix}.self_attn.kv_b_proj.weight": Target(a + ("kv_b",), index, 1),
      f"{prefix}.self_attn.o_proj.weight": Target(a + ("o",), index, 2),
  }
  if cfg.q_lora_rank is None:
    plan[f"{prefix}.self_attn.q_proj.weight"] = Target(a + ("q",), index, 1)
  else:
    plan[f"{prefix}.self_attn.q_a_proj.weight"] = Target(a + ("q_a",), index, 1)
    plan[f"{prefix}.self_attn.q_a_layernorm.weight"] = Target(a + ("q_a_norm",), index)
    plan[f"{prefix}.self_attn.q_b_proj.weight"] = Target(a + ("q_b",), index, 1)
    if cfg.attention_bias:
      plan[f"{prefix}.self_attn.q_a_proj.bias"] = Target(a + ("q_a_bias",), index)
  if cfg.attention_bias:
    plan[f"{prefix}.self_attn.kv_a_proj_with_mqa.bias"] = Target(a + ("kv_a_bias",), index)
    plan[f"{prefix}.self_attn.o_proj.bias"] = Target(a + ("o_bias",), index)
  if not moe:
    plan.update(_linear_pieces(f"{prefix}.mlp", path + ("mlp",), index))
    return plan
  m = path + ("moe",)
  plan[f"{prefix}.mlp.gate.weight"] = Target(m + ("router",), index, 1)
  plan[f"{prefix}.mlp.gate.e_score_correction_bias"] = Target(m + ("router_bias",), index)
  for e in range(cfg.n_routed_experts):
    plan.update(_linear_pieces(f"{prefix}.mlp.experts.{e}", m + ("experts",), index + (e,)))
  if cfg.n_shared_experts:
    plan.update(_linear_pieces(f"{prefix}.mlp.shared_experts", m + ("shared",), index))
  return plan


def iter_conversion_plan(cfg: ModelConfig) -> Iterator[tuple[str, Target]]:
  """`conversion_plan`'s entries one by one (a block's at a time), so that a caller can stop early."""
  yield from {
      "model.embed_tokens.weight": Target(("embed",)),
      "model.norm.weight": Target(("final_norm",)),
      "lm_head.weight": Target(("lm_head",), (), 1),
  }.items()
  for i in range(cfg.n_layers):
    dense = i < cfg.first_k_dense_replace
    group, local = ("dense_layers", i) if dense else ("moe_layers", i - cfg.first_k_dense_replace)
    yield from _block_plan(f"model.layers.{i}", (group,), (local,), not dense, cfg).items()
  for k in range(cfg.num_mtp_layers):
    prefix = f"model.layers.{cfg.n_layers + k}"
    yield from _block_plan(prefix, ("mtp", "block"), (k,), cfg.n_moe_layers > 0, cfg).items()
    yield f"{prefix}.enorm.weight", Target(("mtp", "enorm"), (k,))
    yield f"{prefix}.hnorm.weight", Target(("mtp", "hnorm"), (k,))
    yield f"{prefix}.eh_proj.weight", Target(("mtp", "eh_proj"), (k,), 1)
    yield f"{prefix}.shared_head.norm.weight", Target(("mtp", "final_norm"), (k,))


def conversion_plan(cfg: ModelConfig) -> dict[str, Target]:
  """Every HF tensor name that `cfg` needs -> its `Target` (MTP modules at layers n_layers ... n_layers+M-1)."""
  return dict(iter_conversion_plan(cfg))


def mtp_copies(cfg: ModelConfig) -> dict[str, str]:
  """MTP modules' copies of the shared embedding / head (DeepSeek-V3 release) -> the main tensor they copy."""
  out = {}
  for k in range(cfg.num_mtp_layers):
    prefix = f"model.layers.{cfg.n_layers + k}"
    out[f"{prefix}.embed_tokens.weight"] = "model.embed_tokens.weight"
    out[f"{prefix}.shared_head.head.weight"] = "lm_head.weight"
  return out


def count_mtp_layers(names, n_layers: int) -> int:
  """Number of layer indices >= n_layers present in `names`; they must be n_layers, n_layers + 1, ..."""
  extra = sorted({int(m.group(1)) for n in names if (m := _LAYER_RE.match(n)) and int(m.group(1)) >= n_layers})
  if extra != list(range(n_layers, n_layers + len(extra))):
    raise ValueError(f"the checkpoint has layers {extra} beyond num_hidden_layers={n_layers}; MTP layers must be "
                     f"numbered {n_layers}, {n_layers + 1}, ...: check num_hidden_layers in config.json.")
  return len(extra)


def _default_dtype(hf: Mapping[str, Any]) -> str:
  """The checkpoint's dtype if c2jax can store it (float32 / bfloat16), else float32."""
  src = hf.get("text_config", hf)
  dt = src.get("dtype") or src.get("torch_dtype") or hf.get("dtype") or hf.get("torch_dtype")
  return "bfloat16" if dt == "bfloat16" else "float32"


def read_hf_config(hf_dir: str) -> dict[str, Any]:
  """config.json of `hf_dir`: a JSON object in a regular file (`checkpoint_files.read_json_object`)."""
  if not os.path.isdir(hf_dir):
    raise MissingInput(f"--hf_dir={hf_dir} is not a directory; point it at an HF checkpoint directory with "
                       "config.json and *.safetensors.")
  path = os.path.join(hf_dir, "config.json")
  if not os.path.lexists(path):
    raise MissingInput(f"{path} is missing; point --hf_dir at an HF checkpoint directory with config.json.")
  return checkpoint_files.read_json_object(path, "config.json")


def _text_hf(hf: Mapping[str, Any]) -> Mapping[str, Any]:
  """The text model's config: `text_config` (Kimi K2.5) or the top level."""
  text = hf.get("text_config", hf)
  if not isinstance(text, dict):
    raise CheckpointFormatError(f"config.json's text_config is a JSON {type(text).__name__}, not an object.")
  return text


def _config_count(src: Mapping[str, Any], field: str, default: int | None = None) -> int:
  """A count field of config.json (num_hidden_layers, n_routed_experts): a non-negative int (null: `default`)."""
  value = src.get(field)
  if value is None and default is not None:
    return default
  if not isinstance(value, int) or isinstance(value, bool) or value < 0:
    raise CheckpointFormatError(f"config.json's {field}={str(value)[:100]} is not a non-negative int.")
  return value


# config.json's size fields that `ModelConfig.from_hf_dict` reads: required ones, then those that may be absent or
# null; each must be a non-negative int (a string or float there used to reach ModelConfig as a raw TypeError).
_REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                   "qk_rope_head_dim", "v_head_dim", "intermediate_size")
_OPTIONAL_SIZES = ("q_lora_rank", "moe_intermediate_size", "n_shared_experts", "num_experts_per_tok", "n_group",
                   "topk_group", "first_k_dense_replace", "num_nextn_predict_layers", "max_position_embeddings",
                   "num_key_value_heads")
_NUMBERS = ("rms_norm_eps", "routed_scaling_factor", "initializer_range", "rope_theta")


def _check_config_fields(hf: Mapping[str, Any]) -> None:
  """Refuses a config.json whose size fields are not non-negative ints, or whose float fields are not numbers."""
  src = _text_hf(hf)
  missing = [f for f in _REQUIRED_SIZES if f not in src]
  if missing:
    raise CheckpointFormatError(f"config.json has no {', '.join(missing)}; it does not describe a DeepSeek-V3-style "
                                "model.")
  for field in _REQUIRED_SIZES:
    _config_count(src, field)
  for field in _OPTIONAL_SIZES:
    _config_count(src, field, default=0)
  for field in _NUMBERS:
    value = src.get(field, 0.0)
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                              or (isinstance(value, float) and not math.isfinite(value))):
      raise CheckpointFormatError(f"config.json's {field}={str(value)[:100]} is not a finite number.")


def _check_counts(hf_dir: str, hf: Mapping[str, Any], text: Mapping[str, str], n_layers: int) -> None:
  """Refuses a config.json that declares more layers or routed experts than the checkpoint holds tensors of.

  This runs before anything is built per layer or per expert: a config declaring 10^6 layers over a two-layer
  file is refused in time proportional to the file.

  Args:
    hf_dir: the checkpoint directory, for messages.
    hf: config.json.
    text: plan name -> checkpoint name of the text model's tensors.
    n_layers: num_hidden_layers.
  """
  layers = {int(m.group(1)) for p in text if (m := _LAYER_RE.match(p))}
  held = sum(1 for i in layers if i < n_layers)
  if held < n_layers:
    first = next(i for i in range(n_layers) if i not in layers)  # at most len(layers) + 1 steps
    raise CheckpointFormatError(f"config.json's num_hidden_layers={n_layers} but {hf_dir} holds tensors of only "
                                f"{held} of those layers (none of layer {first}); fix num_hidden_layers or the "
                                "checkpoint.")
  n_routed = _config_count(_text_hf(hf), "n_routed_experts", default=0)
  experts = {int(m.group(2)) for p in text if (m := _EXPERT_RE.match(p))}
  held = sum(1 for e in experts if e < n_routed)
  dense = _text_hf(hf).get("first_k_dense_replace", 0)
  if n_routed and held < n_routed and not (isinstance(dense, int) and dense >= n_layers):
    raise CheckpointFormatError(f"config.json's n_routed_experts={n_routed} but {hf_dir} holds tensors of only "
                                f"{held} of those experts; fix n_routed_experts or the checkpoint.")


def _bounded_plan(hf_dir: str, cfg: ModelConfig, n_tensors: int) -> dict[str, Target]:
  """`conversion_plan(cfg)`, refused as soon as it names more tensors than the checkpoint holds (each plan entry
  must be in the checkpoint), so its cost is bounded by the file whatever the config's sizes."""
  plan = dict(itertools.islice(iter_conversion_plan(cfg), n_tensors + 1))
  if len(plan) > n_tensors:
    raise CheckpointFormatError(f"config.json implies more than the {n_tensors} text-model tensors that {hf_dir} "
                                f"holds ({cfg.n_layers} layers, {cfg.n_routed_experts} routed experts, "
                                f"{cfg.num_mtp_layers} MTP layers); fix config.json or the checkpoint.")
  return plan


def _expected_hf_shape(piece: tuple[int, ...], n_in: int | None) -> tuple[int, ...]:
  if n_in is None:
    return piece
  return (math.prod(piece[n_in:]), math.prod(piece[:n_in]))


def _to_layout(w: np.ndarray, piece: tuple[int, ...], n_in: int | None) -> np.ndarray:
  if n_in is None:
    return w
  return w.T.reshape(piece)


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
  if a.shape != b.shape:
    return False
  return all(np.array_equal(a[i:i + _COMPARE_ROWS], b[i:i + _COMPARE_ROWS])
             for i in range(0, max(a.shape[0], 1), _COMPARE_ROWS))


def _list(names, limit: int = 20) -> str:
  names = sorted(names)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def _module_classes(plan_name: str, plan: Mapping[str, Target]) -> tuple[str, ...]:
  """Class names (with bases) of the module holding `plan_name` in DeepSeek-V3's modeling code, for matching.

  Only Linear and Embedding modules can be quantized (compressed-tensors), so other modules get (): the router
  `mlp.gate` is a plain Module with a weight, the norms are RMSNorms.
  """
  if not plan_name.endswith(".weight"):
    return ()
  if plan_name.endswith("embed_tokens.weight"):
    return ("Embedding", "Module")
  t = plan.get(plan_name)
  linear = (t is not None and t.n_in is not None) or plan_name.endswith("shared_head.head.weight")
  return ("Linear", "Module") if linear and not plan_name.endswith("mlp.gate.weight") else ()


def _check_int4_targets(weights: HfWeights, quant: Any, names: Mapping[str, str],
                        plan: Mapping[str, Target]) -> None:
  """Every weight is INT4 exactly when quantization_config's targets / ignore say so (compressed-tensors' matching).

  Args:
    weights: the checkpoint.
    quant: its quantization scheme.
    names: plan name -> checkpoint name of every text-model tensor converted or compared.
    plan: the conversion plan.
  Raises:
    ValueError listing the weights stored otherwise than the config says.
  """
  config_int4 = isinstance(quant, int4_pack.PackQuantizedInt4)
  bad = []
  for plan_name, name in sorted(names.items()):
    classes = _module_classes(plan_name, plan)
    want = config_int4 and quant.quantizes(name.rsplit(".", 1)[0], classes)
    if want and not weights.is_int4(name):
      bad.append(f"{name} is stored as a plain tensor, but quantization_config quantizes it")
    elif weights.is_int4(name) and not want:
      bad.append(f"{name} is stored INT4, but quantization_config's targets and ignore list leave it unquantized")
  if bad:
    raise ValueError(f"{len(bad)} weights disagree with quantization_config: {'; '.join(bad[:10])}"
                     f"{' ...' if len(bad) > 10 else ''}. Fix quantization_config's targets / ignore or the "
                     "checkpoint.")


def convert_hf_checkpoint(hf_dir: str, out_dir: str, *, dtype: str | None = None,
                          progress: bool = True) -> ConversionSummary:
  """Converts the HF checkpoint in `hf_dir` into a new c2jax checkpoint `out_dir`, one tensor at a time.

  Args:
    hf_dir: directory with config.json and safetensors (single file or sharded with an index); the flat
      DeepSeek-V3 / Kimi K2 layout or the Kimi K2.5 one (`layout_of`); BF16, FP8 or INT4 (compressed-tensors
      pack-quantized) weights.
    out_dir: where the c2jax checkpoint goes (`load_checkpoint(out_dir)` reads it); must not hold one already.
    dtype: "float32" or "bfloat16" for the stored params (the router stays float32), dequantized weights
      included: INT4 ones are exact in float32 and rounded to nearest even in bfloat16; None: the checkpoint's
      dtype from config.json when it is one of those, else float32.
    progress: show a tqdm progress bar over tensors.
  Returns:
    a `ConversionSummary`.
  Raises:
    ValueError: listing the unexpected and the missing tensors, a tensor whose shape the config contradicts, an
      incomplete INT4 weight, or weights whose quantization contradicts quantization_config.
  """
  check_new_checkpoint(out_dir, "--out_dir")  # ExistingOutput before any tensor is read
  hf = read_hf_config(hf_dir)
  layout = layout_of(hf)
  quant = quantization_from_hf_config(hf)
  weights = HfWeights(hf_dir, quant)
  skipped_tower = sorted(n for n in weights.keys() if layout.is_skipped(n))
  # plan name -> checkpoint name of the text model's tensors; other names are unexpected.
  text = {p: n for n in weights.keys() if not layout.is_skipped(n) and (p := layout.plan_name(n)) is not None}
  n_layers = _config_count(_text_hf(hf), "num_hidden_layers")
  _check_config_fields(hf)
  _check_counts(hf_dir, hf, text, n_layers)
  num_mtp = count_mtp_layers(text, n_layers)
  param_dtype = dtype or _default_dtype(hf)
  cfg = ModelConfig.from_hf_dict(hf, num_mtp_layers=num_mtp, param_dtype=param_dtype)
  summary = ConversionSummary(cfg=cfg, out_dir=out_dir, num_mtp_layers=num_mtp)
  declared = _text_hf(hf).get("num_nextn_predict_layers", 0) or 0
  if declared != num_mtp:
    summary.notes.append(f"config.json declares num_nextn_predict_layers={declared} but the checkpoint holds "
                         f"{num_mtp} MTP layer(s); converting the {num_mtp} present.")

  plan = _bounded_plan(hf_dir, cfg, len(text))
  copies = {p: main for p, main in mtp_copies(cfg).items() if p in text}  # compared when present, never written
  # HF builds shared experts of width moe_intermediate_size * 0 when n_shared_experts == 0 and saves them empty.
  empty_shared = {p for p, n in text.items() if ".mlp.shared_experts." in p and not cfg.n_shared_experts
                  and weights.nbytes(n) == 0}
  unexpected = ({text[p] for p in set(text) - set(plan) - set(copies) - empty_shared}
                | (set(weights.keys()) - set(text.values()) - set(skipped_tower)))
  missing = {layout.checkpoint_name(p) for p in set(plan) - set(text)}
  if unexpected or missing:
    raise ValueError(f"{hf_dir} does not match its config.json ({layout.name} layout, {cfg.n_layers} layers, "
                     f"first_k_dense_replace={cfg.first_k_dense_replace}, q_lora_rank={cfg.q_lora_rank}, "
                     f"attention_bias={cfg.attention_bias}, n_shared_experts={cfg.n_shared_experts}, "
                     f"{num_mtp} MTP layers): {len(unexpected)} unexpected tensors [{_list(unexpected)}]; "
                     f"{len(missing)} missing tensors [{_list(missing)}]. Fix config.json or the checkpoint.")
  summary.skipped += [f"{text[p]} (empty shared expert: n_shared_experts=0)" for p in sorted(empty_shared)]
  if skipped_tower:
    summary.skipped += [f"{n} (not converted: {layout.skipped_what})" for n in skipped_tower]
    summary.notes.append(f"skipped {len(skipped_tower)} tensors of {layout.skipped_what}: c2jax converts the text "
                         "model only.")

  # Quantization and shapes are checked before anything is written, so a wrong config fails in seconds, not hours.
  used = {p: text[p] for p in list(plan) + list(copies)}
  _check_int4_targets(weights, quant, used, plan)
  for name in used.values():  # an integer tensor would be converted as its values, an FP8 one needs its scale
    weights.check_float(name)
  leaf_shapes = _leaf_shapes(cfg)
  bad = []
  for p, t in plan.items():
    piece = leaf_shapes[t.path][len(t.index):]
    want = _expected_hf_shape(piece, t.n_in)
    if weights.shape(text[p]) != want:
      bad.append(f"{text[p]} is {list(weights.shape(text[p]))}, config implies {list(want)}")
  for p, main in copies.items():
    if weights.shape(text[p]) != weights.shape(text[main]):
      bad.append(f"{text[p]} is {list(weights.shape(text[p]))}, {text[main]} is {list(weights.shape(text[main]))}")
  if bad:
    raise ValueError(f"{len(bad)} tensors have shapes that config.json contradicts: {'; '.join(bad[:20])}. Fix "
                     "config.json or the checkpoint.")
  if any(weights.is_int4(n) for n in used.values()):
    summary.notes.append(f"INT4 weights ({quant.describe()}) were dequantized exactly (q * scale in float32) and "
                         f"stored as {param_dtype}" + (", rounded to nearest even: the values compressed-tensors' "
                                                       "own BF16 decompression gives." if param_dtype == "bfloat16"
                                                       else ", exactly."))

  # File order makes the reads sequential.
  order = sorted(used, key=lambda p: (weights.info(used[p]).file, weights.info(used[p]).offset))
  with StreamingCheckpointWriter(out_dir, cfg) as writer, tqdm.tqdm(
      total=len(order), unit="tensor", desc="convert", disable=not progress) as bar:
    for p in order:
      name = used[p]
      if p in copies:
        if not _arrays_equal(weights.get(name), weights.get(text[copies[p]])):
          msg = (f"{name} differs from {text[copies[p]]}; c2jax's MTP shares the main embedding and head, so the "
                 "MTP copy is ignored.")
          summary.warnings.append(msg)
          logging.warning(msg)
        summary.skipped.append(f"{name} (MTP copy of {text[copies[p]]})")
      else:
        t = plan[p]
        w = weights.get(name)
        summary.num_dequantized_fp8 += int(weights.is_fp8(name))
        summary.num_dequantized_int4 += int(weights.is_int4(name))
        piece = _to_layout(w, leaf_shapes[t.path][len(t.index):], t.n_in)
        writer.write(t.path, t.index, piece)
        summary.num_tensors += 1
        summary.num_elements += piece.size
        del w, piece  # before reading the next tensor: peak memory stays at one tensor
      bar.update(1)
  return summary


def _leaf_shapes(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))
  return {tuple(k.key for k in path): spec.shape for path, spec in flat}
