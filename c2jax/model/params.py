"""Parameter layout of the model: one table of shapes, logical axes and initializers.

Params are a plain nested dict of arrays. Every leaf is declared once here as a `ParamSpec` (shape, logical axis
names, initializer), and everything else is derived from that table: random init (`init_params`), abstract
shapes (`abstract_params`, never allocating), logical axes for sharding (`logical_axes`), the trainable mask,
and parameter counts (`count_params`).

Layout (weights are stored [in, out] so that activations multiply from the left):

  embed                    [V, D]
  dense_layers/...         stacked [Ld, ...] over the first `first_k_dense_replace` layers (scanned)
  moe_layers/...           stacked [Lm, ...] over the remaining layers (scanned)
    attn_norm [D], mlp_norm [D]
    attn/q [D, N, H] or attn/q_a [D, Lq], q_a_norm [Lq], q_b [Lq, N, H]   (H = qk_nope + qk_rope)
    attn/kv_a [D, Lkv + R], kv_a_norm [Lkv], kv_b [Lkv, N, Hn + Hv], o [N, Hv, D]
    mlp/{gate, up} [D, F], mlp/down [F, D]                           (dense layers)
    moe/router [D, E] (float32), moe/router_bias [E] (e_score_correction_bias; not trained by gradient)
    moe/experts/{gate, up} [E, D, Fe], moe/experts/down [E, Fe, D]
    moe/shared/{gate, up} [D, Fs], moe/shared/down [Fs, D]
  final_norm               [D]
  lm_head                  [D, V]
  mtp/...                  stacked [M, ...]: enorm [D], hnorm [D], eh_proj [2D, D], block (a MoE block), final_norm
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.config import ModelConfig

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """One parameter: its shape, logical axis names (one per dim) and how to initialize it."""

  shape: tuple[int, ...]
  axes: tuple[str, ...]
  init: str = "normal"  # "normal" (std = initializer_range), "ones", "zeros"
  dtype: str | None = None  # None: the config's param_dtype.
  # A weight [..., in, out] whose first `normed_outputs` output units feed an RMSNorm (MLA's q_a and kv_a): those
  # columns are drawn with std 1/sqrt(in), the rest with initializer_range (see `_std`).
  normed_outputs: int = 0

  def __post_init__(self):
    if len(self.shape) != len(self.axes):
      raise ValueError(f"ParamSpec shape {self.shape} and axes {self.axes} differ in rank.")
    if not 0 <= self.normed_outputs <= (self.shape[-1] if self.shape else 0):
      raise ValueError(f"ParamSpec normed_outputs={self.normed_outputs} must lie in [0, "
                       f"{self.shape[-1] if self.shape else 0}] (the output units of {self.shape}).")


def _stack(tree: dict, n: int, axis_name: str) -> dict:
  return jax.tree.map(lambda s: dataclasses.replace(s, shape=(n, *s.shape), axes=(axis_name, *s.axes)), tree,
                      is_leaf=lambda x: isinstance(x, ParamSpec))


def _attention_specs(cfg: ModelConfig) -> dict:
  d, n = cfg.d_model, cfg.n_heads
  p: dict[str, ParamSpec] = {}
  if cfg.q_lora_rank is None:
    p["q"] = ParamSpec((d, n, cfg.qk_head_dim), ("embed", "heads", "head_dim"))
  else:
    p["q_a"] = ParamSpec((d, cfg.q_lora_rank), ("embed", "q_lora"), normed_outputs=cfg.q_lora_rank)
    p["q_a_norm"] = ParamSpec((cfg.q_lora_rank,), ("q_lora",), "ones")
    p["q_b"] = ParamSpec((cfg.q_lora_rank, n, cfg.qk_head_dim), ("q_lora", "heads", "head_dim"))
    if cfg.attention_bias:
      p["q_a_bias"] = ParamSpec((cfg.q_lora_rank,), ("q_lora",), "zeros")
  # The latent columns feed kv_a_norm; the rope key's columns are used as they are.
  p["kv_a"] = ParamSpec((d, cfg.kv_lora_rank + cfg.qk_rope_head_dim), ("embed", "kv_lora"),
                        normed_outputs=cfg.kv_lora_rank)
  p["kv_a_norm"] = ParamSpec((cfg.kv_lora_rank,), ("kv_lora",), "ones")
  p["kv_b"] = ParamSpec((cfg.kv_lora_rank, n, cfg.qk_nope_head_dim + cfg.v_head_dim), ("kv_lora", "heads", "head_dim"))
  p["o"] = ParamSpec((n, cfg.v_head_dim, d), ("heads", "head_dim", "embed"))
  if cfg.attention_bias:
    p["kv_a_bias"] = ParamSpec((cfg.kv_lora_rank + cfg.qk_rope_head_dim,), ("kv_lora",), "zeros")
    p["o_bias"] = ParamSpec((d,), ("embed",), "zeros")
  return p


def _mlp_specs(d: int, f: int, hidden_axis: str = "mlp") -> dict:
  return {"gate": ParamSpec((d, f), ("embed", hidden_axis)), "up": ParamSpec((d, f), ("embed", hidden_axis)),
          "down": ParamSpec((f, d), (hidden_axis, "embed"))}


def _block_specs(cfg: ModelConfig, moe: bool) -> dict:
  d = cfg.d_model
  p: dict[str, Any] = {"attn_norm": ParamSpec((d,), ("embed",), "ones"), "attn": _attention_specs(cfg),
                       "mlp_norm": ParamSpec((d,), ("embed",), "ones")}
  if not moe:
    p["mlp"] = _mlp_specs(d, cfg.intermediate_size)
    return p
  e, fe = cfg.n_routed_experts, cfg.moe_intermediate_size
  m: dict[str, Any] = {
      "router": ParamSpec((d, e), ("embed", "expert_router"), dtype="float32"),
      "router_bias": ParamSpec((e,), ("expert_router",), "zeros", dtype="float32"),
      "experts": {"gate": ParamSpec((e, d, fe), ("expert", "embed", "expert_mlp")),
                  "up": ParamSpec((e, d, fe), ("expert", "embed", "expert_mlp")),
                  "down": ParamSpec((e, fe, d), ("expert", "expert_mlp", "embed"))},
  }
  if cfg.n_shared_experts:
    m["shared"] = _mlp_specs(d, cfg.shared_intermediate_size)
  p["moe"] = m
  return p


def param_specs(cfg: ModelConfig) -> Params:
  """The full table of `ParamSpec`s for `cfg`, in the layout described in the module docstring."""
  d, v = cfg.d_model, cfg.vocab_size
  specs: Params = {"embed": ParamSpec((v, d), ("vocab", "embed"))}
  if cfg.n_dense_layers:
    specs["dense_layers"] = _stack(_block_specs(cfg, moe=False), cfg.n_dense_layers, "layers")
  if cfg.n_moe_layers:
    specs["moe_layers"] = _stack(_block_specs(cfg, moe=True), cfg.n_moe_layers, "layers")
  specs["final_norm"] = ParamSpec((d,), ("embed",), "ones")
  specs["lm_head"] = ParamSpec((d, v), ("embed", "vocab"))
  if cfg.num_mtp_layers:
    mtp = {"enorm": ParamSpec((d,), ("embed",), "ones"), "hnorm": ParamSpec((d,), ("embed",), "ones"),
           "eh_proj": ParamSpec((2 * d, d), ("mtp_concat", "embed")),
           "block": _block_specs(cfg, moe=cfg.n_moe_layers > 0),
           "final_norm": ParamSpec((d,), ("embed",), "ones")}
    specs["mtp"] = _stack(mtp, cfg.num_mtp_layers, "mtp_layers")
  return specs


def _is_spec(x) -> bool:
  return isinstance(x, ParamSpec)


def _std(spec: ParamSpec, initializer_range: float) -> float | np.ndarray:
  """The init's standard deviation: `initializer_range`, except for the output units of a down-projection that an
  RMSNorm normalizes (MLA's query and KV latents), which get std 1/sqrt(fan_in): [out] per column, or a float.

  Why: the norm makes such a projection scale-invariant (c = norm(x W) is unchanged when W is scaled), so its scale
  sets only how fast AdamW turns it (a step moves each entry by up to about the learning rate, whatever its size:
  up to 15% of a std-0.02 entry at lr 3e-3). Drawn at 0.02 (HF's init), the latent that K, V and Q are read from
  keeps turning: a Llama given MLA's normed kv latent at 0.02 formed no in-context copying circuit in 600 steps,
  and at 1/sqrt(fan_in) it copied almost as early as without it (docs/experiments/copying.md). At 1/sqrt(fan_in)
  the latent has unit RMS before its norm, so the norm starts as the identity. The function at init is the same
  either way (up to the norm's eps).
  """
  if not spec.normed_outputs:
    return initializer_range
  std = np.full(spec.shape[-1], initializer_range, np.float32)
  std[:spec.normed_outputs] = spec.shape[-2] ** -0.5
  return std


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
  """Random init: normal(0, initializer_range) for matrices as HF does, except normal(0, 1/sqrt(fan_in)) for the
  latent columns of MLA's down-projections (q_a, kv_a; see `_std`); ones for norms, zeros for biases.

  One compiled program for the whole tree (eagerly, every parameter shape would compile its own). Jit the caller
  with `out_shardings` (see c2jax.pretrain.sharded) to build a large model directly into its shards.
  """
  return _init_params(cfg, key)


# Models with at most this many random parameters draw them in one call (see `_init_params`).
_ONE_DRAW_MAX_SIZE = 1 << 27


@functools.partial(jax.jit, static_argnums=0)
def _init_params(cfg: ModelConfig, key: jax.Array) -> Params:
  specs = param_specs(cfg)
  leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
  sizes = [math.prod(s.shape) if s.init == "normal" else 0 for s in leaves]
  if sum(sizes) <= _ONE_DRAW_MAX_SIZE:
    # Small models draw all their noise at once and slice it: XLA:CPU's compile time grows steeply with the
    # number of separate threefry draws in one program (20 small ones ~40 s on 2 cores, one large one ~1 s).
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    offsets = itertools.accumulate(sizes, initial=0)
    draws = [jax.lax.slice(flat, (o,), (o + n,)).reshape(s.shape) if n else None
             for s, o, n in zip(leaves, offsets, sizes)]
  else:
    # Large ones draw each leaf apart, so that under `out_shardings` each draw is made in its own shards
    # (a flat vector would have no sharding to inherit).
    keys = jax.random.split(key, len(leaves))
    draws = [jax.random.normal(k, s.shape, jnp.float32) if n else None for s, k, n in zip(leaves, keys, sizes)]

  def make(spec: ParamSpec, z: jax.Array | None) -> jax.Array:
    dtype = jnp.dtype(spec.dtype or cfg.param_dtype)
    if spec.init == "ones":
      return jnp.ones(spec.shape, dtype)
    if spec.init == "zeros":
      return jnp.zeros(spec.shape, dtype)
    return (jnp.asarray(_std(spec, cfg.initializer_range), jnp.float32) * z).astype(dtype)

  return jax.tree.unflatten(treedef, [make(s, z) for s, z in zip(leaves, draws)])


def abstract_params(cfg: ModelConfig) -> Params:
  """`jax.ShapeDtypeStruct`s of the params: no memory is allocated (safe for the 1T-parameter config)."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype or cfg.param_dtype)),
                      param_specs(cfg), is_leaf=_is_spec)


def logical_axes(cfg: ModelConfig) -> Params:
  """The logical axis names of every param (a tuple of str per leaf), for `flax.linen.logical_to_mesh_sharding`."""
  return jax.tree.map(lambda s: jax.sharding.PartitionSpec(*s.axes), param_specs(cfg), is_leaf=_is_spec)


def trainable_mask(params: Params) -> Params:
  """True for leaves trained by gradient; False for `router_bias`, which follows the balancing rule instead."""
  def walk(tree, name=""):
    if isinstance(tree, dict):
      return {k: walk(v, k) for k, v in tree.items()}
    return name != "router_bias"
  return walk(params)


@dataclasses.dataclass(frozen=True)
class ParamCount:
  """Parameter counts. `active` counts what one token touches: K routed experts per MoE layer, all else whole."""

  total: int
  active: int
  embedding: int  # input embedding + LM head
  mtp: int  # MTP modules (not in total/active; speculative decoding and MTP training only)

  def summary(self) -> str:
    return (f"total {self.total / 1e9:.3f}B, active {self.active / 1e9:.3f}B "
            f"(embedding+head {self.embedding / 1e9:.3f}B; MTP modules {self.mtp / 1e9:.3f}B extra)")


def _size(tree) -> int:
  return sum(math.prod(s.shape) for s in jax.tree.leaves(tree, is_leaf=_is_spec))


def count_params(cfg: ModelConfig) -> ParamCount:
  """Total and active parameter counts of the main model (MTP counted apart), from shapes only."""
  specs = param_specs(cfg)
  mtp = _size(specs.pop("mtp", {}))
  total = _size(specs)
  routed = _size(specs["moe_layers"]["moe"]["experts"]) if "moe_layers" in specs else 0
  inactive = routed - (routed * cfg.num_experts_per_tok // cfg.n_routed_experts if routed else 0)
  return ParamCount(total=total, active=total - inactive, embedding=_size(specs["embed"]) + _size(specs["lm_head"]),
                    mtp=mtp)
