"""Each RL formula against a closed-form numpy computation on hand-made inputs: advantages, policy losses,
aggregation weights, KL estimators (values and exact expected gradients) and the plausibility filter."""

import dataclasses
import functools
import math

from absl.testing import absltest, parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.rl import advantages, batch as batch_lib, filters, kl, policy_loss
from c2jax.registry import Registry


def _np_groups(reward, group, weight):
  """Per row: (mean, sample std, count, all-equal) of its group over weighted rows, by plain python."""
  out = []
  for g in group:
    rs = [r for r, gg, w in zip(reward, group, weight) if gg == g and w > 0]
    n = len(rs)
    mean = sum(rs) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (n - 1)) if n > 1 else 0.0
    out.append((mean, std, n, float(max(rs) == min(rs))))
  return np.array(out)


class AdvantagesTest(parameterized.TestCase):
  # Three groups with uneven sizes, ids not contiguous, plus a chain of two segments (rows 6, 7: weight on one
  # row only) that must count once.
  reward = np.array([1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 0.25], np.float32)
  group = np.array([7, 3, 7, 3, 9, 9, 3, 3, 7], np.int32)
  weight = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1], np.float32)

  def test_group_stats(self):
    stats = advantages.group_stats(jnp.asarray(self.reward), jnp.asarray(self.group), jnp.asarray(self.weight))
    want = _np_groups(self.reward, self.group, self.weight)
    np.testing.assert_allclose(stats.mean, want[:, 0], rtol=1e-6)
    np.testing.assert_allclose(stats.std, want[:, 1], rtol=1e-5)
    np.testing.assert_array_equal(stats.count, want[:, 2])
    np.testing.assert_array_equal(stats.zero_variance, want[:, 3])
    self.assertEqual(list(np.asarray(stats.zero_variance)), [0, 0, 0, 0, 1, 1, 0, 0, 0])

  @parameterized.parameters("dr_grpo", "grpo", "rloo")
  def test_estimators(self, name):
    got, _ = advantages.advantages(name, jnp.asarray(self.reward), jnp.asarray(self.group),
                                   jnp.asarray(self.weight), eps=1e-6)
    st = _np_groups(self.reward, self.group, self.weight)
    mean, std, n = st[:, 0], st[:, 1], st[:, 2]
    if name == "dr_grpo":
      want = self.reward - mean
    elif name == "grpo":
      want = (self.reward - mean) / (std + 1e-6)
    else:  # leave-one-out mean of the others, computed directly
      want = np.array([r - (mean_i * n_i - r) / (n_i - 1) if n_i > 1 else 0.0
                       for r, mean_i, n_i in zip(self.reward, mean, n)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Both segments of the chain get the chain's advantage.
    self.assertAlmostEqual(float(got[6]), float(got[7]), places=6)

  @parameterized.parameters("dr_grpo", "grpo", "rloo")
  def test_equal_rewards_give_exactly_zero(self, name):
    # 0.1 is not dyadic: the float32 mean of seven of them is an ulp off, which grpo's 1/(std + eps) would blow up.
    got, _ = advantages.advantages(name, jnp.full(7, 0.1), jnp.zeros(7, jnp.int32), jnp.ones(7))
    np.testing.assert_array_equal(got, np.zeros(7))

  @parameterized.parameters("dr_grpo", "grpo", "rloo")
  def test_numpy_inputs_are_array_like(self, name):
    """The entry points take ArrayLike: numpy rows give the jax rows' advantages and statistics bit for bit."""
    from_np = advantages.advantages(name, self.reward, self.group, self.weight)
    from_jax = advantages.advantages(name, jnp.asarray(self.reward), jnp.asarray(self.group),
                                     jnp.asarray(self.weight))
    chex.assert_trees_all_equal((from_np[0], dataclasses.asdict(from_np[1])),
                                (from_jax[0], dataclasses.asdict(from_jax[1])))
    chex.assert_trees_all_equal(kl.kl_estimate("k3", self.reward - 1.0, self.reward),
                                kl.kl_estimate("k3", jnp.asarray(self.reward - 1.0), jnp.asarray(self.reward)))

  def test_unknown_name_lists_choices(self):
    with self.assertRaisesRegex(ValueError, "Unknown advantage estimator 'ppo'; known: dr_grpo, grpo, rloo"):
      advantages.advantages("ppo", jnp.zeros(2), jnp.zeros(2, jnp.int32), jnp.ones(2))


class PolicyLossTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    self.logp = np.log(rng.uniform(0.05, 0.9, (3, 5))).astype(np.float32)
    self.blogp = (self.logp + rng.normal(0, 0.4, (3, 5))).astype(np.float32)
    self.adv = np.array([[1.5], [-0.7], [0.0]], np.float32)

  def test_ppo_clip_value_and_grad(self):
    fn = functools.partial(policy_loss.ppo_clip, eps_low=0.2, eps_high=0.28, tis_cap=2.0)
    loss, clipped = fn(jnp.asarray(self.logp), jnp.asarray(self.blogp), jnp.asarray(self.adv))
    ratio = np.exp(self.logp - self.blogp)
    want = -np.minimum(ratio * self.adv, np.clip(ratio, 0.8, 1.28) * self.adv)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-7)
    active = np.clip(ratio, 0.8, 1.28) * self.adv < ratio * self.adv
    np.testing.assert_array_equal(clipped, active.astype(np.float32))
    self.assertTrue(active.any() and (~active).any())  # the inputs exercise both branches
    grad = jax.grad(lambda lp: jnp.sum(fn(lp, jnp.asarray(self.blogp), jnp.asarray(self.adv))[0]))(
        jnp.asarray(self.logp))
    # d/dlogp of -rho A is -rho A where the clip is inactive, 0 where active.
    np.testing.assert_allclose(grad, np.where(active, 0.0, -ratio * self.adv), rtol=1e-5, atol=1e-7)

  def test_tis_grad(self):
    fn = functools.partial(policy_loss.truncated_importance_sampling, eps_low=0.2, eps_high=0.2, tis_cap=1.2)
    ratio = np.exp(self.logp - self.blogp)
    grad = jax.grad(lambda lp: jnp.sum(fn(lp, jnp.asarray(self.blogp), jnp.asarray(self.adv))[0]))(
        jnp.asarray(self.logp))
    np.testing.assert_allclose(grad, -np.minimum(ratio, 1.2) * self.adv, rtol=1e-5, atol=1e-7)
    _, truncated = fn(jnp.asarray(self.logp), jnp.asarray(self.blogp), jnp.asarray(self.adv))
    np.testing.assert_array_equal(truncated, (ratio > 1.2).astype(np.float32))


class AggregationTest(absltest.TestCase):
  # Sequences (rows) 0 and 1 are segments of one chain (unit 5); 2 is a chain alone; 3 has no action tokens.
  mask = np.array([[0, 1, 1, 1, 0, 0],
                   [0, 1, 0, 0, 0, 0],
                   [0, 1, 1, 1, 1, 1],
                   [0, 0, 0, 0, 0, 0]], np.float32)
  unit = np.array([5, 5, 2, 8], np.int32)

  def _w(self, name, unit=None, c=24.0):
    scale = policy_loss.AGGREGATIONS.get(name)(jnp.asarray(self.mask.sum(1)), jnp.asarray(
        self.unit if unit is None else unit), c)
    return self.mask * np.asarray(scale)[:, None]

  def test_token_sum_constant(self):
    np.testing.assert_allclose(self._w("token_sum_constant"), self.mask / 24)
    np.testing.assert_allclose(self._w("token_sum_constant", c=100.0), self.mask / 100)

  def test_token_mean(self):
    np.testing.assert_allclose(self._w("token_mean"), self.mask / 9)

  def test_seq_mean_token_mean_chain_and_row_units(self):
    # Chain unit: chain 5 has 4 tokens, chain 2 has 5, two units -> weights 1/8 and 1/10.
    want = np.zeros_like(self.mask)
    want[:2] = self.mask[:2] / 4 / 2
    want[2] = self.mask[2] / 5 / 2
    np.testing.assert_allclose(self._w("seq_mean_token_mean"), want, rtol=1e-6)
    # Row unit: three rows with tokens (3, 1, 5 tokens).
    want = self.mask / np.maximum(self.mask.sum(1, keepdims=True), 1) / 3
    np.testing.assert_allclose(self._w("seq_mean_token_mean", unit=np.arange(4)), want, rtol=1e-6)


class KlTest(parameterized.TestCase):

  def test_estimator_values(self):
    logp = np.log(np.array([0.2, 0.5, 0.01], np.float32))
    ref = np.log(np.array([0.3, 0.1, 0.4], np.float32))
    r = np.exp(ref - logp)
    for name, want in (("k1", -np.log(r)), ("k2", 0.5 * np.log(r) ** 2), ("k3", r - 1 - np.log(r))):
      np.testing.assert_allclose(kl.kl_estimate(name, jnp.asarray(logp), jnp.asarray(ref)), want, rtol=1e-5,
                                 err_msg=name)

  # Exact expectations over a categorical policy pi = softmax(theta) by enumerating its 5 outcomes:
  # E_pi[grad of the per-sample loss term] for each placement, against the analytic KL gradients.
  theta = np.array([0.3, -1.0, 0.8, 0.0, -0.4])
  ref_logits = np.array([-0.5, 0.2, 0.1, 1.0, -0.3])

  def _expected_grad(self, name, placement, behaviour=None):
    ref_lp = jax.nn.log_softmax(jnp.asarray(self.ref_logits))

    def expected(theta):
      lp = jax.nn.log_softmax(theta)
      pi = jax.lax.stop_gradient(jnp.exp(lp))
      mu_lp = jax.lax.stop_gradient(lp) if behaviour is None else jax.nn.log_softmax(jnp.asarray(behaviour))
      # Samples come from mu (= pi on-policy); each outcome weighted by its sampling probability.
      weights = pi if behaviour is None else jnp.exp(mu_lp)
      return jnp.sum(weights * kl.kl_loss_term(name, placement, lp, ref_lp, mu_lp))

    return np.asarray(jax.grad(expected)(jnp.asarray(self.theta)))

  def _kl_grads(self):
    def reverse(theta):  # KL(pi || ref)
      lp, rl = jax.nn.log_softmax(theta), jax.nn.log_softmax(jnp.asarray(self.ref_logits))
      return jnp.sum(jnp.exp(lp) * (lp - rl))

    def forward_kl(theta):  # KL(ref || pi)
      lp, rl = jax.nn.log_softmax(theta), jax.nn.log_softmax(jnp.asarray(self.ref_logits))
      return jnp.sum(jnp.exp(rl) * (rl - lp))

    t = jnp.asarray(self.theta)
    return np.asarray(jax.grad(reverse)(t)), np.asarray(jax.grad(forward_kl)(t))

  def test_k1_in_loss_has_zero_expected_gradient(self):
    np.testing.assert_allclose(self._expected_grad("k1", kl.KlPlacement.LOSS), 0.0, atol=1e-7)

  def test_loss_placement_gradients(self):
    reverse, forward_kl = self._kl_grads()
    self.assertGreater(np.abs(reverse - forward_kl).max(), 1e-2)  # the two directions differ here
    np.testing.assert_allclose(self._expected_grad("k2", kl.KlPlacement.LOSS), reverse, atol=1e-6)
    np.testing.assert_allclose(self._expected_grad("k3", kl.KlPlacement.LOSS), forward_kl, atol=1e-6)

  @parameterized.parameters("k1", "k3")
  def test_straight_through_gives_the_kl_gradient(self, name):
    reverse, _ = self._kl_grads()
    np.testing.assert_allclose(self._expected_grad(name, kl.KlPlacement.LOSS_STRAIGHT_THROUGH), reverse, atol=1e-6)
    # Off-policy: samples from another policy mu, corrected by the importance weight.
    mu = np.array([0.0, 0.5, -0.2, 0.3, 0.1])
    np.testing.assert_allclose(self._expected_grad(name, kl.KlPlacement.LOSS_STRAIGHT_THROUGH, behaviour=mu),
                               reverse, atol=1e-6)

  def test_k1_in_reward_is_reinforce_on_minus_kl(self):
    # IN_REWARD: reward -k1 with a REINFORCE gradient E_pi[(-k1) grad log pi] = -grad KL(pi || ref).
    reverse, _ = self._kl_grads()
    ref_lp = jax.nn.log_softmax(jnp.asarray(self.ref_logits))

    def surrogate(theta):
      lp = jax.nn.log_softmax(theta)
      shaped = -jax.lax.stop_gradient(kl.kl_estimate("k1", lp, ref_lp))
      return jnp.sum(jax.lax.stop_gradient(jnp.exp(lp)) * shaped * lp)

    np.testing.assert_allclose(jax.grad(surrogate)(jnp.asarray(self.theta)), -reverse, atol=1e-6)


class FilterTest(absltest.TestCase):

  def test_token_and_sequence_modes(self):
    blogp = np.log(np.array([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]], np.float32))
    # Trainer / actor ratios: row 0: 1, 2 (too high), 0.3 (too low), 1 (off the mask); row 1: all 1 except 0.7,
    # which is inside the band but a trainer probability of 0.35, below a min_prob of 0.4.
    logp = blogp + np.log(np.array([[1.0, 3.0, 0.3, 1.0], [1.0, 0.7, 1.0, 1.0]], np.float32))
    logp = np.minimum(logp, 0.0)  # probabilities <= 1: 3 x 0.5 becomes 1, a ratio of 2 > 1.9
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
    f = filters.PlausibilityFilter(mode=filters.FilterMode.TOKEN, min_ratio=0.5, max_ratio=1.9)
    keep = np.asarray(filters.plausible(jnp.asarray(logp), jnp.asarray(blogp), jnp.asarray(mask), f))
    np.testing.assert_array_equal(keep, [[1, 0, 0, 1], [1, 1, 1, 1]])
    f = filters.PlausibilityFilter(mode=filters.FilterMode.TOKEN, min_ratio=0.5, max_ratio=1.9, min_prob=0.4)
    keep = np.asarray(filters.plausible(jnp.asarray(logp), jnp.asarray(blogp), jnp.asarray(mask), f))
    np.testing.assert_array_equal(keep, [[1, 0, 0, 1], [1, 0, 1, 1]])  # 0.35 < 0.4
    f = filters.PlausibilityFilter(mode=filters.FilterMode.SEQUENCE, min_ratio=0.5, max_ratio=1.9)
    keep = np.asarray(filters.plausible(jnp.asarray(logp), jnp.asarray(blogp), jnp.asarray(mask), f))
    np.testing.assert_array_equal(keep, [[0, 0, 0, 0], [1, 1, 1, 1]])
    f = filters.PlausibilityFilter(mode=filters.FilterMode.SEQUENCE, min_ratio=0.5, max_ratio=1.9,
                                   sequence_max_fraction=0.7)  # 2 of 3 filtered = 0.67 <= 0.7: kept
    keep = np.asarray(filters.plausible(jnp.asarray(logp), jnp.asarray(blogp), jnp.asarray(mask), f))
    np.testing.assert_array_equal(keep, np.ones((2, 4)))
    # Packed rows: row 0 holds sequence 0 (1 of 2 action tokens filtered: kept at 0.6) and sequence 1 (its one
    # action token filtered: dropped), where the whole row (2 of 3) would be dropped.
    f = filters.PlausibilityFilter(mode=filters.FilterMode.SEQUENCE, min_ratio=0.5, max_ratio=1.9,
                                   sequence_max_fraction=0.6)
    seq = jnp.asarray([[0, 0, 1, 1], [2, 2, 2, -1]], jnp.int32)
    keep = np.asarray(filters.plausible(jnp.asarray(logp), jnp.asarray(blogp), jnp.asarray(mask), f, seq, 3))
    np.testing.assert_array_equal(keep, [[1, 1, 0, 0], [1, 1, 1, 1]])
    nan_row = np.where(np.arange(4) == 2, np.nan, blogp[1])[None].astype(np.float32)
    f = filters.PlausibilityFilter(mode=filters.FilterMode.TOKEN)
    keep = np.asarray(filters.plausible(jnp.asarray(blogp[1:]), jnp.asarray(nan_row), jnp.ones((1, 4)), f))
    np.testing.assert_array_equal(keep, [[1, 1, 0, 1]])  # a NaN behaviour log-prob is implausible
    f = filters.PlausibilityFilter(mode=filters.FilterMode.NONE)
    keep = np.asarray(filters.plausible(jnp.asarray(logp), jnp.asarray(blogp), jnp.asarray(mask), f))
    np.testing.assert_array_equal(keep, np.ones((2, 4)))

  def test_bad_thresholds(self):
    with self.assertRaisesRegex(ValueError, "min_ratio <= 1 <= max_ratio"):
      filters.PlausibilityFilter(min_ratio=2.0, max_ratio=3.0)


class BatchHelpersTest(absltest.TestCase):

  def test_chain_segments_and_sums(self):
    chain = jnp.asarray([4, 9, 4, 4, 1], jnp.int32)
    valid = jnp.asarray([1, 1, 1, 0, 1], jnp.float32)
    count, first = batch_lib.chain_segments(chain, valid)
    np.testing.assert_array_equal(count, [2, 1, 2, 2, 1])
    np.testing.assert_array_equal(first, [1, 1, 0, 0, 1])
    sums = batch_lib.segment_sum_by(chain, jnp.asarray([1.0, 2.0, 3.0, 100.0, 5.0]), valid)
    np.testing.assert_array_equal(sums, [4, 2, 4, 4, 5])

  def test_check_batch_names_the_field(self):
    b = batch_lib.example_batch()
    del b["behaviour_logprobs"]
    with self.assertRaisesRegex(ValueError, "lacks behaviour_logprobs"):
      batch_lib.check_batch(b)
    b = batch_lib.example_batch()
    b["truncated"] = np.zeros((3,), np.float32)
    with self.assertRaisesRegex(ValueError, r"truncated has shape \(3,\); expected \[N\] = \(4,\)"):
      batch_lib.check_batch(b)
    b = batch_lib.example_batch()
    b["positions"] = np.zeros((4, 8), np.int32)
    for f in ("group_id", "chain_id", "truncated"):
      b[f] = b[f][:3]
    b["reward_terms"] = {"outcome": b["reward_terms"]["outcome"][:3]}
    with self.assertRaisesRegex(ValueError, "3 sequences in 4 rows without segment_ids"):
      batch_lib.check_batch(b)
    b["segment_ids"] = np.zeros((4, 8), np.int32)
    batch_lib.check_batch(b)  # packed: N sequences in B rows
    del b["positions"]
    with self.assertRaisesRegex(ValueError, "needs per-sequence positions"):
      batch_lib.check_batch(b)


class RegistryTest(absltest.TestCase):

  def test_duplicate_and_unknown(self):
    r = Registry("thing")
    r.register("a")(1)
    with self.assertRaisesRegex(ValueError, "already registered"):
      r.register("a")(2)
    with self.assertRaisesRegex(ValueError, "Unknown thing 'b'; known: a."):
      r.get("b")
    chex.assert_equal(r.names(), ["a"])


if __name__ == "__main__":
  absltest.main()
