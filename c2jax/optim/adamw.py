"""AdamW with a warmup + decay schedule and global-norm clipping: the optimizer of both the pretraining step
(`c2jax.pretrain.step`, report section 3: AdamW) and the RL update (`c2jax.rl.update`).

  tx = make_optimizer(OptimizerConfig(learning_rate=1e-5, warmup_steps=0), untrained=("mtp",))
  opt_state = tx.init(params); updates, opt_state = tx.update(grads, opt_state, params)

Leaves outside `c2jax.model.params.trainable_mask` (the router correction biases, moved only by the balancing rule)
are never touched. The state's structure depends only on whether clipping is on, so consecutive phases with other
schedules, rates or weight decay continue one optimizer state.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax
import optax

from c2jax.model.params import Params, trainable_mask


class Decay(enum.Enum):
  """Learning-rate decay after warmup, from the peak to `final_lr_fraction` x peak over the schedule."""

  COSINE = "cosine"
  LINEAR = "linear"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW, its schedule and clipping.

  Attributes:
    learning_rate: the peak learning rate.
    warmup_steps / total_steps: linear warmup from 0 (step 0 has rate 0; warmup_steps=0: none, the first step moves
      at the full rate) then `decay` to `final_lr_fraction` x peak at `total_steps` (held there after);
      final_lr_fraction=1 gives a constant rate after warmup.
    decay: the decay's shape.
    schedule_offset: the optimizer step at which this schedule starts (a later training phase continues the
      same AdamW state, whose step count is global, with a fresh warmup + decay of its own).
    weight_decay, b1, b2, eps: AdamW.
    grad_clip: global-norm clipping (0 disables).
  """

  learning_rate: float = 3e-4
  warmup_steps: int = 10
  total_steps: int = 1000
  final_lr_fraction: float = 0.1
  decay: Decay = Decay.COSINE
  schedule_offset: int = 0
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0

  def __post_init__(self):
    if not self.learning_rate >= 0 or self.warmup_steps < 0 or self.total_steps < 1:
      raise ValueError(f"learning_rate={self.learning_rate}, warmup_steps={self.warmup_steps} and total_steps="
                       f"{self.total_steps} must be >= 0, >= 0 and >= 1.")
    if not 0 <= self.final_lr_fraction <= 1:
      raise ValueError(f"final_lr_fraction={self.final_lr_fraction} must lie in [0, 1].")
    if self.grad_clip < 0 or self.weight_decay < 0:
      raise ValueError(f"grad_clip={self.grad_clip} and weight_decay={self.weight_decay} must be >= 0.")


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  """The learning rate as a function of the optimizer's (global) step count."""
  peak, end = cfg.learning_rate, cfg.learning_rate * cfg.final_lr_fraction
  decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
  if cfg.decay == Decay.COSINE:
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=cfg.final_lr_fraction)
  else:
    decay = optax.linear_schedule(peak, end, decay_steps)
  # No warmup: the first step already moves at the full rate (a warmup's step 0 has rate 0).
  local = (optax.join_schedules([optax.linear_schedule(0.0, peak, cfg.warmup_steps), decay], [cfg.warmup_steps])
           if cfg.warmup_steps > 0 else decay)
  return lambda count: local(count - cfg.schedule_offset)


def _decay_mask(params: Params, untrained: tuple[str, ...]) -> Any:
  """Which leaves weight decay shrinks: all but the top-level groups in `untrained` (a step without the MTP loss
  leaves the MTP modules as they are, for the phase that distils them). Always a mask, so that the optimizer state
  has one structure whatever is decayed."""
  return {k: jax.tree.map(lambda _, k=k: k not in untrained, v) for k, v in params.items()}


def make_optimizer(cfg: OptimizerConfig, *, untrained: tuple[str, ...] = ()) -> optax.GradientTransformation:
  """AdamW with warmup + decay and clipping; leaves outside `trainable_mask` are never touched.

  Args:
    cfg: the optimizer's settings.
    untrained: top-level parameter groups the step gives no gradient signal (e.g. "mtp" without the MTP loss):
      weight decay leaves them unchanged.
  """
  chain = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
  chain.append(optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                           mask=lambda params: _decay_mask(params, tuple(untrained))))
  tx = optax.chain(*chain)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                               lambda p: jax.tree.map(lambda m: "train" if m else "frozen", trainable_mask(p)))
