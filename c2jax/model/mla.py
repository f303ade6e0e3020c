"""Multi-head latent attention (MLA), DeepSeek-V2/V3 (the Kimi K2.5 base of Composer 2, report section 2).

Queries come from an optional low-rank path (D -> Lq -> N x H); keys and values from one compressed latent
c_kv [Lkv] per token, expanded per head by kv_b; a small decoupled rope key k_rope [R] is shared by all heads.
Only c_kv and k_rope (Lkv + R numbers per token and layer) need caching or communicating, which the sampler's
KV cache and context parallelism exploit.

This is the training-side (expanded) form; see c2jax/actors for the absorbed-weights decode form.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from c2jax.model import rope as rope_lib
from c2jax.model.config import ModelConfig
from c2jax.model.norms import LATENT_NORM_EPS, rms_norm
from c2jax.model.sharding import constrain


@dataclasses.dataclass(frozen=True)
class Latents:
  """Per-token quantities of MLA before per-head expansion.

  Attributes:
    q_nope: [B, T, N, Hn] query, non-rotary part.
    q_rope: [B, T, N, R] query, rotary part (rotated).
    c_kv: [B, S, Lkv] normalized KV latent.
    k_rope: [B, S, R] shared rotary key (rotated).
  """

  q_nope: jax.Array
  q_rope: jax.Array
  c_kv: jax.Array
  k_rope: jax.Array


def project_latents(p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array, cfg: ModelConfig) -> Latents:
  """Query and compressed KV latents of x [B, T, D]; cos/sin [B, T, R/2] from `rope.rope_angles`."""
  dt = x.dtype
  if cfg.q_lora_rank is None:
    q = jnp.einsum("btd,dnh->btnh", x, p["q"].astype(dt))
  else:
    qa = x @ p["q_a"].astype(dt)
    if "q_a_bias" in p:
      qa = qa + p["q_a_bias"].astype(dt)
    qa = rms_norm(qa, p["q_a_norm"], LATENT_NORM_EPS)
    q = jnp.einsum("btl,lnh->btnh", qa, p["q_b"].astype(dt))
  q = constrain(q, ("batch", "seq", "heads", "head_dim"))
  q_nope, q_rope = q[..., :cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim:]

  kv = x @ p["kv_a"].astype(dt)
  if "kv_a_bias" in p:
    kv = kv + p["kv_a_bias"].astype(dt)
  c_kv = rms_norm(kv[..., :cfg.kv_lora_rank], p["kv_a_norm"], LATENT_NORM_EPS)
  k_rope = kv[..., cfg.kv_lora_rank:]

  q_rope = rope_lib.apply_rope(q_rope, cos, sin, cfg.rope.layout)
  k_rope = rope_lib.apply_rope(k_rope, cos, sin, cfg.rope.layout)
  return Latents(q_nope=q_nope, q_rope=q_rope, c_kv=c_kv, k_rope=k_rope)


def attention_mask(q_positions: jax.Array, k_positions: jax.Array, q_segments: jax.Array | None,
                   k_segments: jax.Array | None) -> jax.Array:
  """Causal (by position) and same-document (by segment id) mask [B, 1, T, S] of bools.

  Causality uses positions, not indices, so packed documents with per-segment positions, caches and
  context-parallel chunks all mask correctly; the segment test keeps packed documents apart.
  """
  mask = k_positions[:, None, :] <= q_positions[:, :, None]
  if q_segments is not None:
    mask = mask & (q_segments[:, :, None] == k_segments[:, None, :])
  return mask[:, None]


def attend(p: dict, lat: Latents, mask: jax.Array, cfg: ModelConfig) -> jax.Array:
  """Attention of queries over keys expanded from the latents; returns per-head values [B, T, N, Hv].

  Args:
    p: attention params.
    lat: `Latents` (queries [B, T, ...], keys [B, S, ...]).
    mask: [B, 1, T, S] bools, True where a query may attend.
    cfg: model config.
  """
  dt = lat.c_kv.dtype
  kv = jnp.einsum("bsl,lnh->bsnh", lat.c_kv, p["kv_b"].astype(dt))
  k_nope, v = kv[..., :cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim:]
  # The rope key is shared by all heads: contract it once per head pair without broadcasting it N times.
  logits = (jnp.einsum("btnh,bsnh->bnts", lat.q_nope, k_nope, preferred_element_type=jnp.float32) +
            jnp.einsum("btnr,bsr->bnts", lat.q_rope, lat.k_rope, preferred_element_type=jnp.float32))
  logits = logits * cfg.attention_scale
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  return jnp.einsum("bnts,bsnh->btnh", probs, v)


def output_projection(p: dict, values: jax.Array) -> jax.Array:
  """o_proj: [B, T, N, Hv] -> [B, T, D]."""
  dt = values.dtype
  out = jnp.einsum("btnh,nhd->btd", values, p["o"].astype(dt))
  if "o_bias" in p:
    out = out + p["o_bias"].astype(dt)
  return out


def mla(p: dict, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
        cfg: ModelConfig) -> jax.Array:
  """Full-sequence causal MLA: x [B, T, D], positions [B, T], segment_ids [B, T] or None -> [B, T, D]."""
  cos, sin = rope_lib.rope_angles(positions, cfg.rope, cfg.qk_rope_head_dim)
  lat = project_latents(p, x, cos, sin, cfg)
  mask = attention_mask(positions, positions, segment_ids, segment_ids)
  values = attend(p, lat, mask, cfg)
  return output_projection(p, values)
