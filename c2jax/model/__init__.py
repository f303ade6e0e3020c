"""The DeepSeek-V3 / Kimi-K2.5 MoE model of Composer 2 as pure functions of (params, inputs)."""

from c2jax.model.config import ModelConfig, MoeDispatch, Precision, Remat, RopeConfig, RopeLayout, RopeType
from c2jax.model.params import abstract_params, count_params, init_params, logical_axes, param_specs
from c2jax.model.transformer import ModelOutput, forward

__all__ = ["ModelConfig", "MoeDispatch", "Precision", "Remat", "RopeConfig", "RopeLayout", "RopeType",
           "abstract_params", "count_params", "init_params", "logical_axes", "param_specs", "ModelOutput", "forward"]
