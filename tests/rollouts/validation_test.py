"""The data path refuses what it must not accept, written as an attacker (or an unlucky operator) would try it:
cursors of another buffer, a second live writer with the same id, lost commit records, tampered or malformed commit
records (a changed digit, aliased rows, extra groups, deep or huge JSON, out-of-range row fields), a damaged
head.json or trainer.json, a damaged LATEST.

Each refusal is one sentence naming the bad entry (ValueError / WriterConflict / WeightStoreError), never a raw
TypeError, JSONDecodeError or RecursionError, and nothing is lost silently: a lost or rejected commit record is
counted by every reader, and the records after it are still read.
"""

import hashlib
import json
import os
import re
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


# The record of a call of two groups (seqs 1 and 2, rows 3-8) between two calls of one group (seq 0, rows 0-2 and
# seq 3, rows 9-11), as a tamperer edits it: on its bytes, or on its JSON (then written back with the checksum left
# as it was, or recomputed the way anyone reading the format could).
_NESTED = "[" * 100_000 + "]" * 100_000


def _recompute(rec):
  body = {k: v for k, v in rec.items() if k != "checksum"}
  return {**body, "checksum": "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def _flip(raw, pattern):
  """`raw` with the first digit after the regex `pattern` changed (0->1, ..., 9->0; hex a-f -> 0)."""
  m = re.search(pattern, raw)
  i = m.end()
  while not chr(raw[i]).isalnum():
    i += 1
  c = chr(raw[i])
  new = str((int(c) + 1) % 10) if c.isdigit() else "0"
  return raw[:i] + new.encode() + raw[i + 1:]


def _number(raw, pattern, text):
  """`raw` with the first number after the regex `pattern` replaced by `text`."""
  m = re.search(pattern + rb"\s*(-?[0-9][0-9.eE+-]*)", raw)
  return raw[:m.start(1)] + text + raw[m.end(1):]


def _set(path, value):
  """An edit setting rec[path...] = value (path of dict keys and list indices)."""
  def edit(rec):
    node = rec
    for k in path[:-1]:
      node = node[k]
    node[path[-1]] = value
  return edit


def _entry(i, *path):
  return ("groups", i, *path)


def _rf(i, field, j=0):
  return _entry(i, "row_fields", field, j)


def _term(i, name="outcome", j=0):
  return _entry(i, "row_fields", "reward_terms", name, j)


def _extra_group(rec):
  g = json.loads(json.dumps(rec["groups"][-1]))
  g["row0"] += g["rows"]  # the next call's rows: claims seq 3 too
  rec["groups"].append(g)


def _alias_earlier_rows(rec):
  rec["groups"][0]["row0"], rec["groups"][1]["row0"] = 0, 3  # seq 0's rows, then seq 1's own


def _old_format(rec):
  rec.pop("checksum", None)
  rec["schema_version"] = 2


_BYTE_EDITS = (
    ("reward_digit", lambda raw: _flip(raw, rb'"outcome": \[0\.')),
    ("reward_digit_second_group", lambda raw: _flip(raw, rb'"outcome": \[.*?"outcome": \[0\.')),
    ("length_digit", lambda raw: _flip(raw, rb'(?<![_a-z])"length": \[')),
    ("prompt_length_digit", lambda raw: _flip(raw, rb'"prompt_length": \[')),
    ("row0_digit", lambda raw: _flip(raw, rb'"row0": ')),
    ("rows_digit", lambda raw: _flip(raw, rb'"rows": ')),
    ("checksum_digit", lambda raw: _flip(raw, rb'"checksum": "sha256:')),
    ("truncated_record", lambda raw: raw[:len(raw) // 2]),
    ("empty_record", lambda raw: b""),
    ("not_utf8", lambda raw: b"\xff\xfe" + raw),
    ("nested_1e5", lambda raw: _NESTED.encode()),
    ("nested_1e5_in_meta", lambda raw: raw.replace(b'"meta": {}', b'"meta": {"x": ' + _NESTED.encode() + b"}", 1)),
    ("huge_string_in_meta", lambda raw: raw.replace(b'"meta": {}', b'"meta": {"x": "' + b"y" * (5 << 20) + b'"}', 1)),
    ("huge_list_in_meta", lambda raw: raw.replace(b'"meta": {}', b'"meta": {"x": [' + b"0," * (3 << 20) + b"0]}", 1)),
    ("nan_literal_reward", lambda raw: _number(raw, rb'"outcome": \[', b"NaN")),
    ("infinity_literal_reward", lambda raw: _number(raw, rb'"outcome": \[', b"Infinity")),
    ("overflowing_reward", lambda raw: _number(raw, rb'"outcome": \[', b"1e999")),
    ("negative_length_text", lambda raw: _number(raw, rb'(?<![_a-z])"length": \[', b"-1")),
)

_JSON_EDITS = (  # (name, edit of the parsed record, recompute the checksum)
    ("reward_value", _set(_term(0), 1.0), False),
    ("reward_value_other_term", _set(_term(1, "length_penalty", 2), 0.0), False),
    ("length_value", _set(_rf(0, "length"), 6), False),
    ("aliased_rows", _alias_earlier_rows, False),
    ("extra_group", _extra_group, False),
    ("dropped_group", lambda rec: rec["groups"].pop(), False),
    ("checksum_removed", lambda rec: rec.pop("checksum", None), False),
    ("old_format_without_checksum", _old_format, False),
    # Recomputed checksums: only the structural checks stand between these and the trainer.
    ("aliased_rows_recomputed", _alias_earlier_rows, True),
    ("aliased_rows_within_call_recomputed", _set(_entry(1, "row0"), 3), True),
    ("rows_past_the_call_recomputed", _set(_entry(0, "row0"), 4), True),
    ("extra_group_recomputed", _extra_group, True),
    ("nan_reward_recomputed", _set(_term(0), float("nan")), True),
    ("inf_reward_recomputed", _set(_term(1), float("inf")), True),
    ("minus_inf_reward_recomputed", _set(_term(0, "length_penalty"), float("-inf")), True),
    ("float32_overflow_reward_recomputed", _set(_term(0), 1e39), True),
    ("negative_length_recomputed", _set(_rf(0, "length"), -1), True),
    ("length_past_seq_len_recomputed", _set(_rf(1, "length", 2), 17), True),
    ("prompt_plus_length_past_seq_len_recomputed", _set(_rf(0, "prompt_length"), 12), True),
    ("negative_prompt_length_recomputed", _set(_rf(0, "prompt_length"), -2), True),
    ("negative_segment_recomputed", _set(_rf(0, "segment", 1), -1), True),
    ("segment_past_rows_recomputed", _set(_rf(0, "segment", 1), 3), True),
    ("negative_chain_id_recomputed", _set(_rf(1, "chain_id"), -1), True),
    ("chain_id_past_rows_recomputed", _set(_rf(1, "chain_id", 2), 2**31 - 1), True),
    ("truncated_two_recomputed", _set(_rf(0, "truncated"), 2.0), True),
    ("truncated_half_recomputed", _set(_rf(0, "truncated", 1), 0.5), True),
    ("string_reward_recomputed", _set(_term(0), "0.5"), True),
    ("bool_reward_recomputed", _set(_term(0), True), True),
    ("float_length_recomputed", _set(_rf(0, "length"), 6.5), True),
    ("bool_length_recomputed", _set(_rf(0, "length"), True), True),
    ("string_row0_recomputed", _set(_entry(0, "row0"), "3"), True),
    ("bool_rows_recomputed", _set(_entry(1, "rows"), True), True),
    ("int_task_id_recomputed", _set(_entry(0, "task_id"), 7), True),
    ("list_meta_recomputed", _set(_entry(0, "meta"), []), True),
    ("missing_field_recomputed", lambda rec: rec["groups"][0]["row_fields"].pop("segment"), True),
    ("short_field_recomputed", lambda rec: rec["groups"][0]["row_fields"]["length"].pop(), True),
    ("unknown_reward_term_recomputed", _set(_entry(0, "row_fields", "reward_terms", "bonus"), [1.0] * 3), True),
    ("groups_not_a_list_recomputed", _set(("groups",), {"0": 1}), True),
    ("seq_of_another_call_recomputed", _set(("seq",), 2), True),
    ("record_of_another_shard_recomputed", _set(("shard",), "v"), True),
)


class TamperedRecordTest(parameterized.TestCase):
  """A real writer commits seq 0, then seqs 1-2 in one call (one record), then seq 3; the middle record is edited
  on disk. A real reader hands out seqs 0 and 3 exactly as written and never the edited call's groups: both are
  counted in stats["corrupt_groups"] and the record in stats["rejected_records"], and the cursor moves past them."""

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)
    with RolloutWriter(self.url, "w", SPEC) as w:
      w.commit(make_group(0), {"task_id": "a"})
      w.commit_many([make_group(1), make_group(2)], [{"task_id": "b1"}, {"task_id": "b2"}])
      w.commit(make_group(3), {"task_id": "c"})
    self.path = os.path.join(self.url, "shards", "w", commit_key(1))
    with open(self.path, "rb") as f:
      self.raw = f.read()

  def _write(self, raw):
    self.assertNotEqual(raw, self.raw)
    with open(self.path, "wb") as f:
      f.write(raw)

  def _assert_skipped_and_counted(self):
    reader = RolloutReader(self.url, SPEC)
    got = reader.poll()  # never raises, whatever the record holds
    self.assertEqual([g.meta["seq"] for g in got], [0, 3])
    assert_group_equal(self, make_group(0), got[0].data)
    assert_group_equal(self, make_group(3), got[1].data)
    self.assertEqual(reader.cursor, {"w": 4})
    self.assertEqual((reader.stats["corrupt_groups"], reader.stats["lost_groups"]), (2, 0))
    self.assertEqual(reader.stats.get("rejected_records"), 1)
    self.assertEqual(reader.poll(), [])

  @parameterized.named_parameters(*_BYTE_EDITS)
  def test_an_edited_record_is_skipped_and_counted(self, edit):
    self._write(edit(self.raw))
    self._assert_skipped_and_counted()

  @parameterized.named_parameters(*_JSON_EDITS)
  def test_an_edited_record_json_is_skipped_and_counted(self, edit, recompute):
    rec = json.loads(self.raw)
    edit(rec)
    self._write(json.dumps(_recompute(rec) if recompute else rec, sort_keys=True).encode())
    self._assert_skipped_and_counted()

  def test_a_record_copied_from_another_seq_is_skipped_and_counted(self):
    with open(os.path.join(self.url, "shards", "w", commit_key(0)), "rb") as f:
      self._write(f.read())
    self._assert_skipped_and_counted()

  def test_random_byte_edits_never_hand_out_other_values(self):
    rng = np.random.default_rng(0)
    alphabet = b'0123456789-.eE+[]{}",: aN'
    for trial in range(60):
      raw = bytearray(self.raw)
      for i in rng.integers(0, len(raw), rng.integers(1, 3)):
        raw[i] = alphabet[rng.integers(len(alphabet))]
      with open(self.path, "wb") as f:
        f.write(bytes(raw))
      reader = RolloutReader(self.url, SPEC)
      got = {g.meta["seq"]: g for g in reader.poll()}
      # An edit that changes no value (a space for a space) may stand; any other skips both groups, counted.
      self.assertIn(sorted(got), ([0, 1, 2, 3], [0, 3]), f"trial {trial}")
      for seq, g in got.items():
        assert_group_equal(self, make_group(seq), g.data)
      self.assertEqual(reader.stats["corrupt_groups"], 4 - len(got), f"trial {trial}")

  def _tamper_reward(self):
    rec = json.loads(self.raw)
    rec["groups"][0]["row_fields"]["reward_terms"]["outcome"][0] = 1.0
    self._write(json.dumps(rec, sort_keys=True).encode())

  def test_a_rejected_last_record_waits_then_reads_the_next_without_head_json(self):
    url = temp_dir(self)
    w = RolloutWriter(url, "w", SPEC)
    self.addCleanup(w.close)
    w.commit(make_group(0), {"task_id": "a"})
    w.commit_many([make_group(1), make_group(2)], [{"task_id": "b1"}, {"task_id": "b2"}])
    self.path = os.path.join(url, "shards", "w", commit_key(1))
    self._tamper_reward()
    reader = RolloutReader(url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0])
    self.assertEqual(reader.poll(), [])  # seq 2: in the rejected record, or not written yet? Wait and see.
    self.assertEqual(reader.stats["corrupt_groups"], 1)
    self.assertEqual(w.commit(make_group(3), {"task_id": "c"}), 3)
    with open(os.path.join(url, "shards", "w", "head.json"), "w") as f:
      f.write("{garbage")  # the later record alone shows that seq 2 was committed
    got = reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [3])
    assert_group_equal(self, make_group(3), got[0].data)
    self.assertEqual((reader.stats["corrupt_groups"], reader.stats["lost_groups"]), (2, 0))
    self.assertEqual(reader.stats.get("rejected_records"), 1)

  def test_a_writer_reopened_after_a_rejected_last_record_goes_on_after_it(self):
    self._tamper_reward()
    os.remove(os.path.join(self.url, "shards", "w", commit_key(3)))
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0])
    with RolloutWriter(self.url, "w", SPEC) as w:  # the last record's group count is unknown: seq 2 comes next
      self.assertEqual(w.commit_many([make_group(4), make_group(5)], [{"task_id": "d"}, {"task_id": "e"}]), [2, 3])
    got = reader.poll()
    self.assertEqual([g.meta["seq"] for g in got], [2, 3])
    for g, seed in zip(got, (4, 5)):
      assert_group_equal(self, make_group(seed), g.data)
    self.assertEqual((reader.stats["corrupt_groups"], reader.stats.get("rejected_records")), (1, 1))


_BAD_GROUPS = (  # (name, edit of a group, field the refusal names)
    ("nan_reward", lambda g: g["reward_terms"]["outcome"].__setitem__(0, np.nan), "reward_terms"),
    ("inf_reward", lambda g: g["reward_terms"]["length_penalty"].__setitem__(1, np.inf), "reward_terms"),
    ("float64_overflowing_reward", lambda g: g["reward_terms"].__setitem__("outcome", np.full(3, 1e39)),
     "reward_terms"),
    ("negative_length", lambda g: g["length"].__setitem__(0, -1), "length"),
    ("length_past_seq_len", lambda g: g["length"].__setitem__(2, 17), "length"),
    ("prompt_plus_length_past_seq_len", lambda g: g["prompt_length"].__setitem__(0, 12), "prompt_length"),
    ("negative_segment", lambda g: g["segment"].__setitem__(1, -1), "segment"),
    ("chain_id_past_rows", lambda g: g["chain_id"].__setitem__(0, 2**31 - 1), "chain_id"),
    ("truncated_two", lambda g: g["truncated"].__setitem__(0, 2.0), "truncated"),
    ("nan_truncated", lambda g: g["truncated"].__setitem__(0, np.nan), "truncated"),
    ("nan_logprob", lambda g: g["behaviour_logprobs"].__setitem__((0, 3), np.nan), "behaviour_logprobs"),
)


class WriterRefusalTest(parameterized.TestCase):
  """What readers reject, the writer refuses to write: one sentence naming the field, nothing written."""

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)
    self.writer = RolloutWriter(self.url, "w", SPEC)
    self.addCleanup(self.writer.close)
    self.writer.commit(make_group(0), {"task_id": "a"})

  def _assert_nothing_written(self):
    self.assertEqual(self.writer.next_seq, 1)
    self.assertEqual(sorted(os.listdir(os.path.join(self.url, "shards", "w", "commits"))), [commit_key(0)[8:]])
    self.assertEqual(self.writer.commit(make_group(1), {"task_id": "b"}), 1)  # the writer goes on
    self.assertEqual([g.meta["seq"] for g in RolloutReader(self.url, SPEC).poll()], [0, 1])

  @parameterized.named_parameters(*_BAD_GROUPS)
  def test_a_group_out_of_range_is_refused(self, edit, field):
    group = make_group(5)
    edit(group)
    with self.assertRaisesRegex(ValueError, f"fields? {field}"):
      self.writer.commit(group, {"task_id": "bad"})
    self._assert_nothing_written()

  @parameterized.named_parameters(
      ("nested_100", {"x": json.loads("[" * 100 + "]" * 100)}, "nested"),
      ("huge", {"x": "y" * (5 << 20)}, "bytes"),
      ("nan", {"x": float("nan")}, "JSON-able"),
  )
  def test_a_meta_readers_would_reject_is_refused(self, meta, message):
    with self.assertRaisesRegex(ValueError, message):
      self.writer.commit(make_group(5), {"task_id": "bad", **meta})
    self._assert_nothing_written()


_BAD_HEADS = (
    ("garbage", b"{not json"),
    ("empty", b""),
    ("partly_written", b'{"committed": 5, "pend'),
    ("list", b"[5]"),
    ("string_count", b'{"committed": "5", "pending": 2}'),
    ("negative_count", b'{"committed": -100, "pending": 2}'),
    ("negative_pending", b'{"committed": 5, "pending": -50}'),
    ("bool_count", b'{"committed": true, "pending": 2}'),
    ("nan_count", b'{"committed": NaN, "pending": 2}'),
    ("nested_1e5", _NESTED.encode()),
    ("huge", b'{"committed": 0, "pad": "' + b"x" * (5 << 20) + b'"}'),
    ("missing", None),
)


class DamagedHeadTest(parameterized.TestCase):
  """A shard's head.json that cannot be read is never read as 0 committed groups (admission would over-admit until
  it is rewritten): the status counts what the shard's records show, or the last readable head, and counts the
  shard in damaged_heads."""

  def setUp(self):
    super().setUp()
    self.url = temp_dir(self)
    with RolloutWriter(self.url, "w", SPEC) as w:  # 5 groups in 3 calls, 2 pending tickets
      w.commit(make_group(0), {"task_id": "a"})
      w.commit_many([make_group(s) for s in (1, 2)], [{"task_id": "b"}] * 2)
      w.commit_many([make_group(s) for s in (3, 4)], [{"task_id": "c"}] * 2)
      w.begin({"task_id": "p1"})
      w.begin({"task_id": "p2"})
    _commit(self.url, "v", [7])
    self.head = os.path.join(self.url, "shards", "w", "head.json")
    getattr(admission, "_LAST_HEADS", {}).clear()  # this process has seen no head of this buffer yet
    self.good = admission.read_status(self.url)
    self.assertEqual((self.good.committed, self.good.pending), (6, 2))

  def _damage(self, data):
    if data is None:
      os.remove(self.head)
    else:
      with open(self.head, "wb") as f:
        f.write(data)

  def _assert_conservative(self, status):
    self.assertEqual((status.committed, status.pending), (6, 2))
    self.assertEqual(getattr(status, "damaged_heads", None), 1)
    for held in range(4):
      self.assertEqual(admission.admit(status, held, 1), admission.admit(self.good, held, 1))

  @parameterized.named_parameters(*_BAD_HEADS)
  def test_after_a_readable_head_the_last_one_counts(self, data):
    self._damage(data)
    self._assert_conservative(admission.read_status(self.url))

  @parameterized.named_parameters(*_BAD_HEADS)
  def test_without_a_readable_head_the_records_and_tickets_count(self, data):
    self._damage(data)
    getattr(admission, "_LAST_HEADS", {}).clear()
    self._assert_conservative(admission.read_status(self.url))

  def test_a_reader_is_not_stopped_by_a_damaged_head(self):
    self._damage(_NESTED.encode())
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual(len(reader.poll()), 6)
    self.assertEqual(reader.backlog(), 0)


class TrainerProgressTest(parameterized.TestCase):

  @parameterized.named_parameters(("garbage", "{not json"), ("list", "[1, 2]"), ("strings", '{"version": "x"}'),
                                  ("negative", '{"version": -5, "groups_consumed": 0}'),
                                  ("zero_per_step", '{"version": 1, "groups_per_step": 0}'),
                                  ("nested_1e5", "[" * 100_000 + "]" * 100_000),
                                  ("nested_in_a_field", '{"version": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                                  ("huge", '{"version": 8, "pad": "' + "x" * (5 << 20) + '"}'))
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
