"""AdamW's schedule (warmup, decay, per-phase offset) and what weight decay leaves alone."""

from absl.testing import absltest
from absl.testing import parameterized
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


if __name__ == "__main__":
  absltest.main()
