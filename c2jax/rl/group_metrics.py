"""Per-prompt-group metrics read off every training batch for free (report section 4).

Each RL batch already holds G samples of each prompt, so the estimators that an evaluation would compute come at
no extra cost: the report follows both mean reward and best-of-K through RL, and they rise together. The
unbiased estimators here draw k of a group's n samples without replacement:

  pass@k     = 1 - C(n - c, k) / C(n, k)                       (Chen et al. 2021; c successes among n)
  best-of-k  = sum_i r_(i) C(i - 1, k - 1) / C(n, k)            (r_(1) <= ... <= r_(n), i 1-based): E[max of k]

Inputs are per-row arrays [B] with `group_id [B]` (any int32 ids, in any order; groups may differ in size) and
`weight [B]` in {0, 1} selecting the rows that count: one representative row per trajectory, 0 on padding. The
weight is authoritative: a row of weight 0 belongs to no group whatever its id (padding rows have group_id < 0).

Everything is jnp with static shapes (groups live in B segments), so it jits inside the update step; `k` is a
Python int (static).

These are the training-time form of evaluation's estimators: the one numpy pass@k / best-of-K, per task on the host
with exact integer binomials, is `c2jax.eval.metrics`, and tests/eval/metrics_test.py holds the two equal. They share
no code on purpose: `rl` sits below `eval` in the layer order, and the form here (float32 products over sorted
segments, static shapes) is what a jitted update needs, not what a host-side evaluation of a few tasks does.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


class GroupEstimate(NamedTuple):
  """A mean over the groups that qualify and how many did (float32 scalars; the mean is 0 when none did)."""

  value: jax.Array
  groups: jax.Array


@dataclasses.dataclass(frozen=True)
class _Groups:
  """The batch's rows sorted by (counted first, group id, value), and its groups as segments 0..B-1.

  Per sorted row p ([B]): `value`, `valid` (float32 0/1), `segment` (its group's index), `rank` (0-based position
  of its value within its group, ascending). Per segment s ([B]): `size` n_s (0 for segments no group uses).
  `count`: the number of groups (float32 scalar).
  """

  value: jax.Array
  valid: jax.Array
  segment: jax.Array
  rank: jax.Array
  size: jax.Array
  count: jax.Array


def _groups(group_id: ArrayLike, weight: ArrayLike, value: jax.Array) -> _Groups:
  group_id, weight = jnp.asarray(group_id), jnp.asarray(weight)
  b = group_id.shape[0]
  valid = weight > 0
  # Rows that do not count sort last whatever their id, so that they never split or join a group; within a
  # group, values ascend, which gives each row its rank (ties in any order: tied values are interchangeable).
  order = jnp.lexsort((value, group_id, (~valid).astype(jnp.int32)))
  gid, valid = group_id[order], valid[order]
  value = jnp.where(valid, value[order], 0.0)  # padding may hold garbage (inf, NaN), which 0 * x would spread
  pos = jnp.arange(b)
  starts = valid & jnp.concatenate([jnp.ones((1,), bool), gid[1:] != gid[:-1]])
  segment = jnp.maximum(jnp.cumsum(starts) - 1, 0)  # uncounted rows join the last group but add nothing to it
  start = jax.ops.segment_min(jnp.where(valid, pos, b), segment, num_segments=b)
  validf = valid.astype(jnp.float32)
  size = jax.ops.segment_sum(validf, segment, num_segments=b)
  return _Groups(value=value, valid=validf, segment=segment, rank=jnp.maximum(pos - start[segment], 0), size=size,
                 count=jnp.sum(starts).astype(jnp.float32))


def _check(k: int, *rows: ArrayLike) -> None:
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be a Python int >= 1 (it is static); got {k!r}.")
  shapes = {tuple(jnp.shape(r)) for r in rows}
  if len(shapes) != 1 or len(next(iter(shapes))) != 1:
    raise ValueError(f"Group metrics take per-row arrays of one shape [B]; got shapes {sorted(shapes)}.")


def _mean_over(values: jax.Array, counted: jax.Array) -> GroupEstimate:
  n = jnp.sum(counted)
  return GroupEstimate(value=jnp.sum(jnp.where(counted > 0, values, 0.0)) / jnp.maximum(n, 1.0), groups=n)


def pass_at_k(success: ArrayLike, group_id: ArrayLike, weight: ArrayLike, k: int) -> GroupEstimate:
  """Mean over groups of the unbiased pass@k estimator 1 - C(n - c, k) / C(n, k) (Chen et al. 2021); per task on the
  host: `c2jax.eval.metrics.pass_at_k`.

  C(n - c, k) / C(n, k) = prod_{j < k} (n - c - j) / (n - j): a product of k ratios in [0, 1], exact where
  lgamma differences would lose digits in float32, and exactly 0 (pass@k = 1) when n - c < k.

  Args:
    success: [B] bool, or float read as success where > 0.5 (for a fraction-of-tests outcome pass
      `outcome == 1`).
    group_id: [B] int the prompt group of each row.
    weight: [B] 1 on the rows that count (one per trajectory), 0 elsewhere.
    k: samples drawn per group (static).

  Returns:
    GroupEstimate(value, groups): the mean over groups with n >= k, and the number of those groups; groups with
    n < k have no unbiased estimate and are left out.
  """
  _check(k, success, group_id, weight)
  s = (jnp.asarray(success) > 0.5).astype(jnp.float32)
  g = _groups(group_id, weight, s)
  n = g.size
  c = jax.ops.segment_sum(g.value, g.segment, num_segments=n.shape[0])
  j = jnp.arange(k, dtype=jnp.float32)
  ratios = jnp.maximum(n[:, None] - c[:, None] - j, 0.0) / jnp.maximum(n[:, None] - j, 1.0)  # [B segments, k]
  return _mean_over(1.0 - jnp.prod(ratios, axis=1), (n >= k).astype(jnp.float32))


def best_of_k(reward: ArrayLike, group_id: ArrayLike, weight: ArrayLike, k: int) -> GroupEstimate:
  """Mean over groups of the unbiased estimator of E[max of k rewards drawn without replacement from the group]; per
  task on the host: `c2jax.eval.metrics.best_of_k`.

  With the group's n rewards ascending, r_(i) is the maximum of C(i - 1, k - 1) of the C(n, k) subsets, so the
  estimate is sum_i r_(i) C(i - 1, k - 1) / C(n, k); the coefficient is (k / n) prod_{j < k-1} (i-1-j) / (n-1-j).
  k = 1 gives the group mean, k = n its maximum.

  Args:
    reward: [B] float the trajectory's reward.
    group_id: [B] int the prompt group of each row.
    weight: [B] 1 on the rows that count (one per trajectory), 0 elsewhere.
    k: samples drawn per group (static).

  Returns:
    GroupEstimate(value, groups): the mean over groups with n >= k, and the number of those groups.
  """
  _check(k, reward, group_id, weight)
  g = _groups(group_id, weight, jnp.asarray(reward, jnp.float32))
  n_row = g.size[g.segment]
  i_minus_1 = g.rank.astype(jnp.float32)
  j = jnp.arange(k - 1, dtype=jnp.float32)
  ratios = jnp.maximum(i_minus_1[:, None] - j, 0.0) / jnp.maximum(n_row[:, None] - 1.0 - j, 1.0)  # [B, k - 1]
  coef = k / jnp.maximum(n_row, 1.0) * jnp.prod(ratios, axis=1)
  per_group = jax.ops.segment_sum(coef * g.value, g.segment, num_segments=g.size.shape[0])
  return _mean_over(per_group, (g.size >= k).astype(jnp.float32))


def group_reward_stats(reward: ArrayLike, group_id: ArrayLike, weight: ArrayLike) -> dict[str, jax.Array]:
  """How many groups carry a learning signal: under group-relative advantages a group whose rewards are all equal
  (all pass, all fail) contributes nothing.

  Args:
    reward: [B] float the trajectory's reward.
    group_id: [B] int the prompt group of each row.
    weight: [B] 1 on the rows that count (one per trajectory), 0 elsewhere.

  Returns:
    float32 scalars: "groups" (number of groups), "zero_variance_groups" (groups whose rewards are all exactly
    equal, groups of one included), "zero_variance_fraction" (0 with no groups), "mean_reward" (over the
    counted rows; 0 with none).
  """
  _check(1, reward, group_id, weight)
  reward = jnp.asarray(reward, jnp.float32)
  g = _groups(group_id, weight, reward)
  b = g.size.shape[0]
  lo = jax.ops.segment_min(jnp.where(g.valid > 0, g.value, jnp.inf), g.segment, num_segments=b)
  hi = jax.ops.segment_max(jnp.where(g.valid > 0, g.value, -jnp.inf), g.segment, num_segments=b)
  zero_var = jnp.sum(((g.size > 0) & (hi <= lo)).astype(jnp.float32))
  w = (jnp.asarray(weight) > 0).astype(jnp.float32)
  return {
      "groups": g.count,
      "zero_variance_groups": zero_var,
      "zero_variance_fraction": zero_var / jnp.maximum(g.count, 1.0),
      "mean_reward": jnp.sum(jnp.where(w > 0, reward, 0.0)) / jnp.maximum(jnp.sum(w), 1.0),
  }


def length_by_outcome(lengths: ArrayLike, success: ArrayLike, weight: ArrayLike) -> dict[str, jax.Array]:
  """Mean length of successful and of unsuccessful trajectories: whether the length penalty shortens the easy
  wins while the failures keep thinking (report section 4).

  Args:
    lengths: [B] the trajectory's response tokens.
    success: [B] bool, or float read as success where > 0.5.
    weight: [B] 1 on the rows that count (one per trajectory), 0 elsewhere.

  Returns:
    float32 scalars: "mean_length_success", "mean_length_failure" (0 when there are none), "success_count",
    "failure_count".
  """
  _check(1, lengths, success, weight)
  lengths = jnp.asarray(lengths, jnp.float32)
  w = (jnp.asarray(weight) > 0).astype(jnp.float32)
  s = (jnp.asarray(success) > 0.5).astype(jnp.float32) * w
  f = w - s
  n_s, n_f = jnp.sum(s), jnp.sum(f)
  return {
      "mean_length_success": jnp.sum(jnp.where(s > 0, lengths, 0.0)) / jnp.maximum(n_s, 1.0),
      "mean_length_failure": jnp.sum(jnp.where(f > 0, lengths, 0.0)) / jnp.maximum(n_f, 1.0),
      "success_count": n_s,
      "failure_count": n_f,
  }
