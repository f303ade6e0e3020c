"""Multi-token prediction modules (DeepSeek-V3 section 2.2), used by Composer 2 for speculative decoding and trained
by self-distillation in the long-context and SFT phases (report section 3).

Module k (1-based) at position i combines the previous representation h^{k-1}_i with the embedding of token
t_{i+k}, and predicts t_{i+k+1}:
  h'^k_i = eh_proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])
  h^k    = Block_k(h'^k)                     (a full decoder block)
  P^k    = softmax(lm_head(final_norm_k(h^k)))  (embedding and head shared with the main model)
h^0 is the main model's final normed hidden state, the quantity serving engines feed the released MTP weights.
Positions near the end whose t_{i+k} does not exist see token 0; their predictions are masked in the loss.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.model.embedding import lm_head
from c2jax.model.norms import rms_norm


@dataclasses.dataclass(frozen=True)
class MtpOutput:
  """logits [M, B, T, V] float32; expert_ids [M, B, T, K] int32 (zeros for dense MTP blocks); dropped [M] float32
  assignments dropped for lack of expert capacity (see `moe.MoeOutput`)."""

  logits: jax.Array
  expert_ids: jax.Array
  dropped: jax.Array


def shift_left(tokens: jax.Array, k: int) -> jax.Array:
  """tokens [B, T] shifted left by k with zero fill: out[:, i] = tokens[:, i + k]."""
  return jnp.pad(tokens[:, k:], ((0, 0), (0, k)))


def mtp_forward(params: dict, hidden: jax.Array, tokens: jax.Array, positions: jax.Array,
                segment_ids: jax.Array | None, cfg: ModelConfig, block_fn: Callable,
                forced_ids: jax.Array | None = None, token_mask: jax.Array | None = None) -> MtpOutput:
  """Runs the M MTP modules sequentially from hidden [B, T, D] (main model, normed) and tokens [B, T]."""
  p_all = params["mtp"]
  emb_table = params["embed"].astype(hidden.dtype)
  h = hidden
  logits, ids, dropped = [], [], []
  b, t, _ = hidden.shape
  for k in range(1, cfg.num_mtp_layers + 1):
    p = jax.tree.map(lambda a, k=k: a[k - 1], p_all)
    e = emb_table[shift_left(tokens, k)]
    x = jnp.concatenate([rms_norm(e, p["enorm"], cfg.rms_norm_eps), rms_norm(h, p["hnorm"], cfg.rms_norm_eps)],
                        axis=-1) @ p["eh_proj"].astype(h.dtype)
    h, moe_out = block_fn(p["block"], x, positions, segment_ids, forced_ids=None if forced_ids is None else
                          forced_ids[k - 1], token_mask=token_mask)
    logits.append(lm_head(params, rms_norm(h, p["final_norm"], cfg.rms_norm_eps)))
    ids.append(moe_out.expert_ids if moe_out is not None else jnp.zeros((b, t, cfg.num_experts_per_tok), jnp.int32))
    dropped.append(moe_out.dropped if moe_out is not None else jnp.zeros((), jnp.float32))
  return MtpOutput(logits=jnp.stack(logits), expert_ids=jnp.stack(ids), dropped=jnp.stack(dropped))
