"""The LM train step: losses fall, the balancing bias follows its rule, every metric is there."""

import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import presets
from c2jax.optim import OptimizerConfig
from c2jax.pretrain.step import MtpTarget, StepConfig, init_state, train_step


class StepTest(absltest.TestCase):

  @pytest.mark.slow
  def test_steps_lower_loss_and_bias_follows_balancing_rule(self):
    cfg = presets.tiny()
    hp = StepConfig(optim=OptimizerConfig(learning_rate=3e-3, warmup_steps=1, total_steps=20), bias_update_rate=1e-2,
                    z_loss_weight=1e-4, mtp_target=MtpTarget.SELF_DISTILL)
    state = init_state(cfg, hp, jax.random.key(0))
    bias0 = state.params["moe_layers"]["moe"]["router_bias"]
    step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp))
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, cfg.vocab_size)
    segments = jnp.concatenate([jnp.ones((4, 20), jnp.int32), 2 * jnp.ones((4, 12), jnp.int32)], axis=1)
    positions = jnp.concatenate([jnp.arange(20), jnp.arange(12)])[None].repeat(4, 0)
    batch = {"tokens": tokens, "segment_ids": segments, "positions": positions}
    losses = []
    for _ in range(6):
      prev = state
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    self.assertLess(losses[-1], losses[0] - 0.1)
    chex.assert_tree_all_finite(state.params)
    self.assertEqual(int(state.step), 6)
    # The bias moves by exactly +-rate (or 0) per step: AdamW and weight decay never touch it.
    delta = np.abs(np.asarray(state.params["moe_layers"]["moe"]["router_bias"] -
                              prev.params["moe_layers"]["moe"]["router_bias"]))
    self.assertTrue(np.all(np.isclose(delta, 0.0) | np.isclose(delta, 1e-2)), delta)
    self.assertGreater(float(jnp.abs(state.params["moe_layers"]["moe"]["router_bias"] - bias0).max()), 0)
    for key in ("ce", "mtp_ce", "mtp_kl", "z_loss", "grad_norm", "expert_load_max"):
      self.assertIn(key, metrics)
    # 2 documents of 20 and 12 tokens: 19 + 11 next-token targets per row (document starts are not targets).
    self.assertEqual(float(metrics["tokens"]), 4 * 30)


if __name__ == "__main__":
  absltest.main()
