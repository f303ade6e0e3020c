"""The language-model train step: next-token CE (+ MTP loss, + z-loss), AdamW (`c2jax.optim`), and the
balancing-bias update.

  state, metrics = train_step(state, batch, cfg=..., hp=...)     # jit with donate_argnums=0

A pure function of (state, batch): it runs unchanged on one CPU device or under a sharded mesh (state built from
abstract shapes into its shardings by the caller).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax
import jax.numpy as jnp
import optax

from c2jax.model import losses
from c2jax.model import moe as moe_lib
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params, init_params
from c2jax.model.transformer import forward
from c2jax.optim import OptimizerConfig, make_optimizer


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
  """What the LM step does besides next-token CE.

  Attributes:
    optim: AdamW, its schedule and clipping (`c2jax.optim.OptimizerConfig`).
    mtp_weight: lambda, the MTP loss weight (DeepSeek-V3 uses 0.3 then 0.1); 0 leaves the MTP modules out (and
      out of weight decay).
    mtp_target: what the MTP modules learn (labels or self-distillation from the main model).
    z_loss_weight: weight of the z-loss (0 disables).
    bias_update_rate: u of the aux-loss-free balancing rule (0 disables).
  """

  optim: OptimizerConfig = OptimizerConfig()
  mtp_weight: float = 0.3
  mtp_target: MtpTarget = MtpTarget.LABELS
  z_loss_weight: float = 0.0
  bias_update_rate: float = 1e-3

  @property
  def untrained(self) -> tuple[str, ...]:
    """Parameter groups this step gives no gradient signal (weight decay leaves them alone)."""
    return () if self.mtp_weight > 0 else ("mtp",)


def make_step_optimizer(hp: StepConfig) -> optax.GradientTransformation:
  """The step's AdamW (`c2jax.optim.make_optimizer`), MTP modules out of weight decay when not trained."""
  return make_optimizer(hp.optim, untrained=hp.untrained)


@dataclasses.dataclass(frozen=True)
class TrainState:
  """step: int32 scalar; params; opt_state."""

  step: jax.Array
  params: Params
  opt_state: Any


jax.tree_util.register_dataclass(TrainState, data_fields=["step", "params", "opt_state"], meta_fields=[])


def init_state(cfg: ModelConfig, hp: StepConfig, key: jax.Array, params: Params | None = None) -> TrainState:
  """Step 0: `params` (a base model's, for continued pretraining) or a random init from `key`, a fresh AdamW."""
  params = init_params(cfg, key) if params is None else params
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=make_step_optimizer(hp).init(params))


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
  updates, opt_state = make_step_optimizer(hp).update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if hp.bias_update_rate > 0 and "moe_layers" in params:
    moe = params["moe_layers"]["moe"]
    new_bias = moe_lib.update_correction_bias(moe["router_bias"], load, hp.bias_update_rate)
    params = {**params, "moe_layers": {**params["moe_layers"], "moe": {**moe, "router_bias": new_bias}}}
    metrics["expert_load_max"] = jnp.max(load) * cfg.n_routed_experts  # 1.0 means perfectly balanced
  metrics["grad_norm"] = optax.tree.norm(grads)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
