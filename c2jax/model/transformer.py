"""The DeepSeek-V3 / Kimi-K2.5 decoder as a pure function of (params, inputs).

  h = embed[tokens]
  for each layer (first `first_k_dense_replace` dense, then MoE; each group scanned over stacked params):
    h = h + MLA(rms_norm(h)); h = h + FFN(rms_norm(h))      FFN = SwiGLU MLP or MoE
  logits = rms_norm(h) @ lm_head                           (untied head)
  MTP modules (DeepSeek-V3 multi-token prediction; Composer 2 trains them by self-distillation, report section 3)
  continue from the main model's normed hidden state, see `c2jax.model.mtp`.

`forward` returns the chosen expert ids of every MoE layer and accepts forced ids (routing replay, report
section 4), so the sampler's routing can be replayed exactly in the trainer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import mla as mla_lib
from c2jax.model import moe as moe_lib
from c2jax.model import mtp as mtp_lib
from c2jax.model.config import ModelConfig, Remat
from c2jax.model.embedding import embed, lm_head
from c2jax.model.norms import rms_norm
from c2jax.model.params import Params
from c2jax.model.sharding import constrain, current_layout


@dataclasses.dataclass(frozen=True)
class ModelOutput:
  """What `forward` returns.

  Attributes:
    logits: [B, T, V] float32 next-token logits.
    hidden: [B, T, D] the final normed hidden state (input of the LM head and of MTP module 1).
    expert_ids: [Lm, B, T, K] int32 routed experts per MoE layer (Lm = n_moe_layers; [0, B, T, K] if none).
    expert_load: [Lm, E] float32 per-layer expert load fractions (input of `update_correction_bias`).
    expert_dropped: [Lm] float32 per-layer assignments dropped for lack of capacity (0 when dropless).
    mtp_logits: [M, B, T, V] float32 or None; mtp_logits[k-1, :, i] predicts token i + k + 1.
    mtp_expert_ids: [M, B, T, K] int32 or None, routing of the MTP blocks.
    mtp_expert_dropped: [M] float32 or None, the MTP blocks' dropped assignments.
  """

  logits: jax.Array
  hidden: jax.Array
  expert_ids: jax.Array
  expert_load: jax.Array
  expert_dropped: jax.Array
  mtp_logits: jax.Array | None = None
  mtp_expert_ids: jax.Array | None = None
  mtp_expert_dropped: jax.Array | None = None


jax.tree_util.register_dataclass(
    ModelOutput,
    data_fields=["logits", "hidden", "expert_ids", "expert_load", "expert_dropped", "mtp_logits", "mtp_expert_ids",
                 "mtp_expert_dropped"],
    meta_fields=[])


def block(p: dict, h: jax.Array, positions: jax.Array, segment_ids: jax.Array | None, cfg: ModelConfig,
          forced_ids: jax.Array | None = None, token_mask: jax.Array | None = None):
  """One pre-norm decoder block on h [B, T, D]. Returns (h, MoeOutput or None)."""
  a = mla_lib.mla(p["attn"], rms_norm(h, p["attn_norm"], cfg.rms_norm_eps), positions, segment_ids, cfg)
  h = constrain(h + a, ("batch", "seq", "embed"))
  return ffn_residual(p, h, cfg, forced_ids, token_mask)


def ffn_residual(p: dict, h: jax.Array, cfg: ModelConfig, forced_ids: jax.Array | None = None,
                 token_mask: jax.Array | None = None):
  """The second half of a block: h + FFN(rms_norm(h)) with a SwiGLU MLP or the MoE. Returns (h, MoeOutput | None)."""
  x = rms_norm(h, p["mlp_norm"], cfg.rms_norm_eps)
  if "moe" in p:
    out = moe_lib.moe_ffn(p["moe"], x, cfg, forced_ids, token_mask)
    return constrain(h + out.y, ("batch", "seq", "embed")), out
  m = p["mlp"]
  return constrain(h + moe_lib.swiglu(x, m["gate"], m["up"], m["down"]), ("batch", "seq", "embed")), None


def _remat(fn, cfg: ModelConfig):
  if cfg.remat is Remat.NONE:
    return fn
  policy = None if cfg.remat is Remat.FULL else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return jax.checkpoint(fn, policy=policy)


def _scan_blocks(stacked: dict, h, positions, segment_ids, cfg: ModelConfig, forced_ids, token_mask):
  """Scans `block` over stacked layer params; returns (h, (ids [L, B, T, K], load [L, E], dropped [L]) | None)."""
  is_moe = "moe" in stacked

  def step(carry, xs):
    p, forced = xs
    out_h, moe_out = block(p, carry, positions, segment_ids, cfg, forced, token_mask)
    if is_moe:
      return out_h, (moe_out.expert_ids, moe_out.load, moe_out.dropped)
    return out_h, None

  step = _remat(step, cfg)
  return jax.lax.scan(step, h, (stacked, forced_ids), unroll=cfg.scan_unroll)


def _take(a: jax.Array | None, index: np.ndarray, axis: int) -> jax.Array | None:
  return None if a is None else jnp.take(a, index, axis=axis)


def _block_in_order(order: np.ndarray, cfg: ModelConfig):
  """`block` on natural-order inputs that runs in the layout's sequence `order` (used by the MTP blocks)."""
  inverse = np.argsort(order)

  def run(p, h, positions, segment_ids, forced_ids=None, token_mask=None):
    out_h, moe_out = block(p, _take(h, order, 1), _take(positions, order, 1), _take(segment_ids, order, 1), cfg,
                           _take(forced_ids, order, 1), _take(token_mask, order, 1))
    if moe_out is not None:
      moe_out = dataclasses.replace(moe_out, expert_ids=_take(moe_out.expert_ids, inverse, 1))
    return _take(out_h, inverse, 1), moe_out

  return run


def forward(params: Params, tokens: jax.Array, *, cfg: ModelConfig, positions: jax.Array | None = None,
            segment_ids: jax.Array | None = None, forced_expert_ids: jax.Array | None = None,
            token_mask: jax.Array | None = None, with_mtp: bool = True,
            forced_mtp_expert_ids: jax.Array | None = None) -> ModelOutput:
  """Runs the model.

  Args:
    params: the param pytree (`c2jax.model.params`).
    tokens: [B, T] int token ids.
    cfg: the architecture.
    positions: [B, T] int positions (default arange(T)); per-segment positions for packed sequences.
    segment_ids: [B, T] int document ids; attention never crosses documents. None: one document per row.
    forced_expert_ids: [Lm, B, T, K] routing replay: use these experts instead of routing.
    token_mask: [B, T] weights of tokens in the expert-load statistics (padding excluded); default all.
    with_mtp: also run the MTP modules (when the config has any).
    forced_mtp_expert_ids: [M, B, T, K] routing replay for the MTP blocks.
  Returns:
    `ModelOutput`.
  """
  b, t = tokens.shape
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  lm = cfg.n_moe_layers
  if forced_expert_ids is not None and forced_expert_ids.shape != (lm, b, t, cfg.num_experts_per_tok):
    raise ValueError(f"forced_expert_ids has shape {forced_expert_ids.shape}; expected [Lm, B, T, K] = "
                     f"{(lm, b, t, cfg.num_experts_per_tok)}.")
  # A layout may run the decoder stack in another sequence order (context parallelism balances the causal
  # triangle that way). Everything per-token travels with the tokens, and the natural order is restored before
  # the heads, so the outputs do not depend on it.
  layout = current_layout()
  order = None if layout is None or layout.sequence_order is None else np.asarray(layout.sequence_order(t))
  def in_order(a: jax.Array | None, axis: int = 1) -> jax.Array | None:
    return a if order is None else _take(a, order, axis)

  run_tokens, run_positions, run_segments, run_mask = (in_order(a) for a in (tokens, positions, segment_ids,
                                                                             token_mask))
  run_forced = in_order(forced_expert_ids, 2)
  h = embed(params, run_tokens, cfg)
  if cfg.n_dense_layers:
    h, _ = _scan_blocks(params["dense_layers"], h, run_positions, run_segments, cfg, None, run_mask)
  if lm:
    h, (expert_ids, load, dropped) = _scan_blocks(params["moe_layers"], h, run_positions, run_segments, cfg,
                                                  run_forced, run_mask)
  else:
    expert_ids = jnp.zeros((0, b, t, cfg.num_experts_per_tok), jnp.int32)
    load = jnp.zeros((0, cfg.n_routed_experts), jnp.float32)
    dropped = jnp.zeros((0,), jnp.float32)
  if order is not None:
    inverse = np.argsort(order)
    h = constrain(_take(h, inverse, 1), ("batch", "seq", "embed"))
    expert_ids = _take(expert_ids, inverse, 2)
  hidden = rms_norm(h, params["final_norm"], cfg.rms_norm_eps)
  logits = constrain(lm_head(params, hidden), ("batch", "seq", "vocab"))
  out = ModelOutput(logits=logits, hidden=hidden, expert_ids=expert_ids, expert_load=load, expert_dropped=dropped)
  if with_mtp and cfg.num_mtp_layers:
    block_fn = functools.partial(block, cfg=cfg) if order is None else _block_in_order(order, cfg)
    mtp_out = mtp_lib.mtp_forward(params, hidden, tokens, positions, segment_ids, cfg, block_fn,
                                  forced_mtp_expert_ids, token_mask)
    out = dataclasses.replace(out, mtp_logits=mtp_out.logits, mtp_expert_ids=mtp_out.expert_ids,
                              mtp_expert_dropped=mtp_out.dropped)
  return out
