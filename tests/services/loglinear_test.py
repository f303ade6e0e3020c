"""The log-linear fits of c2jax/services/loglinear.py: perplexity against compute, reward against perplexity."""

import math

from absl.testing import absltest
import numpy as np

from c2jax.services import loglinear


class PerplexityFitTest(absltest.TestCase):

  def test_recovers_a_power_law_and_leaves_out_x_zero(self):
    records = [{"flops": 0.0, "heldout_ce": 9.0, "phase": "bulk"}]  # step 0: ln(0) is no point of the line
    records += [{"flops": x, "heldout_ce": 5.0 - 0.25 * math.log(x), "phase": "bulk"} for x in (1e3, 1e4, 1e5, 1e6)]
    fit = loglinear.fit(records, x="flops")
    self.assertEqual(fit.points, 4)
    self.assertAlmostEqual(fit.slope, -0.25, places=10)
    self.assertAlmostEqual(fit.intercept, 5.0, places=9)
    self.assertAlmostEqual(fit.r2, 1.0, places=12)
    self.assertAlmostEqual(fit.ppl_ratio_per_10x, 10 ** -0.25, places=10)
    self.assertAlmostEqual(fit.predict_ppl(1e4), math.exp(5.0 - 0.25 * math.log(1e4)), places=9)

  def test_phases_select_points_and_too_few_give_none(self):
    records = [{"step": s, "heldout_ce": 3.0, "phase": p} for s, p in ((1, "a"), (2, "a"), (3, "b"), (4, "b"))]
    self.assertIsNone(loglinear.fit(records, x="step", phases=["a"]))
    with self.assertRaisesRegex(ValueError, "x='bytes'"):
      loglinear.fit(records, x="bytes")


class RewardFitTest(absltest.TestCase):

  def test_matches_numpys_least_squares_on_ln_perplexity(self):
    rng = np.random.default_rng(0)
    ppl = np.geomspace(10.0, 500.0, 7)
    reward = 0.9 - 0.1 * np.log(ppl) + rng.normal(0, 0.01, ppl.size)
    fit = loglinear.fit_reward(list(zip(ppl, reward)))
    slope, intercept = np.polyfit(np.log(ppl), reward, 1)
    self.assertAlmostEqual(fit.slope, slope, places=10)
    self.assertAlmostEqual(fit.intercept, intercept, places=10)
    residual = reward - (intercept + slope * np.log(ppl))
    self.assertAlmostEqual(fit.r2, 1 - np.sum(residual ** 2) / np.sum((reward - reward.mean()) ** 2), places=10)
    self.assertAlmostEqual(fit.per_halving, -slope * math.log(2), places=10)
    self.assertEqual(fit.ppl_range, (10.0, 500.0))
    self.assertAlmostEqual(fit.predict(50.0), intercept + slope * math.log(50.0), places=10)

  def test_needs_three_finite_points_at_two_perplexities(self):
    self.assertIsNone(loglinear.fit_reward([(10.0, 0.1), (20.0, 0.2)]))
    self.assertIsNone(loglinear.fit_reward([(10.0, 0.1), (20.0, math.nan), (40.0, 0.3)]))
    self.assertIsNone(loglinear.fit_reward([(10.0, 0.1), (10.0, 0.2), (10.0, 0.3)]))  # one perplexity, seeds apart

  def test_a_flat_reward_has_no_r2(self):
    fit = loglinear.fit_reward([(10.0, 0.0), (20.0, 0.0), (40.0, 0.0)])
    self.assertAlmostEqual(fit.slope, 0.0, places=12)
    self.assertTrue(math.isnan(fit.r2))


if __name__ == "__main__":
  absltest.main()
