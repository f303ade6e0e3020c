"""The pass@k and best-of-K estimators of c2jax/eval/metrics.py against their definitions (brute force over every
k-subset, sampled k-subsets)."""

import itertools

from absl.testing import absltest, parameterized
import numpy as np

from c2jax.eval.metrics import best_of_k, pass_at_k


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


if __name__ == "__main__":
  absltest.main()
