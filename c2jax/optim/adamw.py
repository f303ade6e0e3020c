"""AdamW with a warmup + decay schedule and global-norm clipping: the optimizer of both the pretraining step
(`c2jax.pretrain.step`, report section 3: AdamW) and the RL update (`c2jax.rl.update`).

  tx = make_optimizer(OptimizerConfig(learning_rate=1e-5, warmup_steps=0), untrained=("mtp",))
  opt_state = tx.init(params); updates, opt_state = tx.update(grads, opt_state, params)

Leaves outside `c2jax.model.params.trainable_mask` (the router correction biases, moved only by the balancing rule)
are never touched. `lr_multipliers` gives the leaves whose path matches a pattern a learning rate of their own (a
multiple of the schedule's, e.g. `(("(dense|moe)_layers/attn/(q_a|kv_a)", 0.3),)`). The state's structure depends
only on whether clipping is on and whether `lr_multipliers` is set, so consecutive phases with other schedules, rates
or weight decay continue one optimizer state.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, NamedTuple

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
    lr_multipliers: (pattern, multiplier) pairs: a leaf whose "/"-joined path (e.g. "moe_layers/attn/kv_a") fully
      matches the regular expression `pattern` moves at `multiplier` x the schedule's rate, weight decay included (a
      learning rate of its own, as a parameter group has in torch); clipping stays global. Each pattern must match at
      least one trained leaf and no leaf may match two. Empty: one rate for every leaf.
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
  lr_multipliers: tuple[tuple[str, float], ...] = ()

  def __post_init__(self):
    if not self.learning_rate >= 0 or self.warmup_steps < 0 or self.total_steps < 1:
      raise ValueError(f"learning_rate={self.learning_rate}, warmup_steps={self.warmup_steps} and total_steps="
                       f"{self.total_steps} must be >= 0, >= 0 and >= 1.")
    if not 0 <= self.final_lr_fraction <= 1:
      raise ValueError(f"final_lr_fraction={self.final_lr_fraction} must lie in [0, 1].")
    if self.grad_clip < 0 or self.weight_decay < 0:
      raise ValueError(f"grad_clip={self.grad_clip} and weight_decay={self.weight_decay} must be >= 0.")
    for pattern, multiplier in self.lr_multipliers:
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(f"lr_multipliers pattern {pattern!r} is not a regular expression ({e}); write one that "
                         "fully matches parameter paths such as 'moe_layers/attn/kv_a'.") from None
      if not multiplier >= 0:
        raise ValueError(f"lr_multipliers[{pattern!r}]={multiplier} must be >= 0.")


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


def _path(path: tuple) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def lr_multiplier_tree(updates: Any, lr_multipliers: tuple[tuple[str, float], ...]) -> Any:
  """The multiplier of every leaf of `updates` (1.0 where no pattern matches); raises ValueError when a pattern
  matches no leaf or a leaf matches two patterns."""
  compiled = [(re.compile(p), p, m) for p, m in lr_multipliers]
  used = set()

  def one(path, _):
    name = _path(path)
    hits = [(p, m) for r, p, m in compiled if r.fullmatch(name)]
    if len(hits) > 1:
      raise ValueError(f"lr_multipliers: {name!r} matches {[p for p, _ in hits]}; make the patterns disjoint.")
    used.update(p for p, _ in hits)
    return hits[0][1] if hits else 1.0

  tree = jax.tree_util.tree_map_with_path(one, updates)
  unused = [p for _, p, _ in compiled if p not in used]
  if unused:
    names = [_path(path) for path, _ in jax.tree_util.tree_leaves_with_path(updates)]
    raise ValueError(f"lr_multipliers patterns {unused} match no trained parameter; each must fully match a path "
                     f"such as {names[:3]} (slash-separated).")
  return tree


class _ScaleState(NamedTuple):
  """No state: `scale_by_lr_multipliers` is stateless."""


def scale_by_lr_multipliers(lr_multipliers: tuple[tuple[str, float], ...]) -> optax.GradientTransformation:
  """Multiplies each leaf's update by its `lr_multiplier_tree` entry; the patterns are checked against the
  parameters at `init`."""

  def init(params):
    lr_multiplier_tree(params, lr_multipliers)  # a pattern that matches nothing fails here, before training
    return _ScaleState()

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u * m, updates, lr_multiplier_tree(updates, lr_multipliers)), state

  return optax.GradientTransformation(init, update)


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
  if cfg.lr_multipliers:  # after AdamW: the leaf's whole step (its decay too) is scaled, its moments are not
    chain.append(scale_by_lr_multipliers(cfg.lr_multipliers))
  tx = optax.chain(*chain)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                               lambda p: jax.tree.map(lambda m: "train" if m else "frozen", trainable_mask(p)))
