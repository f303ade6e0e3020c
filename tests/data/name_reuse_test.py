"""The names probe's labels: on a hand-made document, exactly the tokens inside a name's later uses (after the
name's first token) are LATER and those inside its first use FIRST; keywords and one-token names count nowhere."""

import os
import tempfile

from absl.testing import absltest
import numpy as np

from c2jax.data import bpe
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.name_reuse import NamePart, label_names, name_rows
from c2jax.data.tokenizer import make_tokenizer

O, F, L = NamePart.OTHER, NamePart.FIRST, NamePart.LATER


def _marked(text: str, ends, part) -> str:
  """The text with FIRST tokens in {} and LATER tokens in []."""
  out, start = [], 0
  for end, p in zip(ends, part):
    piece = text[start:end]
    out.append({F: f"{{{piece}}}", L: f"[{piece}]"}.get(p, piece))
    start = end
  return "".join(out)


class NameReuseTest(absltest.TestCase):

  def test_hand_made_document(self):
    text = "def area(w, h):\n  return w * h\nx = area(2, 3)\n"
    # Tokens: "def", " ", "ar", "ea", "(", "w", ", ", "h", ...: a name of one token has nothing after its first token.
    pieces = ["def", " ", "ar", "ea", "(", "w", ", ", "h", "):\n  ", "return", " ", "w", " * ", "h", "\n",
              "x", " = ", "ar", "e", "a", "(2, 3)\n"]
    self.assertEqual("".join(pieces), text)
    ends = np.cumsum([len(p) for p in pieces])
    part = label_names(text, ends)
    self.assertEqual(_marked(text, ends, part), "def ar{ea}(w, h):\n  return w * h\nx = ar[e][a](2, 3)\n")
    # A token that starts before the name (a BPE's leading space) is its first token, and is not counted.
    ends = np.cumsum([len(p) for p in ["a_b", " a_", "b", " a_b"]])
    np.testing.assert_array_equal(label_names("a_b a_b a_b", ends), [O, O, L, O])

  def test_keywords_are_not_names_and_the_language_is_a_parameter(self):
    text = "return returned return"
    ends = np.arange(1, len(text) + 1)  # one character per token
    part = label_names(text, ends)
    self.assertEqual(_marked(text, ends, part), "return r{e}{t}{u}{r}{n}{e}{d} return")
    part = label_names(text, ends, keywords=())
    self.assertEqual(_marked(text, ends, part),
                     "r{e}{t}{u}{r}{n} r{e}{t}{u}{r}{n}{e}{d} r[e][t][u][r][n]")

  def test_rows_in_a_tokenizer(self):
    docs = ["x" * 10, "value = 1\nvalue += 2\nprint(value)\n" * 3, "déjà = 1\ndéjà = 2\nother = déjà\n" * 3]
    # A BPE of a few merges: "value" stays several tokens.
    for tok in (ByteTokenizer(), make_tokenizer(bpe.train_bpe(docs * 4, 264, os.path.join(tempfile.mkdtemp(),
                                                                                            "t.json")))):
      rows = name_rows(docs, tok, seq_len=24, n_rows=2)  # the first document is too short for a row
      self.assertEqual(rows.tokens.shape, (2, 24))
      self.assertTrue((rows.tokens[:, 0] == tok.bos_id).all())
      self.assertEqual(tok.decode(rows.tokens[0, 1:].tolist()), ("value = 1\nvalue += 2\nprint(value)\n" * 3)[
          :len(tok.decode(rows.tokens[0, 1:].tolist()))])
      later = tok.decode(rows.tokens[0][rows.part[0] == L].tolist())
      self.assertTrue(later and set(later) <= set("value"), later)
      self.assertTrue((rows.part[:, 0] == O).all())
      self.assertTrue(tok.decode(rows.tokens[1, 1:].tolist()).startswith("dj = 1"))  # read as ASCII
    with self.assertRaisesRegex(ValueError, "Only 0 documents fill a 24-token row of the name probe with a first"):
      name_rows(["short"], ByteTokenizer(), seq_len=24, n_rows=1)


if __name__ == "__main__":
  absltest.main()
