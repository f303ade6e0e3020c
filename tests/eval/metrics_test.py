"""The pass@k and best-of-K estimators of c2jax/eval/metrics.py against their definitions (brute force over every
k-subset, sampled k-subsets), and against the RL update's on-device form of them (c2jax/rl/group_metrics.py)."""

import itertools

from absl.testing import absltest, parameterized
import numpy as np

from c2jax.eval.metrics import best_of_k, pass_at_k, summary
from c2jax.rl import group_metrics


def brute_best_of_k(outcomes, k):
  return float(np.mean([max(s) for s in itertools.combinations(outcomes, k)]))


class BestOfKTest(parameterized.TestCase):

  @parameterized.parameters(*[(n, k, seed) for n in (1, 3, 8, 10) for k in (1, 2, 3, 8) for seed in (0, 1) if k <= n])
  def test_is_the_mean_max_over_all_k_subsets(self, n, k, seed):
    rng = np.random.default_rng(seed)
    outcomes = rng.choice([0.0, 0.25, 0.5, 1.0], size=n)  # partial credit, ties included
    self.assertAlmostEqual(best_of_k(outcomes, k), brute_best_of_k(outcomes, k), places=12)

  def test_k_equal_n_is_the_maximum_and_k_one_the_mean(self):
    o = [0.3, 0.0, 0.9, 0.5]
    self.assertAlmostEqual(best_of_k(o, 4), 0.9)
    self.assertAlmostEqual(best_of_k(o, 1), np.mean(o))

  @parameterized.parameters((16, 0, 8), (16, 5, 8), (16, 16, 8), (8, 3, 1), (9, 8, 4))
  def test_on_pass_fail_outcomes_it_is_pass_at_k(self, n, c, k):
    outcomes = [1.0] * c + [0.0] * (n - c)
    self.assertAlmostEqual(best_of_k(outcomes, k), pass_at_k(n, c, k), places=12)

  @parameterized.parameters(0, 5)
  def test_bad_k_is_refused(self, k):
    with self.assertRaisesRegex(ValueError, "1 <= k <= samples"):
      best_of_k([0.0, 1.0, 0.5, 0.5], k)


class PassAtKTest(absltest.TestCase):

  def test_pass_at_k_is_the_unbiased_estimator(self):
    rng = np.random.default_rng(0)
    # Against the definition: the chance that a random k-subset of the n samples holds a passing one.
    for n, c, k in [(8, 0, 1), (8, 3, 1), (8, 3, 4), (8, 8, 8), (5, 1, 5)]:
      outcomes = np.array([1] * c + [0] * (n - c))
      draws = [outcomes[rng.permutation(n)[:k]].any() for _ in range(20000)]
      self.assertAlmostEqual(pass_at_k(n, c, k), float(np.mean(draws)), delta=0.015)
    with self.assertRaises(ValueError):
      pass_at_k(4, 1, 5)


class SummaryTest(absltest.TestCase):

  def test_the_figures_of_an_outcome_matrix(self):
    outcome = np.array([[1.0, 0.0, 0.5, 1.0], [0.0, 0.0, 0.25, 0.0]])  # 2 tasks x 4 samples, partial credit
    r = summary(outcome, success_threshold=1.0, pass_k=(1, 2, 8))  # k = 8 > samples is left out
    self.assertEqual(set(r), {"pass@1", "pass@2", "best_of_1", "best_of_2", "best_of_4", "reward/mean", "tasks",
                              "samples"})
    self.assertAlmostEqual(r["pass@1"], np.mean([pass_at_k(4, 2, 1), pass_at_k(4, 0, 1)]))
    self.assertAlmostEqual(r["pass@2"], np.mean([pass_at_k(4, 2, 2), 0.0]))
    self.assertAlmostEqual(r["best_of_4"], np.mean([1.0, 0.25]))
    self.assertAlmostEqual(r["reward/mean"], outcome.mean())
    self.assertEqual((r["tasks"], r["samples"]), (2, 4))


class GroupMetricsAgreeTest(parameterized.TestCase):
  """The RL update's per-group estimators (jnp, float32) and these (numpy, exact) are one formula."""

  @parameterized.parameters(1, 2, 3, 5)
  def test_pass_at_k_and_best_of_k_agree(self, k):
    rng = np.random.default_rng(k)
    sizes = [5, 7, 3, 6]  # groups of different sizes; those with n < k have no estimate in either
    group_id = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    reward = rng.choice([0.0, 0.25, 0.5, 1.0], size=len(group_id)).astype(np.float32)
    weight = np.ones(len(group_id), np.float32)
    groups = [reward[group_id == g] for g in range(len(sizes)) if sizes[g] >= k]
    got = group_metrics.pass_at_k(reward >= 1.0, group_id, weight, k)
    want = np.mean([pass_at_k(len(g), int((g >= 1.0).sum()), k) for g in groups])
    self.assertAlmostEqual(float(got.value), want, places=5)
    self.assertEqual(float(got.groups), len(groups))
    got = group_metrics.best_of_k(reward, group_id, weight, k)
    self.assertAlmostEqual(float(got.value), np.mean([best_of_k(g, k) for g in groups]), places=5)


if __name__ == "__main__":
  absltest.main()
