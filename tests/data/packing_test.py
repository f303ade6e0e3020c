"""Packing invariants: segments, positions restarting at each document piece, loss masks (padding, first tokens,
chat weights), documents longer than T cut into pieces, and every token of a small corpus emitted exactly once."""

import collections

from absl.testing import absltest, parameterized
import grain
import numpy as np

from c2jax.data import packing
from c2jax.data import sources
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.pipeline import eval_batches, lm_dataset
from tests.data import batches as batch_checks
from tests.data import corpora

TOK = ByteTokenizer()


class PackingTest(parameterized.TestCase):

  def test_tokenize_plain_and_chat(self):
    plain = packing.tokenize("ab", TOK)
    np.testing.assert_array_equal(plain["tokens"], [TOK.BOS, 97, 98, TOK.EOS])
    np.testing.assert_array_equal(plain["weights"], [1, 1, 1, 1])
    chat = packing.tokenize((("q?", 0.0), ("a", 1.0)), TOK)
    np.testing.assert_array_equal(chat["tokens"], [TOK.BOS, 113, 63, 97, TOK.EOS])
    np.testing.assert_array_equal(chat["weights"], [0, 0, 0, 1, 1])

  def test_tokenize_token_documents_as_they_are(self):
    doc = sources.TokenDocument((TOK.BOS, 97, TOK.EOS, 98), (0.0, 1.0, 1.0, 0.0))  # an EOS mid-document stays
    out = packing.tokenize(doc, TOK)
    np.testing.assert_array_equal(out["tokens"], [TOK.BOS, 97, TOK.EOS, 98])
    np.testing.assert_array_equal(out["weights"], [0, 1, 1, 0])
    with self.assertRaisesRegex(ValueError, "outside the tokenizer's 259 ids"):
      packing.tokenize(sources.TokenDocument((1, 300), (0.0, 1.0)), TOK)

  def test_rows_by_hand(self):
    # Documents of 3, 12 and 1 tokens with T = 8: the 12-token one becomes pieces of 8 and 4.
    docs = [{"tokens": np.arange(n, dtype=np.int32) + 10 * (i + 1), "weights": np.full(n, w, np.float32)}
            for i, (n, w) in enumerate([(3, 1.0), (12, 0.5), (1, 1.0)])]
    rows = packing.pack_rows(packing.chunk_documents(grain.MapDataset.source(docs).to_iter_dataset(), 8), 8,
                             pad_id=TOK.PAD, num_bins=4)
    batch = packing.finish_batch(next(iter(rows.batch(4))), 4, TOK.PAD)
    batch_checks.check_batch(self, batch, 4, 8)
    np.testing.assert_array_equal(batch["tokens"][0], [10, 11, 12, 28, 29, 30, 31, 30])  # first fit: 3 + 4 + 1
    np.testing.assert_array_equal(batch["segment_ids"][0], [1, 1, 1, 2, 2, 2, 2, 3])
    np.testing.assert_array_equal(batch["positions"][0], [0, 1, 2, 0, 1, 2, 3, 0])
    np.testing.assert_array_equal(batch["loss_mask"][0], [0, 1, 1, 0, .5, .5, .5, 0])
    np.testing.assert_array_equal(batch["tokens"][1], np.arange(20, 28))
    np.testing.assert_array_equal(batch["loss_mask"][1], [0] + [.5] * 7)
    for key in ("tokens", "segment_ids", "positions", "loss_mask"):  # two empty rows pad the short batch
      want = {"tokens": TOK.PAD, "segment_ids": 0, "loss_mask": 0}.get(key)
      if key == "positions":
        np.testing.assert_array_equal(batch[key][2:], np.tile(np.arange(8), (2, 1)))
      else:
        self.assertTrue((batch[key][2:] == want).all(), key)

  def test_a_chat_document_longer_than_a_row_is_refused(self):
    chat = packing.tokenize((("a long question?", 0.0), ("yes", 1.0)), TOK)  # 21 tokens, prompt weight 0
    ds = packing.chunk_documents(grain.MapDataset.source([chat]).to_iter_dataset(), 16)
    with self.assertRaisesRegex(ValueError, "raise seq_len to >= 21"):
      next(iter(ds))
    self.assertLen(list(packing.chunk_documents(grain.MapDataset.source([chat]).to_iter_dataset(), 21)), 1)

  @parameterized.parameters((16, 3), (64, 5))
  def test_no_token_lost_or_duplicated(self, seq_len, batch_size):
    texts = corpora.documents(40, 3 * seq_len, seed=seq_len)
    path = corpora.write_jsonl(texts)
    got = collections.Counter()
    batches = list(lm_dataset([{"kind": "jsonl", "path": path}], TOK, seq_len=seq_len, batch_size=batch_size,
                              seed=1, num_epochs=1, shuffle_window_tokens=8 * seq_len))
    for batch in batches:
      batch_checks.check_batch(self, batch, batch_size, seq_len)
      np.testing.assert_array_equal(batch["loss_mask"], (batch["segment_ids"] > 0) & (batch["positions"] > 0))
      got.update(batch_checks.segments(batch))
    want = batch_checks.pieces(texts, TOK, seq_len)
    self.assertEqual(got, want)
    self.assertTrue(any(len(p) == seq_len for p in want), "some document was longer than T")
    padding = sum((b["segment_ids"] == 0).sum() for b in batches) / (len(batches) * batch_size * seq_len)
    self.assertLess(padding, 0.35)

  def test_eval_batches_are_fixed(self):
    texts = corpora.documents(30, 50)
    source = {"kind": "jsonl", "path": corpora.write_jsonl(texts)}
    first = eval_batches(source, TOK, seq_len=32, batch_size=4, n_batches=3)
    again = eval_batches(source, TOK, seq_len=32, batch_size=4, n_batches=3)
    self.assertLen(first, 3)
    for a, b in zip(first, again):
      batch_checks.check_batch(self, a, 4, 32)
      for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    other = eval_batches(source, TOK, seq_len=32, batch_size=4, n_batches=1, seed=1)
    self.assertFalse(np.array_equal(other[0]["tokens"], first[0]["tokens"]))
    every = eval_batches(source, TOK, seq_len=32, batch_size=4, n_batches=1000)  # fewer when the source ends
    self.assertLess(len(every), 1000)
    self.assertEqual(collections.Counter(sum((batch_checks.segments(b) for b in every), [])),
                     batch_checks.pieces(texts, TOK, 32))


if __name__ == "__main__":
  absltest.main()
