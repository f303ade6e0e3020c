"""A coding suite's own BPE: trained once on its train text and cached, other tokenizer specs passed through, and
the coding task suite encoding prompts and decoding samples with it."""

import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import pytest

import c2jax.envs  # noqa: F401  (registers the suites)
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs.teachers import demonstrations
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.teachers import suite_tokenizer
from c2jax.envs.token_tasks.suite import TASK_SUITES


class SuiteTokenizerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def test_resolve_trains_once_and_passes_other_specs_through(self):
    self.assertEqual(suite_tokenizer.resolve("byte", "tiny_functions"), "byte")
    self.assertEqual(suite_tokenizer.resolve("/some/tokenizer.json", "tiny_functions"), "/some/tokenizer.json")
    with self.assertRaisesRegex(ValueError, "bpe:<vocab_size>"):
      suite_tokenizer.resolve("bpe:big", "tiny_functions")
    path = suite_tokenizer.resolve("bpe:400", "tiny_functions", cache_dir=self.tmp)
    self.assertTrue(path.startswith(self.tmp) and os.path.exists(path))
    stamp = os.stat(path).st_mtime_ns
    with mock.patch.object(suite_tokenizer, "train_bpe", side_effect=AssertionError("retrained")):
      self.assertEqual(suite_tokenizer.resolve("bpe:400", "tiny_functions", cache_dir=self.tmp), path)
    self.assertEqual(os.stat(path).st_mtime_ns, stamp)
    self.assertNotEqual(suite_tokenizer.resolve("bpe:420", "tiny_functions", cache_dir=self.tmp), path)

  def test_spec_names_the_text_and_refuses_others(self):
    for bad in ("bpe:512:notes", "bpe:512:repository:x", "bpe::repository"):
      with self.assertRaisesRegex(ValueError, "bpe:<vocab_size>\\[:<text>\\] with <text> one of"):
        suite_tokenizer.resolve(bad, "tiny_long_horizon", cache_dir=self.tmp)
    plain = suite_tokenizer.resolve("bpe:1024", "tiny_long_horizon", cache_dir=self.tmp)
    self.assertEqual(suite_tokenizer.resolve("bpe:1024:demonstrations", "tiny_long_horizon", cache_dir=self.tmp),
                     plain)
    with_files = suite_tokenizer.resolve("bpe:1024:repository", "tiny_long_horizon", cache_dir=self.tmp)
    self.assertNotEqual(with_files, plain)
    # The notes' words are in the repository text only: with it each step's words are one token per word, without it
    # the operation words stay split (the demonstrations write code, never "subtract").
    def pieces(path):
      tok = make_tokenizer(path)
      return [tok.decode([i]) for i in tok.encode("step 2: subtract 5", bos=False, eos=False)]
    self.assertEqual(pieces(with_files), ["step", " 2", ":", " subtract", " 5"])
    self.assertNotIn(" subtract", pieces(plain))
    texts = suite_tokenizer.suite_texts("tiny_long_horizon", text=suite_tokenizer.TokenizerText.REPOSITORY)
    heldout_notes = {t.files["notes/step_1.txt"]
                     for t in demonstrations.suite_tasks("tiny_long_horizon", "heldout")}
    self.assertTrue(heldout_notes)
    self.assertFalse(heldout_notes & set(texts))  # held-out repositories never shape the vocabulary

  @pytest.mark.slow
  def test_episodes_text_holds_the_teachers_observations(self):
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))
    self.assertEqual(suite_tokenizer.teacher_name("tiny_spec"), "spec_fixer")
    self.assertEqual(suite_tokenizer.teacher_name("tiny_functions"), suite_tokenizer.DEFAULT_TEACHER)
    played = []
    real = suite_tokenizer.teacher_observations

    def spy(*args, **kwargs):
      played.append(real(*args, **kwargs))
      return played[-1]

    with mock.patch.object(suite_tokenizer, "teacher_observations", side_effect=spy):
      episodes = suite_tokenizer.resolve("bpe:512:episodes", "tiny_spec", cache_dir=self.tmp)
      self.assertEqual(suite_tokenizer.resolve("bpe:512:episodes", "tiny_spec", cache_dir=self.tmp), episodes)
    self.assertLen(played, 1)  # played once, then cached (the cache key does not need the observations)
    observations = played[0]
    # The teacher's test runs, passing and (in its recovering episodes) failing, are in the text.
    self.assertTrue(any("\nOK\n" in o and "Ran 3 tests" in o for o in observations))
    # The run tool shows no run time (env.without_timings): two plays give the same text, every machine the same BPE.
    self.assertTrue(all("Ran 3 tests in 0.000s" in o for o in observations if "Ran 3 tests" in o))
    self.assertEqual(suite_tokenizer.teacher_observations("tiny_spec"), observations)
    failing = [o for o in observations if "FAILED (failures=" in o]
    self.assertNotEmpty(failing)
    repository = make_tokenizer(suite_tokenizer.resolve("bpe:512:repository", "tiny_spec", cache_dir=self.tmp))
    tok = make_tokenizer(episodes)
    # The wrappers and unittest's lines became tokens: a failing run costs well under the repository BPE's tokens.
    sample = failing[0]
    self.assertLess(len(tok.encode(sample, bos=False, eos=False)),
                    0.7 * len(repository.encode(sample, bos=False, eos=False)))

  def test_coding_suite_encodes_prompts_and_decodes_samples_with_it(self):
    with mock.patch.dict(os.environ, {"C2JAX_CACHE_DIR": self.tmp}):
      suite = TASK_SUITES.get("coding")(instructions="none", tokenizer="bpe:512")
      tok = make_tokenizer(suite_tokenizer.resolve("bpe:512", "tiny_functions"))
      task = suite.task("heldout", 0)
      prompt, answer = demonstrations.sft_examples("tiny_functions", "heldout", max_examples=1, instructions="none")[0]
      self.assertEqual(task.prompt[0], tok.bos_id)
      self.assertEqual(tok.decode(task.prompt), prompt)
      self.assertLess(len(task.prompt), len(prompt.encode()) // 2)  # ~3 bytes per token
      try:
        sandbox_lib.check_available()
      except sandbox_lib.SandboxUnavailable as e:
        self.skipTest(str(e))
      self.assertEqual(suite.reward(task, tok.encode(answer, bos=False, eos=True))["outcome"], 1.0)


if __name__ == "__main__":
  absltest.main()
