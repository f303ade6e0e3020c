"""Group-relative advantage estimators, registered by name (report section 4: "Dr. GRPO").

Each estimator maps per-row rewards to per-row advantages relative to the row's prompt group. Rows of one
self-summary chain carry the chain's reward; `weight` selects one representative row per chain, so a chain counts
once in its group's statistics however many segments it has, and every segment receives the chain's advantage.

  name      A_i                                            paper
  dr_grpo   r_i - mean_g(r)                                Dr. GRPO (Liu et al. 2025, eq. 3): no std division
  grpo      (r_i - mean_g(r)) / (std_g(r) + eps)           GRPO (Shao et al. 2024), std with ddof=1 as in TRL
  rloo      r_i - mean_{g, j != i}(r_j) = n/(n-1) (r_i - mean_g(r))    RLOO (Ahmadian et al. 2024)

Shapes: reward, group_id, weight, and the result are all [N] (sequences: rows of a padded batch, c2jax/rl/batch.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from c2jax.registry import Registry

ADVANTAGES: Registry[Callable[[GroupStats, jax.Array, float], jax.Array]] = Registry("advantage estimator")


@dataclasses.dataclass(frozen=True)
class GroupStats:
  """Statistics of each row's group over the representative rows (all [B], float32).

  Attributes:
    count: n_g, the number of trajectories in the row's group.
    mean: mean_g(r).
    std: the sample standard deviation of the group's rewards (ddof=1; 0 for n_g = 1).
    zero_variance: 1 if all of the group's rewards are equal (no learning signal under any estimator here).
  """

  count: jax.Array
  mean: jax.Array
  std: jax.Array
  zero_variance: jax.Array


def group_stats(reward: ArrayLike, group_id: ArrayLike, weight: ArrayLike) -> GroupStats:
  """Per-row statistics of its group: reward, group_id, weight [B] (weight 1 on one row per trajectory)."""
  reward, group_id, weight = jnp.asarray(reward), jnp.asarray(group_id), jnp.asarray(weight)
  same = (group_id[:, None] == group_id[None, :]).astype(jnp.float32) * weight[None, :]  # [B, B]: B rows, small
  count = jnp.sum(same, axis=1)
  mean = jnp.sum(same * reward[None, :], axis=1) / jnp.maximum(count, 1.0)
  sq = jnp.sum(same * jnp.square(reward[None, :] - mean[:, None]), axis=1)
  std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
  # Exact equality, not std < eps: rewards like 0/1 outcomes are equal exactly, and a tiny nonzero spread is
  # still a signal for dr_grpo.
  lo = jnp.min(jnp.where(same > 0, reward[None, :], jnp.inf), axis=1)
  hi = jnp.max(jnp.where(same > 0, reward[None, :], -jnp.inf), axis=1)
  return GroupStats(count=count, mean=mean, std=std, zero_variance=(hi <= lo).astype(jnp.float32))


@ADVANTAGES.register("dr_grpo")
def dr_grpo(stats: GroupStats, reward: jax.Array, eps: float) -> jax.Array:
  """Dr. GRPO: A_i = r_i - mean_g(r). The report's choice: no std normalization (which up-weights groups that
  are nearly all-pass or all-fail, i.e. too easy or too hard)."""
  del eps
  return reward - stats.mean


@ADVANTAGES.register("grpo")
def grpo(stats: GroupStats, reward: jax.Array, eps: float) -> jax.Array:
  """GRPO: A_i = (r_i - mean_g(r)) / (std_g(r) + eps)."""
  return (reward - stats.mean) / (stats.std + eps)


@ADVANTAGES.register("rloo")
def rloo(stats: GroupStats, reward: jax.Array, eps: float) -> jax.Array:
  """RLOO: A_i = r_i - mean of the other n-1 rewards of the group; 0 for a group of one."""
  del eps
  n = stats.count
  return jnp.where(n > 1, n / jnp.maximum(n - 1.0, 1.0) * (reward - stats.mean), 0.0)


def advantages(name: str, reward: ArrayLike, group_id: ArrayLike, weight: ArrayLike,
               eps: float = 1e-6) -> tuple[jax.Array, GroupStats]:
  """(A [B], GroupStats) with the estimator registered as `name`.

  A group whose rewards are all equal gets exactly zero advantage: in float32 its mean can be an ulp off the
  common value, which grpo's division by (std + eps) with std = 0 would blow up into a systematic push.
  """
  reward = jnp.asarray(reward)
  stats = group_stats(reward, group_id, weight)
  adv = ADVANTAGES.get(name)(stats, reward, eps)
  return jnp.where(stats.zero_variance > 0, 0.0, adv), stats
