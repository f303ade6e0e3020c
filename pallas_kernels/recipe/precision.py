"""The experts' number-format recipe as data (Composer 2 report section 5): what `ops.expert_matmul` computes, and
what a model config names (`c2jax.model.config.ModelConfig.precision`). Kernels know no model: the enum lives here
and the model imports it."""

import enum


class Precision(enum.Enum):
  """Number format of the routed experts' matmuls.

  BF16: no quantization: the experts run in the model's compute `dtype` with the configured `moe_dispatch`.
  MXFP8: E4M3 values with E8M0 scales per 32 along each matmul's contraction axis, forward and backward.
  NVFP4_FWD_MXFP8_BWD: the report's recipe: forward in NVFP4 (E2M1 values, E4M3 scales per 16) with per-token
    second-level scales, so a token's output never depends on other tokens; backward in MXFP8, both operands
    re-quantized from the saved high-precision inputs along each gradient's contraction axis.
  The quantized precisions run the experts as grouped matmuls over expert-sorted rows (whatever `moe_dispatch`).
  """

  BF16 = "bf16"
  MXFP8 = "mxfp8"
  NVFP4_FWD_MXFP8_BWD = "nvfp4_fwd_mxfp8_bwd"
