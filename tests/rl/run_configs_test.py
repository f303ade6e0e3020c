"""The shipped RL run configs resolve, and the main job's shapes hold its task suite (no prompt cut, no answer
cut off by the token budget, no SFT demonstration longer than a row)."""

from absl.testing import absltest
from absl.testing import parameterized

import c2jax.envs  # noqa: F401  (registers the suites)
from c2jax.data import bpe
from c2jax.data import sft
from c2jax.data.tokenizer import make_tokenizer
from c2jax.rl import run_config
from c2jax.rl import warm_start
from configs import rl_char_class
from configs import rl_tiny


class RunConfigsTest(parameterized.TestCase):

  @parameterized.named_parameters(("rl_tiny", rl_tiny), ("rl_char_class", rl_char_class))
  def test_resolves(self, module):
    c = module.get_config()
    cfg = run_config.rl_config(c)
    actors = run_config.actor_config(c)
    suite = run_config.task_suite(c)
    self.assertEqual(cfg.model, run_config.model_config(c))
    self.assertLessEqual(c.eval.tasks, suite.size("heldout"))
    self.assertGreater(actors.max_new_tokens, 0)
    self.assertBetween(run_config.best_of(c), 1, c.eval.samples)

  def test_best_of_defaults_to_the_samples_and_refuses_more(self):
    c = rl_tiny.get_config()
    self.assertEqual((c.eval.samples, run_config.best_of(c)), (16, 8))  # the K = 8, from 16 samples
    del c.eval["best_of"]
    self.assertEqual(run_config.best_of(c), 16)
    c.eval.best_of = 17
    with self.assertRaisesRegex(ValueError, "eval.best_of=17"):
      run_config.best_of(c)

  def test_main_job_shapes_hold_the_suite(self):
    c = rl_tiny.get_config()
    suite = run_config.task_suite(c)
    actors = run_config.actor_config(c)
    tok = make_tokenizer(bpe.resolve(c.task.tokenizer, c.task.coding_suite))
    self.assertEqual(c.model_overrides.vocab_size, tok.vocab_size)
    for split in ("train", "heldout"):
      longest = max(len(suite.task(split, i).prompt) for i in range(suite.size(split)))
      self.assertLessEqual(longest, actors.prompt_len, split)
      examples = sft.sft_examples(c.task.coding_suite, split, instructions=c.task.instructions,
                                  max_turns=c.task.max_turns, max_tokens=c.task.max_tokens,
                                  suite_options=dict(c.task.suite_options))
      self.assertLen(examples, suite.size(split))
      answer = max(len(tok.encode(r, bos=False, eos=True)) for _, r in examples)
      self.assertLessEqual(answer, actors.max_new_tokens, split)
      demo = max(len(tok.encode(p, bos=True, eos=False)) + len(tok.encode(r, bos=False, eos=True))
                 for p, r in examples)
      self.assertLessEqual(demo, c.sft.seq_len, split)
    self.assertIn(tok.eos_id, actors.stop_tokens)
    # The SFT trains the RL run's own model on the same prompts.
    p = warm_start.sft_config(c)
    source = dict(p.phases.sft.sources.tasks)
    self.assertEqual((source["suite"], source["instructions"], dict(source["suite_options"])),
                     (c.task.coding_suite, "none", dict(c.task.suite_options)))
    self.assertEqual(p.tokenizer, bpe.resolve(c.task.tokenizer, c.task.coding_suite))


if __name__ == "__main__":
  absltest.main()
