"""The rollout buffer on a local directory: round trips, exactly-once reading, cursors, crash recovery, corruption,
admission arithmetic, collation and staleness."""

import dataclasses
import fcntl
import json
import os
import shutil
import struct
import tempfile
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import numpy as np

from c2jax.rl import batch as batch_lib
from c2jax.rollouts import admission
from c2jax.rollouts import buffer as buffer_lib
from c2jax.services import collate
from c2jax.rollouts import schema
from c2jax.rollouts import storage as storage_lib
from c2jax.rollouts.buffer import Group, RolloutReader, RolloutWriter
from c2jax.rollouts.storage import Store

SPEC = schema.BufferSpec(seq_len=16, n_moe_layers=2, experts_per_tok=2, reward_terms=("outcome", "length_penalty"))


def temp_dir(test):
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def make_group(seed, rows=3, version=0, spec=SPEC):
  """A random group whose every array differs from the other seeds' (so mixed-up rows are detected)."""
  g = schema.example_group(spec, rows=rows, seed=seed, version=version)
  g["tokens"] = g["tokens"] + 1000 * seed
  g["chain_id"] = np.array([r // 2 for r in range(rows)], np.int32)  # two-segment chains
  g["segment"] = np.array([r % 2 for r in range(rows)], np.int32)
  g["truncated"] = (np.arange(rows) % 3 == 0).astype(np.float32)
  if spec.n_moe_layers:
    g["expert_ids"] = g["expert_ids"] + seed
  return g


def assert_group_equal(test, want, got):
  test.assertEqual(set(want), set(got))
  for k, v in want.items():
    if k == "reward_terms":
      test.assertEqual(set(v), set(got[k]))
      for name, x in v.items():
        np.testing.assert_array_equal(x, got[k][name])
        test.assertEqual(got[k][name].dtype, np.float32)
    else:
      np.testing.assert_array_equal(v, got[k], err_msg=k)
      test.assertEqual(got[k].dtype, np.asarray(v).dtype, msg=k)


class BufferTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)

  def test_round_trip_is_bit_exact(self):
    groups = [make_group(s, rows=r, version=s) for s, r in ((0, 3), (1, 1), (2, 9))]
    with RolloutWriter(self.url, "actor-0", SPEC) as w:
      for i, g in enumerate(groups):
        self.assertEqual(w.commit(g, {"task_id": f"task{i}", "start_version": i}), i)
    reader = RolloutReader(self.url)
    out = reader.poll()
    self.assertLen(out, 3)
    self.assertEqual(reader.spec, SPEC)
    for i, (want, got) in enumerate(zip(groups, out)):
      assert_group_equal(self, want, got.data)
      self.assertEqual(got.meta["task_id"], f"task{i}")
      self.assertEqual(got.meta["start_version"], i)
      self.assertEqual((got.meta["shard"], got.meta["seq"], got.meta["rows"]), ("actor-0", i, want["tokens"].shape[0]))
    self.assertEqual(reader.cursor, {"actor-0": 3})
    self.assertEqual(reader.stats["groups_read"], 3)
    self.assertEqual(reader.stats["rows_read"], 13)
    self.assertGreater(reader.stats["bytes_read"], 0)
    self.assertEqual(reader.poll(), [])
    self.assertEqual(reader.backlog(), 0)

  def test_no_moe_layers_stores_no_expert_ids(self):
    spec = schema.BufferSpec(seq_len=8)
    g = make_group(0, spec=spec)
    RolloutWriter(self.url, "w", spec).commit(g, {"task_id": "t"})
    (got,) = RolloutReader(self.url, spec).poll()
    assert_group_equal(self, g, got.data)
    self.assertNotIn("expert_ids", got.data)

  def test_exactly_once_across_many_polls_and_writers(self):
    writers = [RolloutWriter(self.url, f"w{i}", SPEC) for i in range(3)]
    reader = RolloutReader(self.url, SPEC)
    seen = []
    for step in range(6):
      for i, w in enumerate(writers):
        if (step + i) % 2 == 0:
          w.commit(make_group(10 * i + step, rows=2), {"task_id": f"{i}/{step}"})
      seen += reader.poll(max_groups=2 if step % 2 else None)
    while reader.backlog():
      seen += reader.poll(max_groups=1)
    keys = [(g.meta["shard"], g.meta["seq"]) for g in seen]
    self.assertLen(keys, len(set(keys)))
    self.assertEqual(sorted(keys), sorted((f"w{i}", s) for i, w in enumerate(writers) for s in range(w.next_seq)))
    for g in seen:  # contents belong to their own commit
      i, step = map(int, g.meta["task_id"].split("/"))
      assert_group_equal(self, make_group(10 * i + step, rows=2), g.data)

  def test_round_robin_across_shards(self):
    for name in ("a", "b"):
      w = RolloutWriter(self.url, name, SPEC)
      for s in range(3):
        w.commit(make_group(s), {"task_id": name})
    out = RolloutReader(self.url).take(4)
    self.assertEqual(sorted(g.meta["shard"] for g in out), ["a", "a", "b", "b"])

  def test_cursor_restore_yields_only_the_rest(self):
    w = RolloutWriter(self.url, "w", SPEC)
    for s in range(7):
      w.commit(make_group(s), {"task_id": str(s)})
    first = RolloutReader(self.url)
    got = first.take(3)
    cursor = json.loads(json.dumps(first.cursor))  # what a checkpoint stores
    self.assertEqual(cursor, {"w": 3})
    rest = RolloutReader(self.url, cursor=cursor).poll()
    self.assertEqual([g.meta["seq"] for g in got + rest], list(range(7)))
    with self.assertRaisesRegex(ValueError, "cursor"):
      RolloutReader(self.url, cursor={"w": "3"})

  def test_take_cursor_describes_exactly_the_groups_handed_out(self):
    writers = [RolloutWriter(self.url, n, SPEC) for n in ("a", "b")]
    for s in range(3):
      for w in writers:
        w.commit(make_group(s), {"task_id": str(s)})
    reader = RolloutReader(self.url)
    self.assertEqual([len(reader.poll(max_groups=1))], [1])
    got = reader.take(2)
    self.assertLen(got, 2)
    self.assertEqual(sum(reader.cursor.values()), 3)
    self.assertEqual(reader.backlog(), 3)
    # All or nothing: at the timeout none are handed out and the cursor does not move.
    self.assertEqual(reader.take(10, timeout_s=0.2, poll_interval_s=0.02), [])
    self.assertEqual(sum(reader.cursor.values()), 3)
    more = reader.take(3, timeout_s=5)
    self.assertLen(more, 3)
    self.assertEqual(reader.cursor, {"a": 3, "b": 3})
    resumed = RolloutReader(self.url, cursor={"a": 1, "b": 1})
    self.assertLen(resumed.poll(), 4)

  def test_a_call_is_one_commit_record_holding_the_row_fields_exactly(self):
    groups = [make_group(s, rows=r) for s, r in ((0, 3), (1, 1), (2, 4))]
    extremes = np.array([0.1, np.nextafter(np.float32(0), np.float32(1)), -3.4028235e38, 3.4028235e38], np.float32)
    groups[2]["reward_terms"]["outcome"] = extremes
    groups[2]["chain_id"] = np.array([3, 0, 0, 2], np.int32)  # any chain ids in [0, R)
    with RolloutWriter(self.url, "w", SPEC) as w:
      self.assertEqual(w.commit_many(groups, [{"task_id": f"t{i}"} for i in range(3)]), [0, 1, 2])
    shard = Store(os.path.join(self.url, "shards", "w"))
    self.assertEqual(shard.list("commits/"), [buffer_lib.commit_key(0)])
    arrays = sorted({k.split("/")[1] for k in shard.list("arrays/")})
    self.assertEqual(arrays, ["behaviour_logprobs", "expert_ids", "loss_mask", "policy_version", "tokens"])
    got = RolloutReader(self.url, SPEC).poll()
    self.assertEqual([(g.meta["seq"], g.meta["row0"], g.meta["task_id"]) for g in got],
                     [(0, 0, "t0"), (1, 3, "t1"), (2, 4, "t2")])
    for want, g in zip(groups, got):
      assert_group_equal(self, want, g.data)
    chex.assert_trees_all_equal(got[2].data["reward_terms"]["outcome"].view(np.uint32), extremes.view(np.uint32))

  def test_a_cursor_inside_a_call_resumes_at_the_cursor(self):
    groups = [make_group(s) for s in range(5)]
    with RolloutWriter(self.url, "w", SPEC) as w:
      w.commit_many(groups[:4], [{"task_id": f"t{i}"} for i in range(4)])
      w.commit(groups[4], {"task_id": "t4"})
    reader = RolloutReader(self.url, SPEC)
    self.assertLen(reader.take(2, timeout_s=5), 2)
    self.assertEqual(reader.cursor, {"w": 2})
    resumed = RolloutReader(self.url, SPEC, cursor=reader.cursor)
    got = resumed.poll()
    self.assertEqual([g.meta["seq"] for g in got], [2, 3, 4])
    for want, g in zip(groups[2:], got):
      assert_group_equal(self, want, g.data)
    self.assertEqual(resumed.cursor, {"w": 5})
    self.assertEqual(resumed.stats["groups_read"], 3)
    self.assertEqual([g.meta["seq"] for g in RolloutReader(self.url, SPEC, cursor={"w": 3}).poll()], [3, 4])
    self.assertEqual(RolloutReader(self.url, SPEC, cursor={"w": 5}).poll(), [])
    with self.assertRaisesRegex(buffer_lib.CursorError, "past the end"):
      RolloutReader(self.url, SPEC, cursor={"w": 6})

  def test_a_shard_of_another_schema_version_is_refused_in_one_sentence(self):
    old = Store(os.path.join(self.url, "shards", "old"))
    old.write_json("schema.json", {**SPEC.to_json(), "schema_version": schema.SCHEMA_VERSION - 1})
    Store(self.url).write_json("writers/old.json", {"shard": "old"})
    with self.assertRaisesRegex(buffer_lib.BufferRefusal,
                                f"schema_version is {schema.SCHEMA_VERSION - 1}; .* new buffer URL"):
      RolloutWriter(self.url, "old", SPEC)
    with RolloutWriter(self.url, "new", SPEC) as w:
      w.commit(make_group(0), {"task_id": "t"})
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["shard"] for g in reader.poll()], ["new"])
    self.assertEqual(reader.stats["skipped_shards"], 1)

  def test_commit_many_is_in_order_and_exactly_once(self):
    w = RolloutWriter(self.url, "w", SPEC, shard_rows=8)  # small objects: calls straddle and fill several
    reader = RolloutReader(self.url, SPEC)
    tickets = [w.begin({"task_id": f"ticket{i}"}) for i in range(2)]
    calls = [[(0, 3), (1, 1), (2, 9)], [(3, 2)], [(4, 8), (5, 5)]]
    want, seen = [], []
    self.assertEqual(w.commit_many([], []), [])
    for n, call in enumerate(calls):
      groups = [make_group(s, rows=r) for s, r in call]
      metas = [{"task_id": f"t{s}"} for s, _ in call]
      ids = None
      if n == 2:  # task ids from the tickets
        metas, ids = [{"k": 1}, None], tickets
      first = w.next_seq
      self.assertEqual(w.commit_many(groups, metas, ids), list(range(first, first + len(call))))
      want += groups
      seen += reader.poll(max_groups=2)
    seen += reader.poll()
    self.assertEqual([g.meta["seq"] for g in seen], list(range(6)))
    for g, data in zip(seen, want):
      assert_group_equal(self, data, g.data)
    self.assertEqual([g.meta["row0"] for g in seen], [0, 3, 4, 13, 15, 23])
    self.assertEqual([g.meta["task_id"] for g in seen[4:]], ["ticket0", "ticket1"])
    self.assertEqual(seen[4].meta["k"], 1)
    self.assertEqual(w.pending(), [])
    self.assertEqual(admission.read_status(self.url), admission.BufferStatus(6, 0, 0, 0, 1))
    # Checked before anything is written.
    bad = make_group(9)
    bad["tokens"] = bad["tokens"][:, :4]
    for args, msg in (([make_group(7), bad], [{"task_id": "a"}, {"task_id": "b"}]), "tokens"), \
                     (([make_group(7)], [{"task_id": "a"}, {"task_id": "b"}]), "1 groups, 2 metas"), \
                     (([make_group(7)], [{"task_id": "a"}], ["nope"]), "not pending"):
      with self.assertRaisesRegex(ValueError, msg):
        w.commit_many(*args)
    t = w.begin({"task_id": "x"})
    with self.assertRaisesRegex(ValueError, "same ticket"):
      w.commit_many([make_group(7)] * 2, [None] * 2, [t, t])
    self.assertEqual(w.next_seq, 6)
    self.assertEqual(reader.poll(), [])

  def crash_mid_commit_many(self):
    """Commits groups 0-1, then a call of groups 2-4 that died after writing its rows but before its commit record
    landed (so before deleting its tickets and updating head.json). Returns (the call's record, tickets)."""
    w = RolloutWriter(self.url, "w", SPEC)
    w.commit_many([make_group(0), make_group(1)], [{"task_id": "a"}, {"task_id": "b"}])
    head = os.path.join(self.url, "shards", "w", "head.json")
    tickets = [w.begin({"task_id": f"c{i}"}) for i in range(3)]
    saved_head = open(head, "rb").read()
    saved_tickets = {t: open(os.path.join(self.url, "shards", "w", "pending", f"{t}.json"), "rb").read()
                     for t in tickets}
    w.commit_many([make_group(s) for s in (2, 3, 4)], [None] * 3, tickets)
    record = os.path.join(self.url, "shards", "w", "commits", f"{2:012d}.json")
    saved_record = open(record, "rb").read()
    os.remove(record)
    with open(head, "wb") as f:
      f.write(saved_head)
    for t, data in saved_tickets.items():
      with open(os.path.join(self.url, "shards", "w", "pending", f"{t}.json"), "wb") as f:
        f.write(data)
    return saved_record, tickets

  def test_later_record_visible_before_an_earlier_one_waits(self):
    saved_record, _ = self.crash_mid_commit_many()
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0, 1])  # waits at 2: head.json does not count it
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    with open(os.path.join(self.url, "shards", "w", "commits", f"{2:012d}.json"), "wb") as f:
      f.write(saved_record)  # the slow record lands
    got = reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [2, 3, 4])
    assert_group_equal(self, make_group(2), got[0].data)

  def test_a_call_whose_record_never_landed_commits_none_of_its_groups(self):
    _, tickets = self.crash_mid_commit_many()
    reader = RolloutReader(self.url, SPEC)
    self.assertLen(reader.poll(), 2)
    w = RolloutWriter(self.url, "w", SPEC)
    self.assertEqual(w.next_seq, 2)
    self.assertEqual([t for t, _ in w.pending()], tickets)  # every group of the call is re-run
    self.assertEqual(w.commit_many([make_group(s) for s in (5, 6, 7)], [None] * 3, tickets), [2, 3, 4])
    got = reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [2, 3, 4])
    for g, s in zip(got, (5, 6, 7)):
      assert_group_equal(self, make_group(s), g.data)
    self.assertEqual((reader.stats["corrupt_groups"], reader.stats["lost_groups"]), (0, 0))
    self.assertEqual(w.pending(), [])

  def test_take_waits_for_new_commits(self):
    w = RolloutWriter(self.url, "w", SPEC)
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual(reader.take(1, timeout_s=0.05), [])
    w.commit(make_group(0), {"task_id": "t"})
    self.assertLen(reader.take(1, timeout_s=5), 1)

  def test_reopened_writer_overwrites_uncommitted_rows(self):
    w = RolloutWriter(self.url, "w", SPEC)
    w.commit(make_group(0), {"task_id": "t0"})
    # An actor killed mid-commit: its rows are written, its commit record is not.
    w._write_rows([schema.normalize_group(make_group(99, rows=5), SPEC)], 3)
    reader = RolloutReader(self.url)
    self.assertLen(reader.poll(), 1)
    w2 = RolloutWriter(self.url, "w", SPEC)
    self.assertEqual(w2.next_seq, 1)
    self.assertEqual(w2.commit(make_group(1, rows=2), {"task_id": "t1"}), 1)
    (got,) = reader.poll()
    self.assertEqual(got.meta["row0"], 3)
    assert_group_equal(self, make_group(1, rows=2), got.data)

  def leave_unfinished_writes(self, directory, keys):
    """What a process SIGKILLed inside tensorstore file writes leaves: `<key>.__lock` files, never renamed over
    their keys, each longer than the key's next value (here: the key's current bytes, or a record, then padding)."""
    for key in keys:
      path = os.path.join(directory, key)
      old = b'{"seq": 1, "meta": {}}'
      if os.path.exists(path):
        with open(path, "rb") as f:
          old = f.read()
      with open(path + storage_lib.TS_LOCK_SUFFIX, "wb") as f:
        f.write(old + b"\x07" * 4096)

  @parameterized.named_parameters(
      # The async RL job's flake (groups_consumed one past the groups trained): an actor SIGKILLed while its commit
      # record was being written; the re-run group's record came out as garbage and the reader skipped its seq.
      ("commit_record", "record"),
      ("array_objects", "arrays"),  # the zarr shards the re-run's rows go to (and the committed rows beside them)
      ("head_and_owner", "head"),
  )
  def test_reopened_writer_is_not_corrupted_by_writes_a_killed_writer_left_unfinished(self, what):
    w = RolloutWriter(self.url, "w", SPEC)
    w.commit(make_group(0), {"task_id": "t0"})
    ticket = w.begin({"task_id": "t1"})
    w._write_rows([schema.normalize_group(make_group(99, rows=5), SPEC)], 3)
    shard = os.path.join(self.url, "shards", "w")
    objects = [os.path.relpath(os.path.join(d, n), shard) for d, _, names in os.walk(os.path.join(shard, "arrays"))
               for n in names if n != "zarr.json"]
    self.assertNotEmpty(objects)
    keys = {"record": [buffer_lib.commit_key(1)], "arrays": objects, "head": ["head.json", "owner.json"]}[what]
    self.leave_unfinished_writes(shard, keys)
    reader = RolloutReader(self.url, SPEC)
    self.assertLen(reader.poll(), 1)

    w2 = RolloutWriter(self.url, "w", SPEC)  # the restarted actor (w stands for the killed one)
    self.assertEqual([t for t, _ in w2.pending()], [ticket])
    self.assertEqual(w2.commit(make_group(1, rows=2), {"task_id": "t1"}, ticket), 1)
    w2.commit(make_group(2), {"task_id": "t2"})
    got = reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [1, 2])
    assert_group_equal(self, make_group(1, rows=2), got[0].data)
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    self.assertEqual(reader.cursor, {"w": 3})  # the cursor counts exactly the groups handed out
    fresh = RolloutReader(self.url, SPEC)
    for want, g in zip((make_group(0), make_group(1, rows=2), make_group(2)), fresh.poll()):
      assert_group_equal(self, want, g.data)
    self.assertEqual((fresh.cursor, fresh.stats["corrupt_groups"]), ({"w": 3}, 0))
    self.assertEqual(Store(shard).read_json("head.json")["committed"], 3)
    left = [n for _, _, names in os.walk(shard) for n in names if n.endswith(storage_lib.TS_LOCK_SUFFIX)]
    self.assertEmpty(left)

  def test_trainer_progress_is_not_corrupted_by_a_write_a_killed_trainer_left_unfinished(self):
    w = RolloutWriter(self.url, "w", SPEC)
    w.commit(make_group(0), {"task_id": "t0"})
    self.leave_unfinished_writes(self.url, ["trainer.json"])
    reader = RolloutReader(self.url, SPEC)
    reader.take(1)
    reader.publish_progress(version=3, groups_per_step=1)
    self.assertEqual(Store(self.url).read_json("trainer.json")["cursor"], {"w": 1})
    status = admission.read_status(self.url)
    self.assertFalse(status.trainer_damaged)
    self.assertEqual((status.trainer_version, status.consumed), (3, 1))

  @absltest.skipUnless(hasattr(fcntl, "F_OFD_SETLK"), "open-file-description locks are Linux-only")
  def test_a_write_in_flight_keeps_its_lock_file(self):
    # tensorstore holds an open-file-description lock on `<key>.__lock` while it writes (in this process too).
    path = os.path.join(self.url, "k.json" + storage_lib.TS_LOCK_SUFFIX)
    with open(path, "wb") as f:
      f.write(b"partial")
    fd = os.open(path, os.O_RDWR)
    try:
      fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
      self.assertFalse(storage_lib.remove_unfinished_write(path))
      self.assertTrue(os.path.exists(path))
    finally:
      os.close(fd)
    self.assertTrue(storage_lib.remove_unfinished_write(path))
    self.assertFalse(os.path.exists(path))
    self.assertFalse(storage_lib.remove_unfinished_write(path))

  def test_pending_of_a_silent_writer_expires_from_admission(self):
    gone, alive = RolloutWriter(self.url, "gone", SPEC), RolloutWriter(self.url, "alive", SPEC)
    for w in (gone, alive):
      w.begin({"task_id": "t"})
      w.begin({"task_id": "u"})
    now = time.time()
    self.assertEqual(admission.read_status(self.url, pending_lease_s=60, now=now).pending, 4)
    # Two minutes later only the writer that renewed its lease still holds admission slots.
    alive.heartbeat()
    later = time.time() + 120
    with mock.patch.object(time, "time", return_value=later):
      alive.heartbeat()
    self.assertEqual(admission.read_status(self.url, pending_lease_s=60, now=later).pending, 2)
    self.assertEqual(admission.read_status(self.url, now=later).pending, 4)  # no lease: every ticket counts
    # heartbeat(min_interval_s) writes only when the last write is older than that.
    head = lambda: Store(os.path.join(self.url, "shards", "gone")).read_json("head.json")["time"]
    before = head()
    gone.heartbeat(min_interval_s=3600)
    self.assertEqual(head(), before)

  def test_pending_tickets_survive_reopen(self):
    w = RolloutWriter(self.url, "w", SPEC)
    t1 = w.begin({"task_id": "a", "seed": 1})
    t2 = w.begin({"task_id": "b", "seed": 2})
    t3 = w.begin({"task_id": "c", "seed": 3})
    self.assertLess(t1, t2)
    w.commit(make_group(0), {"task_id": "a"}, t1)
    self.assertEqual(admission.read_status(self.url).pending, 2)
    del w  # crash
    w = RolloutWriter(self.url, "w", SPEC)
    self.assertEqual(w.pending(), [(t2, {"task_id": "b", "seed": 2}), (t3, {"task_id": "c", "seed": 3})])
    w.commit(make_group(1), {"start_version": 3}, t2)  # task id from the ticket
    w.cancel(t3)
    self.assertEqual(w.pending(), [])
    status = admission.read_status(self.url)
    self.assertEqual((status.committed, status.pending), (2, 0))
    self.assertEqual([g.meta["task_id"] for g in RolloutReader(self.url).poll()], ["a", "b"])
    with self.assertRaisesRegex(ValueError, "not pending"):
      w.commit(make_group(2), {"task_id": "x"}, t2)
    # Killed after the commit record, before the ticket's deletion: reopening finishes the job.
    t4 = w.begin({"task_id": "d"})
    ticket_file = os.path.join(self.url, "shards", "w", "pending", f"{t4}.json")
    saved = open(ticket_file, "rb").read()
    w.commit(make_group(3), {}, t4)
    with open(ticket_file, "wb") as f:
      f.write(saved)
    self.assertEqual(RolloutWriter(self.url, "w", SPEC).pending(), [])
    with self.assertRaisesRegex(ValueError, "task_id"):
      w.commit(make_group(2), {})

  def test_schema_mismatch_refused_by_writer_and_skipped_by_reader(self):
    other = schema.BufferSpec(seq_len=8)
    RolloutWriter(self.url, "a", SPEC).commit(make_group(0), {"task_id": "t"})
    RolloutWriter(self.url, "b", other).commit(make_group(0, spec=other), {"task_id": "t"})
    with self.assertRaisesRegex(ValueError, "shard 'b'|Shard 'b'"):
      RolloutWriter(self.url, "b", SPEC)
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["shard"] for g in reader.poll()], ["a"])
    reader.poll()
    self.assertEqual(reader.stats["skipped_shards"], 1)  # logged and counted once
    self.assertEqual([g.meta["shard"] for g in RolloutReader(self.url).poll()], ["a"])  # first shard's spec
    with open(os.path.join(self.url, "shards", "a", "schema.json"), "w") as f:
      f.write("{not json")
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual(reader.poll(), [])
    self.assertEqual(reader.stats["skipped_shards"], 2)

  def test_corrupt_chunk_is_skipped_and_counted(self):
    w = RolloutWriter(self.url, "w", SPEC, shard_rows=8)
    groups = [make_group(s, rows=8) for s in range(3)]  # one object of one [8, T] chunk per group
    for s, g in enumerate(groups):
      w.commit(g, {"task_id": str(s)})
    path = os.path.join(self.url, "shards", "w", "arrays", "tokens", "c", "1", "0")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
      f.write(bytes(data))
    reader = RolloutReader(self.url)
    with self.assertLogs(level="WARNING") as logs:
      out = reader.poll()
    self.assertIn("skipping group 1 of shard 'w'", "\n".join(logs.output))
    self.assertEqual([g.meta["seq"] for g in out], [0, 2])
    assert_group_equal(self, groups[2], out[1].data)
    self.assertEqual(reader.stats["corrupt_groups"], 1)
    (named,) = reader.skipped  # what the count is made of, with why
    self.assertStartsWith(named, "shard 'w' group 1: ")
    self.assertEqual(reader.cursor, {"w": 3})
    self.assertEqual(reader.poll(), [])  # never retried

  def test_transient_storage_errors_are_retried_not_skipped(self):
    w = RolloutWriter(self.url, "w", SPEC)
    groups = [make_group(s) for s in range(3)]
    for s, g in enumerate(groups):
      w.commit(g, {"task_id": str(s)})
    original, failures = buffer_lib._Shard.array, []

    def flaky(shard, *args):
      # An object store's 503 on the first two reads of group 0, then a permanent one on every read of group 2.
      failures.append(args)
      if len(failures) <= 2 or args[-1] > 6:
        raise ValueError("UNAVAILABLE: simulated 503 Slow Down")
      return original(shard, *args)

    self.enter_context(mock.patch.object(buffer_lib._Shard, "array", flaky))
    reader = RolloutReader(self.url, SPEC)
    got = []
    for _ in range(3):
      got += reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [0, 1])  # group 0 retried, not lost
    assert_group_equal(self, groups[0], got[0].data)
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    for _ in range(buffer_lib.MAX_TRANSIENT_RETRIES):
      reader.poll()
    self.assertEqual(reader.stats["corrupt_groups"], 1)  # a failure that never clears is skipped in the end
    self.assertEqual(reader.cursor, {"w": 3})

  def test_missing_chunk_and_garbage_commit_record_are_skipped(self):
    w = RolloutWriter(self.url, "w", SPEC, shard_rows=8)
    for s in range(4):
      w.commit(make_group(s, rows=8), {"task_id": str(s)})
    with open(os.path.join(self.url, "shards", "w", "commits", f"{1:012d}.json"), "w") as f:
      f.write('{"seq": 1, "row0": "oops"')
    os.remove(os.path.join(self.url, "shards", "w", "arrays", "loss_mask", "c", "2", "0"))
    reader = RolloutReader(self.url)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0, 3])
    self.assertEqual(reader.stats["corrupt_groups"], 2)
    self.assertEqual([s.split(":")[0] for s in reader.skipped], ["shard 'w' group 1", "shard 'w' group 2"])
    w2 = RolloutWriter(self.url, "w", SPEC)  # resumes after the last (readable) record
    self.assertEqual(w2.commit(make_group(4), {"task_id": "4"}), 4)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [4])

  def test_check_group_names_the_field(self):
    g = make_group(0)
    schema.check_group(g, SPEC)
    cases = [
        ("tokens", lambda g: g.update(tokens=g["tokens"][:, :8]), "tokens has shape"),
        ("loss_mask", lambda g: g.update(loss_mask=g["loss_mask"] * 2), "loss_mask has values"),
        ("policy_version", lambda g: g.update(policy_version=g["policy_version"].astype(np.float32)), "dtype"),
        ("expert_ids", lambda g: g.update(expert_ids=g["expert_ids"][:1]), "expert_ids has shape"),
        ("expert range", lambda g: g["expert_ids"].__setitem__(0, 40000), "expert_ids has ids"),
        ("reward", lambda g: g["reward_terms"].pop("outcome"), "reward_terms"),
        ("missing", lambda g: g.pop("length"), "lacks field length"),
        ("unknown", lambda g: g.update(extra=np.zeros(3)), "unknown field extra"),
    ]
    for name, edit, msg in cases:
      bad = make_group(0)
      edit(bad)
      with self.assertRaisesRegex(ValueError, msg, msg=name):
        schema.check_group(bad, SPEC)
    with self.assertRaisesRegex(ValueError, "tokens"):
      RolloutWriter(self.url, "w", SPEC).commit({**g, "tokens": g["tokens"][:, :4]}, {"task_id": "t"})
    self.assertEqual(RolloutReader(self.url).poll(), [])

  def test_spec_json(self):
    self.assertEqual(schema.BufferSpec.from_json(json.loads(json.dumps(SPEC.to_json()))), SPEC)
    v = schema.SCHEMA_VERSION
    for d, msg in (({"schema_version": v}, "seq_len"), ({"seq_len": 4}, "schema_version"),
                   ({"schema_version": v, "seq_len": 4, "k": 1}, "unknown field 'k'"),
                   ({"schema_version": v, "seq_len": "4"}, "seq_len must be an int"),
                   ({"schema_version": v - 1, "seq_len": 4}, "new buffer URL")):
      with self.assertRaisesRegex(ValueError, msg):
        schema.BufferSpec.from_json(d)
    with self.assertRaisesRegex(ValueError, "safe name"):
      RolloutWriter(self.url, "../x", SPEC)


class AdmissionTest(parameterized.TestCase):

  @parameterized.parameters(
      # committed, pending, consumed, trainer_version, groups_per_step, weights_version, max_lag, target, admitted
      (0, 0, 0, 0, 4, 0, 0, 0, True),
      (3, 0, 0, 0, 4, 0, 0, 0, True),    # 4th group of update 0: version 0 trains on it
      (3, 1, 0, 0, 4, 0, 0, 1, False),   # would land in update 1: needs version 1 when synchronous
      (3, 1, 0, 0, 4, 0, 1, 1, True),
      (8, 3, 4, 1, 4, 1, 1, 2, True),
      (9, 3, 4, 1, 4, 1, 1, 3, False),
      (12, 0, 12, 3, 4, 3, 0, 3, True),
      (6, 0, 4, 7, 2, 7, 0, 8, False),   # a restarted trainer resumed at version 7: counted from there, not 0
      (6, 0, 4, 7, 2, 7, 1, 8, True),
      (5, 0, 4, 7, 2, 7, 0, 7, True),
      (3, 0, 4, 7, 2, 7, 0, 7, True),    # consumed read after a newer head.json: never behind the trainer
  )
  def test_arithmetic(self, committed, pending, consumed, trainer_version, gps, version, max_lag, target, admitted):
    status = admission.BufferStatus(committed=committed, pending=pending, consumed=consumed,
                                    trainer_version=trainer_version, groups_per_step=gps)
    self.assertEqual(admission.target_version(status), target)
    self.assertEqual(admission.admit(status, version, max_lag), admitted)

  def test_synchronous_admits_exactly_the_training_weights(self):
    """With max_lag 0, every group is started by the weights version whose update consumes it."""
    gps, status, started = 3, admission.BufferStatus(0, 0, 0, 5, 3), []
    for _ in range(4):  # updates from version 5
      while admission.admit(status, status.trainer_version, 0):
        started.append(status.trainer_version)
        status = dataclasses.replace(status, committed=status.committed + 1)
      self.assertEqual(status.committed - status.consumed, gps)
      status = dataclasses.replace(status, consumed=status.consumed + gps, trainer_version=status.trainer_version + 1)
    self.assertEqual(started, [v for v in range(5, 9) for _ in range(gps)])

  def test_status_from_storage(self):
    url = temp_dir(self)
    self.assertEqual(admission.read_status(url), admission.BufferStatus(0, 0, 0, 0, 1))
    a, b = RolloutWriter(url, "a", SPEC), RolloutWriter(url, "b", SPEC)
    for s in range(3):
      a.commit(make_group(s), {"task_id": "t"})
    b.begin({"task_id": "u"})
    b.commit(make_group(5), {"task_id": "v"})
    reader = RolloutReader(url)
    reader.take(2)
    reader.publish_progress(version=1, groups_per_step=2)
    status = admission.read_status(url)
    self.assertEqual(status, admission.BufferStatus(committed=4, pending=1, consumed=2, trainer_version=1,
                                                    groups_per_step=2))
    self.assertEqual(admission.target_version(status), 2)
    self.assertTrue(admission.admit(status, 1, 1))
    self.assertFalse(admission.admit(status, 1, 0))


class CollateTest(absltest.TestCase):

  def groups(self):
    g0, g1 = make_group(0, rows=3, version=2), make_group(1, rows=2, version=4)
    g1["chain_id"] = np.array([0, 0], np.int32)  # one chain of two segments
    return [Group(g0, {"seq": 0}), Group(g1, {"seq": 1})]

  def test_batch_with_padding(self):
    batch = collate.groups_to_batch(self.groups(), rows=8)
    batch_lib.check_batch(batch, SPEC.n_moe_layers, SPEC.experts_per_tok)
    chex.assert_shape(batch["tokens"], (8, 16))
    chex.assert_shape(batch["expert_ids"], (2, 8, 16, 2))
    np.testing.assert_array_equal(batch["group_id"], [0, 0, 0, 1, 1, -1, -1, -1])
    np.testing.assert_array_equal(batch["chain_id"], [0, 0, 1, 2, 2, -1, -1, -1])
    np.testing.assert_array_equal(batch["loss_mask"][5:], 0)
    np.testing.assert_array_equal(batch["expert_ids"][:, 3:5], self.groups()[1].data["expert_ids"])
    np.testing.assert_array_equal(batch["reward_terms"]["outcome"][:3],
                                  self.groups()[0].data["reward_terms"]["outcome"])
    self.assertEqual(batch["tokens"].dtype, np.int32)
    self.assertEqual(batch["loss_mask"].dtype, np.float32)
    self.assertEqual(set(batch), set(batch_lib.REQUIRED_FIELDS) | {"expert_ids"})
    no_pad = collate.groups_to_batch(self.groups())
    chex.assert_shape(no_pad["tokens"], (5, 16))
    with self.assertRaisesRegex(ValueError, "5 rows"):
      collate.groups_to_batch(self.groups(), rows=4)

  def test_packed_layout(self):
    groups = self.groups()
    g1 = groups[1].data
    g1["length"] = np.array([3, 3], np.int32)  # short sequences: two of them share a row with a longer one
    g1["loss_mask"][:, 2 + 3:] = 0.0
    batch = collate.groups_to_batch(groups, rows=8)
    lengths = collate.sequence_lengths(groups, rows=8)
    np.testing.assert_array_equal(lengths, [9, 9, 9, 5, 5, 0, 0, 0])  # prompt_length + length; padding rows 0
    self.assertIs(collate.lay_out(batch, lengths, None), batch)
    packed = collate.lay_out(batch, lengths, buckets=(2, 4, 8))  # rows [9, 5], [9, 5], [9]: 3 fit in 4
    batch_lib.check_batch(packed, SPEC.n_moe_layers, SPEC.experts_per_tok)
    chex.assert_shape(packed["tokens"], (4, 16))
    chex.assert_shape(packed["expert_ids"], (2, 4, 16, 2))
    self.assertEqual(float(packed["loss_mask"].sum()), float(batch["loss_mask"].sum()))
    np.testing.assert_array_equal(np.bincount(packed["segment_ids"][packed["segment_ids"] >= 0]), lengths[:5])
    with self.assertRaisesRegex(ValueError, "more than the largest bucket 2"):
      collate.lay_out(batch, lengths, buckets=(2,))

  def test_staleness(self):
    groups = self.groups()
    lag = collate.staleness(collate.groups_to_batch(groups, rows=8), trainer_version=5)
    n0 = int(groups[0].data["loss_mask"].sum())
    n1 = int(groups[1].data["loss_mask"].sum())
    np.testing.assert_array_equal(lag, [3] * n0 + [1] * n1)
    np.testing.assert_array_equal(collate.staleness(groups, 5), lag)
    batch = collate.groups_to_batch(groups, rows=8)
    batch["policy_version"][1, 5] = 5  # an in-flight update mid-sequence: row 1's 4th action token (mask from 2)
    self.assertEqual(collate.staleness(batch, 5)[int(batch["loss_mask"][0].sum()) + 3], 0)


if __name__ == "__main__":
  absltest.main()
