"""The two ends of the decoder: the token embedding and the (untied) LM head, shared by the main model, the MTP
modules (`c2jax.model.mtp`: DeepSeek-V3 shares both with every MTP module) and the cached decode path."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.model.params import Params
from c2jax.model.sharding import constrain


def embed(params: Params, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
  """tokens [B, T] int -> [B, T, D] in the compute dtype."""
  return constrain(params["embed"].astype(cfg.dtype)[tokens], ("batch", "seq", "embed"))


def lm_head(params: Params, hidden: jax.Array) -> jax.Array:
  """hidden [..., D] (normed) -> float32 logits [..., V]."""
  return jnp.einsum("...d,dv->...v", hidden, params["lm_head"].astype(hidden.dtype),
                    preferred_element_type=jnp.float32)
