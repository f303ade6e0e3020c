"""Reward composition and the nonlinear length penalty against direct float64 formulas and their limits."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from c2jax import typed_config
from c2jax.rl import rewards

X = np.array([0.0, 1e-7, 1e-4, 9.9e-4, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 7.5, 30.0, 200.0], np.float32)


def direct(x, k, q):
  """C_{k,q}(x) as the report writes it, in float64 (accurate away from k = 0 and q = 1)."""
  x = np.asarray(x, np.float64)
  return ((1.0 + k * x) ** (1.0 - q) - 1.0) / (k * (1.0 - q))


def slope(x, k, q):
  """dC/dx = (1 + k x)^-q, from differentiating the direct formula by hand."""
  return (1.0 + k * np.asarray(x, np.float64)) ** (-q)


# Traced k and q: one compilation per shape serves every case, which keeps the tests fast.
_penalty = jax.jit(rewards.length_penalty)
_grad_x = jax.jit(jax.vmap(jax.grad(rewards.length_penalty), in_axes=(0, None, None)))


_grad_all = jax.jit(jax.grad(rewards.length_penalty, argnums=(0, 1, 2)))


def penalty(x, k, q):
  return _penalty(jnp.asarray(x, jnp.float32), jnp.float32(k), jnp.float32(q))


def grad_x(x, k, q):
  return np.asarray(_grad_x(jnp.asarray(x, jnp.float32), jnp.float32(k), jnp.float32(q)), np.float64)


class LengthPenaltyTest(parameterized.TestCase):

  @parameterized.parameters((1.0, 0.5), (2.0, 0.25), (0.3, 0.9), (1.0, 1.5), (0.5, -1.0), (4.0, 3.0), (1e-2, 0.5))
  def test_matches_direct_formula_away_from_limits(self, k, q):
    got = np.asarray(penalty(X, k, q), np.float64)
    np.testing.assert_allclose(got, direct(X, k, q), rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(grad_x(X, k, q), slope(X, k, q), rtol=2e-6)

  @parameterized.parameters(1.0, 1.0 - 1e-7, 1.0 + 1e-7, 1.0 - 1e-4, 1.0 + 1e-4)
  def test_q_near_one_is_logarithmic(self, q):
    k = 1.5
    x64 = X.astype(np.float64)
    got = np.asarray(penalty(X, k, q), np.float64)
    log_limit = np.log1p(k * x64) / k
    # Exact value near q = 1 from the series in (1 - q): C = L/k (1 + a/2 + a^2/6), a = (1 - q) log1p(k x).
    a = (1.0 - q) * np.log1p(k * x64)
    exact = log_limit * (1.0 + a / 2.0 + a * a / 6.0)
    np.testing.assert_allclose(got, exact, rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(got, log_limit, rtol=abs(1.0 - q) * 4.0 + 2e-6, atol=1e-12)
    np.testing.assert_allclose(grad_x(X, k, q), slope(X, k, q), rtol=2e-6)
    # Python floats, as a static config passes them (1 - q is then formed in float64).
    np.testing.assert_allclose(np.asarray(rewards.length_penalty(X, k, q), np.float64), exact, rtol=2e-6, atol=1e-12)

  @parameterized.parameters((0.0, 0.5), (1e-9, 0.5), (0.0, 1.0), (1e-9, 1.0), (0.0, 3.0), (1e-9, 1.0 + 1e-7),
                            (1e-30, 0.5))
  def test_small_k_is_linear(self, k, q):
    got = np.asarray(penalty(X, k, q), np.float64)
    np.testing.assert_allclose(got, X.astype(np.float64), rtol=1e-6, atol=0)
    np.testing.assert_allclose(grad_x(X, k, q), np.ones_like(X), rtol=1e-6)

  def test_zero_length_is_zero(self):
    for k, q in [(0.0, 1.0), (1.0, 0.5), (3.0, 2.0)]:
      self.assertEqual(float(penalty(0.0, k, q)), 0.0)

  @parameterized.parameters((0.0, 1.0), (1e-9, 1.0), (1.0, 1.0), (0.0, 0.5), (1.0, 1.0 - 1e-7))
  def test_gradients_finite_and_continuous_at_limits(self, k, q):
    # Gradients in every argument, with k and q traced, at x = 0 and beyond: finite everywhere.
    for x in [0.0, 1e-5, 0.7, 20.0]:
      gx, gk, gq = _grad_all(jnp.float32(x), jnp.float32(k), jnp.float32(q))
      self.assertTrue(np.all(np.isfinite([gx, gk, gq])), msg=f"x={x} k={k} q={q}: {gx} {gk} {gq}")
    # Continuity across the limits: nudging k or q moves the slope only as much as (1 + k x)^-q moves.
    at_limit = grad_x(X, k, q)
    np.testing.assert_allclose(at_limit, slope(X, k, q), rtol=2e-6)
    for dk, dq in [(1e-6, 0.0), (0.0, 1e-6), (0.0, -1e-6), (1e-6, 1e-6)]:
      nudged = grad_x(X, k + dk, q + dq)
      np.testing.assert_allclose(nudged, slope(X, k + dk, q + dq), rtol=2e-6)
      moved = np.abs(slope(X, k + dk, q + dq) - slope(X, k, q))
      self.assertTrue(np.all(np.abs(nudged - at_limit) <= moved + 2e-6), msg=f"jump at dk={dk} dq={dq}")

  def test_continuous_across_series_switches(self):
    # u = k x crosses 1e-3 and a = (1 - q) log1p(u) crosses +-0.1 inside these grids.
    for k, q, xs in [(1.0, 0.5, np.linspace(9e-4, 1.1e-3, 41)), (1.0, 0.5, np.linspace(0.2, 0.23, 41)),
                     (1.0, 1.5, np.linspace(0.2, 0.23, 41))]:
      xs = xs.astype(np.float32)
      got = np.asarray(penalty(xs, k, q), np.float64)
      np.testing.assert_allclose(got, direct(xs, k, q), rtol=1e-6)
      np.testing.assert_allclose(grad_x(xs, k, q), slope(xs, k, q), rtol=1e-6)

  @parameterized.parameters((0.0, 0.5), (1.0, 0.5), (1.0, 1.0), (2.0, 3.0), (0.5, -1.0))
  def test_monotone_increasing_in_x(self, k, q):
    xs = np.linspace(0.0, 50.0, 2001, dtype=np.float32)
    c = np.asarray(penalty(xs, k, q))
    self.assertTrue(np.all(np.diff(c) >= 0), msg=f"not monotone at k={k} q={q}")
    self.assertGreater(c[-1], c[1])

  def test_concave_for_positive_q(self):
    # Easy tasks pay the most per token: the marginal cost of length falls as the chain grows.
    g = grad_x(X, 1.0, 0.5)
    self.assertTrue(np.all(np.diff(g) < 0))

  def test_jit_and_traced_k_q(self):
    x = jnp.asarray(X)
    got = jax.jit(rewards.length_penalty)(x, jnp.float32(2.0), jnp.float32(0.25))
    np.testing.assert_allclose(np.asarray(got, np.float64), direct(X, 2.0, 0.25), rtol=2e-6, atol=1e-12)
    self.assertEqual(got.dtype, jnp.float32)

  def test_negative_k_is_rejected(self):
    with self.assertRaisesRegex(ValueError, "k must be >= 0"):
      rewards.length_penalty(X, -0.1, 0.5)


def _reward_config(d):
  return typed_config.from_plain(rewards.RewardConfig(), d, "reward")


class RewardConfigTest(parameterized.TestCase):

  def test_from_plain_and_hashable(self):
    cfg = _reward_config({"weights": {"outcome": 1.0, "style": 0.1},
                                          "length_penalty": {"weight": 0.2, "k": 2, "q": 0.5}})
    self.assertEqual(cfg.weights, (("outcome", 1.0), ("style", 0.1)))
    self.assertEqual(cfg.length_penalty, rewards.LengthPenaltyConfig(weight=0.2, k=2.0, q=0.5, scale=1000.0))
    same = rewards.RewardConfig(weights=(("outcome", 1), ("style", 0.1)),
                                length_penalty=rewards.LengthPenaltyConfig(weight=0.2, k=2.0))
    self.assertEqual(hash(cfg), hash(same))
    self.assertEqual(cfg, same)
    self.assertEqual(_reward_config({}), rewards.RewardConfig())

  def test_from_a_config_dict(self):
    cd = ml_collections.ConfigDict({"weights": {"outcome": 1.0, "malformed_tool_calls": -0.5}})
    cfg = _reward_config(cd)
    self.assertEqual(dict(cfg.weights), {"outcome": 1.0, "malformed_tool_calls": -0.5})

  @parameterized.named_parameters(
      ("unknown_term", {"weights": {"outcome": 1.0, "styel": 0.1}}, "unknown reward term 'styel'; known: "),
      ("unknown_key", {"weight": {"outcome": 1.0}},
       "reward has no field 'weight'; its fields are length_penalty, weights"),
      ("unknown_lp_key", {"length_penalty": {"lambda": 1.0}}, "reward.length_penalty has no field 'lambda'"),
      ("negative_k", {"length_penalty": {"k": -1.0}}, "k must be >= 0"),
      ("negative_weight", {"length_penalty": {"weight": -0.1}}, "weight must be >= 0"),
      ("zero_scale", {"length_penalty": {"scale": 0.0}}, "scale must be > 0"),
      ("nan_weight", {"weights": {"outcome": float("nan")}}, "finite number"),
      ("duplicate", {"weights": [("outcome", 1.0), ("outcome", 2.0)]}, "'outcome' more than once"),
  )
  def test_bad_config(self, d, message):
    with self.assertRaisesRegex(ValueError, message):
      _reward_config(d)

  def test_registered_terms(self):
    self.assertEqual(rewards.REWARD_TERMS.names(),
                     ["communication", "hack_attempts", "malformed_tool_calls", "outcome", "style"])
    for name in rewards.REWARD_TERMS:
      term = rewards.REWARD_TERMS.get(name)
      self.assertEqual(term.name, name)
      self.assertNotEmpty(term.doc)


class ComposeRewardsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.terms = {
        "outcome": np.array([1.0, 0.0, 0.5, 1.0, 0.25], np.float32),
        "style": np.array([0.9, 0.1, 0.5, 0.0, 1.0], np.float32),
        "malformed_tool_calls": np.array([0.0, 3.0, 1.0, 0.0, 2.0], np.float32),
        "communication": np.array([0.3, 0.3, 0.3, 0.3, 0.3], np.float32),
    }
    self.lengths = np.array([0.0, 500.0, 1500.0, 4000.0, 12000.0], np.float32)

  def test_total_and_parts(self):
    cfg = _reward_config({
        "weights": {"outcome": 1.0, "style": 0.1, "malformed_tool_calls": -0.05},
        "length_penalty": {"weight": 0.2, "k": 2.0, "q": 0.5, "scale": 1000.0},
    })
    out = jax.jit(rewards.compose_rewards, static_argnames="cfg")(self.terms, self.lengths, cfg=cfg)
    t = {n: v.astype(np.float64) for n, v in self.terms.items()}
    x = self.lengths.astype(np.float64) / 1000.0
    penalty = (np.sqrt(1.0 + 2.0 * x) - 1.0) / (2.0 * 0.5)  # C_{2, 1/2}(x) by hand
    want = t["outcome"] + 0.1 * t["style"] - 0.05 * t["malformed_tool_calls"] - 0.2 * penalty
    np.testing.assert_allclose(out.total, want, rtol=1e-6, atol=1e-6)
    self.assertEqual(set(out.parts), {"outcome", "style", "malformed_tool_calls", "length_penalty"})
    np.testing.assert_allclose(out.parts["style"], 0.1 * t["style"], rtol=1e-6)
    np.testing.assert_allclose(out.parts["malformed_tool_calls"], -0.05 * t["malformed_tool_calls"], rtol=1e-6)
    np.testing.assert_allclose(out.parts["length_penalty"], -0.2 * penalty, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sum(np.asarray(v, np.float64) for v in out.parts.values()), out.total, atol=1e-6)
    # Unconfigured terms are logged raw but do not move the reward.
    np.testing.assert_array_equal(out.raw["communication"], self.terms["communication"])
    self.assertEqual(set(out.raw), set(self.terms))
    self.assertEqual(out.total.dtype, jnp.float32)

  def test_default_is_outcome_only(self):
    out = rewards.compose_rewards(self.terms, self.lengths, rewards.RewardConfig())
    np.testing.assert_array_equal(out.total, self.terms["outcome"])
    np.testing.assert_array_equal(out.parts["length_penalty"], np.zeros(5, np.float32))

  def test_output_is_pytree(self):
    out = rewards.compose_rewards(self.terms, self.lengths, rewards.RewardConfig())
    leaves = jax.tree.leaves(out)
    self.assertLen(leaves, 1 + 2 + len(self.terms))
    doubled = jax.tree.map(lambda v: 2 * v, out)
    self.assertIsInstance(doubled, rewards.RewardOutput)
    np.testing.assert_array_equal(doubled.total, 2 * self.terms["outcome"])

  def test_missing_configured_term(self):
    cfg = rewards.RewardConfig(weights=(("outcome", 1.0), ("communication", 0.2)))
    terms = {"outcome": self.terms["outcome"], "style": self.terms["style"]}
    with self.assertRaisesRegex(ValueError, r"'communication' has weight 0.2 but the batch reports only outcome, "
                                r"style"):
      rewards.compose_rewards(terms, self.lengths, cfg)

  def test_zero_weight_term_may_be_missing(self):
    cfg = rewards.RewardConfig(weights=(("outcome", 1.0), ("communication", 0.0)))
    out = rewards.compose_rewards({"outcome": self.terms["outcome"]}, self.lengths, cfg)
    np.testing.assert_array_equal(out.parts["communication"], np.zeros(5, np.float32))
    np.testing.assert_array_equal(out.total, self.terms["outcome"])

  def test_unknown_batch_term(self):
    terms = dict(self.terms, politeness=np.zeros(5, np.float32))
    with self.assertRaisesRegex(ValueError, "'politeness' in the batch is not registered; known: communication"):
      rewards.compose_rewards(terms, self.lengths, rewards.RewardConfig())

  def test_shape_mismatch(self):
    terms = dict(self.terms, style=np.zeros(4, np.float32))
    with self.assertRaisesRegex(ValueError, r"'style' has shape \(4,\); expected \[B\] = \(5,\)"):
      rewards.compose_rewards(terms, self.lengths, rewards.RewardConfig())

  def test_longer_chains_earn_less(self):
    cfg = rewards.RewardConfig(length_penalty=rewards.LengthPenaltyConfig(weight=0.1, k=1.0, q=0.5))
    lengths = np.array([0.0, 1000.0, 2000.0, 8000.0, 64000.0], np.float32)
    out = rewards.compose_rewards({"outcome": np.ones(5, np.float32)}, lengths, cfg)
    self.assertEqual(float(out.total[0]), 1.0)
    self.assertTrue(np.all(np.diff(np.asarray(out.total)) < 0))
    # Concave: the second 1000 tokens cost less than the first.
    chex.assert_scalar_positive(float((out.total[0] - out.total[1]) - (out.total[1] - out.total[2])))
    self.assertAlmostEqual(float(out.total[1]), 1.0 - 0.1 * (math.sqrt(2.0) - 1.0) / 0.5, places=6)


if __name__ == "__main__":
  absltest.main()
