"""Tiny DeepSeek-V3-shaped model: every architectural feature on, forward+backward in seconds on a 2-core CPU.

  python -c "from configs.model import tiny; print(tiny.get_model_config())"
"""

from c2jax.model.config import ModelConfig, RopeConfig, RopeType


def get_model_config() -> ModelConfig:
  return ModelConfig(
      vocab_size=512, d_model=64, n_layers=3, n_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
      qk_rope_head_dim=8, v_head_dim=16, intermediate_size=192, moe_intermediate_size=32, n_routed_experts=16,
      n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True,
      routed_scaling_factor=2.5, first_k_dense_replace=1, num_mtp_layers=1, max_position_embeddings=8192,
      scan_unroll=4,
      rope=RopeConfig(theta=50000.0, type=RopeType.YARN, factor=4.0, original_max_position_embeddings=2048,
                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
