"""AdamW's schedule (warmup, decay, per-phase offset), what weight decay leaves alone and per-leaf learning-rate
multipliers."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.optim import Decay, OptimizerConfig, make_optimizer, make_schedule
from c2jax.pretrain.step import StepConfig


class ScheduleTest(parameterized.TestCase):

  @parameterized.parameters(Decay.COSINE, Decay.LINEAR)
  def test_phase_schedule_warms_up_then_decays_from_its_offset(self, decay):
    hp = OptimizerConfig(learning_rate=1.0, warmup_steps=4, total_steps=14, final_lr_fraction=0.1, decay=decay,
                    schedule_offset=100)
    f = make_schedule(hp)
    np.testing.assert_allclose([float(f(100 + i)) for i in range(5)], [0.0, 0.25, 0.5, 0.75, 1.0], atol=1e-6)
    np.testing.assert_allclose(float(f(114)), 0.1, atol=1e-6)
    np.testing.assert_allclose(float(f(130)), 0.1, atol=1e-6)  # held at the floor after the phase's steps
    mid = float(f(109))  # half-way through the decay
    np.testing.assert_allclose(mid, 0.55, atol=1e-6)  # cosine and linear agree at the midpoint
    quarter = float(f(106.5))
    expected = {Decay.COSINE: 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 0.25)), Decay.LINEAR: 1.0 - 0.9 * 0.25}[decay]
    np.testing.assert_allclose(quarter, expected, atol=1e-5)

  def test_no_warmup_starts_at_the_peak(self):
    f = make_schedule(OptimizerConfig(learning_rate=2.0, warmup_steps=0, total_steps=10))
    self.assertAlmostEqual(float(f(0)), 2.0, places=6)


class OptimizerTest(absltest.TestCase):

  def test_untrained_groups_are_left_alone_and_the_state_keeps_its_structure(self):
    params = {"embed": jnp.ones((4, 2)), "mtp": {"w": jnp.ones((3,))}}
    zero = jax.tree.map(jnp.zeros_like, params)
    structures = []
    for weight in (0.0, 0.3):  # the MTP loss weight of a pretraining phase: 0 leaves the MTP modules untrained
      hp = StepConfig(optim=OptimizerConfig(learning_rate=0.1, warmup_steps=0, weight_decay=0.5), mtp_weight=weight)
      self.assertEqual(hp.untrained, () if weight else ("mtp",))
      tx = make_optimizer(hp.optim, untrained=hp.untrained)
      state = tx.init(params)
      structures.append(jax.tree.structure(state))
      updates, _ = tx.update(zero, state, params)
      self.assertLess(float(updates["embed"].max()), 0.0)  # decoupled weight decay shrinks trained leaves
      self.assertEqual(float(jnp.abs(updates["mtp"]["w"]).max()) > 0, weight > 0)
    self.assertEqual(structures[0], structures[1])  # one optimizer state across phases with and without MTP

  def test_bad_settings_are_refused(self):
    for kw in ({"final_lr_fraction": 1.5}, {"total_steps": 0}, {"grad_clip": -1.0}):
      with self.assertRaises(ValueError):
        OptimizerConfig(**kw)


class LrMultipliersTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    k1 = jax.random.key(0)
    self.params = {"layers": {"attn": {"q_a": jnp.ones((3, 2)), "q_a_norm": jnp.ones((2,)), "kv_a": jnp.ones((3, 4))}},
                   "embed": jnp.ones((5, 3))}
    leaves, treedef = jax.tree.flatten(self.params)
    keys = jax.random.split(k1, len(leaves))
    self.grads = jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])

  def _updates(self, lr_multipliers):
    cfg = OptimizerConfig(learning_rate=0.1, warmup_steps=0, weight_decay=0.5, lr_multipliers=lr_multipliers)
    tx = make_optimizer(cfg)
    state = tx.init(self.params)
    updates, state = tx.update(self.grads, state, self.params)
    updates, _ = tx.update(self.grads, state, self.params)  # a second step: moments and decay, not only the sign
    return updates

  def test_the_multiplier_scales_exactly_the_matching_leaves(self):
    base = self._updates(())
    scaled = self._updates((("layers/attn/(q_a|kv_a)", 0.25),))
    for name in ("q_a", "kv_a"):
      chex.assert_trees_all_close(scaled["layers"]["attn"][name], 0.25 * base["layers"]["attn"][name], rtol=1e-6)
    # q_a_norm contains "q_a" but does not fully match; embed matches nothing: both keep the schedule's rate.
    chex.assert_trees_all_close(scaled["layers"]["attn"]["q_a_norm"], base["layers"]["attn"]["q_a_norm"])
    chex.assert_trees_all_close(scaled["embed"], base["embed"])
    self.assertGreater(float(jnp.abs(base["layers"]["attn"]["q_a"]).min()), 0.0)

  def test_a_pattern_that_matches_nothing_is_refused_at_init(self):
    tx = make_optimizer(OptimizerConfig(lr_multipliers=(("layers/attn/q_b", 0.5),)))
    with self.assertRaisesRegex(ValueError, r"\['layers/attn/q_b'\] match no trained parameter"):
      tx.init(self.params)

  def test_overlapping_or_malformed_patterns_are_refused(self):
    tx = make_optimizer(OptimizerConfig(lr_multipliers=(("layers/.*", 0.5), (".*/q_a", 2.0))))
    with self.assertRaisesRegex(ValueError, "make the patterns disjoint"):
      tx.init(self.params)
    with self.assertRaisesRegex(ValueError, "is not a regular expression"):
      OptimizerConfig(lr_multipliers=(("layers/(q_a", 0.5),))
    with self.assertRaisesRegex(ValueError, "must be >= 0"):
      OptimizerConfig(lr_multipliers=(("embed", -1.0),))


if __name__ == "__main__":
  absltest.main()
