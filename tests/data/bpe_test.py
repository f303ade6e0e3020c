"""The coding suite's BPE tokenizer: byte-level round trips, the specials the pipelines look up, numbers and
words as single tokens, caching, and the coding task suite encoding prompts and decoding samples with it."""

import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest

import c2jax.envs  # noqa: F401  (registers the suites)
from c2jax.data import bpe
from c2jax.data import sft
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs import sandbox as sandbox_lib
from c2jax.envs.tasks import TASK_SUITES

CORPUS = ["Write `def f(x):` returning x plus 16. Example: f(2) == 18",
          "    return x + 16\n", "s with every 'u' replaced by 'q'"] * 50


class BpeTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def test_round_trips_any_text_and_names_its_specials(self):
    tok = make_tokenizer(bpe.train_bpe(CORPUS, 400, os.path.join(self.tmp, "t.json")))
    self.assertEqual((tok.pad_id, tok.bos_id, tok.eos_id), (0, 1, 2))
    self.assertLessEqual(tok.vocab_size, 400)  # at most: the corpus may run out of merges
    for text in ("x plus 16", "naïve ünïcode — 中文 \t\n", "<tool name=\"finish\"/>", ""):
      ids = tok.encode(text, bos=True, eos=True)
      self.assertEqual((ids[0], ids[-1]), (1, 2))
      self.assertEqual(tok.decode(ids), text)
    # Frequent words and numbers (with their leading space) are single tokens.
    self.assertLen(tok.encode(" plus", bos=False, eos=False), 1)
    self.assertLen(tok.encode(" 16", bos=False, eos=False), 1)
    with self.assertRaisesRegex(ValueError, "vocab_size=100"):
      bpe.train_bpe(CORPUS, 100, os.path.join(self.tmp, "small.json"))

  def test_resolve_trains_once_and_passes_other_specs_through(self):
    self.assertEqual(bpe.resolve("byte", "tiny_functions"), "byte")
    self.assertEqual(bpe.resolve("/some/tokenizer.json", "tiny_functions"), "/some/tokenizer.json")
    with self.assertRaisesRegex(ValueError, "bpe:<vocab_size>"):
      bpe.resolve("bpe:big", "tiny_functions")
    path = bpe.resolve("bpe:400", "tiny_functions", cache_dir=self.tmp)
    self.assertTrue(path.startswith(self.tmp) and os.path.exists(path))
    stamp = os.stat(path).st_mtime_ns
    with mock.patch.object(bpe, "train_bpe", side_effect=AssertionError("retrained")):
      self.assertEqual(bpe.resolve("bpe:400", "tiny_functions", cache_dir=self.tmp), path)
    self.assertEqual(os.stat(path).st_mtime_ns, stamp)
    self.assertNotEqual(bpe.resolve("bpe:420", "tiny_functions", cache_dir=self.tmp), path)

  def test_coding_suite_encodes_prompts_and_decodes_samples_with_it(self):
    with mock.patch.dict(os.environ, {"C2JAX_CACHE_DIR": self.tmp}):
      suite = TASK_SUITES.get("coding")(instructions="none", tokenizer="bpe:512")
      tok = make_tokenizer(bpe.resolve("bpe:512", "tiny_functions"))
      task = suite.task("heldout", 0)
      prompt, answer = sft.sft_examples("tiny_functions", "heldout", max_examples=1, instructions="none")[0]
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
