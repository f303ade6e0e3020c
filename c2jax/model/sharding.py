"""Logical sharding annotations of activations.

The model names the axes of its key activations (`batch`, `seq`, `embed`, `heads`, `vocab`, `expert`, ...);
`c2jax.parallel` maps logical names to mesh axes with flax's logical-axis rules. Outside such a context (a
single device, or no rules set) `constrain` is the identity, so the model runs unchanged everywhere.
"""

from __future__ import annotations

import flax.linen as nn
import jax


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
  """Annotates x [len(axes) dims] with logical axis names (no-op without logical-axis rules and a mesh)."""
  if len(axes) != x.ndim:
    raise ValueError(f"constrain: {len(axes)} axis names {axes} for an array of rank {x.ndim}.")
  return nn.with_logical_constraint(x, axes)
