"""The language-model train step: next-token CE (+ MTP loss, + z-loss), AdamW, and the balancing-bias update.

  state, metrics = train_step(state, batch, cfg=..., hp=...)     # jit with donate_argnums=0

A pure function of (state, batch): it runs unchanged on one CPU device or under a sharded mesh (state built from
abstract shapes into its shardings by the caller).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from c2jax.model import losses
from c2jax.model import moe as moe_lib
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params, init_params, trainable_mask
from c2jax.model.transformer import forward


class Decay(enum.Enum):
  """Learning-rate decay after warmup, from the peak to `final_lr_fraction` x peak over the schedule."""

  COSINE = "cosine"
  LINEAR = "linear"


class MtpTarget(enum.Enum):
  """What the MTP modules learn (report section 3: "MTP layers trained by self-distillation").

  LABELS: the data's token k+1 ahead (DeepSeek-V3's MTP cross-entropy).
  SELF_DISTILL: the main model's own next-token distribution at the position the MTP depth predicts for
    (softmax of the main logits there, under stop-gradient): the drafter learns to imitate the model it drafts
    for, which is what speculative decoding's acceptance rate rewards.
  """

  LABELS = "labels"
  SELF_DISTILL = "self_distill"


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Optimization hyperparameters of the LM step.

  Attributes:
    learning_rate: peak learning rate (a schedule is built by `make_optimizer`).
    warmup_steps / total_steps: linear warmup from 0 (step 0 has rate 0; warmup_steps=0: none) then `decay` to
      `final_lr_fraction` x peak at `total_steps` (held there after).
    decay: the decay's shape.
    schedule_offset: the optimizer step at which this schedule starts (a later training phase continues the
      same AdamW state, whose step count is global, with a fresh warmup + decay of its own).
    weight_decay, b1, b2, eps: AdamW.
    grad_clip: global-norm clipping (0 disables).
    mtp_weight: lambda, the MTP loss weight (DeepSeek-V3 uses 0.3 then 0.1); 0 leaves the MTP modules out.
    mtp_target: what the MTP modules learn (labels or self-distillation from the main model).
    z_loss_weight: weight of the z-loss (0 disables).
    bias_update_rate: u of the aux-loss-free balancing rule (0 disables).
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
  mtp_weight: float = 0.3
  mtp_target: MtpTarget = MtpTarget.LABELS
  z_loss_weight: float = 0.0
  bias_update_rate: float = 1e-3


def make_schedule(hp: StepConfig) -> optax.Schedule:
  """The learning rate as a function of the optimizer's (global) step count."""
  peak, end = hp.learning_rate, hp.learning_rate * hp.final_lr_fraction
  decay_steps = max(hp.total_steps - hp.warmup_steps, 1)
  if hp.decay == Decay.COSINE:
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=hp.final_lr_fraction)
  else:
    decay = optax.linear_schedule(peak, end, decay_steps)
  # No warmup: the first step already moves at the full rate (a warmup's step 0 has rate 0).
  local = (optax.join_schedules([optax.linear_schedule(0.0, peak, hp.warmup_steps), decay], [hp.warmup_steps])
           if hp.warmup_steps > 0 else decay)
  return lambda count: local(count - hp.schedule_offset)


def _decay_mask(params: Params, train_mtp: bool) -> Any:
  """Which leaves weight decay shrinks: all but the MTP modules of a step that does not train them (a phase without
  the MTP loss leaves them as they are, for the phase that distils them). Always a mask, so that the optimizer
  state has one structure in every phase."""
  return {k: jax.tree.map(lambda _: train_mtp or k != "mtp", v) for k, v in params.items()}


def make_optimizer(hp: StepConfig) -> optax.GradientTransformation:
  """AdamW with warmup + decay and clipping; leaves outside `trainable_mask` are never touched.

  The state's structure depends only on whether clipping is on, so phases with different schedules, rates or
  weight decay continue one optimizer state.
  """
  chain = [optax.clip_by_global_norm(hp.grad_clip)] if hp.grad_clip > 0 else []
  chain.append(optax.adamw(make_schedule(hp), b1=hp.b1, b2=hp.b2, eps=hp.eps, weight_decay=hp.weight_decay,
                           mask=functools.partial(_decay_mask, train_mtp=hp.mtp_weight > 0)))
  tx = optax.chain(*chain)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                               lambda p: jax.tree.map(lambda m: "train" if m else "frozen", trainable_mask(p)))


@dataclasses.dataclass(frozen=True)
class TrainState:
  """step: int32 scalar; params; opt_state."""

  step: jax.Array
  params: Params
  opt_state: Any


jax.tree_util.register_dataclass(TrainState, data_fields=["step", "params", "opt_state"], meta_fields=[])


def init_state(cfg: ModelConfig, hp: StepConfig, key: jax.Array) -> TrainState:
  params = init_params(cfg, key)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=make_optimizer(hp).init(params))


def document_mask(batch: dict) -> jax.Array:
  """[B, T] float32 weight of predicting tokens[:, i]: `loss_mask` (default 1), zeroed where token i starts a new
  document of a packed row (segment_ids[i] != segment_ids[i - 1]), so no document is predicted from another."""
  tokens = batch["tokens"]
  mask = batch.get("loss_mask")
  mask = jnp.ones(tokens.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
  seg = batch.get("segment_ids")
  if seg is not None:
    same = jnp.concatenate([jnp.zeros_like(seg[:, :1], bool), seg[:, 1:] == seg[:, :-1]], axis=1)
    mask = mask * same
  return mask


def loss_fn(params: Params, batch: dict, cfg: ModelConfig, hp: StepConfig):
  """Scalar loss and aux for a batch {tokens [B, T], loss_mask?, positions?, segment_ids?, token_mask?}."""
  tokens = batch["tokens"]
  mask = document_mask(batch)
  segments = batch.get("segment_ids")
  with_mtp = hp.mtp_weight > 0 and cfg.num_mtp_layers > 0
  out = forward(params, tokens, cfg=cfg, positions=batch.get("positions"), segment_ids=segments,
                token_mask=batch.get("token_mask"), with_mtp=with_mtp)
  ce = losses.next_token_loss(out.logits, tokens, mask)
  loss = ce.mean
  metrics = {"ce": ce.mean, "tokens": ce.weight}
  if cfg.n_moe_layers:
    # Nonzero only under an expert-parallel layout given a capacity factor (dropless is the default).
    metrics["moe_dropped"] = jnp.sum(out.expert_dropped) + (
        0.0 if out.mtp_expert_dropped is None else jnp.sum(out.mtp_expert_dropped))
  if with_mtp:
    if hp.mtp_target == MtpTarget.SELF_DISTILL:
      mtp = losses.mtp_distill_loss(out.mtp_logits, out.logits, mask, segments)
      metrics["mtp_kl"] = mtp.kl.mean
      mtp = mtp.ce
    else:
      mtp = losses.mtp_loss(out.mtp_logits, tokens, mask, segments)
    loss = loss + hp.mtp_weight * mtp.mean
    metrics["mtp_ce"] = mtp.mean
  if hp.z_loss_weight > 0:
    z = losses.z_loss(out.logits[:, :-1], mask[:, 1:])
    loss = loss + hp.z_loss_weight * z.mean
    metrics["z_loss"] = z.mean
  metrics["loss"] = loss
  return loss, (metrics, out.expert_load)


def train_step(state: TrainState, batch: dict, *, cfg: ModelConfig, hp: StepConfig) -> tuple[TrainState, dict]:
  """One AdamW step on `batch`; also moves the router correction biases by the balancing rule."""
  (_, (metrics, load)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, cfg, hp)
  updates, opt_state = make_optimizer(hp).update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if hp.bias_update_rate > 0 and "moe_layers" in params:
    moe = params["moe_layers"]["moe"]
    new_bias = moe_lib.update_correction_bias(moe["router_bias"], load, hp.bias_update_rate)
    params = {**params, "moe_layers": {**params["moe_layers"], "moe": {**moe, "router_bias": new_bias}}}
    metrics["expert_load_max"] = jnp.max(load) * cfg.n_routed_experts  # 1.0 means perfectly balanced
  metrics["grad_norm"] = optax.tree.norm(grads)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
