"""Logical-axis rules and the `Layout` of the model on a mesh (report section 5: FSDP + EP + CP).

Parameters and activations carry logical axis names (`c2jax.model.params.logical_axes`, `constrain` calls in
the model). Two rule tables map them to mesh axes:

  parameters   `expert` -> expert; `embed` -> fsdp, expert; then context (ZeRO-3 over the whole data-parallel
               group that is not a pure replica); `heads`, `mlp`, `expert_mlp`, `vocab` -> tensor.
  activations  `batch` -> data, fsdp, expert; `seq` -> context; `heads`, `mlp`, `vocab` -> tensor.

Parameter rules are resolved per array with divisibility in mind (`param_spec`): a mesh axis is used only where
it divides the dimension, and a data-parallel axis (fsdp, expert, context) that found no named dimension is put
on the largest dimension it divides (never a stacked-layer or vocab dim). So Kimi's [7168, F] matrices still
shard 4096 ways over fsdp x expert (7168 takes fsdp, F takes expert), while the embedding and LM head, whose only
other dim is the vocab, shard over the axes that divide 7168 and are replicated over the rest (~0.5 GB per
device at full size). The optimizer state mirrors the parameters' shardings (`state_shardings`).

`make_layout` bundles the mesh, the activation rules, expert-parallel MoE (always, under a mesh: routing stays
local to each device and only tokens move) and context-parallel attention (when the context axis is split, with
the zig-zag sequence order that balances the causal triangle).
"""

from __future__ import annotations

import math
from typing import Any

import jax

from c2jax.model.config import ModelConfig
from c2jax.model.params import param_specs
from c2jax.model.sharding import Layout
from c2jax.parallel import context_parallel
from c2jax.parallel import expert_parallel
from c2jax.parallel.mesh import AXES, BATCH_AXES, CONTEXT, EXPERT, FSDP, TENSOR, MeshRefusal

P = jax.sharding.PartitionSpec

PARAM_RULES: dict[str, tuple[str, ...]] = {
    "expert": (EXPERT,),
    "embed": (FSDP, EXPERT),
    "mtp_concat": (FSDP, EXPERT),
    "heads": (TENSOR,),
    "mlp": (TENSOR,),
    "expert_mlp": (TENSOR,),
    "vocab": (TENSOR,),
}
# Axes over which parameters are sharded rather than replicated (ZeRO-3); `data` holds full replicas. `context`
# ranks see different tokens of the same sequences, so for the parameters they are data-parallel ranks like any
# other: sharding over them too divides the state by cp (at 256K tokens with context 32 that is 61 -> 2 GiB).
_SHARDING_AXES = (FSDP, EXPERT, CONTEXT)
# Dims a leftover sharding axis never goes to: the stacked-layer dims (the layer scan would gather the whole stack
# to slice one layer), the vocab (the LM head would compute logits vocab-split over a token axis and exchange
# them), and the router's tiny expert dim.
_NO_FALLBACK = ("layers", "mtp_layers", "vocab", "expert_router")

ACTIVATION_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("batch", BATCH_AXES),
    ("seq", (CONTEXT,)),
    ("heads", (TENSOR,)),
    ("mlp", (TENSOR,)),
    ("vocab", (TENSOR,)),
)


def param_spec(shape: tuple[int, ...], axes: tuple[str, ...], mesh_shape: dict[str, int]) -> P:
  """Mesh PartitionSpec of one parameter of `shape` with logical `axes` (see the module docstring)."""
  assigned: list[list[str]] = [[] for _ in shape]
  used: set[str] = set()

  def fits(i: int, axis: str) -> bool:
    size = mesh_shape[axis]
    return (size > 1 and axis not in used and
            shape[i] % (math.prod(mesh_shape[a] for a in assigned[i]) * size) == 0)

  for i, name in enumerate(axes):
    for axis in PARAM_RULES.get(name, ()):
      if fits(i, axis):
        assigned[i].append(axis)
        used.add(axis)
  for axis in _SHARDING_AXES:
    for i in sorted(range(len(shape)), key=lambda i: -shape[i]):
      if axes[i] not in _NO_FALLBACK and fits(i, axis):
        assigned[i].append(axis)
        used.add(axis)
        break
  return P(*(None if not a else a[0] if len(a) == 1 else tuple(a) for a in assigned))


def param_shardings(cfg: ModelConfig, mesh: jax.sharding.Mesh) -> dict:
  """NamedShardings of every parameter of `cfg` on `mesh` (a pytree like the params)."""
  shape = dict(mesh.shape)
  return jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, param_spec(s.shape, s.axes, shape)),
                      param_specs(cfg), is_leaf=lambda x: hasattr(x, "axes") and hasattr(x, "init"))


def _trailing_dict_keys(path) -> tuple[str, ...]:
  keys: list[str] = []
  for entry in reversed(path):
    if not isinstance(entry, jax.tree_util.DictKey):
      break
    keys.append(entry.key)
  return tuple(reversed(keys))


def mirror_shardings(abstract_tree: Any, params_shardings: dict, mesh: jax.sharding.Mesh) -> Any:
  """Shardings for a tree that holds param-shaped subtrees (optimizer state): each leaf whose trailing dict path
  names a parameter of the same rank gets that parameter's sharding; everything else (counts) is replicated."""
  flat = {tuple(_trailing_dict_keys(p)): s for p, s in jax.tree_util.tree_flatten_with_path(params_shardings)[0]}
  replicated = jax.sharding.NamedSharding(mesh, P())

  def pick(path, leaf):
    keys = _trailing_dict_keys(path)
    for start in range(len(keys)):
      sharding = flat.get(keys[start:])
      if sharding is not None and len(sharding.spec) <= len(leaf.shape):
        return sharding
    return replicated

  return jax.tree_util.tree_map_with_path(pick, abstract_tree)


def check_mesh(cfg: ModelConfig, mesh_shape: dict[str, int], batch_size: int | None = None,
               seq_len: int | None = None) -> None:
  """Raises MeshRefusal (a ValueError), one sentence naming the fix, when the model or batch cannot be laid out on
  the mesh."""
  e, ep = cfg.n_routed_experts, mesh_shape[EXPERT]
  if cfg.n_moe_layers and e % ep:
    raise MeshRefusal(f"{e} experts cannot be split over an expert axis of {ep}; choose an expert axis size that "
                      f"divides {e}.")
  tp = mesh_shape[TENSOR]
  if cfg.n_heads % tp:
    raise MeshRefusal(f"{cfg.n_heads} attention heads cannot be split over a tensor axis of {tp}; choose a tensor "
                      f"axis size that divides {cfg.n_heads}.")
  if cfg.n_moe_layers and cfg.moe_intermediate_size % tp:
    raise MeshRefusal(f"Expert hidden size {cfg.moe_intermediate_size} cannot be split over a tensor axis of {tp}; "
                      "choose a tensor axis size that divides it.")
  shards = math.prod(mesh_shape[a] for a in BATCH_AXES)
  if batch_size is not None and batch_size % shards:
    raise MeshRefusal(f"Batch size {batch_size} is not divisible by data x fsdp x expert = {shards}; use a batch "
                      f"size that is a multiple of {shards}.")
  cp = mesh_shape[CONTEXT]
  if seq_len is not None and cp > 1 and seq_len % (2 * cp):
    raise MeshRefusal(f"Sequence length {seq_len} is not divisible by 2 x context = {2 * cp} (context parallelism "
                      f"splits it into {2 * cp} chunks); pad the sequence to a multiple of {2 * cp}.")


def make_layout(cfg: ModelConfig, mesh: jax.sharding.Mesh, *, capacity_factor: float | None = None) -> Layout:
  """The `Layout` of `cfg` on `mesh`.

  Args:
    cfg: the architecture (checked against the mesh here).
    mesh: a mesh with the axes of `c2jax.parallel.mesh.AXES`.
    capacity_factor: None for dropless expert parallelism (the default); a number to cap each expert's slots
      per source device at capacity_factor x the balanced load, dropping (and counting) the excess.
  """
  missing = [a for a in AXES if a not in mesh.shape]
  if missing:
    raise ValueError(f"The mesh has axes {tuple(mesh.axis_names)} but lacks {missing}; build it with "
                     "c2jax.parallel.mesh.make_mesh (size-1 axes cost nothing).")
  shape = dict(mesh.shape)
  check_mesh(cfg, shape)
  cp = shape[CONTEXT]
  return Layout(
      mesh=mesh, rules=ACTIVATION_RULES,
      routed_experts=expert_parallel.make_expert_parallel(mesh, capacity_factor=capacity_factor),
      attention=context_parallel.make_context_parallel(mesh) if cp > 1 else None,
      sequence_order=(lambda t: context_parallel.zigzag_order(t, cp)) if cp > 1 else None)


def batch_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Sharding of [B, T] batch arrays: batch over data x fsdp x expert, sequence over context."""
  return jax.sharding.NamedSharding(mesh, P(BATCH_AXES, CONTEXT))


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  return jax.sharding.NamedSharding(mesh, P())

