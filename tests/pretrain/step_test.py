"""The LM train step and the tiny pretraining loop."""

import functools
import json
import tempfile

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import checkpoint
from c2jax.pretrain import loop
from c2jax.pretrain.step import StepConfig, init_state, train_step
from configs import pretrain_tiny
from configs.model import tiny


class StepTest(absltest.TestCase):

  def test_steps_lower_loss_and_bias_follows_balancing_rule(self):
    cfg = tiny.get_model_config()
    hp = StepConfig(learning_rate=3e-3, warmup_steps=1, total_steps=20, bias_update_rate=1e-2, z_loss_weight=1e-4)
    state = init_state(cfg, hp, jax.random.key(0))
    bias0 = state.params["moe_layers"]["moe"]["router_bias"]
    step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp))
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, cfg.vocab_size)
    losses = []
    for _ in range(6):
      prev = state
      state, metrics = step(state, {"tokens": tokens})
      losses.append(float(metrics["loss"]))
    self.assertLess(losses[-1], losses[0] - 0.1)
    chex.assert_tree_all_finite(state.params)
    self.assertEqual(int(state.step), 6)
    # The bias moves by exactly +-rate (or 0) per step: AdamW and weight decay never touch it.
    delta = np.abs(np.asarray(state.params["moe_layers"]["moe"]["router_bias"] -
                              prev.params["moe_layers"]["moe"]["router_bias"]))
    self.assertTrue(np.all(np.isclose(delta, 0.0) | np.isclose(delta, 1e-2)), delta)
    self.assertGreater(float(jnp.abs(state.params["moe_layers"]["moe"]["router_bias"] - bias0).max()), 0)
    for key in ("ce", "mtp_ce", "z_loss", "grad_norm", "expert_load_max"):
      self.assertIn(key, metrics)


class LoopTest(absltest.TestCase):

  def test_tiny_run_writes_metrics_and_a_loadable_checkpoint(self):
    c = pretrain_tiny.get_config()
    c.steps, c.log_every, c.batch_size, c.seq_len, c.eval_batches, c.max_train_files = 4, 2, 2, 32, 1, 5
    with tempfile.TemporaryDirectory() as d:
      result = loop.run(c, d)
      self.assertEqual(result["steps"], 4)
      lines = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
      self.assertEqual([l["step"] for l in lines], [2, 4])
      params, cfg = checkpoint.load_checkpoint(result["checkpoint"])
      self.assertEqual(cfg.vocab_size, 259)
      chex.assert_tree_all_finite(params)

  def test_unknown_model_name(self):
    c = pretrain_tiny.get_config()
    c.model = "nope"
    with self.assertRaisesRegex(ValueError, "configs/model/nope.py"):
      loop.model_config_from(c)


if __name__ == "__main__":
  absltest.main()
