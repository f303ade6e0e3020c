"""The SFT warm start of an RL run: its pretraining config, its cache key, reuse of a finished SFT."""

import os
import tempfile

from absl.testing import absltest

from c2jax.model.checkpoint import save_checkpoint
from c2jax.pretrain import loop as pretrain_loop
from c2jax.pretrain.phases import phases_from_config
from c2jax.rl import run_config
from c2jax.rl import warm_start
from configs import rl_char_class
from configs import rl_tiny


def _coding_config():
  c = rl_tiny.get_config()
  c.task = {"suite": "coding", "coding_suite": "tiny_functions", "instructions": "brief", "seed": 0}
  c.sft.update(enabled=True, cache_dir=tempfile.mkdtemp(), steps=8)
  return c


class WarmStartTest(absltest.TestCase):

  def test_sft_config_trains_the_rl_model_on_the_rl_prompts(self):
    c = _coding_config()
    p = warm_start.sft_config(c)
    (phase,) = phases_from_config(p, pretrain_loop.model_config_from(p))
    self.assertEqual(phase.model, run_config.rl_config(c).model)
    self.assertEqual(phase.steps, 8)
    (source,) = phase.sources
    self.assertEqual((source["kind"], source["suite"], source["split"], source["instructions"]),
                     ("sft", "tiny_functions", "train", "brief"))
    self.assertEqual(p.eval.source["split"], "heldout")
    # The teacher of configs/rl_tiny.py: two flawed demonstrations of four per task; held-out loss on clean turns.
    self.assertEqual((source["copies"], source["flawed"], source["flaw"]), (4, 2, "incomplete_call"))
    self.assertEqual((p.eval.source["copies"], p.eval.source["flawed"]), (1, 0))

  def test_cache_key_follows_the_settings(self):
    c = _coding_config()
    a = warm_start.cache_dir(c, warm_start.sft_config(c))
    self.assertEqual(a, warm_start.cache_dir(c, warm_start.sft_config(c)))
    c.sft.learning_rate = 1e-3
    b = warm_start.cache_dir(c, warm_start.sft_config(c))
    self.assertNotEqual(a, b)
    c.task.suite_options = {"max_difficulty": 1}
    d = warm_start.cache_dir(c, warm_start.sft_config(c))
    self.assertNotEqual(b, d)
    c.task.instructions = "none"
    e = warm_start.cache_dir(c, warm_start.sft_config(c))
    self.assertNotEqual(d, e)
    c.sft.teacher.flawed = 0  # a perfect teacher is another SFT
    self.assertNotEqual(e, warm_start.cache_dir(c, warm_start.sft_config(c)))
    self.assertTrue(a.startswith(os.path.abspath(c.sft.cache_dir)))

  def test_a_finished_sft_is_reused_without_training(self):
    c = _coding_config()
    p = warm_start.sft_config(c)
    model = pretrain_loop.model_config_from(p)
    target = os.path.join(warm_start.cache_dir(c, p), "models", "sft")
    import jax
    from c2jax.model.params import abstract_params
    params = jax.tree.map(lambda a: jax.numpy.zeros(a.shape, a.dtype), abstract_params(model))
    save_checkpoint(target, params, model)
    self.assertEqual(warm_start.sft_checkpoint(c), target)

  def test_needs_a_coding_suite(self):
    c = rl_char_class.get_config()
    with self.assertRaisesRegex(ValueError, "coding task suite"):
      warm_start.sft_config(c)


if __name__ == "__main__":
  absltest.main()
