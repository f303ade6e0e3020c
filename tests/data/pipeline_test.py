"""lm_dataset: seeded shuffles (same seed same batches, other seed other batches), epochs, mixing proportions,
disjoint covering shards, exact JSON state save / restore, and the argument errors."""

import collections
import json

from absl.testing import absltest, parameterized
import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.pipeline import host_shard, lm_dataset
from tests.data import batches as batch_checks
from tests.data import corpora

TOK = ByteTokenizer()
T, B = 32, 4


def _take(it, n):
  return [next(it) for _ in range(n)]


def _equal(a, b) -> bool:
  return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x) and len(a) == len(b)


def _segments(batches):
  return collections.Counter(s for b in batches for s in batch_checks.segments(b))


class PipelineTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.texts = corpora.documents(24, 3 * T)
    cls.source = {"kind": "jsonl", "path": corpora.write_jsonl(cls.texts)}
    # Two sources told apart by their letters, for mixing.
    cls.a = {"kind": "jsonl", "path": corpora.write_jsonl(corpora.documents(50, 2 * T, alphabet="a"))}
    cls.b = {"kind": "jsonl", "path": corpora.write_jsonl(corpora.documents(50, 2 * T, seed=1, alphabet="b"))}

  def _ds(self, sources=None, **kw):
    args = dict(seq_len=T, batch_size=B, seed=0, shuffle_window_tokens=16 * T)
    args.update(kw)
    return lm_dataset([self.source] if sources is None else sources, TOK, **args)

  def test_seeded_shuffle(self):
    first = _take(iter(self._ds(seed=3)), 4)
    for batch in first:
      batch_checks.check_batch(self, batch, B, T)
    self.assertTrue(_equal(first, _take(iter(self._ds(seed=3)), 4)))
    self.assertFalse(_equal(first, _take(iter(self._ds(seed=4)), 4)))

  def test_epochs(self):
    one = list(self._ds(num_epochs=1))
    two = list(self._ds(num_epochs=2))
    want = batch_checks.pieces(self.texts, TOK, T)
    self.assertEqual(_segments(one), want)
    self.assertEqual(_segments(two), collections.Counter({k: 2 * v for k, v in want.items()}))
    # Each epoch has its own document order (seen without the piece shuffle, which would hide it): the document
    # starts (pieces beginning with BOS) of the second pass come in another order than those of the first.
    unshuffled = list(self._ds(num_epochs=2, shuffle_window_tokens=T))
    starts = [int(TOK.decode(s).split(":")[0]) for b in unshuffled for s in batch_checks.segments(b)
              if s[0] == TOK.BOS]
    n = len(self.texts)
    self.assertLen(starts, 2 * n)
    self.assertGreater(sum(a != b for a, b in zip(starts[:n], starts[n:])), n // 2)
    forever = iter(self._ds(num_epochs=None))
    self.assertLen(_take(forever, 3 * len(one)), 3 * len(one))

  def test_shards_disjoint_and_covering(self):
    n = 3
    shards = [_segments(self._ds(num_epochs=1, shard_index=i, shard_count=n)) for i in range(n)]
    for i in range(n):
      for j in range(i + 1, n):
        self.assertEmpty(set(shards[i]) & set(shards[j]))
    self.assertEqual(sum(shards, collections.Counter()), batch_checks.pieces(self.texts, TOK, T))
    # Later epochs stay within the shard (grain's slice -> shuffle -> repeat index arithmetic).
    twice = _segments(self._ds(num_epochs=2, shard_index=1, shard_count=n))
    self.assertEqual(twice, collections.Counter({k: 2 * v for k, v in shards[1].items()}))

  @parameterized.parameters(0.25, 0.75)
  def test_mixing_proportions(self, share_a):
    ds = self._ds([dict(self.a, weight=share_a), dict(self.b, weight=1 - share_a)])
    counts = collections.Counter()
    for batch in _take(iter(ds), 40):
      for seg in batch_checks.segments(batch):
        counts["a" if ord("a") in seg else "b"] += 1
    self.assertAlmostEqual(counts["a"] / (counts["a"] + counts["b"]), share_a, delta=0.06)

  def test_copy_data_mixed_into_code_holds_its_weight(self):
    code = {"kind": "jsonl", "path": corpora.write_jsonl(corpora.documents(50, 8 * T, seed=2, alphabet="Z"))}
    copies = {"kind": "copy", "documents": 200, "doc_chars": 8 * T, "weight": 0.25}
    counts = collections.Counter()
    for batch in _take(iter(self._ds([dict(code, weight=0.75), copies])), 40):
      for seg in batch_checks.segments(batch):
        counts["code" if ord("Z") in seg else "copy"] += len(seg)
    self.assertAlmostEqual(counts["copy"] / (counts["copy"] + counts["code"]), 0.25, delta=0.06)

  @parameterized.named_parameters(
      ("forever_mixed", None, True, 5, 6),
      ("second_epoch", 2, False, 11, 12),  # a pass is 10 batches: the restore lands in the second of 2 passes
  )
  def test_state_restore_is_exact(self, num_epochs, mixed, k, m):
    sources = [self.a, dict(self.b, weight=0.5)] if mixed else [self.source]
    uninterrupted = iter(self._ds(sources, num_epochs=num_epochs))
    _take(uninterrupted, k)
    state = json.loads(json.dumps(uninterrupted.get_state()))  # what the checkpoint stores
    want = [next(uninterrupted, None) for _ in range(m)]
    restored = iter(self._ds(sources, num_epochs=num_epochs))
    restored.set_state(state)
    got = [next(restored, None) for _ in range(m)]
    self.assertEqual([g is None for g in got], [w is None for w in want])
    self.assertTrue(_equal([g for g in got if g is not None], [w for w in want if w is not None]))
    if num_epochs is not None:
      self.assertIsNone(want[-1], "the run ended within the m batches")

  def test_host_shard(self):
    self.assertEqual(host_shard(), {"shard_index": 0, "shard_count": 1})  # one process here

  def test_errors(self):
    cases = [
        (dict(sources=[]), "needs at least one data source"),
        (dict(sources=[dict(self.a, weight=0)]), "weight 0; weights must be positive"),
        (dict(shard_index=2, shard_count=2), r"shard_index=2 must lie in \[0, shard_count=2\)"),
        (dict(shard_index=0, shard_count=25), "has 24 documents, fewer than the 25 shards"),
        (dict(num_epochs=0), "num_epochs=0"),
        (dict(seq_len=1), "seq_len=1"),
    ]
    for kw, message in cases:
      with self.subTest(message):
        with self.assertRaisesRegex(ValueError, message):
          self._ds(**kw)


if __name__ == "__main__":
  absltest.main()
