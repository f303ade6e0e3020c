"""Per-group metrics against brute force: every k-subset of every group enumerated in plain Python."""

import itertools
import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.rl import group_metrics as gm

BIG = 2**31 - 1
SMALL = -(2**31)

# Shuffled groups of sizes 4, 1, 3, 5, 2 (ids 7, BIG, -5, SMALL, 123456) with ties, plus rows that do not count:
# padding (id -1, NaN reward) and a row of a real group with weight 0 (weight is authoritative).
GROUP_ID = np.array([7, BIG, -5, 7, -1, SMALL, 123456, -5, SMALL, 7, SMALL, -1, 123456, SMALL, -5, 7, SMALL, 7],
                    np.int32)
WEIGHT = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0], np.float32)
REWARD = np.array([0.5, 0.2, 1.0, 0.0, np.nan, 0.3, 0.9, 1.0, 0.7, 0.5, 0.3, np.inf, 0.1, 0.6, 1.0, 1.0, 0.0, 9.0],
                  np.float32)
SUCCESS = REWARD >= 0.5
LENGTH = np.arange(18, dtype=np.float32) * 100.0 + 50.0


def groups_of(values, group_id, weight):
  """{id: [values of its counted rows]} in plain Python."""
  out = {}
  for v, g, w in zip(values, group_id, weight):
    if w > 0:
      out.setdefault(int(g), []).append(float(v))
  return out


def exact_pass_at_k(successes, k):
  """P(at least one success among k drawn without replacement), by enumerating all k-subsets."""
  subsets = list(itertools.combinations(successes, k))
  return sum(any(s) for s in subsets) / len(subsets)


def exact_best_of_k(rewards, k):
  """E[max of k drawn without replacement], by enumerating all k-subsets."""
  subsets = list(itertools.combinations(rewards, k))
  return sum(max(s) for s in subsets) / len(subsets)


def reference(values, group_id, weight, k, estimator):
  per_group = [estimator(v, k) for v in groups_of(values, group_id, weight).values() if len(v) >= k]
  return (sum(per_group) / len(per_group) if per_group else 0.0), len(per_group)


def random_batch(seed, n_groups=6, max_size=6, rows=40):
  """Shuffled groups of random sizes and large (some negative) ids, padded to `rows` rows (one shape for all
  seeds, so that each jitted function compiles once)."""
  rng = np.random.default_rng(seed)
  ids = (rng.choice(2 * 10**9, n_groups, replace=False) - 10**9).astype(np.int32)
  sizes = rng.integers(1, max_size + 1, n_groups)
  n_pad = rows - sizes.sum()
  group_id = np.concatenate([np.repeat(ids, sizes), -np.arange(1, n_pad + 1)]).astype(np.int32)
  weight = np.concatenate([np.ones(sizes.sum()), np.zeros(n_pad)]).astype(np.float32)
  reward = np.round(rng.random(group_id.shape[0]), 1).astype(np.float32)  # rounding makes ties
  perm = rng.permutation(group_id.shape[0])
  return group_id[perm], weight[perm], reward[perm]


_pass_at_k = jax.jit(gm.pass_at_k, static_argnames="k")
_best_of_k = jax.jit(gm.best_of_k, static_argnames="k")
_group_reward_stats = jax.jit(gm.group_reward_stats)
_length_by_outcome = jax.jit(gm.length_by_outcome)


class PassAtKTest(parameterized.TestCase):

  @parameterized.parameters(1, 2, 3, 5)
  def test_matches_subset_enumeration(self, k):
    got = _pass_at_k(SUCCESS, GROUP_ID, WEIGHT, k=k)
    want, n = reference(SUCCESS, GROUP_ID, WEIGHT, k, exact_pass_at_k)
    self.assertEqual(float(got.groups), n)
    np.testing.assert_allclose(float(got.value), want, rtol=1e-6, atol=1e-7)

  def test_hand_computed(self):
    # Groups (n, c): 7 -> (4, 3), BIG -> (1, 0), -5 -> (3, 3), SMALL -> (5, 2), 123456 -> (2, 1). At k = 2 the
    # group of one is left out; 1 - C(n - c, 2) / C(n, 2) = 1, 1, 1 - 3/10, 1.
    got = _pass_at_k(SUCCESS, GROUP_ID, WEIGHT, k=2)
    self.assertEqual(float(got.groups), 4.0)
    np.testing.assert_allclose(float(got.value), (1 + 1 + 7 / 10 + 1) / 4, rtol=1e-6)

  @parameterized.parameters(0, 1, 2, 3)
  def test_random_batches(self, seed):
    group_id, weight, reward = random_batch(seed)
    success = reward > 0.6
    for k in (1, 3):
      got = _pass_at_k(success.astype(np.float32), group_id, weight, k=k)
      want, n = reference(success, group_id, weight, k, exact_pass_at_k)
      self.assertEqual(float(got.groups), n)
      np.testing.assert_allclose(float(got.value), want, rtol=1e-6, atol=1e-7)

  def test_exactly_one_when_fewer_failures_than_k(self):
    group_id = np.array([3, 3, 3, 9, 9, 9, 9, -1], np.int32)
    success = np.array([1, 1, 0, 0, 1, 1, 0, 0], np.float32)  # n - c = 1 and 2 failures
    weight = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32)
    got = _pass_at_k(success, group_id, weight, k=3)
    self.assertEqual(float(got.value), 1.0)
    self.assertEqual(float(got.groups), 2.0)

  def test_large_group_is_exact(self):
    # n = 200 and k = 50: products of ratios, not float32 lgamma differences.
    n, c, k = 200, 3, 50
    success = np.zeros(n, np.float32)
    success[:c] = 1.0
    got = _pass_at_k(success, np.zeros(n, np.int32), np.ones(n, np.float32), k=k)
    np.testing.assert_allclose(float(got.value), 1 - math.comb(n - c, k) / math.comb(n, k), rtol=1e-6)

  def test_no_group_large_enough(self):
    got = _pass_at_k(SUCCESS, GROUP_ID, WEIGHT, k=6)  # the largest group has 5
    self.assertEqual((float(got.value), float(got.groups)), (0.0, 0.0))

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "k must be a Python int >= 1"):
      gm.pass_at_k(SUCCESS, GROUP_ID, WEIGHT, k=0)
    with self.assertRaisesRegex(ValueError, "one shape"):
      gm.pass_at_k(SUCCESS[:-1], GROUP_ID, WEIGHT, k=1)


class BestOfKTest(parameterized.TestCase):

  @parameterized.parameters(1, 2, 3, 5)
  def test_matches_subset_enumeration(self, k):
    got = _best_of_k(REWARD, GROUP_ID, WEIGHT, k=k)
    want, n = reference(REWARD, GROUP_ID, WEIGHT, k, exact_best_of_k)
    self.assertEqual(float(got.groups), n)
    np.testing.assert_allclose(float(got.value), want, rtol=1e-6)

  @parameterized.parameters(0, 1, 2, 3)
  def test_random_batches(self, seed):
    group_id, weight, reward = random_batch(seed + 10)
    for k in (1, 2, 3):
      got = _best_of_k(reward, group_id, weight, k=k)
      want, n = reference(reward, group_id, weight, k, exact_best_of_k)
      self.assertEqual(float(got.groups), n)
      np.testing.assert_allclose(float(got.value), want, rtol=1e-6)

  def test_k1_is_mean_and_k_n_is_max(self):
    # Padded to the random batches' 40 rows to reuse their compilations.
    group_id = np.pad(np.array([4, 8, 4, 8, 4], np.int32), (0, 35), constant_values=-1)
    reward = np.pad(np.array([0.2, -1.0, 0.8, 3.0, 0.5], np.float32), (0, 35), constant_values=np.nan)
    weight = np.pad(np.ones(5, np.float32), (0, 35))
    np.testing.assert_allclose(float(_best_of_k(reward, group_id, weight, k=1).value), (0.5 + 1.0) / 2, rtol=1e-6)
    got = _best_of_k(reward, group_id, weight, k=2)
    np.testing.assert_allclose(float(got.value), (exact_best_of_k([0.2, 0.8, 0.5], 2) + 3.0) / 2, rtol=1e-6)
    got = _best_of_k(reward, group_id, weight, k=3)
    self.assertEqual((float(got.value), float(got.groups)), (float(np.float32(0.8)), 1.0))

  def test_order_of_rows_does_not_matter(self):
    perm = np.random.default_rng(0).permutation(GROUP_ID.shape[0])
    a = _best_of_k(REWARD, GROUP_ID, WEIGHT, k=3)
    b = _best_of_k(REWARD[perm], GROUP_ID[perm], WEIGHT[perm], k=3)
    chex.assert_trees_all_close(a, b, rtol=1e-6)

  def test_at_least_mean_reward(self):
    # The maximum of k draws is never below one draw: best-of-k rises with k.
    group_id, weight, reward = random_batch(7)
    weight = np.where(np.isin(group_id, [g for g, v in groups_of(reward, group_id, weight).items() if len(v) >= 3]),
                      1.0, 0.0).astype(np.float32)  # the same groups at every k
    values = [float(_best_of_k(reward, group_id, weight, k=k).value) for k in (1, 2, 3)]
    self.assertTrue(np.all(np.diff(values) >= -1e-6), msg=str(values))


class GroupRewardStatsTest(parameterized.TestCase):

  def test_hand_made_batch(self):
    got = _group_reward_stats(REWARD, GROUP_ID, WEIGHT)
    groups = groups_of(REWARD, GROUP_ID, WEIGHT)
    counted = [v for vs in groups.values() for v in vs]
    zero_var = sum(len(set(v)) == 1 for v in groups.values())  # -5: all 1.0; BIG: a group of one
    self.assertEqual(zero_var, 2)
    self.assertEqual(float(got["groups"]), 5.0)
    self.assertEqual(float(got["zero_variance_groups"]), 2.0)
    np.testing.assert_allclose(float(got["zero_variance_fraction"]), 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(float(got["mean_reward"]), np.mean(counted), rtol=1e-6)

  @parameterized.parameters(0, 1, 2)
  def test_random_batches(self, seed):
    group_id, weight, reward = random_batch(seed + 20, n_groups=12, max_size=3)
    reward = (reward > 0.5).astype(np.float32)  # 0/1 outcomes: many groups all-pass or all-fail
    got = _group_reward_stats(reward, group_id, weight)
    groups = groups_of(reward, group_id, weight)
    self.assertEqual(float(got["groups"]), len(groups))
    self.assertEqual(float(got["zero_variance_groups"]), sum(len(set(v)) == 1 for v in groups.values()))

  def test_empty(self):
    got = _group_reward_stats(REWARD, GROUP_ID, np.zeros_like(WEIGHT))
    self.assertEqual({k: float(v) for k, v in got.items()},
                     {"groups": 0.0, "zero_variance_groups": 0.0, "zero_variance_fraction": 0.0, "mean_reward": 0.0})


class LengthByOutcomeTest(absltest.TestCase):

  def test_means_and_counts(self):
    got = _length_by_outcome(LENGTH, SUCCESS, WEIGHT)
    counted = WEIGHT > 0
    wins, losses = LENGTH[counted & SUCCESS], LENGTH[counted & ~SUCCESS]
    self.assertEqual(float(got["success_count"]), len(wins))
    self.assertEqual(float(got["failure_count"]), len(losses))
    np.testing.assert_allclose(float(got["mean_length_success"]), wins.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(got["mean_length_failure"]), losses.mean(), rtol=1e-6)

  def test_no_failures(self):
    lengths = np.full(18, np.nan, np.float32)
    lengths[[2, 5]] = [10.0, 30.0]
    weight = np.zeros(18, np.float32)
    weight[[2, 5]] = 1.0
    got = _length_by_outcome(lengths, np.arange(18) < 9, weight)
    self.assertEqual({k: float(v) for k, v in got.items()},
                     {"mean_length_success": 20.0, "mean_length_failure": 0.0, "success_count": 2.0,
                      "failure_count": 0.0})


class JitTest(absltest.TestCase):

  def test_all_in_one_jit(self):
    @jax.jit
    def metrics(reward, group_id, weight):
      success = reward >= 0.5
      return {"pass@2": gm.pass_at_k(success, group_id, weight, 2), "best@3": gm.best_of_k(reward, group_id,
                                                                                            weight, 3),
              **gm.group_reward_stats(reward, group_id, weight), **gm.length_by_outcome(reward, success, weight)}

    got = metrics(jnp.asarray(REWARD), jnp.asarray(GROUP_ID), jnp.asarray(WEIGHT))
    self.assertTrue(all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(got)))
    want, _ = reference(REWARD, GROUP_ID, WEIGHT, 3, exact_best_of_k)
    np.testing.assert_allclose(float(got["best@3"].value), want, rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
