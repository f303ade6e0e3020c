"""c2jax/rollouts/prefetch.py: the trainer's next batch read in the background, with the cursor of each batch."""

import shutil
import tempfile
import threading
import time

from absl.testing import absltest

from c2jax.rollouts.buffer import RolloutReader, RolloutWriter
from c2jax.rollouts.prefetch import Prefetcher
from tests.rollouts.buffer_test import SPEC, assert_group_equal, make_group


class PrefetcherTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.url = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.url, ignore_errors=True)
    self.writer = RolloutWriter(self.url, "actor-0", SPEC)
    self.addCleanup(self.writer.close)
    self.groups = [make_group(s) for s in range(6)]

  def _commit(self, seeds):
    for s in seeds:
      self.writer.commit(self.groups[s], {"task_id": f"t{s}"})

  def test_batches_come_in_order_with_the_cursor_of_their_own_groups(self):
    self._commit(range(4))
    reader = RolloutReader(self.url, spec=SPEC)
    with Prefetcher(reader, 2, read_timeout_s=0.2, poll_interval_s=0.01) as prefetch:
      first, cursor = prefetch.take(timeout_s=5)
      self.assertEqual([g.meta["seq"] for g in first], [0, 1])
      self.assertEqual(cursor, {"actor-0": 2})
      prefetch.start()  # reads groups 2 and 3 while "the update" runs
      deadline = time.monotonic() + 5
      while reader.cursor != {"actor-0": 4} and time.monotonic() < deadline:
        time.sleep(0.01)
      # The reader has handed out the batch read ahead; the first batch's cursor does not count it.
      self.assertEqual(reader.cursor, {"actor-0": 4})
      self.assertEqual(cursor, {"actor-0": 2})
      second, cursor = prefetch.take(timeout_s=5)
      self.assertEqual(cursor, {"actor-0": 4})
      for want, got in zip(self.groups[2:4], second):
        assert_group_equal(self, want, got.data)

  def test_an_incomplete_batch_is_none_until_it_completes(self):
    self._commit([0])
    reader = RolloutReader(self.url, spec=SPEC)
    with Prefetcher(reader, 2, read_timeout_s=0.1, poll_interval_s=0.01) as prefetch:
      for _ in range(3):  # whether the background read is still waiting or gave up: nothing handed out
        self.assertEqual(prefetch.take(timeout_s=0.05), ([], None))
      self.assertEqual(reader.cursor, {"actor-0": 0})
      self._commit([1])
      got, cursor = [], None
      deadline = time.monotonic() + 5
      while not got and time.monotonic() < deadline:
        got, cursor = prefetch.take(timeout_s=0.5)
      self.assertEqual([g.meta["seq"] for g in got], [0, 1])
      self.assertEqual(cursor, {"actor-0": 2})

  def test_a_failed_read_raises_in_take(self):
    reader = RolloutReader(self.url, spec=SPEC)
    reader.take = lambda *a, **k: (_ for _ in ()).throw(OSError("storage is gone"))
    with Prefetcher(reader, 2) as prefetch:
      with self.assertRaisesRegex(OSError, "storage is gone"):
        prefetch.take(timeout_s=5)

  def test_close_waits_for_a_running_read_and_is_idempotent(self):
    reader = RolloutReader(self.url, spec=SPEC)
    prefetch = Prefetcher(reader, 2, read_timeout_s=0.3, poll_interval_s=0.01)
    prefetch.start()  # waits for groups that never come
    closed = threading.Event()
    t = threading.Thread(target=lambda: (prefetch.close(), closed.set()))
    t.start()
    t.join(timeout=10)
    self.assertTrue(closed.is_set())
    prefetch.close()

  def test_rejects_an_empty_batch_size(self):
    with self.assertRaisesRegex(ValueError, "n >= 1"):
      Prefetcher(RolloutReader(self.url, spec=SPEC), 0)


if __name__ == "__main__":
  absltest.main()
