"""The copy stream: every row parses back into strings written twice, the parts label exactly the copies' symbols,
the same seed gives the same rows, and the scoring averages exactly the labelled positions."""

from absl.testing import absltest
import numpy as np

from c2jax.data.copy_stream import ALPHABET, END, SEPARATOR, CopyStream, Part, copy_losses


class CopyStreamTest(absltest.TestCase):

  def test_rows_are_strings_written_twice_with_their_parts(self):
    rows = CopyStream(seed=3, seq_len=300).batch(4)
    self.assertEqual(rows.tokens.shape, (4, 300))
    self.assertEqual(rows.part.shape, (4, 300))
    for tokens, part in zip(rows.tokens, rows.part):
      i, whole = 0, 0
      while i < len(tokens):
        end = i
        while end < len(tokens) and tokens[end] != SEPARATOR:
          end += 1
        s = tokens[i:end]
        self.assertTrue(np.isin(s, ALPHABET).all())
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
