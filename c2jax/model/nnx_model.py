"""The model as a Flax NNX module: a thin face over the pure functions, for Flax and tunix tooling.

The design card asks for a "functional Flax MoE model": the math lives in pure functions of (params, inputs)
(`c2jax.model.transformer.forward`), and Flax is kept thin. `MoeTransformer` is that thin layer. It owns one
`nnx.Param` per leaf of the pure params pytree, under the same nested names (`embed`, `moe_layers/attn/q_b`, ...,
see `c2jax.model.params`), each carrying its logical axis names as flax sharding metadata (`out_sharding`), and
its `__call__` runs `forward` on those values: no math of its own, so the NNX model and the pure core can never
drift apart. What it adds is the object interface that NNX tools expect (nnx.split / merge / state, nnx.jit,
nnx.grad, nnx.Optimizer, orbax checkpoints of `nnx.state(module)`, the tunix trainers).

  model = MoeTransformer(cfg, jax.random.key(0))   # values == init_params(cfg, jax.random.key(0)), bit for bit
  out = model(tokens)                              # == forward(to_params(model), tokens, cfg=cfg)
  params = to_params(model)                        # the pure pytree (no copy)
  model = from_params(cfg, params)                 # and back (no copy; shapes and dtypes checked)
  model = sharded_module(cfg, key, param_shardings(cfg, mesh))   # built straight into its shards
  model = from_checkpoint("ckpt/tiny")             # a c2jax checkpoint (save_checkpoint / the converters)
  with ocp.StandardCheckpointer() as ckptr:       # a Flax user's checkpoint (async: complete on exit) ...
    ckptr.save(path, nnx.state(model))
  params = load_nnx_state(path, cfg)               # ... read back as pure params

Sharding metadata. Each Param's `out_sharding` is its tuple of logical axis names (`logical_axes(cfg)`), so
`nnx.get_partition_spec(nnx.state(model))` gives the logical specs. The mesh placement itself comes from c2jax's
own rules (`c2jax.parallel.layout.param_shardings`, divisibility-aware, which flax's name-to-name logical rules
cannot express), passed in as a pytree of shardings: this module is in the model layer and imports nothing
above it. Params are made with `eager_sharding=False`, since flax 0.12 would otherwise try to place a value by
its logical names as if they were mesh axes (and fail without a mesh).

`router_bias` leaves are `RouterBias`, a subclass of `nnx.Param`: they are params to every Param filter (so state
and checkpoints hold them like any leaf), and `TRAINABLE` leaves them out, as `trainable_mask` does for the pure
params (the bias follows the load-balancing rule, not the gradient).
"""

from __future__ import annotations

import os
from typing import Any

from flax import nnx
import jax
import numpy as np
import orbax.checkpoint as ocp

from c2jax.model import checkpoint as checkpoint_lib
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params, ParamSpec, abstract_params, init_params, param_specs
from c2jax.model.transformer import ModelOutput, forward


class RouterBias(nnx.Param):
  """`moe/router_bias` [.., E]: the routing correction bias, a param that is updated by the balancing rule."""


# Params trained by gradient (everything but `RouterBias`), e.g. `nnx.Optimizer(model, tx, wrt=TRAINABLE)`.
TRAINABLE = nnx.All(nnx.Param, nnx.Not(RouterBias))


def _is_spec(x: Any) -> bool:
  return isinstance(x, ParamSpec)


def _flat_with_names(tree: Any, is_leaf=None) -> dict[str, Any]:
  """{'moe_layers/attn/q_b': leaf, ...}, in jax's (sorted) key order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat}


class MoeTransformer(nnx.Module):
  """The DeepSeek-V3-style MoE transformer of `c2jax.model.transformer` as an NNX module.

  Attributes:
    cfg: the architecture (static).
    embed, dense_layers, moe_layers, final_norm, lm_head, mtp: the params, as nested dicts of `nnx.Param` laid
      out exactly like `init_params(cfg, key)` (a group the config does not have, e.g. `mtp`, is absent).
  """

  def __init__(self, cfg: ModelConfig, key: jax.Array):
    """Initializes the params with `init_params(cfg, key)` (the same values, bit for bit).

    Args:
      cfg: the architecture.
      key: a jax random key (`jax.random.key(seed)`).
    """
    self.cfg = cfg
    self._set_params(init_params(cfg, key))

  def _set_params(self, params: Params):
    specs = param_specs(self.cfg)

    def wrap(spec: ParamSpec, value: Any, name: str) -> nnx.Param:
      kind = RouterBias if name.endswith("router_bias") else nnx.Param
      return kind(value, out_sharding=tuple(spec.axes), eager_sharding=False)

    for group, group_specs in specs.items():
      named = jax.tree_util.tree_map_with_path(
          lambda path, s, v: wrap(s, v, "/".join(str(k.key) for k in path)), group_specs, params[group],
          is_leaf=_is_spec)
      # Dicts of Variables are data to an NNX pytree only when marked so.
      setattr(self, group, nnx.data(named) if isinstance(named, dict) else named)

  def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None, forced_expert_ids: jax.Array | None = None,
               token_mask: jax.Array | None = None, with_mtp: bool = True,
               forced_mtp_expert_ids: jax.Array | None = None) -> ModelOutput:
    """`c2jax.model.transformer.forward` on this module's params (see it for the arguments' meaning).

    Args:
      tokens: [B, T] int token ids.
      positions: [B, T] int positions (default arange(T)).
      segment_ids: [B, T] int document ids (None: one document per row).
      forced_expert_ids: [Lm, B, T, K] routing replay.
      token_mask: [B, T] weights of tokens in the expert-load statistics.
      with_mtp: also run the MTP modules (when the config has any).
      forced_mtp_expert_ids: [M, B, T, K] routing replay for the MTP blocks.
    Returns:
      `ModelOutput` (logits [B, T, V], hidden [B, T, D], expert ids [Lm, B, T, K], ...).
    """
    return forward(to_params(self), tokens, cfg=self.cfg, positions=positions, segment_ids=segment_ids,
                   forced_expert_ids=forced_expert_ids, token_mask=token_mask, with_mtp=with_mtp,
                   forced_mtp_expert_ids=forced_mtp_expert_ids)


def to_params(module: MoeTransformer) -> Params:
  """The module's params as the pure pytree of `c2jax.model.params` (the same arrays: no copy)."""
  return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def _check_params(cfg: ModelConfig, params: Params) -> None:
  """Raises ValueError naming the first leaf (in sorted key order) whose presence, shape or dtype is wrong."""
  want = _flat_with_names(abstract_params(cfg))
  got = _flat_with_names(params)
  for name in sorted(set(want) | set(got)):
    if name not in got:
      problem = f"{name} is missing"
    elif name not in want:
      problem = f"{name} is not a param of this config"
    else:
      w, g = want[name], got[name]
      g_shape, g_dtype = tuple(np.shape(g)), np.dtype(getattr(g, "dtype", np.asarray(g).dtype))
      if g_shape == tuple(w.shape) and g_dtype == np.dtype(w.dtype):
        continue
      problem = (f"{name} is {g_dtype.name}{list(g_shape)} where the config needs "
                 f"{np.dtype(w.dtype).name}{list(w.shape)}")
    raise ValueError(f"params do not match the config: {problem}; pass the config the params were built for.")


def from_params(cfg: ModelConfig, params: Params) -> MoeTransformer:
  """A `MoeTransformer` holding `params` (the same arrays, with their shardings: no copy).

  Args:
    cfg: the architecture.
    params: a pure param pytree of `cfg` (arrays, or `jax.ShapeDtypeStruct`s for an abstract module).
  Raises:
    ValueError naming the first leaf that is missing, unexpected, or of another shape or dtype than `cfg` needs.
  """
  _check_params(cfg, params)
  # The module's structure (graph and Variable metadata) without computing anything, then the given values.
  graphdef, state = nnx.split(nnx.eval_shape(lambda: MoeTransformer(cfg, jax.random.key(0))))
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def abstract_module(cfg: ModelConfig, shardings: Any = None) -> MoeTransformer:
  """A `MoeTransformer` of `jax.ShapeDtypeStruct`s (nothing allocated), e.g. an orbax restore target.

  Args:
    cfg: the architecture.
    shardings: None, or a pytree of `jax.sharding.Sharding` shaped like the params, attached to the structs.
  """
  abstract = abstract_params(cfg)
  if shardings is not None:
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return from_params(cfg, abstract)


def sharded_module(cfg: ModelConfig, key: jax.Array, shardings: Any) -> MoeTransformer:
  """`MoeTransformer(cfg, key)` built straight into `shardings` (no param is ever whole on one device).

  Args:
    cfg: the architecture.
    key: a jax random key.
    shardings: a pytree of `jax.sharding.Sharding` shaped like the params, e.g.
      `c2jax.parallel.layout.param_shardings(cfg, mesh)`: the same placement as the pure params' mesh path.
  """
  init = jax.jit(lambda k: to_params(MoeTransformer(cfg, k)), out_shardings=shardings)
  return from_params(cfg, init(key))


def from_checkpoint(directory: str, *, shardings: Any = None, dtype: str | None = None) -> MoeTransformer:
  """A `MoeTransformer` from a c2jax checkpoint (`save_checkpoint`, the converters), its config included.

  Args:
    directory: the checkpoint directory.
    shardings: as `c2jax.model.checkpoint.load_checkpoint`'s (default: the first local device).
    dtype: as `load_checkpoint`'s ("float32" / "bfloat16" to cast; None keeps the stored dtype).
  """
  params, cfg = checkpoint_lib.load_checkpoint(directory, shardings=shardings, dtype=dtype)
  return from_params(cfg, params)


def load_nnx_state(path: str, cfg: ModelConfig, *, shardings: Any = None) -> Params:
  """Pure params from an orbax checkpoint of `nnx.state(module)` (`ocp.StandardCheckpointer().save(path, ...)`).

  Orbax stores each NNX variable under its path plus a `value` key; restoring into the module's abstract state
  and taking its pure dict gives back the layout of `c2jax.model.params`.

  Args:
    path: the directory the state was saved to.
    cfg: the architecture of the saved module.
    shardings: a pytree of shardings shaped like the params, or one for every leaf (default: the first local
      device). Each host reads only its shards.
  Raises:
    ValueError naming the leaves when the checkpoint does not hold this config's params.
  """
  path = os.path.abspath(path)
  if shardings is None:
    shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, abstract_params(cfg))
  target = nnx.state(abstract_module(cfg, shardings), nnx.Param)
  with ocp.StandardCheckpointer() as ckptr:
    stored = {name.removesuffix("/value"): tuple(m.shape)
              for name, m in _flat_with_names(ckptr.metadata(path).item_metadata.tree).items()}
    want = {name: tuple(a.shape) for name, a in _flat_with_names(abstract_params(cfg)).items()}
    problems = [f"missing {n}" for n in sorted(set(want) - set(stored))]
    problems += [f"unexpected {n}" for n in sorted(set(stored) - set(want))]
    problems += [f"{n} is stored as {list(stored[n])}, the config needs {list(want[n])}"
                 for n in sorted(set(want) & set(stored)) if stored[n] != want[n]]
    if problems:
      raise ValueError(f"{path} does not hold the NNX state of this config: {'; '.join(problems[:10])}; pass the "
                       "config of the saved module.")
    restored = ckptr.restore(path, target)
  return nnx.to_pure_dict(restored)
