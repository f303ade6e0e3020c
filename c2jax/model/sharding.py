"""The model's view of parallelism: logical activation names and the active `Layout`.

The model names the axes of its key activations (`batch`, `seq`, `embed`, `heads`, `vocab`, ...) with
`constrain`. A `Layout` (built by `c2jax.parallel.layout`) says how those names map to the axes of a device mesh
and supplies the two computations that need explicit collectives: expert-parallel MoE and context-parallel
attention. It is made active for the duration of tracing with `use_layout`; outside one (a single device, or
plain jit) `constrain` is the identity and the model uses its local MoE and attention, so the same `forward`
runs unchanged everywhere.

A layout is read at trace time only, the way flax's logical-axis rules are: jit the function that enters
`use_layout`, not the other way round.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import dataclasses
from typing import Any, Callable, Iterator

import jax
import numpy as np

# (moe params, x [B, T, D], cfg, forced ids [B, T, K] | None) -> RoutedOutput.
RoutedExpertsFn = Callable[..., "RoutedOutput"]
# (attention params, Latents, positions [B, T], segment_ids [B, T] | None, cfg) -> values [B, T, N, Hv].
AttentionFn = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class RoutedOutput:
  """What a routed-experts implementation returns for x [B, T, D].

  Attributes:
    y: [B, T, D] sum_k g_k FFN_{ids_k}(x) (routed experts only; the shared expert is added by the caller).
    ids: [B, T, K] int32 chosen (or replayed) experts.
    dropped: scalar float32, assignments dropped for lack of capacity (0 when dropless).
  """

  y: jax.Array
  ids: jax.Array
  dropped: jax.Array


jax.tree_util.register_dataclass(RoutedOutput, data_fields=["y", "ids", "dropped"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class Layout:
  """How the model is laid out over a mesh.

  Attributes:
    mesh: the device mesh.
    rules: logical activation axis name -> tuple of mesh axis names (empty: replicated).
    routed_experts: expert-parallel MoE (None: the model's local dispatch under XLA's partitioner).
    attention: context-parallel attention (None: the model's local attention).
    sequence_order: t -> a permutation [t] of the sequence in which the decoder stack runs (None: natural order).
      Context parallelism runs the stack in a load-balanced chunk order; positions and segment ids travel with
      the tokens, so results are unchanged, and `forward` restores the natural order before the heads.
  """

  mesh: jax.sharding.Mesh
  rules: tuple[tuple[str, tuple[str, ...]], ...]
  routed_experts: RoutedExpertsFn | None = None
  attention: AttentionFn | None = None
  sequence_order: Callable[[int], np.ndarray] | None = None

  def __post_init__(self):
    if self.sequence_order is not None and self.attention is None:
      # The local attention skips keys after a query's index, which is only exact in natural order.
      raise ValueError("A Layout with a sequence_order needs an attention that accepts it (context-parallel "
                       "attention); set both or neither.")

  def spec(self, axes: tuple[str | None, ...]) -> jax.sharding.PartitionSpec:
    """PartitionSpec of an activation with these logical axis names (unknown names are replicated)."""
    table = dict(self.rules)
    used: set[str] = set()
    out: list[Any] = []
    for name in axes:
      mesh_axes = tuple(a for a in table.get(name, ()) if a not in used and self.mesh.shape[a] > 1)
      used.update(mesh_axes)
      out.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return jax.sharding.PartitionSpec(*out)


_LAYOUT: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("c2jax_layout", default=None)


@contextlib.contextmanager
def use_layout(layout: Layout | None) -> Iterator[Layout | None]:
  """Makes `layout` active while tracing the enclosed code (None: none, the single-device model)."""
  token = _LAYOUT.set(layout)
  try:
    yield layout
  finally:
    _LAYOUT.reset(token)


def with_layout(fn: Callable, layout: Layout | None) -> Callable:
  """fn, traced with `layout` active (wrap before jit: the layout is read while tracing)."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with use_layout(layout):
      return fn(*args, **kwargs)

  return wrapped


def current_layout() -> Layout | None:
  """The active layout, or None."""
  return _LAYOUT.get()


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
  """Annotates x [len(axes) dims] with logical axis names; the identity when no layout is active."""
  if len(axes) != x.ndim:
    raise ValueError(f"constrain: {len(axes)} axis names {axes} for an array of rank {x.ndim}.")
  layout = _LAYOUT.get()
  if layout is None:
    return x
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(layout.mesh, layout.spec(axes)))
