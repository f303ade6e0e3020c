"""The copy stream: every row parses back into strings written twice, the parts label exactly the copies' symbols,
the same seed gives the same rows, and the scoring averages exactly the labelled positions."""

import os
import tempfile

from absl.testing import absltest
import numpy as np

from c2jax.data import bpe
from c2jax.data import sources
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.copy_stream import (ALPHABET, END, SEPARATOR, WIDE_ALPHABET, CopyStream, Part, copy_losses,
                                    copy_text)
from c2jax.data.tokenizer import make_tokenizer


class CopyStreamTest(absltest.TestCase):

  def _assert_strings_written_twice(self, rows, alphabet) -> set[int]:
    """Checks each row parses into strings over `alphabet` written twice, with their parts; returns the symbols."""
    seen: set[int] = set()
    for tokens, part in zip(rows.tokens, rows.part):
      i, whole = 0, 0
      while i < len(tokens):
        end = i
        while end < len(tokens) and tokens[end] != SEPARATOR:
          end += 1
        s = tokens[i:end]
        self.assertTrue(np.isin(s, alphabet).all())
        seen |= set(s.tolist())
        if end + 1 + len(s) + 1 > len(tokens):
          break  # the row's cut pair
        self.assertBetween(len(s), 24, 48)
        second = tokens[end + 1:end + 1 + len(s)]
        np.testing.assert_array_equal(second, s)
        self.assertEqual(tokens[end + 1 + len(s)], END)
        np.testing.assert_array_equal(part[i:end], [Part.OTHER] + [Part.FIRST] * (len(s) - 1))
        np.testing.assert_array_equal(part[end + 1:end + 1 + len(s)], [Part.OTHER] + [Part.SECOND] * (len(s) - 1))
        self.assertEqual(part[end], Part.OTHER)
        i, whole = end + 2 + len(s), whole + 1
      self.assertGreaterEqual(whole, 2)
    return seen

  def test_rows_are_strings_written_twice_with_their_parts(self):
    rows = CopyStream(seed=3, seq_len=300).batch(4)
    self.assertEqual(rows.tokens.shape, (4, 300))
    self.assertEqual(rows.part.shape, (4, 300))
    self._assert_strings_written_twice(rows, ALPHABET)

  def test_alphabet_size_draws_from_the_first_symbols_of_the_wide_alphabet(self):
    np.testing.assert_array_equal(WIDE_ALPHABET[:32], ALPHABET)  # the default alphabet is its first 32
    self.assertLen(set(WIDE_ALPHABET.tolist()), 222)  # bytes 33-255 but the separator
    self.assertNotIn(SEPARATOR, WIDE_ALPHABET)
    self.assertNotIn(END, WIDE_ALPHABET)
    wide = self._assert_strings_written_twice(CopyStream(seed=3, seq_len=300, alphabet_size=200).batch(8),
                                              WIDE_ALPHABET[:200])
    self.assertGreater(len(wide), 150)  # 8 rows of ~3 strings of 24-48 symbols reach most of 200
    narrow = self._assert_strings_written_twice(CopyStream(seed=3, seq_len=300, alphabet_size=8).batch(4),
                                                ALPHABET[:8])
    self.assertLen(narrow, 8)
    np.testing.assert_array_equal(CopyStream(seed=3, alphabet_size=32).batch(2).tokens,
                                  CopyStream(seed=3).batch(2).tokens)
    for size in (1, len(WIDE_ALPHABET) + 1):
      with self.assertRaisesRegex(ValueError, f"alphabet_size={size} must be in \\[2, {len(WIDE_ALPHABET)}\\]"):
        CopyStream(alphabet_size=size)
    with self.assertRaisesRegex(ValueError, "alphabet_size=33 must be in \\[2, 32\\] with a tokenizer"):
      CopyStream(alphabet_size=33, tokenizer=ByteTokenizer())

  def test_in_a_bpe_both_copies_are_the_same_tokens_and_the_parts_label_them(self):
    # A BPE that merges symbol pairs, so that a copy's tokens are not its bytes.
    path = bpe.train_bpe([copy_text(np.random.default_rng(i), 2000) for i in range(4)], 400,
                         os.path.join(tempfile.mkdtemp(), "t.json"))
    tok = make_tokenizer(path)
    rows = CopyStream(seed=3, seq_len=200, tokenizer=tok).batch(2)
    for tokens, part in zip(rows.tokens, rows.part):
      self.assertEqual(tokens[0], tok.bos_id)
      text = tok.decode(tokens[1:].tolist())
      pairs = text.split("\n")[:-1]  # the last pair is cut
      self.assertGreaterEqual(len(pairs), 2)
      for pair in pairs:
        first, second = pair.split(":")
        self.assertEqual(first, second)
      # Parts: each whole copy is OTHER (its first token) then FIRST or SECOND tokens, as many in both copies.
      first_runs = np.diff(np.flatnonzero(np.diff(np.r_[0, part == Part.FIRST, 0])))[::2]
      second_runs = np.diff(np.flatnonzero(np.diff(np.r_[0, part == Part.SECOND, 0])))[::2]
      np.testing.assert_array_equal(first_runs[:len(pairs)], second_runs[:len(pairs)])
      self.assertLess(len(tokens) - 1, len(text))  # merged: fewer tokens than characters
      i = int(np.flatnonzero(part == Part.SECOND)[0])
      n = int(first_runs[0]) + 1
      np.testing.assert_array_equal(tokens[i - 1:i + n - 1], tokens[1:1 + n])  # the second copy repeats the first

  def test_byte_tokenizer_rows_are_the_byte_rows_after_bos(self):
    rows = CopyStream(seed=5, seq_len=120, tokenizer=ByteTokenizer()).batch(2)
    plain = CopyStream(seed=5, seq_len=119).batch(2)
    np.testing.assert_array_equal(rows.tokens[:, 1:], plain.tokens)
    np.testing.assert_array_equal(rows.part[:, 1:], plain.part)
    self.assertTrue((rows.tokens[:, 0] == ByteTokenizer().bos_id).all())

  def test_copy_source_documents_are_copies_and_seeded(self):
    ds = sources.open_source({"kind": "copy", "documents": 5, "doc_chars": 300, "seed": 7})
    self.assertLen(ds, 5)
    self.assertEqual(ds[2], sources.open_source({"kind": "copy", "documents": 5, "doc_chars": 300, "seed": 7})[2])
    self.assertNotEqual(ds[2], ds[3])
    for pair in ds[0].split("\n")[:-1]:
      first, second = pair.split(":")
      self.assertEqual(first, second)
      self.assertBetween(len(first), 24, 48)
    self.assertBetween(len(ds[0]), 300, 300 + 2 * 48 + 2)
    with self.assertRaisesRegex(ValueError, "has no documents of at least min_bytes"):
      sources.open_source({"kind": "copy", "doc_chars": 300, "min_bytes": 1000})

  def test_seeded(self):
    a, b, c = CopyStream(seed=1).batch(2), CopyStream(seed=1).batch(2), CopyStream(seed=2).batch(2)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    self.assertFalse(np.array_equal(a.tokens, c.tokens))
    stream = CopyStream(seed=1)
    self.assertFalse(np.array_equal(stream.batch(2).tokens, stream.batch(2).tokens))  # a stream, not one batch again

  def test_copy_losses_average_the_labelled_targets(self):
    part = np.array([[Part.OTHER, Part.FIRST, Part.FIRST, Part.OTHER, Part.SECOND, Part.SECOND]])
    ce = np.array([[1.0, 2.0, 9.0, 4.0, 6.0]])  # ce[:, i] predicts token i + 1
    self.assertEqual(copy_losses(ce, part), (1.5, 5.0))

  def test_bad_lengths(self):
    with self.assertRaisesRegex(ValueError, "min_len <= max_len"):
      CopyStream(min_len=10, max_len=5)
    with self.assertRaisesRegex(ValueError, "seq_len=40 holds no whole pair"):
      CopyStream(seq_len=40)


if __name__ == "__main__":
  absltest.main()
