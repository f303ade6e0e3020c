"""The SFT warm start of an RL run: its pretraining config, its cache key, reuse of a finished SFT."""

import dataclasses
import os
import shutil
import tempfile

from absl.testing import absltest
import jax

from c2jax.input_errors import MissingInput
from c2jax.model.checkpoint import save_checkpoint
from c2jax.model.params import abstract_params
from c2jax.services import rl_run_config
from c2jax.services import warm_start
from configs import rl_char_class
from configs import rl_tiny


def _coding_config(**sft):
  c = rl_tiny.get_config("single_turn")  # the single-turn demonstrations (the agentic job's are recorded traces)
  c.task = rl_run_config.task_defaults("coding", coding_suite="tiny_functions", instructions="brief")
  c.sft.update(enabled=True, cache_dir=tempfile.mkdtemp(), steps=8)
  c.sft.update(sft)
  return rl_run_config.parse(c)


class WarmStartTest(absltest.TestCase):

  def test_sft_config_trains_the_rl_model_on_the_rl_prompts(self):
    cfg = _coding_config()
    p = warm_start.sft_config(cfg)
    (phase,) = p.phases_resolved()
    self.assertEqual(phase.model, cfg.rl.model)
    self.assertEqual(phase.steps, 8)
    (source,) = phase.sources
    self.assertEqual((source["kind"], source["suite"], source["split"], source["instructions"]),
                     ("sft", "tiny_functions", "train", "brief"))
    self.assertEqual(p.eval.source["split"], "heldout")
    # The single-turn teacher of configs/rl_tiny.py: two flawed demonstrations of four per task; held-out loss on
    # clean turns.
    self.assertEqual((source["copies"], source["flawed"], source["flaw"]), (4, 2, "incomplete_call"))
    self.assertEqual((p.eval.source["copies"], p.eval.source["flawed"]), (1, 0))
    # The SFT's optimizer and step settings are the pretraining defaults (c2jax/services/pretrain_run_config.py).
    self.assertEqual((phase.hp.optim.weight_decay, phase.hp.z_loss_weight, phase.hp.bias_update_rate),
                     (0.1, 1e-4, 1e-3))

  def test_cache_key_follows_the_settings(self):
    cfg = _coding_config()
    key = lambda c: warm_start.cache_dir(c, warm_start.sft_config(c))
    a = key(cfg)
    self.assertEqual(a, key(cfg))
    b = key(dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, learning_rate=1e-3)))
    self.assertNotEqual(a, b)
    d = key(dataclasses.replace(cfg, task={**cfg.task, "suite_options": {"max_difficulty": 1}}))
    self.assertNotEqual(a, d)
    e = key(dataclasses.replace(cfg, task={**cfg.task, "instructions": "none"}))
    self.assertNotEqual(a, e)
    perfect = dataclasses.replace(cfg.sft, teacher=dataclasses.replace(cfg.sft.teacher, flawed=0))
    self.assertNotEqual(a, key(dataclasses.replace(cfg, sft=perfect)))  # a perfect teacher is another SFT
    self.assertTrue(a.startswith(os.path.abspath(cfg.sft.cache_dir)))

  def test_a_finished_sft_is_reused_without_training(self):
    cfg = _coding_config()
    p = warm_start.sft_config(cfg)
    model = p.model_config
    target = os.path.join(warm_start.cache_dir(cfg, p), "models", "sft")
    params = jax.tree.map(lambda a: jax.numpy.zeros(a.shape, a.dtype), abstract_params(model))
    save_checkpoint(target, params, model)
    self.assertEqual(warm_start.sft_checkpoint(cfg), target)

  def test_a_base_checkpoint_starts_the_sft_and_keys_its_cache_by_content(self):
    cfg = _coding_config()
    model = warm_start.sft_config(cfg).model_config
    zeros = jax.tree.map(lambda a: jax.numpy.zeros(a.shape, a.dtype), abstract_params(model))
    base = os.path.join(tempfile.mkdtemp(), "models", "step_40")
    save_checkpoint(base, zeros, model)
    with_base = lambda path: dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, base_checkpoint=path))
    p = warm_start.sft_config(with_base(base))
    self.assertEqual(p.init_checkpoint, base)
    key = lambda c: warm_start.cache_dir(c, warm_start.sft_config(c))
    first = key(with_base(base))
    self.assertNotEqual(first, key(cfg))  # from a base model is another SFT than from a random init
    self.assertEqual(first, key(with_base(base)))
    # The same model written elsewhere, later (a pretraining rerun in a fresh clone) is the same base: the same SFT.
    elsewhere = os.path.join(tempfile.mkdtemp(), "clone", "models", "bulk")
    save_checkpoint(elsewhere, zeros, model)
    self.assertEqual(first, key(with_base(elsewhere)))
    # One value changed, saved over the same path, is another base, so another SFT.
    ones = jax.tree.map(lambda a: a.at[(0,) * a.ndim].set(1), zeros)
    shutil.rmtree(base)
    save_checkpoint(base, ones, model)
    self.assertNotEqual(first, key(with_base(base)))

  def test_a_base_that_is_no_checkpoint_is_refused_in_one_sentence(self):
    cfg = _coding_config()
    cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, base_checkpoint=tempfile.mkdtemp()))
    with self.assertRaisesRegex(MissingInput, r"^sft.base_checkpoint: .* is not a c2jax checkpoint: "
                                               r"model_config.json is missing"):
      warm_start.cache_dir(cfg, warm_start.sft_config(cfg))

  def test_needs_a_coding_suite(self):
    cfg = rl_run_config.parse(rl_char_class.get_config())  # sft.enabled=False: the run config is valid
    with self.assertRaisesRegex(ValueError, "coding task suite"):
      warm_start.sft_config(cfg)


if __name__ == "__main__":
  absltest.main()
