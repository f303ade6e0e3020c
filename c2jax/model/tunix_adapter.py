"""c2jax's MoE behind tunix's model call, so that tunix's `Sampler` generates from it and its GRPO learner trains
it (an interop and benchmarking bridge: tunix itself is an optional test/bench extra, never imported here).

  model = TunixModel(c2jax_nnx_module)             # or TunixModel.from_params(cfg, params)
  logits, cache = model(tokens, positions, cache, attention_mask)   # tunix's signature
  cache = model.init_cache(batch_size, cache_size, dtype)           # what tunix's Sampler calls

The math is c2jax's: with `cache=None` the call is `transformer.forward`; with a cache it is `decode.extend`
against c2jax's own MLA latent cache (`decode.KVCache`, not tunix's per-layer {k, v, end_index} dicts: tunix's
vanilla sampler only threads the cache through, so the latent layout travels as it is). What this module adds is
glue that maps tunix's inputs onto c2jax's:

- tunix's attention masks are "causal over the non-pad tokens" (`make_causal_attn_mask`, `compute_attention_masks`).
  A token's own entry on the mask's diagonal says whether it is a real token: mask[b, i, i] (prefill and the
  learner's full-sequence calls, whose query i sits at cache column i).
- Without a cache (the learner's log-probs): pads get segment 0 and real tokens segment 1, so real tokens attend
  exactly the real tokens before them, as tunix's mask says. A pad's own logits differ from what tunix's models
  give (tunix masks them out of every loss and metric).
- With a cache (the sampler): c2jax's cache slot s holds position s (tunix's models index slots by buffer step
  instead). Pads in a left-padded prompt are moved to position `cache_size`, past the cache, so that their latents
  are dropped rather than written over a real token's slot. A one-token step (decode) is always a real token.
  Deviation: a generated token equal to the tokenizer's pad id stays in c2jax's cache, where tunix's own models
  would mask it out of later steps (tunix decides padding by token id).
- Pads still run through the MoE (out of its load statistics via `token_mask`); dispatch is dropless, so they take
  no capacity from real tokens (an expert-parallel layout given a capacity factor is the exception).

`router_bias` is a `nnx_model.RouterBias`, which tunix's optimizer (`wrt=nnx.Param`) includes: its gradient is
zero (routing selects under stop_gradient), so SGD and Adam leave it unchanged, but a decoupled weight decay
(adamw) would shrink it; give tunix an optimizer without weight decay, or mask it out.

Shapes: B batch, T new tokens, S cache slots, V vocab.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp

from c2jax.model import decode as decode_lib
from c2jax.model import nnx_model
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params


@dataclasses.dataclass(frozen=True)
class TunixConfig:
  """The config view tunix reads off a model (`rl_cluster` builds a `CacheConfig` from it, whose sizes are never
  used to allocate since the model has `init_cache`): num_kv_heads=1 and head_dim = Lkv + R describe one MLA
  latent per token and layer.

  Attributes:
    num_layers: decoder layers (MTP modules excluded).
    num_kv_heads: 1.
    head_dim: kv_lora_rank + qk_rope_head_dim.
    vocab_size: V.
    model: the c2jax architecture.
  """

  num_layers: int
  num_kv_heads: int
  head_dim: int
  vocab_size: int
  model: ModelConfig


class TunixModel(nnx.Module):
  """c2jax's `MoeTransformer` with tunix's model interface (`__call__`, `init_cache`, `num_embed`,
  `get_model_input`, `config`).

  Attributes:
    model: the wrapped `nnx_model.MoeTransformer` (its params are this module's state, under `model/`).
    cfg: the c2jax architecture.
    config: the `TunixConfig` view tunix reads.
  """

  def __init__(self, model: nnx_model.MoeTransformer):
    self.model = model
    self.cfg = model.cfg
    self.config = TunixConfig(num_layers=model.cfg.n_layers, num_kv_heads=1,
                              head_dim=model.cfg.kv_lora_rank + model.cfg.qk_rope_head_dim,
                              vocab_size=model.cfg.vocab_size, model=model.cfg)

  @classmethod
  def from_params(cls, cfg: ModelConfig, params: Params) -> TunixModel:
    """Wraps pure c2jax params (the same arrays, no copy)."""
    return cls(nnx_model.from_params(cfg, params))

  def to_params(self) -> Params:
    """The pure c2jax param tree (arrays, or tracers inside a transform)."""
    return nnx_model.to_params(self.model)

  @property
  def num_embed(self) -> int:
    return self.cfg.vocab_size

  def init_cache(self, batch_size: int, cache_size: int, dtype: jnp.dtype | None = None) -> decode_lib.KVCache:
    """A zero c2jax latent cache of `cache_size` slots per row. tunix passes the params' dtype; the cache keeps the
    config's compute dtype instead, as c2jax's own sampler does."""
    del dtype
    return decode_lib.init_cache(self.cfg, batch_size, cache_size)

  def get_model_input(self) -> dict:
    """A dummy input of tunix's call (tunix traces the model with it, e.g. to add LoRA)."""
    return {"input_tokens": jnp.ones((2, 1), jnp.int32), "positions": jnp.zeros((2, 1), jnp.int32), "cache": None,
            "attention_mask": jnp.ones((2, 1, 1), jnp.bool_)}

  def __call__(self, input_tokens: jax.Array, positions: jax.Array, cache: decode_lib.KVCache | None,
               attention_mask: jax.Array | None, output_hidden_states: bool = False
               ) -> tuple[jax.Array, decode_lib.KVCache | None]:
    """tunix's model call: c2jax's `forward` without a cache, `decode.extend` with one.

    Args:
      input_tokens: [B, T] int token ids.
      positions: [B, T] int positions (tunix counts real tokens only; pads repeat a neighbour's position).
      cache: None (whole sequences) or a cache from `init_cache` / a previous call.
      attention_mask: [B, T, S] bool, tunix's causal-over-real-tokens mask (S = T without a cache, the cache size
        with one); None: every token is real.
      output_hidden_states: also sow the final normed hidden state [B, T, D] as `nnx.Intermediate`
        'all_hidden_states' (tunix's score heads read it).
    Returns:
      (logits [B, T, V] float32, the updated cache, or None without one).
    """
    b, t = input_tokens.shape
    if attention_mask is None or (cache is not None and t == 1):
      real = jnp.ones((b, t), jnp.bool_)
    else:
      idx = jnp.arange(t)
      real = attention_mask[:, idx, idx].astype(jnp.bool_)
    if cache is None:
      out = self.model(input_tokens, positions=positions, segment_ids=real.astype(jnp.int32),
                       token_mask=real.astype(jnp.float32), with_mtp=False)
      new_cache = None
    else:
      # Pads go past the cache, where `extend` drops their latents instead of overwriting a real token's slot.
      at = jnp.where(real, positions, cache.max_len).astype(jnp.int32)
      out = decode_lib.extend(self.to_params(), cache, input_tokens, at, cfg=self.cfg)
      new_cache = out.cache
    if output_hidden_states:
      self.sow(nnx.Intermediate, "all_hidden_states", out.hidden)
    return out.logits, new_cache
