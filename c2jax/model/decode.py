"""Cached inference: the decoder run on new tokens against an MLA latent KV cache (prefill, decode, verification).

The cache stores, per layer and position, MLA's compressed latent c_kv [Lkv] and the rotated rope key k_rope [R]:
(Lkv + R) numbers per token and layer (576 for Kimi K2.5 / DeepSeek-V3 against 2 x 128 x 192 = 49152 for full
per-head K and V). Attention over it uses the absorbed-weights form (`mla.attend_cached`).

  cache = init_cache(cfg, batch=B, max_len=S)
  out = extend(params, cache, tokens, positions, cfg=cfg)    # tokens/positions [B, t]: t = P (prefill), 1 (decode),
  out.logits, out.hidden, out.expert_ids, out.cache           # or k + 1 (speculative verification)

`extend` equals `forward` on the whole sequence so far, position by position (tests/model/decode_test.py). MTP
modules have their own cache slots (`extend_mtp`), used by speculative decoding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from c2jax.model import mla as mla_lib
from c2jax.model import rope as rope_lib
from c2jax.model.config import ModelConfig
from c2jax.model.embedding import embed, lm_head
from c2jax.model.norms import rms_norm
from c2jax.model.params import Params
from c2jax.model.transformer import ffn_residual


@dataclasses.dataclass(frozen=True)
class LayerCache:
  """Latent KV cache of a stack of layers: c_kv [L, B, S, Lkv], k_rope [L, B, S, R] (slot s holds position s)."""

  c_kv: jax.Array
  k_rope: jax.Array


jax.tree_util.register_dataclass(LayerCache, data_fields=["c_kv", "k_rope"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class KVCache:
  """The model's latent KV cache: one `LayerCache` per stacked group (dense layers, MoE layers, MTP modules;
  None for an empty group)."""

  dense: LayerCache | None
  moe: LayerCache | None
  mtp: LayerCache | None

  @property
  def max_len(self) -> int:
    return next(c for c in (self.dense, self.moe, self.mtp) if c is not None).c_kv.shape[2]


jax.tree_util.register_dataclass(KVCache, data_fields=["dense", "moe", "mtp"], meta_fields=[])


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
  """A zero cache for `batch` rows of up to `max_len` positions (dtype: the compute dtype by default)."""
  dt = jnp.dtype(dtype or cfg.dtype)

  def stack(n: int) -> LayerCache | None:
    if n == 0:
      return None
    return LayerCache(c_kv=jnp.zeros((n, batch, max_len, cfg.kv_lora_rank), dt),
                      k_rope=jnp.zeros((n, batch, max_len, cfg.qk_rope_head_dim), dt))

  return KVCache(dense=stack(cfg.n_dense_layers), moe=stack(cfg.n_moe_layers), mtp=stack(cfg.num_mtp_layers))


def cached_block(p: dict, h: jax.Array, positions: jax.Array, cache: LayerCache, layer: jax.Array | int,
                 cfg: ModelConfig, forced_ids: jax.Array | None = None, window: int | None = None):
  """Decoder block `layer` of a stack on new tokens h [B, t, D] at positions [B, t], against the stack's cache.

  The new tokens' latents are scattered into the stacked cache in place (t entries per layer, not a copy of the
  layer's S slots), then the layer's slots are read by the absorbed attention: all of them, or the first `window`
  (static) when every query's position is below it. Returns (h [B, t, D], MoeOutput or None, cache).
  """
  x = rms_norm(h, p["attn_norm"], cfg.rms_norm_eps)
  cos, sin = rope_lib.rope_angles(positions, cfg.rope, cfg.qk_rope_head_dim)
  lat = mla_lib.project_latents(p["attn"], x, cos, sin, cfg)
  rows = jnp.arange(h.shape[0])[:, None]
  # Positions past the cache (a finished row still stepping) are dropped rather than clamped onto real slots.
  c_kv = cache.c_kv.at[layer, rows, positions].set(lat.c_kv.astype(cache.c_kv.dtype), mode="drop")
  k_rope = cache.k_rope.at[layer, rows, positions].set(lat.k_rope.astype(cache.k_rope.dtype), mode="drop")
  keys_c, keys_r = c_kv[layer], k_rope[layer]
  if window is not None and window < keys_c.shape[1]:
    keys_c, keys_r = keys_c[:, :window], keys_r[:, :window]
  values = mla_lib.attend_cached(p["attn"], lat, positions, keys_c, keys_r, cfg)
  h = h + mla_lib.output_projection(p["attn"], values)
  h, moe_out = ffn_residual(p, h, cfg, forced_ids)
  return h, moe_out, LayerCache(c_kv=c_kv, k_rope=k_rope)


def _scan_cached(stacked: dict, cache: LayerCache, h: jax.Array, positions: jax.Array, cfg: ModelConfig,
                 forced_ids: jax.Array | None, window: int | None = None):
  """Scans `cached_block` over a stack (the cache in the carry, updated in place); returns (h, new LayerCache,
  expert ids [L, B, t, K] or None)."""
  is_moe = "moe" in stacked
  n = cache.c_kv.shape[0]

  def step(carry, xs):
    h, c = carry
    p, forced, layer = xs
    h, moe_out, c = cached_block(p, h, positions, c, layer, cfg, forced, window)
    return (h, c), (moe_out.expert_ids if is_moe else None)

  (h, cache), ids = jax.lax.scan(step, (h, cache), (stacked, forced_ids, jnp.arange(n)))
  return h, cache, ids


@dataclasses.dataclass(frozen=True)
class ExtendOutput:
  """What `extend` returns.

  Attributes:
    logits: [B, t, V] float32 next-token logits of the new tokens.
    hidden: [B, t, D] final normed hidden states (the input of MTP module 1).
    expert_ids: [Lm, B, t, K] int32 routed experts of the new tokens.
    cache: the cache with the new tokens' latents written.
  """

  logits: jax.Array
  hidden: jax.Array
  expert_ids: jax.Array
  cache: KVCache


jax.tree_util.register_dataclass(ExtendOutput, data_fields=["logits", "hidden", "expert_ids", "cache"],
                                 meta_fields=[])


def extend(params: Params, cache: KVCache, tokens: jax.Array, positions: jax.Array, *, cfg: ModelConfig,
           forced_expert_ids: jax.Array | None = None, window: int | None = None) -> ExtendOutput:
  """Runs the main model on new tokens [B, t] at positions [B, t] (increasing within each row), attending to the
  cache at slots <= each token's position, and writes their latents into the cache.

  Rows may sit at different positions (prompts of different lengths). Slots past a row's position are never read,
  so whatever an earlier step left there (padding of a shorter prompt, rejected draft tokens) does not matter
  until it is overwritten.

  Args:
    params: model params.
    cache: from `init_cache` or a previous `extend`.
    tokens: [B, t] int token ids.
    positions: [B, t] int absolute positions (< cache.max_len).
    cfg: the architecture.
    forced_expert_ids: [Lm, B, t, K] routing replay for the new tokens.
    window: attend to the first `window` cache slots only (static); every query that matters must sit at a
      position < window (queries past it, whose outputs are discarded, see the window alone). Attention costs
      window, not max_len, per query: the agent engine picks the smallest bucket above its slots' lengths.
  """
  b, t = tokens.shape
  h = embed(params, tokens, cfg)
  dense, moe = cache.dense, cache.moe
  if cfg.n_dense_layers:
    h, dense, _ = _scan_cached(params["dense_layers"], dense, h, positions, cfg, None, window)
  if cfg.n_moe_layers:
    h, moe, expert_ids = _scan_cached(params["moe_layers"], moe, h, positions, cfg, forced_expert_ids, window)
  else:
    expert_ids = jnp.zeros((0, b, t, cfg.num_experts_per_tok), jnp.int32)
  hidden = rms_norm(h, params["final_norm"], cfg.rms_norm_eps)
  return ExtendOutput(logits=lm_head(params, hidden), hidden=hidden, expert_ids=expert_ids.astype(jnp.int32),
                      cache=dataclasses.replace(cache, dense=dense, moe=moe))


@dataclasses.dataclass(frozen=True)
class MtpExtendOutput:
  """logits [M, B, t, V] float32: module k's prediction at position i of token i + k + 1; hidden [B, t, D]: the
  last module's output h^M (a drafter reusing a module feeds it back as the previous representation); cache: with
  the MTP modules' latents written."""

  logits: jax.Array
  hidden: jax.Array
  cache: KVCache


jax.tree_util.register_dataclass(MtpExtendOutput, data_fields=["logits", "hidden", "cache"], meta_fields=[])


def extend_mtp(params: Params, cache: KVCache, hidden: jax.Array, next_tokens: jax.Array, positions: jax.Array, *,
               cfg: ModelConfig) -> MtpExtendOutput:
  """Runs the MTP modules on new positions against their cache (see `c2jax.model.mtp` for the math).

  Module k at position i combines h^{k-1}_i with the embedding of token i + k. This takes the main model's hidden
  states [B, t, D] at positions [B, t] and `next_tokens` [M, B, t]: next_tokens[k - 1, :, j] = token at
  positions[:, j] + k (for k = 1 the token right after each position, known once it was sampled).
  """
  p_all = params["mtp"]
  emb_table = params["embed"].astype(hidden.dtype)
  h = hidden
  mtp = cache.mtp
  logits = []
  for k in range(1, cfg.num_mtp_layers + 1):
    p = jax.tree.map(lambda a, k=k: a[k - 1], p_all)
    e = emb_table[next_tokens[k - 1]]
    x = jnp.concatenate([rms_norm(e, p["enorm"], cfg.rms_norm_eps), rms_norm(h, p["hnorm"], cfg.rms_norm_eps)],
                        axis=-1) @ p["eh_proj"].astype(h.dtype)
    h, _, mtp = cached_block(p["block"], x, positions, mtp, k - 1, cfg)
    logits.append(lm_head(params, rms_norm(h, p["final_norm"], cfg.rms_norm_eps)))
  return MtpExtendOutput(logits=jnp.stack(logits), hidden=h, cache=dataclasses.replace(cache, mtp=mtp))
