"""The data path refuses what it must not accept, written as an attacker (or an unlucky operator) would try it:
cursors of another buffer, a second live writer with the same id, lost commit records, a damaged LATEST.

Each refusal is one sentence naming the bad entry (ValueError / WriterConflict / WeightStoreError), never a raw
TypeError or JSONDecodeError, and nothing is lost silently: a lost commit record is counted by every reader.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from c2jax.rollouts import admission
from c2jax.rollouts.buffer import RolloutReader, RolloutWriter, WriterConflict, commit_key
from c2jax.rollouts.weight_store import WeightStore, WeightStoreError
from tests.rollouts.buffer_test import SPEC, assert_group_equal, make_group, temp_dir

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A writer in another process that holds its shard open until its stdin closes.
_HOLDER = textwrap.dedent("""
    import sys
    from c2jax.rollouts.buffer import RolloutWriter
    from tests.rollouts.buffer_test import SPEC, make_group
    w = RolloutWriter(sys.argv[1], sys.argv[2], SPEC)
    w.commit(make_group(100), {"task_id": "held"})
    print("open", flush=True)
    sys.stdin.read()
""")


def _commit(url, writer_id, seeds):
  with RolloutWriter(url, writer_id, SPEC) as w:
    for s in seeds:
      w.commit(make_group(s), {"task_id": f"t{s}"})


class CursorTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)
    _commit(self.url, "a", range(3))

  def test_a_saved_cursor_resumes(self):
    reader = RolloutReader(self.url, SPEC)
    self.assertLen(reader.take(2, timeout_s=5), 2)
    resumed = RolloutReader(self.url, SPEC, cursor=reader.cursor)
    self.assertEqual([g.meta["seq"] for g in resumed.poll()], [2])
    self.assertEqual(RolloutReader(self.url, SPEC, cursor={"a": 3}).poll(), [])  # exactly at the end is fine
    self.assertEqual(RolloutReader(self.url, SPEC, cursor={"not-yet": 0}).poll()[0].meta["seq"], 0)

  def test_a_shard_the_buffer_does_not_hold_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"entry 'ghost': 5 names a shard that buffer .* does not hold"):
      RolloutReader(self.url, SPEC, cursor={"a": 1, "ghost": 5})
    # Nothing was published from the bad cursor: admission still counts no group as consumed.
    self.assertEqual(admission.read_status(self.url).consumed, 0)

  def test_a_cursor_past_the_end_of_a_shard_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"entry 'a': 4 is past the end of that shard"):
      RolloutReader(self.url, SPEC, cursor={"a": 4})

  @parameterized.named_parameters(
      ("list", [("a", 1)], "is a list"),
      ("string", "a=1", "is a str"),
      ("str_seq", {"a": "1"}, "entry 'a': '1' is not"),
      ("float_seq", {"a": 1.0}, "entry 'a': 1.0 is not"),
      ("bool_seq", {"a": True}, "entry 'a': True is not"),
      ("negative", {"a": -1}, "entry 'a': -1 is not"),
      ("int_key", {3: 1}, "entry 3: 1 is not"),
      ("nested", {"a": {"seq": 1}}, "is not shard id"),
  )
  def test_a_cursor_of_the_wrong_types_is_one_sentence(self, cursor, message):
    with self.assertRaisesRegex(ValueError, message):
      RolloutReader(self.url, SPEC, cursor=cursor)


class WriterOwnershipTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)

  def _hold(self, writer_id):
    env = {**os.environ, "PYTHONPATH": _ROOT}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, self.url, writer_id], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    self.assertEqual(proc.stdout.readline().strip(), "open")
    return proc

  def test_a_second_live_writer_process_with_the_same_id_is_refused(self):
    holder = self._hold("actor-1")
    with self.assertRaisesRegex(WriterConflict, r"Shard 'actor-1' .* is open in another live writer \(pid \d+"):
      RolloutWriter(self.url, "actor-1", SPEC)
    # Another id is fine while it lives.
    _commit(self.url, "actor-2", [7])
    # The holder dies (SIGKILL: no close, no cleanup): the kernel frees the lock and a restart reopens at once.
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with RolloutWriter(self.url, "actor-1", SPEC) as w:
      self.assertEqual(w.next_seq, 1)
      w.commit(make_group(1), {"task_id": "t1"})
    got = {(g.meta["shard"], g.meta["seq"]): g for g in RolloutReader(self.url, SPEC).poll()}
    self.assertEqual(sorted(got), [("actor-1", 0), ("actor-1", 1), ("actor-2", 0)])
    assert_group_equal(self, make_group(100), got[("actor-1", 0)].data)
    assert_group_equal(self, make_group(1), got[("actor-1", 1)].data)

  def test_a_writer_taken_over_stops_before_it_tears_a_group(self):
    # Object stores have no locks: the newest opener owns the shard (owner.json), and the older writer is fenced
    # at its next commit. (Within one process the lock is shared, so this is the takeover path.)
    old = RolloutWriter(self.url, "w", SPEC)
    old.commit(make_group(0), {"task_id": "t0"})
    new = RolloutWriter(self.url, "w", SPEC)
    with self.assertRaisesRegex(WriterConflict, "was opened by another writer .* after this one"):
      old.commit(make_group(50), {"task_id": "stale"})
    with self.assertRaisesRegex(ValueError, "is closed"):
      old.begin({"task_id": "x"})
    new.commit(make_group(1), {"task_id": "t1"})
    groups = RolloutReader(self.url, SPEC).poll()
    self.assertEqual([g.meta["task_id"] for g in groups], ["t0", "t1"])
    for g, seed in zip(groups, (0, 1)):
      assert_group_equal(self, make_group(seed), g.data)

  def test_two_processes_racing_on_one_id_never_both_commit(self):
    env = {**os.environ, "PYTHONPATH": _ROOT}
    script = textwrap.dedent("""
        import sys
        from c2jax.rollouts.buffer import RolloutWriter, WriterConflict
        from tests.rollouts.buffer_test import SPEC, make_group
        try:
          w = RolloutWriter(sys.argv[1], "dup", SPEC)
        except WriterConflict:
          print("refused"); sys.exit(0)
        for s in range(20):
          w.commit(make_group(int(sys.argv[2]) * 100 + s), {"task_id": sys.argv[2]})
        w.close()
        print("wrote")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, self.url, str(i)], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=_ROOT) for i in (1, 2)]
    outs = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    groups = RolloutReader(self.url, SPEC).poll()
    # Either one was refused (they overlapped) or they ran one after the other (the second resumed the first's
    # shard); in both cases every group is whole and none is lost.
    self.assertIn(outs, (["refused", "wrote"], ["wrote", "wrote"]))
    self.assertLen(groups, 20 * outs.count("wrote"))
    for g in groups:
      base = int(g.meta["task_id"]) * 100
      matches = [s for s in range(base, base + 20) if np.array_equal(make_group(s)["tokens"], g.data["tokens"])]
      self.assertLen(matches, 1, "a torn group")
      assert_group_equal(self, make_group(matches[0]), g.data)


class LostRecordTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)
    self.shard = os.path.join(self.url, "shards", "w")

  def test_a_lost_record_and_a_lost_head_are_counted_not_voided_silently(self):
    _commit(self.url, "w", range(6))  # six separate commit calls
    os.remove(os.path.join(self.shard, commit_key(2)))
    os.remove(os.path.join(self.shard, "head.json"))
    with RolloutWriter(self.url, "w", SPEC) as w:  # resumes after the last record; rewrites head.json
      self.assertEqual(w.next_seq, 6)
      w.commit(make_group(6), {"task_id": "t6"})
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0, 1, 3, 4, 5, 6])
    self.assertEqual(reader.stats["lost_groups"], 1)
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    self.assertFalse(os.path.exists(os.path.join(self.shard, commit_key(2))))  # nothing pretends to be group 2

  def test_every_group_of_a_lost_call_record_is_counted(self):
    w = RolloutWriter(self.url, "w", SPEC)
    w.commit(make_group(0), {"task_id": "t0"})
    w.commit_many([make_group(s) for s in (1, 2, 3)], [{"task_id": f"t{s}"} for s in (1, 2, 3)])
    w.commit(make_group(4), {"task_id": "t4"})
    os.remove(os.path.join(self.shard, commit_key(1)))  # the record of the call of groups 1-3
    reader = RolloutReader(self.url, SPEC)
    got = reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [0, 4])
    assert_group_equal(self, make_group(4), got[1].data)
    self.assertEqual((reader.stats["lost_groups"], reader.stats["corrupt_groups"]), (3, 0))
    self.assertEqual(reader.cursor, {"w": 5})

  def test_a_record_lost_while_head_counts_it_is_lost_too(self):
    _commit(self.url, "w", range(3))
    os.remove(os.path.join(self.shard, commit_key(1)))
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0, 2])
    self.assertEqual(reader.stats["lost_groups"], 1)

  def test_a_head_that_counts_records_never_written_loses_no_future_group(self):
    w = RolloutWriter(self.url, "w", SPEC)
    for s in range(3):
      w.commit(make_group(s), {"task_id": f"t{s}"})
    with open(os.path.join(self.shard, "head.json"), "w") as f:  # damaged: counts 1000 commits
      json.dump({"committed": 1000, "pending": 0, "rows": 9, "time": 0}, f)
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0, 1, 2])
    self.assertEqual(reader.poll(), [])  # waits at seq 3 instead of skipping 3..999 as lost
    self.assertEqual(reader.cursor, {"w": 3})
    w.commit(make_group(3), {"task_id": "t3"})
    (got,) = reader.poll()
    assert_group_equal(self, make_group(3), got.data)
    self.assertEqual((reader.stats["lost_groups"], reader.stats["corrupt_groups"]), (0, 0))


class TrainerProgressTest(parameterized.TestCase):

  @parameterized.named_parameters(("garbage", "{not json"), ("list", "[1, 2]"), ("strings", '{"version": "x"}'),
                                  ("negative", '{"version": -5, "groups_consumed": 0}'),
                                  ("zero_per_step", '{"version": 1, "groups_per_step": 0}'))
  def test_a_damaged_trainer_json_admits_nothing_until_it_is_rewritten(self, text):
    url = temp_dir(self)
    _commit(url, "a", range(4))
    reader = RolloutReader(url, SPEC)
    reader.take(2, timeout_s=5)
    reader.publish_progress(version=7, groups_per_step=2)
    self.assertTrue(admission.admit(admission.read_status(url), 7, 1))
    with open(os.path.join(url, "trainer.json"), "w") as f:
      f.write(text)
    damaged = admission.read_status(url)
    self.assertTrue(damaged.trainer_damaged)
    self.assertFalse(any(admission.admit(damaged, held, lag) for held in range(10) for lag in range(3)))
    self.assertEqual(admission.read_progress(url), (-1, -1))  # a refused actor sees a change when it heals
    reader.publish_progress(version=8, groups_per_step=2)
    self.assertEqual(admission.read_progress(url), (8, 2))
    self.assertTrue(admission.admit(admission.read_status(url), 8, 1))


class WeightStoreValidationTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)
    self.store = WeightStore(self.url)
    self.store.publish(0, {"w": np.arange(8, dtype=np.float32)})

  @parameterized.named_parameters(
      ("truncated_json", b'{"version": '),
      ("not_utf8", b"\xff\xfe"),
      ("a_list", b"[0]"),
      ("no_version", b'{"v": 0}'),
      ("string_version", b'{"version": "0"}'),
      ("negative", b'{"version": -3}'),
      ("bool", b'{"version": true}'),
      ("null", b"null"),
  )
  def test_a_damaged_latest_is_a_weight_store_error(self, data):
    with open(os.path.join(self.url, "LATEST"), "wb") as f:
      f.write(data)
    reader = WeightStore(self.url)
    for call in (reader.latest, reader.load, lambda: reader.update(None, None),
                 lambda: self.store.publish(1, {"w": np.ones(8, np.float32)})):
      with self.assertRaisesRegex(WeightStoreError, "LATEST at .* (is damaged|names version)"):
        call()

  def test_a_storage_failure_is_a_weight_store_error(self):
    # As root no permission bit stops a read here, so the storage error is tensorstore's own, as an object store
    # returns it (tensorstore raises ValueError("<status code>: ...")).
    reader = WeightStore(self.url)
    failing = mock.Mock()
    failing.read.side_effect = ValueError("PERMISSION_DENIED: Error reading \"LATEST\"")
    with mock.patch.object(reader, "_kv", failing):
      with self.assertRaisesRegex(WeightStoreError, "Reading LATEST at .* PERMISSION_DENIED"):
        reader.load()


if __name__ == "__main__":
  absltest.main()
