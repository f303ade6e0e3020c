"""A mid-size DeepSeek-V3-shaped MoE for one GPU: 2.6B parameters (0.67B active per token), bf16 compute on
float32 parameters. Its AdamW train step keeps 16 bytes per parameter (39 GiB: params, grads, two moments); XLA's
buffer assignment of the step, compiled from abstract shapes on CPU (jax 0.10.2), came to 62 GiB in all at
4 x 1024 tokens and 74 GiB at 8 x 1024 (3.1 GiB per 1024 tokens), so about 100 GiB at 16 x 1024: tools/gpu_check.sh
runs B=4 on an 80 GB H100 and B=16 on a 141 GB H200 (halving once if the GPU's own assignment runs out). XLA:GPU's
own assignment, compiled for an H100 without one, is lower (tools/gpu_compile.py memory; docs/benchmarks.md).

  python tools/bench_model.py --model=configs/model/gpu_mid.py --dtype=bfloat16 --skip_hf --batch=4 \
      --seq_len=1024 --experts_sweep= --matmul_size=8192   # train-step MFU (tools/gpu_check.sh runs this)
  python tools/bench_sampler.py --model=configs/model/gpu_mid.py --dtype=bfloat16 --skip_hf --skip_spec \
      --batches=64,256                                 # sampler tokens/s

Every matmul dimension is a multiple of 128. Routed experts use capacity-slot dispatch (batched [E, C, D] x
[E, D, F] matmuls, rounds recomputed in the backward pass), whose cost and memory do not depend on how XLA lowers
`jax.lax.ragged_dot` on this GPU (tools/bench_kernels.py measures that lowering: grouped_bf16_ragged_dot). On a
2-core CPU use the `tiny` preset instead: this model is a GPU's.
"""

from c2jax.model.config import ModelConfig, MoeDispatch, RopeConfig


def get_model_config() -> ModelConfig:
  return ModelConfig(
      vocab_size=32768, d_model=2048, n_layers=12, n_heads=16, q_lora_rank=768, kv_lora_rank=512,
      qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=8192,
      moe_intermediate_size=1024, n_routed_experts=32, n_shared_experts=1, num_experts_per_tok=4, n_group=1,
      topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1, num_mtp_layers=0,
      max_position_embeddings=4096, rope=RopeConfig(theta=10000.0), dtype="bfloat16", param_dtype="float32",
      moe_dispatch=MoeDispatch.SLOTS)
