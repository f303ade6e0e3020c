"""Kimi K2.5 text model (DeepSeek-V3 architecture), the base of Composer 2 (report section 2): 1.04T total /
32B active parameters. Never instantiate its params on one host: use `abstract_params` / sharded init.

  python tools/count_params.py --model=kimi_k25
"""

from c2jax.model.config import ModelConfig, RopeConfig, RopeType


def get_model_config() -> ModelConfig:
  return ModelConfig(
      vocab_size=163840, d_model=7168, n_layers=61, n_heads=64, q_lora_rank=1536, kv_lora_rank=512,
      qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432,
      moe_intermediate_size=2048, n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8, n_group=1,
      topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.827, first_k_dense_replace=1, num_mtp_layers=1,
      rms_norm_eps=1e-5, max_position_embeddings=262144, dtype="bfloat16", param_dtype="bfloat16",
      rope=RopeConfig(theta=50000.0, type=RopeType.YARN, factor=64.0, original_max_position_embeddings=4096,
                      beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
