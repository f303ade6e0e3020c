"""Named architectures (`MODEL_PRESETS`): what a run config's `model` names, with `model_overrides` on top.

  cfg = model_config("tiny")                                    # a ModelConfig
  cfg = model_config("tiny", {"vocab_size": 259, "n_layers": 2})  # overrides, each a ModelConfig field
  count_params(model_config("kimi_k25"))                        # 1.026T total / 32.9B active, from shapes alone
  cfg = model_config("checkpoint:ckpt/k25")                     # the architecture a c2jax checkpoint stores

  kimi_k25  the Kimi K2.5 text model (DeepSeek-V3 architecture), the base of Composer 2 (report section 2): never
            instantiate its params on one host (`abstract_params` / sharded init).
  tiny      DeepSeek-V3-shaped with every architectural feature on (MLA with q and kv compression, YaRN,
            group-limited sigmoid routing with a correction bias, a shared expert, a dense first layer, one MTP
            module); forward + backward in seconds on a 2-core CPU.
  small     the same features at widths where matmuls dominate a CPU training step (d_model 512, 8 layers, 64
            routed experts of which 8 active, a 32k vocabulary; 0.22B params, 0.07B active): the config of
            tools/bench_model.py's FLOP/s figure against a large `jnp.dot`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from c2jax import typed_config
from c2jax.model.config import ModelConfig, RopeConfig, RopeType
from c2jax.registry import Registry

MODEL_PRESETS: Registry[Callable[[], ModelConfig]] = Registry("model preset")
# `checkpoint:<dir>` names the architecture of a c2jax checkpoint (its model_config.json), e.g. one converted by
# tools/convert_hf.py: a run starts from it without spelling its shape out in model_overrides.
CHECKPOINT_PREFIX = "checkpoint:"


def _named(name: str) -> ModelConfig:
  if isinstance(name, str) and name.startswith(CHECKPOINT_PREFIX):
    from c2jax.model.checkpoint import read_config  # orbax, on demand
    directory = name[len(CHECKPOINT_PREFIX):]
    if not directory:
      raise ValueError(f"model={name!r} names no directory; write {CHECKPOINT_PREFIX}<c2jax checkpoint dir>.")
    return read_config(directory)
  return MODEL_PRESETS.get(name)()


@MODEL_PRESETS.register("kimi_k25")
def kimi_k25() -> ModelConfig:
  return ModelConfig(
      vocab_size=163840, d_model=7168, n_layers=61, n_heads=64, q_lora_rank=1536, kv_lora_rank=512,
      qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432,
      moe_intermediate_size=2048, n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8, n_group=1,
      topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.827, first_k_dense_replace=1, num_mtp_layers=1,
      rms_norm_eps=1e-5, max_position_embeddings=262144, dtype="bfloat16", param_dtype="bfloat16",
      rope=RopeConfig(theta=50000.0, type=RopeType.YARN, factor=64.0, original_max_position_embeddings=4096,
                      beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))


@MODEL_PRESETS.register("tiny")
def tiny() -> ModelConfig:
  return ModelConfig(
      vocab_size=512, d_model=64, n_layers=3, n_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
      qk_rope_head_dim=8, v_head_dim=16, intermediate_size=192, moe_intermediate_size=32, n_routed_experts=16,
      n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True,
      routed_scaling_factor=2.5, first_k_dense_replace=1, num_mtp_layers=1, max_position_embeddings=8192,
      scan_unroll=4,
      rope=RopeConfig(theta=50000.0, type=RopeType.YARN, factor=4.0, original_max_position_embeddings=2048,
                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))


@MODEL_PRESETS.register("small")
def small() -> ModelConfig:
  # DeepSeek-V3's proportions scaled down: expert width d/2, q/kv ranks 3/8 and 1/4 of d, eight groups of eight
  # experts with four groups searched.
  return ModelConfig(
      vocab_size=32768, d_model=512, n_layers=8, n_heads=8, q_lora_rank=192, kv_lora_rank=128, qk_nope_head_dim=64,
      qk_rope_head_dim=32, v_head_dim=64, intermediate_size=1536, moe_intermediate_size=256, n_routed_experts=64,
      n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4, norm_topk_prob=True,
      routed_scaling_factor=2.5, first_k_dense_replace=1, num_mtp_layers=1, max_position_embeddings=8192,
      rope=RopeConfig(theta=50000.0, type=RopeType.YARN, factor=4.0, original_max_position_embeddings=2048,
                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))


def model_config(name: str, overrides: Mapping[str, Any] | None = None, where: str = "model_overrides"
                 ) -> ModelConfig:
  """The preset `name` (or `checkpoint:<dir>`) with `overrides` (ModelConfig fields, enums by value, `rope` as a
  mapping) applied.

  Raises:
    ValueError: for an unknown preset (listing the known ones) or an override that is not a ModelConfig field or
      has the wrong type (naming `where.<field>`).
    FileNotFoundError: `checkpoint:<dir>` where dir holds no model_config.json.
  """
  return typed_config.from_plain(_named(name), overrides, where)


def load(spec: str) -> ModelConfig:
  """A preset name, `checkpoint:<dir>`, or the path of a .py file that defines `get_model_config() -> ModelConfig`
  (an architecture of one's own, for the tools' `--model` flag)."""
  if not spec.endswith(".py"):
    return _named(spec)
  import importlib.util
  import os
  if not os.path.isfile(spec):
    raise ValueError(f"--model={spec}: no such file; give a preset ({', '.join(MODEL_PRESETS.names())}) or a .py "
                     "file that defines get_model_config().")
  module_spec = importlib.util.spec_from_file_location("c2jax_model_file", spec)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_model_config"):
    raise ValueError(f"--model={spec} defines no get_model_config(); write one that returns a ModelConfig.")
  return module.get_model_config()
