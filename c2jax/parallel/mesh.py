"""Device meshes with the five named axes of c2jax's parallelism (report section 5: FSDP + EP + CP).

  data     pure data parallelism: replicas of the whole state (gradients all-reduced).
  fsdp     fully sharded data parallelism: tokens split, parameters and optimizer state sharded (ZeRO-3).
  expert   expert parallelism: routed experts split; tokens split too (the axis is data-parallel for everything
           else), exchanged with all-to-all inside the MoE layers. Decoupled from `tensor`, as in the report.
  context  context parallelism: the sequence split (attention gathers the small MLA latents, see
           `c2jax.parallel.context_parallel`).
  tensor   tensor parallelism: attention heads, MLP hidden, expert hidden and vocab split.

A size-1 axis costs nothing: every mesh has all five names, so rules and shard_map specs never special-case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import numpy as np

DATA = "data"
FSDP = "fsdp"
EXPERT = "expert"
CONTEXT = "context"
TENSOR = "tensor"
AXES = (DATA, FSDP, EXPERT, CONTEXT, TENSOR)
# Mesh axes that split the batch of sequences (and, in the MoE layers, tokens).
BATCH_AXES = (DATA, FSDP, EXPERT)


class MeshRefusal(ValueError):
  """A mesh that the devices, the model or the batch cannot take; its message is one sentence naming the fix.

  Entry points refuse it like any other bad config value (`c2jax.services.cli.refusals`: exit code 2, no
  traceback)."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Sizes of the five mesh axes; their product is the number of devices used."""

  data: int = 1
  fsdp: int = 1
  expert: int = 1
  context: int = 1
  tensor: int = 1

  def __post_init__(self):
    for name in AXES:
      size = getattr(self, name)
      if not isinstance(size, int) or size < 1:
        raise ValueError(f"Mesh axis {name!r} has size {size!r}; every axis size must be a positive integer.")

  @property
  def shape(self) -> dict[str, int]:
    return {name: getattr(self, name) for name in AXES}

  @property
  def num_devices(self) -> int:
    return math.prod(self.shape.values())

  @property
  def batch_shards(self) -> int:
    """How many ways the batch of sequences is split (data x fsdp x expert)."""
    return self.data * self.fsdp * self.expert

  @classmethod
  def parse(cls, text: str) -> MeshConfig:
    """'fsdp:64,expert:64,context:4' -> MeshConfig (unnamed axes are 1)."""
    sizes: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
      name, sep, value = item.partition(":")
      if not sep or name not in AXES or not value.isdigit():
        raise ValueError(f"Bad mesh item {item!r} in {text!r}; write axis:size pairs with axes from {AXES}, "
                         "e.g. 'fsdp:2,expert:4'.")
      sizes[name] = int(value)
    return cls(**sizes)

  def __str__(self) -> str:
    return ",".join(f"{k}:{v}" for k, v in self.shape.items() if v > 1) or "single"


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A `Mesh` with axes `AXES` of the configured sizes over `devices` (default: all devices, all processes).

  Devices are laid out in `jax.devices()` order with `tensor` fastest-varying, then `context`, `expert`,
  `fsdp`, `data`: the innermost axes, which communicate most, land on the closest devices (same host). A plain
  `Mesh` rather than `jax.make_mesh`, whose Explicit axes (its default in jax 0.10) `shard_map` rejects for
  mismatched specs.
  """
  devices = list(jax.devices() if devices is None else devices)
  if config.num_devices != len(devices):
    raise MeshRefusal(f"Mesh {config} needs {config.num_devices} devices but {len(devices)} are available; make the "
                      "product of the axis sizes equal the device count.")
  grid = np.asarray(devices, dtype=object).reshape(tuple(config.shape.values()))
  return jax.sharding.Mesh(grid, AXES)


def mesh_of(spec: str) -> jax.sharding.Mesh | None:
  """The run config's `mesh` string ('fsdp:2,expert:2') as a Mesh over the first devices; None for '' (one device).

  Raises MeshRefusal when the mesh needs more devices than exist."""
  if not spec:
    return None
  config = MeshConfig.parse(spec)
  if config.num_devices > jax.device_count():
    raise MeshRefusal(f"mesh={spec!r} needs {config.num_devices} devices but only {jax.device_count()} exist; shrink "
                      "the mesh (or fake CPU devices with XLA_FLAGS=--xla_force_host_platform_device_count=N).")
  return make_mesh(config, jax.devices()[:config.num_devices])
