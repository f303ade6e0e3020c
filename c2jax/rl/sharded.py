"""The RL update on a device mesh: `update_step` traced under the mesh's layout (report sections 4 and 6).

  trainer = make_rl_trainer(cfg, make_mesh(MeshConfig(fsdp=2, expert=4)))
  state = trainer.init(jax.random.key(0))            # or trainer.init(key, params) from a checkpoint
  state, metrics = trainer.step(state, trainer.put_batch(host_batch))

Params, AdamW moments and the reference params are sharded as in pretraining (`c2jax.parallel.layout`); batch
rows over data x fsdp x expert and the sequence over context. Nothing in `update_step` knows the mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np

from c2jax.model.params import Params
from c2jax.model.sharding import Layout, with_layout
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import BATCH_AXES, CONTEXT, MeshRefusal
from c2jax.rl.config import RLConfig
from c2jax.rl.update import RLState, init_state, update_step


def state_shardings(cfg: RLConfig, mesh: jax.sharding.Mesh) -> RLState:
  """Shardings of the RL state from abstract shapes (nothing allocated)."""
  abstract = jax.eval_shape(functools.partial(init_state, cfg), jax.random.key(0))
  params = layout_lib.param_shardings(cfg.model, mesh)
  return RLState(step=layout_lib.replicated(mesh), params=params,
                 opt_state=layout_lib.mirror_shardings(abstract.opt_state, params, mesh),
                 ref_params=params if cfg.uses_reference else None)


def batch_shardings(batch: Mapping, mesh: jax.sharding.Mesh) -> dict:
  """Per-field shardings of an RL batch: rows over data x fsdp x expert, tokens over context."""

  def spec(path, x):
    name = path[0].key
    if name == "expert_ids":  # [Lm, B, T, K]
      return NamedSharding(mesh, P(None, BATCH_AXES, CONTEXT, None))
    if np.ndim(x) == 2:  # [B, T]
      return NamedSharding(mesh, P(BATCH_AXES, CONTEXT))
    return NamedSharding(mesh, P(BATCH_AXES))  # [B]

  return jax.tree_util.tree_map_with_path(spec, dict(batch))


@dataclasses.dataclass(frozen=True)
class RLTrainer:
  """The RL update bound to a mesh.

  Attributes:
    layout: the model's layout on the mesh.
    state_shardings: an `RLState` of NamedShardings.
    init: (key, params=None) -> RLState built into its shards (params, when given, are resharded).
    step: (state, batch) -> (state, metrics), jitted, the state donated; metrics replicated scalars.
  """

  layout: Layout
  mesh: jax.sharding.Mesh
  state_shardings: RLState
  init: Callable[..., RLState]
  step: Callable[[RLState, dict], tuple[RLState, dict]]

  def put_batch(self, batch: Mapping) -> dict:
    """Places a global host batch (numpy, the schema of `c2jax.rl.batch`) onto the mesh; every process passes the
    same global batch and contributes its own devices' shards (multi-host safe)."""
    shardings = batch_shardings(batch, self.mesh)
    return jax.tree.map(lambda v, s: jax.make_array_from_callback(np.shape(v), s, lambda index, v=v: v[index]),
                        dict(batch), shardings)


def check_mesh(cfg: RLConfig, mesh_shape: dict[str, int], batch_size: int | None = None,
               seq_len: int | None = None) -> None:
  """Raises MeshRefusal (one sentence naming the fix) when the model, or a batch of `batch_size` rows of `seq_len`
  tokens split into `cfg.micro_batches`, cannot be laid out on a mesh of `mesh_shape`."""
  if batch_size is not None:
    shards = math.prod(mesh_shape[a] for a in BATCH_AXES)
    if batch_size % (cfg.micro_batches * shards):
      raise MeshRefusal(f"Batch size {batch_size} does not split into micro_batches={cfg.micro_batches} of rows "
                        f"divisible by data x fsdp x expert = {shards}; use a multiple of "
                        f"{cfg.micro_batches * shards}.")
  layout_lib.check_mesh(cfg.model, mesh_shape, batch_size, seq_len)


def make_rl_trainer(cfg: RLConfig, mesh: jax.sharding.Mesh, *, capacity_factor: float | None = None,
                    batch_size: int | None = None, seq_len: int | None = None) -> RLTrainer:
  """Builds the sharded init and update for `cfg` on `mesh`.

  Args:
    cfg: the RL config.
    mesh: from `c2jax.parallel.mesh.make_mesh`.
    capacity_factor: None: dropless expert parallelism.
    batch_size / seq_len: when given, checked now: each micro-batch's rows must divide over the batch axes.
  """
  check_mesh(cfg, dict(mesh.shape), batch_size, seq_len)
  layout = layout_lib.make_layout(cfg.model, mesh, capacity_factor=capacity_factor)
  shardings = state_shardings(cfg, mesh)
  jit_init = jax.jit(functools.partial(init_state, cfg), out_shardings=shardings)

  def init(key: jax.Array, params: Params | None = None) -> RLState:
    if params is not None:
      params = jax.device_put(params, shardings.params)
    return jit_init(key, params)

  step = jax.jit(with_layout(functools.partial(update_step, cfg=cfg), layout),
                 out_shardings=(shardings, layout_lib.replicated(mesh)), donate_argnums=0)
  return RLTrainer(layout=layout, mesh=mesh, state_shardings=shardings, init=init, step=step)


def abstract_state(cfg: RLConfig, shardings: RLState) -> Any:
  """`ShapeDtypeStruct`s of the RL state carrying their shardings (for `trainer.step.lower`)."""
  abstract = jax.eval_shape(functools.partial(init_state, cfg), jax.random.key(0))
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
