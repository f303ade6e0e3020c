"""The RL update's configuration: every design choice of the report's RL recipe as one field (report section 4).

Defaults follow the report: Dr. GRPO advantages (no std normalization), Dr. GRPO's constant-normalized token sum
(no length normalization), overlong rollouts kept, a k1 KL to the reference policy, routing replay on, the
plausibility filter on. Each ablation is one override of a run config's `rl` section (read by
`c2jax.typed_config`), e.g. `--config.rl.advantage=grpo`, `--config.rl.aggregation=seq_mean_token_mean`,
`--config.rl.kl_estimator=k3`, `--config.rl.routing_replay=off`, `--config.rl.reward.weights.style=0.1`,
`--config.rl.optim.learning_rate=1e-6`.

Report / paper symbol of each field:
  advantage            A_i of the policy gradient (registry `c2jax.rl.advantages.ADVANTAGES`)
  clip_eps_low/high    epsilon_low / epsilon_high of the clipped ratio (DAPO's clip-higher)
  tis_cap              C of truncated importance sampling min(rho, C)
  aggregation          how token losses are summed (`c2jax.rl.policy_loss.AGGREGATIONS`)
  loss_constant        Dr. GRPO's normalizing constant (0: N x T, the batch's sequences x T)
  kl_coef              beta; kl_estimator k in {k1, k2, k3} of log r, r = pi_ref / pi
  filter               the plausibility thresholds on pi_theta / mu (mu: the actor's sampling policy)
  reward               the reward terms' weights and the length penalty C_{k,q}
"""

from __future__ import annotations

import dataclasses
import enum

from c2jax import typed_config
from c2jax.model.config import ModelConfig
from c2jax.optim import OptimizerConfig
from c2jax.rl import advantages as advantages_lib
from c2jax.rl import kl as kl_lib
from c2jax.rl import policy_loss as policy_loss_lib
from c2jax.rl.filters import PlausibilityFilter
from c2jax.rl.kl import KlPlacement
from c2jax.rl.policy_loss import SequenceUnit
from c2jax.rl.rewards import RewardConfig


class Overlong(enum.Enum):
  """Rollouts cut at the length budget: KEEP them in the loss (the report, Dr. GRPO) or MASK them (DAPO)."""

  KEEP = "keep"
  MASK = "mask"


class RoutingReplay(enum.Enum):
  """REPLAY: the update's forward uses the actor's expert ids (gates recomputed, so the router still learns);
  OFF: the trainer routes afresh (inference and training may then route differently)."""

  REPLAY = "replay"
  OFF = "off"


class ZeroVarianceGroups(enum.Enum):
  """Groups whose rewards are all equal: KEEP them (zero advantage under dr_grpo/rloo, but their tokens still count
  in token_mean normalizers and KL terms) or DROP their rows from the loss."""

  KEEP = "keep"
  DROP = "drop"


def _default_optim() -> OptimizerConfig:
  # RL: a constant learning rate from the first update (no warmup), no weight decay. The router correction biases
  # stay frozen (they are outside the optimizer's trainable mask; routing replay makes the trainer's expert load
  # the actor's, so the balancing rule belongs to pretraining).
  return OptimizerConfig(learning_rate=1e-5, warmup_steps=0, total_steps=1, final_lr_fraction=1.0, weight_decay=0.0,
                         grad_clip=1.0)


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Everything `update_step` needs: the architecture, the optimizer and the RL recipe (hashable: a static arg).

  Attributes:
    model: the architecture.
    optim: AdamW, schedule and clipping (`c2jax.optim.OptimizerConfig`; warmup_steps=0 and final_lr_fraction=1 give
      a constant rate).
    advantage: name in `ADVANTAGES` (dr_grpo, grpo, rloo).
    advantage_eps: eps of grpo's std division.
    zero_variance_groups: KEEP or DROP groups with equal rewards.
    policy_loss: name in `POLICY_LOSSES` (ppo_clip, tis).
    clip_eps_low, clip_eps_high: the ppo_clip range [1 - low, 1 + high].
    tis_cap: the truncation of tis.
    aggregation: name in `AGGREGATIONS` (token_sum_constant, token_mean, seq_mean_token_mean).
    loss_constant: C of token_sum_constant; 0 uses N x T (the batch's sequences times T: B x T when padded).
    sequence_unit: CHAIN or ROW, the unit of seq_mean_token_mean.
    overlong: KEEP or MASK truncated rollouts.
    kl_estimator: name in `KL_ESTIMATORS` (k1, k2, k3).
    kl_placement: NONE, IN_REWARD, LOSS or LOSS_STRAIGHT_THROUGH (see `c2jax.rl.kl`).
    kl_coef: beta; 0 turns the KL (and the reference forward) off.
    filter: the plausibility filter.
    routing_replay: REPLAY or OFF.
    sampling_temperature: the actors' sampling temperature; the trainer's log-probs are those of
      softmax(logits / temperature), the distribution the behaviour log-probs come from. (Top-k / top-p
      truncation cannot be reproduced by the trainer: sample RL rollouts without it.)
    reward: reward terms and length penalty.
    success_threshold: a trajectory counts as solved (pass@k, lengths of correct samples) when its outcome term
      is >= this.
    pass_k: the k of the pass@k and best-of-k metrics.
    micro_batches: gradient accumulation steps; the update does not depend on it (rows split evenly).
  """

  # The architecture: a run config gives it in its own section (`c2jax.services.rl_run_config`), not under rl.
  model: ModelConfig = dataclasses.field(metadata={typed_config.PLAIN: False})
  optim: OptimizerConfig = dataclasses.field(default_factory=_default_optim)
  advantage: str = "dr_grpo"
  advantage_eps: float = 1e-6
  zero_variance_groups: ZeroVarianceGroups = ZeroVarianceGroups.KEEP
  policy_loss: str = "ppo_clip"
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.28
  tis_cap: float = 2.0
  aggregation: str = "token_sum_constant"
  loss_constant: float = 0.0
  sequence_unit: SequenceUnit = SequenceUnit.CHAIN
  overlong: Overlong = Overlong.KEEP
  kl_estimator: str = "k1"
  kl_placement: KlPlacement = KlPlacement.IN_REWARD
  kl_coef: float = 1e-3
  filter: PlausibilityFilter = PlausibilityFilter()
  routing_replay: RoutingReplay = RoutingReplay.REPLAY
  sampling_temperature: float = 1.0
  reward: RewardConfig = RewardConfig()
  success_threshold: float = 1.0
  pass_k: tuple[int, ...] = (1, 4)
  micro_batches: int = 1

  def __post_init__(self):
    # Unknown names fail here, at config time, with the registry's list of choices.
    advantages_lib.ADVANTAGES.get(self.advantage)
    policy_loss_lib.POLICY_LOSSES.get(self.policy_loss)
    policy_loss_lib.AGGREGATIONS.get(self.aggregation)
    kl_lib.KL_ESTIMATORS.get(self.kl_estimator)
    if self.micro_batches < 1:
      raise ValueError(f"micro_batches={self.micro_batches} must be >= 1.")
    if not (0 <= self.clip_eps_low < 1 and self.clip_eps_high >= 0):
      raise ValueError(f"Clip range [1 - {self.clip_eps_low}, 1 + {self.clip_eps_high}] is empty or negative.")
    if self.tis_cap <= 0 or self.kl_coef < 0:
      raise ValueError("tis_cap must be > 0 and kl_coef >= 0.")
    object.__setattr__(self, "pass_k", tuple(int(k) for k in self.pass_k))  # hashable even if given a list
    if self.sampling_temperature <= 0:
      raise ValueError(f"sampling_temperature={self.sampling_temperature} must be > 0 (greedy rollouts have no "
                       "sampling distribution to train on).")
    if not self.pass_k or min(self.pass_k) < 1:
      raise ValueError(f"pass_k={self.pass_k} must list positive k.")

  @property
  def uses_reference(self) -> bool:
    """Whether the update needs the reference policy's log-probs (and the state its params)."""
    return self.kl_placement is not KlPlacement.NONE and self.kl_coef > 0
