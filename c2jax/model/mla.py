"""Multi-head latent attention (MLA), DeepSeek-V2/V3 (the Kimi K2.5 base of Composer 2, report section 2).

Queries come from an optional low-rank path (D -> Lq -> N x H); keys and values from one compressed latent
c_kv [Lkv] per token, expanded per head by kv_b; a small decoupled rope key k_rope [R] is shared by all heads.
Only c_kv and k_rope (Lkv + R numbers per token and layer) need caching or communicating, which the sampler's
KV cache and context parallelism exploit.

Two forms: the training-side expanded form (`attend`: K and V built per head from c_kv), and the absorbed-weights
form for decoding from a latent KV cache (`attend_cached`: kv_b folded into the query and the output, so the
cache holds only c_kv and k_rope).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import rope as rope_lib
from c2jax.model.config import ModelConfig
from c2jax.model.norms import LATENT_NORM_EPS, rms_norm
from c2jax.model.sharding import constrain, current_layout


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


# Query blocks of the causal attention: at most this many, each at least `_MIN_QUERY_BLOCK` rows. Block i attends
# only to keys [0, end of block i), so about (n + 1) / 2n of the T x S scores are computed (5/8 for T=256).
_MAX_QUERY_BLOCKS = 8
_MIN_QUERY_BLOCK = 64


def _scores_bias(q_positions, k_positions, q_segments, k_segments) -> jax.Array:
  """0 where a query may attend, float32 min elsewhere: [B, 1, Tq, Sk] (see `attention_mask`)."""
  mask = attention_mask(q_positions, k_positions, q_segments, k_segments)
  return jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)


def _block_forward(q, k, v, bias):
  """Softmax attention of one query block, head-major: q [B, N, t, H] (pre-scaled), k [B, N, s, H], v [B, N, s, Hv].

  Returns (out [B, N, t, Hv], log-sum-exp [B, N, t, 1] float32), the only residual the backward pass needs
  besides the inputs.
  """
  logits = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=jnp.float32) + bias
  m = jnp.max(logits, axis=-1, keepdims=True)
  e = jnp.exp(logits - m)
  denom = jnp.sum(e, axis=-1, keepdims=True)
  out = jnp.einsum("bnts,bnsh->bnth", (e / denom).astype(v.dtype), v)
  return out, m + jnp.log(denom)


# The blocks compute head-major ([B, N, T, H]): every contraction is then a plain batched matmul over (B, N) with
# the operands in their stored layout. In the token-major layout of the model ([B, T, N, H]) XLA:CPU transposed
# each operand and result of each of the ten einsums per block; `attend` transposes q, k, v once per layer
# instead (docs/benchmarks.md, tools/bench_model.py).
@jax.custom_vjp
def _head_major_block(q, k, v, q_positions, k_positions, q_segments, k_segments):
  """`attention_block` in the head-major layout: q [B, N, t, H], k [B, N, s, H], v [B, N, s, Hv] ->
  (out [B, N, t, Hv], lse [B, N, t])."""
  bias = _scores_bias(q_positions, k_positions, q_segments, k_segments)
  out, lse = _block_forward(q, k, v, bias)
  return out, lse[..., 0]


def _head_major_block_fwd(q, k, v, q_positions, k_positions, q_segments, k_segments):
  bias = _scores_bias(q_positions, k_positions, q_segments, k_segments)
  out, lse = _block_forward(q, k, v, bias)
  return (out, lse[..., 0]), (q, k, v, q_positions, k_positions, q_segments, k_segments, out, lse)


def _head_major_block_bwd(res, cotangents):
  # Recomputes the probabilities from the saved log-sum-exp (flash-attention style): nothing of size T x S is
  # kept between the passes, which on CPU saves more memory traffic than the recompute costs.
  q, k, v, q_positions, k_positions, q_segments, k_segments, out, lse = res
  d_out, d_lse = cotangents
  bias = _scores_bias(q_positions, k_positions, q_segments, k_segments)
  logits = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=jnp.float32) + bias
  probs = jnp.exp(logits - lse)
  dv = jnp.einsum("bnts,bnth->bnsh", probs.astype(d_out.dtype), d_out)
  dprobs = jnp.einsum("bnth,bnsh->bnts", d_out, v, preferred_element_type=jnp.float32)
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
  # d lse / d logits = probs, so the log-sum-exp's cotangent (nonzero when partial blocks are merged by their
  # log-sum-exp, as context parallelism does) joins the softmax's: probs * (dprobs - delta + d_lse).
  dlogits = (probs * (dprobs - delta + d_lse.astype(jnp.float32)[..., None])).astype(q.dtype)
  dq = jnp.einsum("bnts,bnsh->bnth", dlogits, k)
  dk = jnp.einsum("bnts,bnth->bnsh", dlogits, q)

  def no_grad(a):
    return None if a is None else np.zeros(a.shape, jax.dtypes.float0)

  return dq, dk, dv, no_grad(q_positions), no_grad(k_positions), no_grad(q_segments), no_grad(k_segments)


_head_major_block.defvjp(_head_major_block_fwd, _head_major_block_bwd)


def _heads_first(a: jax.Array) -> jax.Array:
  """[B, T, N, H] <-> [B, N, T, H]."""
  return a.transpose(0, 2, 1, 3)


def attention_block(q, k, v, q_positions, k_positions, q_segments, k_segments):
  """Masked softmax attention of one block of queries over one block of keys, with its log-sum-exp.

  The mask is `attention_mask` of the positions and segment ids. A query row with no visible key gets the
  mean of v and a log-sum-exp of about float32 min, so any log-sum-exp merge of partial blocks (context
  parallelism) gives it weight 0. The backward pass keeps only the inputs, the output and the log-sum-exp.

  Args:
    q: [B, t, N, H] queries, already multiplied by the softmax scale.
    k: [B, s, N, H] keys.
    v: [B, s, N, Hv] values.
    q_positions: [B, t] int; k_positions: [B, s] int.
    q_segments: [B, t] int or None; k_segments: [B, s] int or None (None: one document per row).
  Returns:
    (out [B, t, N, Hv] in v's dtype, lse [B, N, t] float32 log-sum-exp of the scaled, masked logits).
  """
  out, lse = _head_major_block(_heads_first(q), _heads_first(k), _heads_first(v), q_positions, k_positions,
                               q_segments, k_segments)
  return _heads_first(out), lse


def query_block_size(t: int) -> int:
  """Rows per query block for a sequence of t tokens (a multiple of 8, or t itself)."""
  block = max(_MIN_QUERY_BLOCK, -(-t // _MAX_QUERY_BLOCKS))
  block = -(-block // 8) * 8
  return min(block, t)


def attend(p: dict, lat: Latents, positions: jax.Array, segment_ids: jax.Array | None,
           cfg: ModelConfig) -> jax.Array:
  """Causal self-attention over keys expanded from the latents; returns per-head values [B, T, N, Hv].

  Queries are taken in blocks; block [i, j) attends to keys [0, j) only. That is exact for self-attention
  when a key after the query is always masked: positions increase with the index inside each segment (how
  sequences and packed documents are laid out), so `attention_mask` masks every later key. Each block has a
  hand-written VJP that keeps only its inputs, output and log-sum-exp.

  Args:
    p: attention params.
    lat: `Latents`, queries and keys of the same T tokens.
    positions: [B, T] int positions.
    segment_ids: [B, T] int document ids, or None for one document per row.
    cfg: model config.
  """
  dt = lat.c_kv.dtype
  # Head-major throughout (see `_head_major_block`): K and V come out of kv_b as [B, N, S, H], q is transposed once.
  kv = jnp.einsum("bsl,lnh->bnsh", lat.c_kv, p["kv_b"].astype(dt))
  k_nope, v = kv[..., :cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim:]
  # One contraction over [nope | rope] (the rope key broadcast to every head) costs one T x S pass instead of
  # two; the scale goes on q, which is S/H times smaller than the scores.
  q = _heads_first(jnp.concatenate([lat.q_nope, lat.q_rope], axis=-1) * jnp.asarray(cfg.attention_scale, dt))
  k_rope = jnp.broadcast_to(lat.k_rope[:, None, :, :], k_nope.shape[:3] + lat.k_rope.shape[-1:])
  k = jnp.concatenate([k_nope, k_rope], axis=-1)
  t = q.shape[2]
  block = query_block_size(t)
  outs = []
  for i in range(0, t, block):
    j = min(i + block, t)
    seg_q = None if segment_ids is None else segment_ids[:, i:j]
    seg_k = None if segment_ids is None else segment_ids[:, :j]
    outs.append(_head_major_block(q[:, :, i:j], k[:, :, :j], v[:, :, :j], positions[:, i:j], positions[:, :j],
                                  seg_q, seg_k)[0])
  return _heads_first(jnp.concatenate(outs, axis=2))


def attend_reference(p: dict, lat: Latents, mask: jax.Array, cfg: ModelConfig) -> jax.Array:
  """Plain masked softmax attention over the full T x S scores: the reference `attend` is tested against.

  Args:
    p: attention params.
    lat: `Latents` (queries [B, T, ...], keys [B, S, ...]).
    mask: [B, 1, T, S] bools from `attention_mask`, True where a query may attend.
    cfg: model config.
  Returns:
    per-head values [B, T, N, Hv].
  """
  dt = lat.c_kv.dtype
  kv = jnp.einsum("bsl,lnh->bsnh", lat.c_kv, p["kv_b"].astype(dt))
  k_nope, v = kv[..., :cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim:]
  logits = (jnp.einsum("btnh,bsnh->bnts", lat.q_nope, k_nope, preferred_element_type=jnp.float32) +
            jnp.einsum("btnr,bsr->bnts", lat.q_rope, lat.k_rope, preferred_element_type=jnp.float32))
  logits = jnp.where(mask, logits * cfg.attention_scale, jnp.finfo(jnp.float32).min)
  return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1).astype(dt), v)


def attend_cached(p: dict, lat: Latents, q_positions: jax.Array, c_kv: jax.Array, k_rope: jax.Array,
                  cfg: ModelConfig) -> jax.Array:
  """Absorbed-weights attention of new queries over a latent KV cache (DeepSeek-V2 section 2.1.2).

  With kv_b = [W_UK | W_UV] per head, q_nope . (W_UK c) = (W_UK^T q_nope) . c: the query is moved into the latent
  space once per token, scores are taken against the cached latents directly, and the latent-space output is
  expanded by W_UV afterwards. Per key this costs Lkv + R multiply-adds per head instead of materializing K and V.

  Args:
    p: attention params.
    lat: `Latents` of the t new tokens (their c_kv / k_rope already written into the cache).
    q_positions: [B, t] absolute positions of the new tokens; a query sees cache slots s <= its position.
    c_kv: [B, S, Lkv] the cached normalized latents (slot s holds position s).
    k_rope: [B, S, R] the cached rotated rope keys.
    cfg: model config.
  Returns:
    per-head values [B, t, N, Hv].
  """
  dt = c_kv.dtype
  w = p["kv_b"].astype(dt)
  w_uk, w_uv = w[..., :cfg.qk_nope_head_dim], w[..., cfg.qk_nope_head_dim:]
  b, t, n = lat.q_nope.shape[:3]
  s = c_kv.shape[1]
  # Scores as [B, S, t*N]: the cached latents are the left matrix of a batched matmul in their stored layout
  # ([S, Lkv] per row, contracted over the minor dim) and the few queries the right one ([Lkv, t*N]); the latent
  # and rope parts are two such matmuls, summed, so the cache is never copied into a concatenated key. XLA:CPU ran
  # the queries-on-the-left form ("bntk,bsk->bnts", the cache contracted as a transposed right matrix) with the
  # [c_kv | k_rope] concatenation 2.7x slower at B=64 and the DeepSeek-V3 width (docs/benchmarks.md,
  # tools/bench_sampler.py).
  q_lat = jnp.einsum("btnh,lnh->bltn", lat.q_nope, w_uk).reshape(b, -1, t * n)
  q_rope = lat.q_rope.astype(dt).transpose(0, 3, 1, 2).reshape(b, -1, t * n)
  logits = (jnp.einsum("bsl,blm->bsm", c_kv, q_lat, preferred_element_type=jnp.float32)
            + jnp.einsum("bsr,brm->bsm", k_rope.astype(dt), q_rope, preferred_element_type=jnp.float32))
  logits = logits.reshape(b, s, t, n).transpose(0, 3, 2, 1)  # [B, N, t, S]
  visible = jnp.arange(c_kv.shape[1])[None, None, None, :] <= q_positions[:, None, :, None]
  logits = jnp.where(visible, logits * cfg.attention_scale, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  out_lat = jnp.einsum("bnts,bsl->bntl", probs, c_kv)
  return jnp.einsum("bntl,lnh->btnh", out_lat, w_uv)


def output_projection(p: dict, values: jax.Array) -> jax.Array:
  """o_proj: [B, T, N, Hv] -> [B, T, D]."""
  dt = values.dtype
  out = jnp.einsum("btnh,nhd->btd", values, p["o"].astype(dt))
  if "o_bias" in p:
    out = out + p["o_bias"].astype(dt)
  return out


def mla(p: dict, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
        cfg: ModelConfig) -> jax.Array:
  """Full-sequence causal MLA: x [B, T, D], positions [B, T], segment_ids [B, T] or None -> [B, T, D].

  Under a `Layout` with context parallelism the attention runs there (latents gathered over the context axis).
  """
  cos, sin = rope_lib.rope_angles(positions, cfg.rope, cfg.qk_rope_head_dim)
  lat = project_latents(p, x, cos, sin, cfg)
  layout = current_layout()
  attend_fn = attend if layout is None or layout.attention is None else layout.attention
  values = attend_fn(p, lat, positions, segment_ids, cfg)
  return output_projection(p, values)
