"""The byte-level BPE trainer: round trips, the specials the pipelines look up, numbers and words as single
tokens (a coding suite's own BPE: tests/envs/teachers/suite_tokenizer_test.py)."""

import os
import shutil
import tempfile

from absl.testing import absltest

from c2jax.data import bpe
from c2jax.data.tokenizer import make_tokenizer

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


if __name__ == "__main__":
  absltest.main()
