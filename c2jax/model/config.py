"""Architecture of the DeepSeek-V3 / Kimi-K2.5 MoE decoder as frozen dataclasses.

A layer receives only this config (never a run config). Field names follow the report's base model (Kimi K2.5,
DeepSeek-V3 architecture; Composer 2 report section 2) and, where an HF `DeepseekV3Config` field exists, its
meaning is the same; `from_hf_dict` / `to_hf_dict` translate.

Shape letters used across `c2jax.model` (documented once here):
  B batch, T/S sequence (query/key), D model width, N heads, H head dim, L latent rank, R rope dims,
  E routed experts, K experts per token (top-k), F FFN hidden, V vocab, M MTP depth, G expert groups.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Mapping

from pallas_kernels.recipe.precision import Precision  # the experts' number format (kernels know no model)
from pallas_kernels.target import Platform  # which backend's program is traced (kernels know no model)


class RopeType(enum.Enum):
  """How rotary frequencies are built (HF `rope_parameters.rope_type`)."""

  DEFAULT = "default"
  YARN = "yarn"


class RopeLayout(enum.Enum):
  """Which dimensions a rotary pair occupies (HF `rope_interleave`).

  INTERLEAVED: pairs (x0, x1), (x2, x3), ... as in DeepSeek's release (HF `rope_interleave=True`).
  HALVES: pairs (x_i, x_{i+R/2}) as in Llama (`rope_interleave=False`).
  """

  INTERLEAVED = "interleaved"
  HALVES = "halves"


class MoeDispatch(enum.Enum):
  """How routed experts are computed. All give the same numbers; they differ only in cost.

  DENSE: every expert on every token, weighted by the (mostly zero) gates. The reference; cost grows with E.
  SLOTS: sort assignments by expert into [E, C, D] capacity slots and run one batched matmul per round;
    dropless: tokens past capacity C are processed exactly in further rounds. Fast on CPU.
  TILES: sort assignments by expert, pad each expert's rows to whole tiles, and run one batched matmul over a
    round of tiles (each with its expert's weights); dropless, and an imbalanced load costs its own rows, not
    extra rounds over every expert. Fastest on CPU.
  RAGGED: `jax.lax.ragged_dot` grouped matmul over expert-sorted rows. Fast where grouped-matmul kernels are.
  AUTO: TILES on CPU, RAGGED on GPU/TPU.
  """

  DENSE = "dense"
  SLOTS = "slots"
  TILES = "tiles"
  RAGGED = "ragged"
  AUTO = "auto"


class Remat(enum.Enum):
  """Activation rematerialization of each scanned decoder block."""

  NONE = "none"
  FULL = "full"
  DOTS_SAVEABLE = "dots_saveable"


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary embedding of the decoupled rope dims (MLA). YaRN fields follow HF `_compute_yarn_parameters`."""

  theta: float = 10000.0
  type: RopeType = RopeType.DEFAULT
  layout: RopeLayout = RopeLayout.INTERLEAVED
  factor: float = 1.0
  original_max_position_embeddings: int = 4096
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  mscale: float = 1.0
  mscale_all_dim: float = 0.0
  attention_factor: float | None = None  # None: derived from factor / mscale / mscale_all_dim as HF does.
  truncate: bool = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """DeepSeek-V3-style MoE decoder with MLA and optional MTP modules.

  Attributes mirror HF `DeepseekV3Config`: d_model=hidden_size, n_layers=num_hidden_layers,
  n_heads=num_attention_heads, num_mtp_layers=num_nextn_predict_layers. `moe_dispatch`, `moe_capacity_factor`,
  `remat`, `scan_unroll`, `platform` and `dtype` are implementation choices: they never change the math;
  `precision` (the experts' FP8/FP4 recipe) changes it within quantization error and is not exported to HF.
  """

  vocab_size: int = 256
  d_model: int = 64
  n_layers: int = 2
  n_heads: int = 4
  q_lora_rank: int | None = 32
  kv_lora_rank: int = 16
  qk_nope_head_dim: int = 16
  qk_rope_head_dim: int = 8
  v_head_dim: int = 16
  intermediate_size: int = 128
  moe_intermediate_size: int = 32
  n_routed_experts: int = 8
  n_shared_experts: int = 1
  num_experts_per_tok: int = 2
  n_group: int = 1
  topk_group: int = 1
  norm_topk_prob: bool = True
  routed_scaling_factor: float = 1.0
  first_k_dense_replace: int = 1
  num_mtp_layers: int = 0
  rms_norm_eps: float = 1e-6
  attention_bias: bool = False
  max_position_embeddings: int = 4096
  rope: RopeConfig = RopeConfig()
  initializer_range: float = 0.02
  # Implementation choices (no effect on the function computed).
  dtype: str = "float32"  # compute dtype of activations and matmuls; params are cast to it.
  param_dtype: str = "float32"
  moe_dispatch: MoeDispatch = MoeDispatch.AUTO
  moe_capacity_factor: float = 1.25
  remat: Remat = Remat.NONE
  scan_unroll: int = 1  # layers per scan iteration; unrolling shallow models saves per-iteration overhead on CPU.
  # The backend whose program is traced (MoE dispatch, Pallas kernels or reference quantizers): AUTO is the devices
  # the program runs on (the layout's mesh, the mesh in context, else the default device; pallas_kernels.target).
  # Where a program runs is not part of a model: checkpoints do not store it (`config_to_json_dict`).
  platform: Platform = Platform.AUTO
  # Training numerics (changes the numbers within quantization error; not part of the HF architecture).
  precision: Precision = Precision.BF16

  def __post_init__(self):
    def need(cond: bool, msg: str):
      if not cond:
        raise ValueError(f"ModelConfig: {msg}")

    need(self.vocab_size > 0 and self.d_model > 0 and self.n_heads > 0, "sizes must be positive.")
    need(0 <= self.first_k_dense_replace <= self.n_layers,
         f"first_k_dense_replace={self.first_k_dense_replace} must lie in [0, n_layers={self.n_layers}].")
    need(self.q_lora_rank is None or self.q_lora_rank > 0, "q_lora_rank must be None or positive.")
    need(self.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim={self.qk_rope_head_dim} must be even (rotary pairs).")
    if self.n_moe_layers:
      need(self.n_routed_experts > 0, "MoE layers need n_routed_experts > 0.")
      need(1 <= self.num_experts_per_tok <= self.n_routed_experts,
           f"num_experts_per_tok={self.num_experts_per_tok} must lie in [1, n_routed_experts={self.n_routed_experts}].")
      need(self.n_routed_experts % self.n_group == 0,
           f"n_routed_experts={self.n_routed_experts} must be divisible by n_group={self.n_group}.")
      need(1 <= self.topk_group <= self.n_group,
           f"topk_group={self.topk_group} must lie in [1, n_group={self.n_group}].")
      if self.n_group > 1:
        need(self.n_routed_experts // self.n_group >= 2,
             "group-limited routing scores a group by its top-2 experts: use >= 2 experts per group.")
        need(self.topk_group * (self.n_routed_experts // self.n_group) >= self.num_experts_per_tok,
             "topk_group groups must hold at least num_experts_per_tok experts.")
      need(self.moe_capacity_factor > 0, "moe_capacity_factor must be positive.")
      need(self.precision is Precision.BF16 or (self.d_model % 32 == 0 and self.moe_intermediate_size % 32 == 0),
           f"precision={self.precision.value} quantizes the expert matmuls in blocks of 32 along d_model="
           f"{self.d_model} and moe_intermediate_size={self.moe_intermediate_size}: make both multiples of 32.")
    need(self.num_mtp_layers >= 0, "num_mtp_layers must be >= 0.")
    need(self.scan_unroll >= 1, f"scan_unroll={self.scan_unroll} must be >= 1.")
    need(self.dtype in ("float32", "bfloat16", "float16"), f"dtype={self.dtype!r}: use float32, bfloat16 or float16.")
    need(self.param_dtype in ("float32", "bfloat16"), f"param_dtype={self.param_dtype!r}: use float32 or bfloat16.")

  # Derived sizes -------------------------------------------------------------------------------------------------
  @property
  def n_dense_layers(self) -> int:
    return self.first_k_dense_replace

  @property
  def n_moe_layers(self) -> int:
    return self.n_layers - self.first_k_dense_replace

  @property
  def qk_head_dim(self) -> int:
    return self.qk_nope_head_dim + self.qk_rope_head_dim

  @property
  def shared_intermediate_size(self) -> int:
    return self.moe_intermediate_size * self.n_shared_experts

  @property
  def attention_scale(self) -> float:
    """Softmax scale: 1/sqrt(qk_head_dim), times mscale(factor, mscale_all_dim)^2 under YaRN (as HF/DeepSeek)."""
    scale = self.qk_head_dim ** -0.5
    r = self.rope
    if r.type is RopeType.YARN and r.mscale_all_dim:
      m = yarn_mscale(r.factor, r.mscale_all_dim)
      scale *= m * m
    return scale

  def replace(self, **kw) -> ModelConfig:
    return dataclasses.replace(self, **kw)

  # HF interop --------------------------------------------------------------------------------------------------
  @classmethod
  def from_hf_dict(cls, hf: Mapping[str, Any], **overrides) -> ModelConfig:
    """Builds a config from an HF `config.json` dict (DeepseekV3 / Kimi-K2 text configs; v4 and v5 rope keys)."""
    if "text_config" in hf:  # Kimi K2.5 wraps the text model in a multimodal config.
      hf = hf["text_config"]
    mt = hf.get("model_type", "deepseek_v3")
    if mt not in ("deepseek_v3", "kimi_k2", "deepseek_v2"):
      raise ValueError(f"model_type {mt!r} is not a DeepSeek-V3-style model; c2jax converts deepseek_v3/kimi_k2.")
    if hf.get("scoring_func", "sigmoid") != "sigmoid":
      raise ValueError(f"scoring_func={hf.get('scoring_func')!r}: c2jax implements the sigmoid router of DeepSeek-V3.")
    if hf.get("tie_word_embeddings", False):
      raise ValueError("tie_word_embeddings=True: DeepSeek-V3 has an untied LM head; tied heads are not supported.")
    nkv = hf.get("num_key_value_heads", hf["num_attention_heads"])
    if nkv != hf["num_attention_heads"]:
      raise ValueError(f"num_key_value_heads={nkv} != num_attention_heads: MLA expands one latent to every head.")
    rp = dict(hf.get("rope_parameters") or {})
    if not rp:
      rp = dict(hf.get("rope_scaling") or {})
      rp.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rtype = rp.get("rope_type", rp.get("type", "default")) or "default"
    if rtype not in ("default", "yarn"):
      raise ValueError(f"rope type {rtype!r} is not supported: use 'default' or 'yarn'.")
    rope = RopeConfig(theta=float(rp.get("rope_theta", hf.get("rope_theta", 10000.0))),
                      type=RopeType(rtype),
                      layout=RopeLayout.INTERLEAVED if hf.get("rope_interleave", True) else RopeLayout.HALVES)
    if rtype == "yarn":
      factor = rp.get("factor")
      orig = rp.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
      if factor is None:
        factor = hf["max_position_embeddings"] / orig
      rope = dataclasses.replace(
          rope, factor=float(factor), original_max_position_embeddings=int(orig),
          beta_fast=float(rp.get("beta_fast") or 32.0), beta_slow=float(rp.get("beta_slow") or 1.0),
          mscale=float(rp.get("mscale") or 0.0), mscale_all_dim=float(rp.get("mscale_all_dim") or 0.0),
          attention_factor=rp.get("attention_factor"), truncate=bool(rp.get("truncate", True)))
    n_routed = hf.get("n_routed_experts") or 0
    kw = dict(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], q_lora_rank=hf.get("q_lora_rank"), kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"], intermediate_size=hf["intermediate_size"],
        moe_intermediate_size=hf.get("moe_intermediate_size", 1), n_routed_experts=n_routed,
        n_shared_experts=hf.get("n_shared_experts") or 0, num_experts_per_tok=hf.get("num_experts_per_tok", 1),
        n_group=hf.get("n_group") or 1, topk_group=hf.get("topk_group") or 1,
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        first_k_dense_replace=hf.get("first_k_dense_replace", 0) if n_routed else hf["num_hidden_layers"],
        num_mtp_layers=hf.get("num_nextn_predict_layers", 0) or 0, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        attention_bias=bool(hf.get("attention_bias", False)),
        max_position_embeddings=hf.get("max_position_embeddings", 4096), rope=rope,
        initializer_range=hf.get("initializer_range", 0.02))
    if hf.get("moe_layer_freq", 1) != 1:
      raise ValueError("moe_layer_freq != 1 is not part of DeepSeek-V3: every layer after the dense ones is MoE.")
    kw.update(overrides)
    return cls(**kw)

  def to_hf_dict(self) -> dict[str, Any]:
    """The HF `DeepseekV3Config` kwargs describing the same architecture (used by parity tests and export)."""
    r = self.rope
    rope_parameters: dict[str, Any] = {"rope_theta": r.theta, "rope_type": r.type.value}
    if r.type is RopeType.YARN:
      rope_parameters.update(factor=r.factor, original_max_position_embeddings=r.original_max_position_embeddings,
                             beta_fast=r.beta_fast, beta_slow=r.beta_slow, mscale=r.mscale,
                             mscale_all_dim=r.mscale_all_dim, truncate=r.truncate)
      if r.attention_factor is not None:
        rope_parameters["attention_factor"] = r.attention_factor
    return dict(
        vocab_size=self.vocab_size, hidden_size=self.d_model, num_hidden_layers=self.n_layers,
        num_attention_heads=self.n_heads, num_key_value_heads=self.n_heads, q_lora_rank=self.q_lora_rank,
        kv_lora_rank=self.kv_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
        qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim,
        intermediate_size=self.intermediate_size, moe_intermediate_size=self.moe_intermediate_size,
        n_routed_experts=self.n_routed_experts, n_shared_experts=self.n_shared_experts,
        num_experts_per_tok=self.num_experts_per_tok, n_group=self.n_group, topk_group=self.topk_group,
        norm_topk_prob=self.norm_topk_prob, routed_scaling_factor=self.routed_scaling_factor,
        first_k_dense_replace=self.first_k_dense_replace, num_nextn_predict_layers=self.num_mtp_layers,
        rms_norm_eps=self.rms_norm_eps, attention_bias=self.attention_bias,
        max_position_embeddings=self.max_position_embeddings, rope_parameters=rope_parameters,
        rope_interleave=r.layout is RopeLayout.INTERLEAVED, tie_word_embeddings=False, hidden_act="silu",
        initializer_range=self.initializer_range, model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        # transformers 5 implies these; vLLM and DeepSeek's own code read them (topk_method "noaux_tc" is what
        # gives vLLM's router its correction bias, scoring_func picks sigmoid over softmax).
        topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  """YaRN attention temperature factor 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
  if scale <= 1:
    return 1.0
  return 0.1 * mscale * math.log(scale) + 1.0


def config_to_json_dict(cfg: ModelConfig) -> dict[str, Any]:
  """A JSON-serializable dict of the config (enums by value); inverse of `config_from_json_dict`."""

  def conv(v):
    if isinstance(v, enum.Enum):
      return v.value
    if dataclasses.is_dataclass(v):
      return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return v

  out = conv(cfg)
  del out["platform"]  # where a program runs is not part of the model: a GPU run's checkpoint must load on a CPU
  return out


def config_from_json_dict(d: Mapping[str, Any]) -> ModelConfig:
  """Inverse of `config_to_json_dict`; unknown keys are an error so that typos do not pass silently."""
  d = dict(d)
  if "platform" in d:  # a file must not choose the program: a GPU-traced model on a CPU host fails only at compile
    raise ValueError(f"a model config file names a platform ({d['platform']!r}); where a program runs is not part "
                     "of a checkpoint (ModelConfig.platform is the run's choice): remove the key.")
  known = {f.name for f in dataclasses.fields(ModelConfig)} - {"platform"}
  unknown = set(d) - known
  if unknown:
    raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; known: {sorted(known)}")
  rope = dict(d.pop("rope", {}))
  if "type" in rope:
    rope["type"] = RopeType(rope["type"])
  if "layout" in rope:
    rope["layout"] = RopeLayout(rope["layout"])
  for key, enum_cls in (("moe_dispatch", MoeDispatch), ("remat", Remat), ("precision", Precision)):
    if key in d:
      d[key] = enum_cls(d[key])
  return ModelConfig(rope=RopeConfig(**rope), **d)
