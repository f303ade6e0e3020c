"""Per-token policy-gradient objectives and their aggregation over tokens, registered by name (report section 4).

Per token t of row i, with the trainer's log-prob log pi_theta, the actor's sampling log-prob log mu (the
behaviour policy, stamped on the batch) and the row's advantage A_i:

  rho = exp(log pi_theta - log mu)                              importance ratio to the behaviour policy

  policy loss      per-token loss l_t                                                    gradient
  ppo_clip         -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)                   rho A grad log pi (unclipped)
  tis              -sg(min(rho, cap)) A log pi_theta                                     min(rho, cap) A grad log pi

(`sg` is stop-gradient; eps_low/eps_high are DAPO's decoupled clip range; tis is truncated importance sampling.)

Aggregation turns per-token losses into the scalar: loss = sum_{i,t} w_{i,t} l_{i,t} with weights

  token_sum_constant    w = m / C           Dr. GRPO: C a constant (default N x T: the batch's sequences times
                                            T, its padded layout's size in either layout), so a token's weight
                                            never depends on its sequence's length (the report's choice)
  token_mean            w = m / sum(m)      DAPO: every token of the batch equal
  seq_mean_token_mean   w = m / |y_u| / U   GRPO: mean over the tokens of each unit u, then over the U units

where m is the action mask. Each weight is m times a scale of its sequence, so an aggregation maps per-sequence token
counts to per-sequence scales and never sees the batch's layout (padded or packed, `c2jax.rl.batch`). For
`seq_mean_token_mean` a unit is a chain (a self-summary trajectory: its segments pooled, the chain counted once, as
GRPO's 1/G sum over outputs) or a sequence (each segment its own), see `SequenceUnit`.

Weights are computed once for the whole batch before it is split into micro-batches, so that the update does not
depend on the micro-batch size (a known trap: normalizing inside each micro-batch changes token weights).
Plausibility filtering later zeroes tokens' contributions but does not change the normalizers: they are known
before the forward pass.
"""

from __future__ import annotations

import enum
from typing import Callable

import jax
import jax.numpy as jnp

from c2jax.registry import Registry


class SequenceUnit(enum.Enum):
  """What a 'sequence' is for `seq_mean_token_mean`: a whole self-summary chain, or each of its segments (ROW: one
  row each in the padded layout)."""

  CHAIN = "chain"
  ROW = "row"


# ------------------------------------------------------------------------------------------------------------------
# Per-token objectives: (logp [B, T], behaviour_logp [B, T], advantage [B, 1] or [B, T], options) ->
# (loss [B, T], clipped [B, T] in {0, 1}).
# ------------------------------------------------------------------------------------------------------------------

POLICY_LOSSES: Registry[Callable[..., tuple[jax.Array, jax.Array]]] = Registry("policy loss")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logp: jax.Array, behaviour_logp: jax.Array, adv: jax.Array, *, eps_low: float, eps_high: float,
             tis_cap: float) -> tuple[jax.Array, jax.Array]:
  """PPO's clipped surrogate against the behaviour policy, with DAPO's separate low/high clip epsilons."""
  del tis_cap
  ratio = jnp.exp(logp - behaviour_logp)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  # The clip is active where it lowers the objective (that term's gradient is zero).
  return -jnp.minimum(unclipped, clipped), (clipped < unclipped).astype(jnp.float32)


@POLICY_LOSSES.register("tis")
def truncated_importance_sampling(logp: jax.Array, behaviour_logp: jax.Array, adv: jax.Array, *, eps_low: float,
                                  eps_high: float, tis_cap: float) -> tuple[jax.Array, jax.Array]:
  """REINFORCE with the importance ratio to the behaviour policy truncated at `tis_cap` (never clips to zero)."""
  del eps_low, eps_high
  ratio = jax.lax.stop_gradient(jnp.exp(logp - behaviour_logp))
  return -jnp.minimum(ratio, tis_cap) * adv * logp, (ratio > tis_cap).astype(jnp.float32)


# ------------------------------------------------------------------------------------------------------------------
# Aggregation scales: (tokens [N] action tokens of each sequence in the loss, unit_id [N], constant C) -> scale [N];
# a token's weight is w = m x the scale of its sequence. See the module docstring.
# ------------------------------------------------------------------------------------------------------------------

AGGREGATIONS: Registry[Callable[[jax.Array, jax.Array, float], jax.Array]] = Registry("loss aggregation")


@AGGREGATIONS.register("token_sum_constant")
def token_sum_constant(tokens: jax.Array, unit_id: jax.Array, constant: float) -> jax.Array:
  """Dr. GRPO: sum over tokens / C (the caller resolves C's default, N x T)."""
  del unit_id
  return jnp.full(tokens.shape, 1.0 / constant, jnp.float32)


@AGGREGATIONS.register("token_mean")
def token_mean(tokens: jax.Array, unit_id: jax.Array, constant: float) -> jax.Array:
  """DAPO: mean over all action tokens of the batch."""
  del unit_id, constant
  return jnp.full(tokens.shape, 1.0, jnp.float32) / jnp.maximum(jnp.sum(tokens), 1.0)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(tokens: jax.Array, unit_id: jax.Array, constant: float) -> jax.Array:
  """GRPO: per-unit token mean, then the mean over units that have any action token."""
  del constant
  same = unit_id[:, None] == unit_id[None, :]
  unit_tokens = jnp.sum(jnp.where(same, tokens[None, :], 0.0), axis=1)  # [N]: tokens of the sequence's unit
  # Units with tokens, each counted once: a sequence contributes 1 / (sequences of its unit that have tokens).
  has = (tokens > 0).astype(jnp.float32)
  unit_seqs = jnp.sum(jnp.where(same, has[None, :], 0.0), axis=1)
  n_units = jnp.sum(has / jnp.maximum(unit_seqs, 1.0))
  return 1.0 / jnp.maximum(unit_tokens, 1.0) / jnp.maximum(n_units, 1.0)
