"""Tokenizers: the byte tokenizer's fixed ids, an HF tokenizer.json built here with the `tokenizers` library (round
trip, BOS / EOS placement, special-token lookup) and `make_tokenizer`."""

import json
import os
import tempfile

from absl.testing import absltest, parameterized
import chex
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.pipeline import eval_batches
from c2jax.data.tokenizer import HFTokenizer, Tokenizer, make_tokenizer
from tests.data import corpora

_CORPUS = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def push(self, x):\n        self.items.append(x)\n",
           "for i in range(10):\n    print(i * i)  # squares\n", "naïve café — ünïcödé\n"] * 4


def _write_bpe(directory: str, specials=("<pad>", "<s>", "</s>")) -> str:
  """A byte-level BPE trained on _CORPUS (no downloads), saved as tokenizer.json."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_CORPUS, trainer)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  return path


class ByteTokenizerTest(absltest.TestCase):

  def test_ids_and_round_trip(self):
    tok = ByteTokenizer()
    self.assertIsInstance(tok, Tokenizer)
    self.assertEqual((tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id), (259, 256, 257, 258))
    text = "x = 'é'\n"
    ids = tok.encode(text)
    chex.assert_type(ids, np.int32)
    self.assertEqual(ids[0], 257)
    self.assertEqual(ids[-1], 258)
    np.testing.assert_array_equal(ids[1:-1], np.frombuffer(text.encode(), np.uint8))
    self.assertEqual(tok.decode(ids), text)
    self.assertLen(tok.encode(text, bos=False, eos=False), len(text.encode()))


class HFTokenizerTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.path = _write_bpe(cls.dir)

  def test_round_trip_and_specials(self):
    tok = make_tokenizer(self.path)
    self.assertIsInstance(tok, HFTokenizer)
    self.assertIsInstance(tok, Tokenizer)
    self.assertEqual((tok.pad_id, tok.bos_id, tok.eos_id), (0, 1, 2))
    self.assertGreater(tok.vocab_size, 256)
    for text in _CORPUS[:4] + ["unseen words: zebra quokka ∑\n"]:
      ids = tok.encode(text, bos=True, eos=True)
      chex.assert_type(ids, np.int32)
      self.assertEqual((ids[0], ids[-1]), (tok.bos_id, tok.eos_id))
      self.assertNotIn(tok.bos_id, ids[1:-1].tolist())
      self.assertEqual(tok.decode(ids), text)
      self.assertEqual(tok.decode(tok.encode(text, bos=False, eos=False)), text)
    self.assertLess(len(tok.encode(_CORPUS[0], bos=False, eos=False)), len(_CORPUS[0]))  # BPE merged something

  def test_encode_text_matches_no_control_token(self):
    # encode matches added tokens (a template's structure); encode_text never matches a special one, nor a
    # non-special one named as a control, so a file spelling them stays its own text.
    directory = tempfile.mkdtemp()
    path = _write_bpe(directory, specials=("<pad>", "<s>", "</s>", "<|im_end|>"))
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
    config["added_tokens"].append({"id": config["model"]["vocab"]["<|im_end|>"] + 1000, "content": "<tool>",
                                   "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": False})
    with open(path, "w", encoding="utf-8") as f:
      json.dump(config, f)
    tok = HFTokenizer(path)
    end, tool = tok.token_id("<|im_end|>"), tok.token_id("<tool>")
    text = "x<|im_end|>y<s></s><pad><tool>z"
    self.assertEqual(tok.encode(text, bos=False, eos=False).tolist().count(end), 1)  # the structure's encoding
    for controls, matched in (((), [tool]), (("<tool>",), [])):
      ids = tok.encode_text(text, controls)
      chex.assert_type(ids, np.int32)
      self.assertEqual([i for i in ids.tolist() if i in (0, 1, 2, end, tool)], matched)
      self.assertEqual(tok.decode(ids, skip_special_tokens=False), text)
    self.assertEqual(tok.encode_text("").tolist(), [])
    np.testing.assert_array_equal(ByteTokenizer().encode_text("<|im_end|>"), list(b"<|im_end|>"))

  def test_encode_text_refuses_a_model_that_merges_into_a_control_token(self):
    tok = tokenizers.Tokenizer(models.BPE(vocab={"<": 0, "x": 1, ">": 2, "<x": 3, "<x>": 4, "<s>": 5, "</s>": 6},
                                          merges=[("<", "x"), ("<x", ">")]))
    tok.add_special_tokens(["<x>", "<s>", "</s>"])
    path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
    tok.save(path)
    with self.assertRaisesRegex(ValueError, r"turns plain text into one of its added tokens \('<x>'\)"):
      HFTokenizer(path).encode_text("x<x>")

  def test_named_specials_and_pad_fallback(self):
    path = _write_bpe(tempfile.mkdtemp(), specials=("<|begin|>", "<|end|>"))
    with self.assertRaisesRegex(ValueError, "no BOS token.*HFTokenizer\\(path, bos="):
      HFTokenizer(path)
    tok = HFTokenizer(path, bos="<|begin|>", eos="<|end|>")
    self.assertEqual((tok.bos_id, tok.eos_id, tok.pad_id), (0, 1, 1))  # no pad token: pads with EOS

  def test_model_directory_names_its_own_specials(self):
    # DeepSeek-V3's names: neither is among the usual ones first, and its tokenizer_config.json says which is which
    # (one as a plain string, one as an AddedToken mapping, as HF writes both).
    bos, eos, eot = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|im_end|>"
    d = tempfile.mkdtemp()
    _write_bpe(d, specials=("<s>", "</s>", bos, eos, eot))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump({"bos_token": {"content": bos, "special": True}, "eos_token": eos}, f)
    tok = make_tokenizer(d)
    self.assertEqual((tok.bos_id, tok.eos_id), (2, 3))  # not <s> / </s>, which come first in the usual names
    self.assertEqual(tok.pad_id, tok.eos_id)
    self.assertEqual(tok.token_id(eot), 4)
    self.assertIsNone(tok.token_id("<|not a token|>"))
    ids = tok.encode(f"a{eot}b", bos=True, eos=False)
    self.assertIn(4, ids.tolist())  # special tokens in the text are matched, not spelled out
    self.assertEqual(tok.decode(ids), "ab")
    self.assertEqual(tok.decode(ids, skip_special_tokens=False), f"{bos}a{eot}b")
    # Given names still win over the directory's.
    self.assertEqual(HFTokenizer(d, eos=eot).eos_id, 4)

  def test_in_the_pipeline(self):
    tok = HFTokenizer(self.path)
    texts = _CORPUS[:4]
    source = {"kind": "jsonl", "path": corpora.write_jsonl(texts)}
    (batch,) = eval_batches(source, tok, seq_len=64, batch_size=4, n_batches=1)
    padding = batch["segment_ids"] == 0
    self.assertTrue(padding.any())
    self.assertTrue((batch["tokens"][padding] == tok.pad_id).all())
    decoded = sorted(tok.decode(batch["tokens"][r][batch["segment_ids"][r] == s])
                     for r in range(4) for s in range(1, int(batch["segment_ids"][r].max()) + 1))
    self.assertEqual(decoded, sorted(texts))

  def test_make_tokenizer(self):
    self.assertEqual(make_tokenizer("byte"), ByteTokenizer())
    with self.assertRaisesRegex(ValueError, "does not exist; give the path of a tokenizer.json"):
      make_tokenizer(os.path.join(self.dir, "missing.json"))
    with self.assertRaisesRegex(ValueError, "use 'byte' or the path"):
      make_tokenizer("")


if __name__ == "__main__":
  absltest.main()
