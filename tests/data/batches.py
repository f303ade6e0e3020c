"""Checks shared by the data tests: the invariants of a packed batch, and its segments as token tuples."""

import collections

import numpy as np


def check_batch(test, batch, batch_size: int, seq_len: int) -> None:
  """Asserts the batch format of c2jax/data/packing.py: shapes, dtypes, segments, positions, loss mask."""
  test.assertEqual(sorted(batch), ["loss_mask", "positions", "segment_ids", "tokens"])
  for key, dtype in (("tokens", np.int32), ("positions", np.int32), ("segment_ids", np.int32),
                     ("loss_mask", np.float32)):
    test.assertEqual(batch[key].shape, (batch_size, seq_len), key)
    test.assertEqual(batch[key].dtype, dtype, key)
  for seg, pos, mask in zip(batch["segment_ids"], batch["positions"], batch["loss_mask"]):
    n = int((seg > 0).sum())
    test.assertTrue((seg[n:] == 0).all(), "padding only at the end of a row")
    if n:
      test.assertEqual(seg[0], 1)
      steps = np.diff(seg[:n])
      test.assertTrue(((steps == 0) | (steps == 1)).all(), f"segments numbered 1, 2, ... in order: {seg}")
    for s in range(1, int(seg.max()) + 1):
      at = seg == s
      np.testing.assert_array_equal(pos[at], np.arange(at.sum()))  # positions restart at every segment
    np.testing.assert_array_equal(pos[n:], np.arange(seq_len - n))
    test.assertTrue((mask[seg == 0] == 0).all(), "no loss on padding")
    test.assertTrue((mask[pos == 0] == 0).all(), "the first token of a segment is never a target")


def segments(batch) -> list[tuple[int, ...]]:
  """Every segment of the batch as a tuple of token ids, row by row."""
  out = []
  for tok, seg in zip(batch["tokens"], batch["segment_ids"]):
    for s in range(1, int(seg.max()) + 1):
      out.append(tuple(tok[seg == s].tolist()))
  return out


def pieces(texts, tokenizer, seq_len: int) -> collections.Counter:
  """The pieces (<= seq_len tokens) the packer must emit for these documents, one count per document piece."""
  out = collections.Counter()
  for text in texts:
    ids = tokenizer.encode(text).tolist()
    for s in range(0, len(ids), seq_len):
      out[tuple(ids[s:s + seq_len])] += 1
  return out
