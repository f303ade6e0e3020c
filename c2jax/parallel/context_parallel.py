"""Context parallelism (CP) for MLA attention: the sequence split over the `context` mesh axis.

Each context rank holds T / cp tokens of every sequence and computes attention for its own queries. Its keys and
values come from the whole (earlier) sequence, so some communication is unavoidable; the choice is what to move.

Gather the latent, not K/V. MLA derives every head's key and value from one compressed latent per token (c_kv
[Lkv], plus the shared rotary key k_rope [R]). We all-gather those latents (and the positions and segment ids)
over `context` and expand them with kv_b on every rank, instead of ring-passing expanded K/V blocks between
neighbours. For Kimi K2.5 that moves kv_lora_rank 512 + rope 64 = 576 values = 1152 bytes per token and layer in
bf16, where full K/V would be 64 heads x (192 + 128) = 20480 values = 40960 bytes: about 36x less (before any
tensor split of the heads, which divides K/V but not the latent). At that size one all-gather is cheap next to the
attention itself, so the ring's point-to-point overlap machinery is not worth its complexity here; the gradient
of the gather is a reduce-scatter of latent-sized cotangents, just as small.
The cost is compute: each context rank re-expands every key its queries use (about all T of them, where one
device or a ring expands each key once), 2 * Lkv * N * (Hn + Hv) FLOPs per key token with N the rank's heads. For
Kimi K2.5 (Hn = Hv = 128) that is 2 * 512 * 256 = 262k FLOPs per head and key, against about N * 320 * T / cp per
key for the causal attention itself: a fraction of about 820 * cp / T, 5% at 16k tokens per rank.

Load balance. Causal attention is a triangle: splitting the sequence into cp contiguous pieces would give the last
rank cp times the first one's work. The layout therefore runs the decoder stack in `zigzag_order`: the sequence is
cut into 2cp chunks of ch = T / (2cp) tokens, and context rank c holds natural chunks A = c and B = 2cp-1-c. Half A
needs key chunks 0..c and half B key chunks 0..2cp-1-c: 2cp+1 (query half, key chunk) pairs on every rank. So every
rank computes exactly 2cp+1 fixed-shape ch x ch attention blocks (`mla.attention_block`, with masks from positions
and segment ids, so packed documents and chunk-local causality are exact), and merges the partial results of each
query half by their log-sum-exp. A query row that sees no key of some block gets weight 0 in the merge; every
query sees at least itself, in its diagonal block.

Skipping key chunks after a query's chunk is exact when a key later in the sequence is always masked for an
earlier query, i.e. positions increase within each document: the same assumption `mla.attend` makes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from c2jax.model import mla
from c2jax.model.config import ModelConfig
from c2jax.parallel.mesh import BATCH_AXES, CONTEXT, TENSOR

# (attention params, Latents, positions [B, T], segment_ids [B, T] | None, cfg) -> values [B, T, N, Hv].
ContextParallelAttention = Callable[[dict, mla.Latents, jax.Array, "jax.Array | None", ModelConfig], jax.Array]


def _check_length(t: int, num_shards: int) -> None:
  if num_shards < 1:
    raise ValueError(f"context size {num_shards} must be a positive integer.")
  if t % (2 * num_shards):
    raise ValueError(f"sequence length {t} is not divisible by 2 x context = {2 * num_shards}; pad the sequence to "
                     f"a multiple of {2 * num_shards}.")


def zigzag_order(t: int, num_shards: int) -> np.ndarray:
  """The load-balanced sequence order of context parallelism: a permutation [t] of arange(t).

  The sequence is cut into 2 * num_shards chunks; shard c's contiguous slice of the result is natural chunk c
  followed by natural chunk 2 * num_shards - 1 - c, so every shard owns the same share of the causal triangle.

  Args:
    t: sequence length T, a multiple of 2 * num_shards.
    num_shards: the context axis size cp.
  Returns:
    int array [T]: position i of the reordered sequence holds natural token order[i].
  """
  _check_length(t, num_shards)
  ch = t // (2 * num_shards)
  chunks = np.arange(t).reshape(2 * num_shards, ch)
  shards = [np.concatenate([chunks[c], chunks[2 * num_shards - 1 - c]]) for c in range(num_shards)]
  return np.concatenate(shards)


def _block_pairs(num_shards: int, shard: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The 2cp+1 (query half, key chunk) pairs of context shard `shard` (a traced int).

  Pair p < shard + 1 is (half A, key chunk p); the rest are (half B, key chunk p - shard - 1), which covers key
  chunks 0..2cp-1-shard. Returns (query half [2cp+1] in {0, 1}, natural key chunk [2cp+1]).
  """
  p = jnp.arange(2 * num_shards + 1)
  half = (p > shard).astype(jnp.int32)
  chunk = jnp.where(half == 0, p, p - shard - 1)
  return half, chunk


def _gathered_slot_of_chunk(num_shards: int) -> np.ndarray:
  """[2cp]: where natural chunk j lies among the 2cp chunk slots of an all-gathered (shard-major) sequence."""
  j = np.arange(2 * num_shards)
  return np.where(j < num_shards, 2 * j, 2 * (2 * num_shards - 1 - j) + 1)


@dataclasses.dataclass(frozen=True)
class ContextAttentionOut:
  """What one device's context-parallel attention region returns.

  Attributes:
    values: [b, t, n, Hv] attention values of the device's queries (b = B / batch shards, t = T / cp,
      n = N / tensor), in the zigzag sequence order of its tokens.
  """

  values: jax.Array


jax.tree_util.register_dataclass(ContextAttentionOut, data_fields=["values"], meta_fields=[])


def _merge_halves(out: jax.Array, lse: jax.Array, half: jax.Array) -> jax.Array:
  """Merges the 2cp+1 partial blocks into the two query halves by their log-sum-exp.

  Args:
    out: [b, P, ch, n, Hv] per-pair softmax outputs (P = 2cp+1).
    lse: [b, P, ch, n] float32 per-pair log-sum-exp.
    half: [P] the query half (0 or 1) of each pair.
  Returns:
    [b, 2, ch, n, Hv] float32 values of half A and half B.
  """
  member = (half[None, :] == jnp.arange(2)[:, None])[None, :, :, None, None]  # [1, 2, P, 1, 1]
  lse_h = jnp.where(member, lse[:, None], -jnp.inf)  # [b, 2, P, ch, n]
  # Any finite shift gives the same result, so the max needs no gradient; it is finite because every half has its
  # diagonal block, where each query sees itself.
  m = jax.lax.stop_gradient(jnp.max(lse_h, axis=2, keepdims=True))
  w = jnp.exp(lse_h - m)  # exactly 0 for other halves' pairs and for rows a block fully masks
  merged = jnp.einsum("bhpcn,bpcnv->bhcnv", w, out.astype(jnp.float32))
  return merged / jnp.sum(w, axis=2)[..., None]


def _context_attention_region(q_nope, q_rope, c_kv, k_rope, positions, kv_b, segment_ids=None, *, num_shards: int,
                              cfg: ModelConfig) -> ContextAttentionOut:
  """Attention of one device's queries over the whole sequence's keys, from latents gathered over `context`.

  Per-device shapes (b = B / batch shards, t = T / cp = 2 ch, n = N / tensor), tokens in zigzag order:
    q_nope [b, t, n, Hn], q_rope [b, t, n, R], c_kv [b, t, Lkv], k_rope [b, t, R], positions [b, t],
    kv_b [Lkv, n, Hn + Hv], segment_ids [b, t] or None.
  Returns `ContextAttentionOut` with values [b, t, n, Hv].
  """
  dt = c_kv.dtype
  b, t, n, _ = q_nope.shape
  ch = t // 2
  pairs = 2 * num_shards + 1
  half, chunk = _block_pairs(num_shards, jax.lax.axis_index(CONTEXT))
  slot = jnp.asarray(_gathered_slot_of_chunk(num_shards))[chunk]  # [P] chunk slot in the gathered sequence

  def gather_pairs(x):
    """Per-token x [b, t, ...] -> the key chunk of every pair [b * P, ch, ...], from all context shards."""
    full = jax.lax.all_gather(x, CONTEXT, axis=1, tiled=True)  # [b, T, ...] shard-major: chunks c, 2cp-1-c, ...
    full = full.reshape((b, 2 * num_shards, ch) + x.shape[2:])
    return jnp.take(full, slot, axis=1).reshape((b * pairs, ch) + x.shape[2:])

  def query_pairs(x):
    """Local x [b, t, ...] -> the query half of every pair [b * P, ch, ...]."""
    x = x.reshape((b, 2, ch) + x.shape[2:])
    return jnp.take(x, half, axis=1).reshape((b * pairs, ch) + x.shape[3:])

  # Only latents cross devices; each pair's keys are expanded here (see the module docstring).
  kv = jnp.einsum("bsl,lnh->bsnh", gather_pairs(c_kv), kv_b.astype(dt))
  k_nope, v = kv[..., :cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim:]
  k_rope_pairs = gather_pairs(k_rope)
  k = jnp.concatenate(
      [k_nope, jnp.broadcast_to(k_rope_pairs[:, :, None, :], k_nope.shape[:3] + k_rope_pairs.shape[-1:])], axis=-1)
  # The scale goes on q (as in `mla.attend`): it is far smaller than the scores.
  q = jnp.concatenate([q_nope, q_rope], axis=-1) * jnp.asarray(cfg.attention_scale, dt)
  seg_q = None if segment_ids is None else query_pairs(segment_ids)
  seg_k = None if segment_ids is None else gather_pairs(segment_ids)
  out, lse = mla.attention_block(query_pairs(q), k, v, query_pairs(positions), gather_pairs(positions), seg_q, seg_k)
  out = out.reshape((b, pairs, ch, n, v.shape[-1]))
  lse = lse.reshape((b, pairs, n, ch)).transpose(0, 1, 3, 2)
  values = _merge_halves(out, lse, half).astype(dt)
  return ContextAttentionOut(values=values.reshape((b, t, n, v.shape[-1])))


def make_context_parallel(mesh: jax.sharding.Mesh) -> ContextParallelAttention:
  """Context-parallel attention over `mesh`: a drop-in replacement of `mla.attend` for a `Layout`.

  The returned fn(p_attn, lat, positions, segment_ids, cfg) -> values [B, T, N, Hv] takes global arrays (it is
  meant to be traced under jit, e.g. inside the decoder's scan over layers) whose sequence axis is in
  `zigzag_order(T, context size)`, and returns values in the same order. Inside, tokens are split as
  P(BATCH_AXES, CONTEXT, ...) and heads over TENSOR (kv_b [Lkv, N, Hn + Hv] as P(None, TENSOR, None)).

  Args:
    mesh: a mesh with the axes of `c2jax.parallel.mesh.AXES`.
  Returns:
    the attention function.
  """
  cp = mesh.shape[CONTEXT]
  tp = mesh.shape[TENSOR]
  batch_shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
  tokens = P(BATCH_AXES, CONTEXT)
  heads = P(BATCH_AXES, CONTEXT, TENSOR, None)
  latent = P(BATCH_AXES, CONTEXT, None)

  def attend(p: dict, lat: mla.Latents, positions: jax.Array, segment_ids: jax.Array | None,
             cfg: ModelConfig) -> jax.Array:
    bsz, t, n, _ = lat.q_nope.shape
    _check_length(t, cp)
    if n % tp:
      raise ValueError(f"{n} attention heads are not divisible by tensor = {tp}; use a tensor size that divides "
                       "the heads.")
    if bsz % batch_shards:
      raise ValueError(f"batch {bsz} is not divisible by data x fsdp x expert = {batch_shards}; use a batch that "
                       "is a multiple of it.")
    # Absent segment ids are left out of the call rather than passed as None, whose meaning in shard_map specs
    # has changed between jax versions.
    segments = () if segment_ids is None else (segment_ids,)
    region = jax.shard_map(
        lambda *a: _context_attention_region(*a, num_shards=cp, cfg=cfg),
        mesh=mesh,
        in_specs=(heads, heads, latent, latent, tokens, P(None, TENSOR, None)) + (tokens,) * len(segments),
        out_specs=ContextAttentionOut(values=heads))
    return region(lat.q_nope, lat.q_rope, lat.c_kv, lat.k_rope, positions, p["kv_b"], *segments).values

  return attend
