"""The language-model train step on a mesh: one jitted function for every mesh shape (report section 6).

  trainer = make_trainer(cfg, hp, make_mesh(MeshConfig(fsdp=2, expert=4)))
  state = trainer.init(jax.random.key(0))          # built from abstract shapes straight into its shards
  state, metrics = trainer.step(state, batch)      # batch {tokens [B, T], ...}; state donated

`trainer.step` is `c2jax.pretrain.step.train_step` itself, traced under the mesh's `Layout`: parameters and
AdamW moments FSDP-sharded (`c2jax.parallel.layout`), experts over `expert` with token all-to-all, sequence over
`context` with latent-gathering attention. Nothing in the step knows the mesh shape; a single-device mesh runs
the same code.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from c2jax.model.config import ModelConfig
from c2jax.model.sharding import Layout, with_layout
from c2jax.parallel import layout as layout_lib
from c2jax.pretrain.step import StepConfig, TrainState, init_state, train_step


@dataclasses.dataclass(frozen=True)
class Trainer:
  """A train step bound to a mesh.

  Attributes:
    layout: the model's layout on the mesh.
    state_shardings: a `TrainState` of NamedShardings (params, AdamW moments mirror them; step replicated).
    batch_sharding: sharding of every [B, T] batch array (batch over data x fsdp x expert, sequence over context).
    init: key -> TrainState, jitted with `out_shardings`: no array is ever built whole on one device.
    step: (state, batch) -> (state, metrics), jitted, the state donated; metrics replicated scalars.
  """

  layout: Layout
  state_shardings: TrainState
  batch_sharding: jax.sharding.NamedSharding
  init: Callable[[jax.Array], TrainState]
  step: Callable[[TrainState, dict], tuple[TrainState, dict]]

  def put_batch(self, batch: dict) -> dict:
    """Places a global host batch {name: [B, T] numpy} onto the mesh.

    Each process passes the same global batch and contributes only the shards of its own devices, so this is
    correct on one host and across several (`jax.distributed`).
    """
    return {k: jax.make_array_from_callback(v.shape, self.batch_sharding, lambda index, v=v: v[index])
            for k, v in batch.items()}


def state_shardings(cfg: ModelConfig, hp: StepConfig, mesh: jax.sharding.Mesh) -> TrainState:
  """Shardings of the whole train state, from abstract shapes only (nothing is allocated)."""
  abstract = jax.eval_shape(functools.partial(init_state, cfg, hp), jax.random.key(0))
  params = layout_lib.param_shardings(cfg, mesh)
  return TrainState(step=layout_lib.replicated(mesh), params=params,
                    opt_state=layout_lib.mirror_shardings(abstract.opt_state, params, mesh))


def make_trainer(cfg: ModelConfig, hp: StepConfig, mesh: jax.sharding.Mesh, *, capacity_factor: float | None = None,
                 batch_size: int | None = None, seq_len: int | None = None) -> Trainer:
  """Builds the sharded init and step for `cfg` on `mesh`.

  Args:
    cfg: the architecture.
    hp: optimization hyperparameters.
    mesh: from `c2jax.parallel.mesh.make_mesh`.
    capacity_factor: None: dropless expert parallelism; a number caps expert slots (drops counted in metrics).
    batch_size / seq_len: when given, checked against the mesh now (one clear error instead of a late one).
  """
  layout_lib.check_mesh(cfg, dict(mesh.shape), batch_size, seq_len)
  layout = layout_lib.make_layout(cfg, mesh, capacity_factor=capacity_factor)
  shardings = state_shardings(cfg, hp, mesh)
  batch_sharding = layout_lib.batch_sharding(mesh)
  init = jax.jit(functools.partial(init_state, cfg, hp), out_shardings=shardings)
  step = jax.jit(with_layout(functools.partial(train_step, cfg=cfg, hp=hp), layout),
                 in_shardings=(shardings, batch_sharding), out_shardings=(shardings, layout_lib.replicated(mesh)),
                 donate_argnums=0)
  return Trainer(layout=layout, state_shardings=shardings, batch_sharding=batch_sharding, init=init, step=step)


def abstract_state(cfg: ModelConfig, hp: StepConfig, shardings: TrainState) -> Any:
  """`ShapeDtypeStruct`s of the train state carrying their shardings (for `trainer.step.lower`)."""
  abstract = jax.eval_shape(functools.partial(init_state, cfg, hp), jax.random.key(0))
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
