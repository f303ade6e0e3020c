"""The rollout buffer: many actor processes append groups, the trainer consumes each group exactly once (report
sections 4 and 6: trainer and rollout workers run independently and meet only in storage).

  writer = RolloutWriter("runs/rl/buffer", "actor-3", spec)          # or s3://bucket/run/buffer, gs://...
  ticket = writer.begin({"task_id": "t17", "seed": 5})               # intent: survives a crash of the actor
  seq = writer.commit(group, {"task_id": "t17", "start_version": 4}, ticket)
  seqs = writer.commit_many(groups, metas, tickets)                   # a sampler call's groups: ~ the cost of one

  reader = RolloutReader("runs/rl/buffer", spec, cursor=ckpt.get("buffer_cursor"))
  groups = reader.take(8, timeout_s=60)                              # blocks until 8 committed groups
  ckpt["buffer_cursor"] = reader.cursor                              # exactly the groups handed out
  reader.publish_progress(version=step + 1, groups_per_step=8)       # feeds the actors' admission control

No coordinator: each writer owns one append-only shard (layout in c2jax/rollouts/schema.py). A commit writes the
groups' rows into the shard's zarr3 arrays first and its commit record last; a commit record is one atomic object
(a renamed file locally, one PUT on S3/GCS) holding every group of its call, so a reader sees a call's groups whole
or not at all. Rows written by a writer
that died before its commit record are invisible, and the restarted writer (same id) overwrites them, after it has
removed what the dead one's unfinished writes left in a local shard (tensorstore would reuse it untruncated and
store garbage: see `storage.remove_unfinished_write`).

Ownership: each shard has one live writer at a time, since two processes with the same writer id would overwrite
each other's rows and records. On a local (or network) filesystem a writer holds an exclusive lock on the shard's
`writer.lock` for its lifetime, so a second live process with the same id is refused at open; the kernel drops the
lock when its process dies, so a restarted actor reopens at once. On every driver (object stores have no locks)
the newest opener also writes its token to `owner.json`, and a writer checks it before its rows and before its
commit records: a writer whose shard was taken over stops at its next commit instead of tearing groups. (Within
one process a second writer of the same id is allowed: it stands for a crashed one, and fences the first.)

Cost: every stored object costs a file (or a PUT) and, in FSYNC mode, an fsync, which for groups of a few hundred
KB outweigh the bytes. `commit_many` therefore writes the rows of all its groups with one write per array of the
[R, T] fields (into shards of SHARD_ROWS rows: whole objects when an actor commits 8 groups of 8 rows at once), all
in flight together, then one commit record for all of them (which also holds the few numbers per row of the [R]
fields), then head.json: an 8-group commit is 6 stored objects, not the 19 of a record per group and an array per
field.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import fcntl
import os
import secrets
import socket
import threading
import time
from typing import Any, Mapping, Sequence

from absl import logging
import numpy as np
import tensorstore as ts

from c2jax.rollouts import records as records_lib
from c2jax.rollouts import schema as schema_lib
from c2jax.rollouts import storage
from c2jax.rollouts.schema import BufferSpec
from c2jax.rollouts.storage import Store, join

# Rows per chunk of the [R, T] arrays (and of each MoE layer of the expert ids): the unit a reader decodes, so one
# group of G = 8 rows is one chunk.
TOKEN_CHUNK_ROWS = 8
# Rows per stored object (a zarr3 shard of chunks, and the chunk of the small [R] arrays): one actor commit of
# 8 groups x 8 rows (`commit_many`) writes whole objects, one per array. Each object costs a file (or PUT) and, in
# FSYNC mode, an fsync, which dominate the write time of small groups; a smaller commit rewrites the object's
# existing chunks (copied, not recompressed).
SHARD_ROWS = 64
# Rows of a new shard's arrays before the first resize (a metadata rewrite of every array, fsynced in FSYNC mode).
INITIAL_ROWS = 16 * SHARD_ROWS
# blosc (lz4 after a byte shuffle, which puts the bytes of each element's significance together, so that the zero
# high bytes of small token ids, expert ids and versions line up): on rollouts (random-ish tokens, log-probs, zero
# padding) it stores within a few percent of zstd level 1 (tokens 0.34 vs 0.35 of the raw bytes, log-probs 0.46 vs
# 0.45, expert ids 0.26 vs 0.25) at about half its CPU time, and encoding is most of a commit's CPU time. The codec
# is recorded in each array's zarr.json, so shards written with another codec stay readable.
_ZARR_CODECS: list[dict[str, Any]] = [
    {"name": "bytes", "configuration": {"endian": "little"}},
    {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle"}},
    {"name": "crc32c"}]  # after the compressor: checks the stored bytes, so corruption fails the read
_IO_CONCURRENCY = 32
_SHARD_INDEX_CODECS: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}},
                                             {"name": "crc32c"}]


class Durability(enum.Enum):
  """When a writer's local files reach the disk (object stores make every PUT durable either way).

  FSYNC: every array object, commit record and ticket is fsynced before the next step (the rows before the
    commit records), so a commit survives a machine crash once `commit` / `commit_many` returns. Ticket deletions
    are not fsynced: a ticket whose group committed is dropped when the writer reopens.
  BUFFERED: no fsync; the OS writes back in its own time (several times faster on local disks). A commit survives
    the writer's crash (the page cache outlives the process); a machine crash can lose the latest commits, and
    readers skip, with a warning, any group it left damaged (checksums, missing chunks).
  head.json is advisory (rebuilt when a writer reopens) and is never fsynced.
  """

  FSYNC = "fsync"
  BUFFERED = "buffered"


@dataclasses.dataclass(frozen=True)
class Group:
  """One committed group as the reader yields it.

  Attributes:
    data: the group's arrays (schema in c2jax/rollouts/schema.py), in-memory dtypes.
    meta: the commit record: "task_id", "shard" (the writer id), "seq" (its index in the shard), "rows", "row0",
      "time" (commit wall time), plus the writer's extra meta.
  """

  data: dict
  meta: dict


def commit_key(seq: int) -> str:
  return f"commits/{seq:012d}.json"


def _record_seqs(store: Store, end: int | None = None, start: int | None = None) -> list[int]:
  """The seqs of the commit records in a shard's `store` (each a call's first seq), sorted; from `start` and below
  `end` only."""
  keys = store.list_range(commit_key(start) if start is not None else "commits/",
                          commit_key(end) if end is not None else "commits0")  # "0" follows "/": the prefix's end
  names = (k[len("commits/"):-len(".json")] for k in keys if k.endswith(".json"))
  return sorted(int(n) for n in names if n.isdigit())


def committed_by_records(store: Store, shard_id: str, spec: BufferSpec | None = None) -> int:
  """The groups a shard's commit records show committed (seqs 0 .. n-1): the end of its last record, or that
  record's first seq + 1 when it is rejected (its group count is unknown); 0 without records. One list and two
  reads: what admission reads when head.json cannot be trusted."""
  seqs = _record_seqs(store)
  if not seqs:
    return 0
  try:
    spec = spec or BufferSpec.from_json(store.read_json("schema.json") or {})
    return records_lib.decode(store.read(commit_key(seqs[-1])) or b"null", seqs[-1], shard_id, spec).end_seq
  except (ValueError, TypeError):  # RecordError, an unreadable schema.json
    return seqs[-1] + 1


def shard_ids(root: Store) -> list[str]:
  """The writer ids of the buffer at `root`, sorted (from the writers/ markers: one small object per shard)."""
  return [k[len("writers/"):-len(".json")] for k in root.list("writers/") if k.endswith(".json")]


class BufferRefusal(ValueError):
  """What the buffer refuses to do, in one sentence: entry points show it without a traceback."""


class WriterConflict(BufferRefusal):
  """A second live writer with the same writer id: refused at open, or fenced at commit after a takeover."""


class CursorError(BufferRefusal):
  """A reader cursor that does not fit the buffer: wrong types, a shard it does not hold, a seq past its end."""


# Local shard path -> [lock fd, writers of this process holding it]: the lock is the process's (see the module
# docstring), taken by its first writer of the shard and released by the last one's close.
_LOCKS: dict[str, list] = {}
_LOCKS_MUTEX = threading.Lock()


def _lock_shard(path: str, writer_id: str, url: str) -> str:
  """Takes this process's exclusive lock on the local shard directory `path`; WriterConflict if another process
  holds it. Returns the lock key to pass to `_unlock_shard`."""
  key = os.path.join(path, "writer.lock")
  with _LOCKS_MUTEX:
    held = _LOCKS.get(key)
    if held is not None:
      held[1] += 1
      return key
    os.makedirs(path, exist_ok=True)
    fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      raise WriterConflict(f"Shard {writer_id!r} of buffer {url} is open in another live writer ({holder}); a writer "
                           f"id must be unique among live writers: stop that process or pick another id.") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    _LOCKS[key] = [fd, 1]
    return key


def _unlock_shard(key: str) -> None:
  with _LOCKS_MUTEX:
    held = _LOCKS.get(key)
    if held is None:
      return
    held[1] -= 1
    if held[1] == 0:
      os.close(held[0])  # releases the flock
      del _LOCKS[key]


def _kvstore_bytes_read() -> int:
  """Bytes read from storage by every tensorstore kvstore of this process so far (tensorstore's own counters)."""
  total = 0
  for m in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/"):
    if m["name"].endswith("/bytes_read"):
      total += sum(int(v.get("value", 0)) for v in m["values"])
  return total


class RolloutWriter:
  """Appends groups to the shard `<url>/shards/<writer_id>/` (one process per writer id).

  Opening an existing shard resumes it: the next sequence number and row offset come from its last commit record,
  pending tickets are kept, and rows written after the last commit (an actor killed mid-group) are overwritten by
  the next commit. The unfinished writes of a killed writer in a local shard are removed first
  (`storage.remove_unfinished_writes`).
  """

  def __init__(self, url: str, writer_id: str, spec: BufferSpec, *, chunk_rows: int = TOKEN_CHUNK_ROWS,
               shard_rows: int = SHARD_ROWS, durability: Durability = Durability.FSYNC):
    """Opens or creates the shard; ValueError if an existing shard has another schema.

    Args:
      url: the buffer's directory URL (local path, s3://, gs://).
      writer_id: the shard's name, [A-Za-z0-9_.-]+, unique among live writers.
      spec: the shapes of every group.
      chunk_rows: rows per chunk of the [R, T] arrays of a new shard, the unit a reader decodes (an existing shard
        keeps its own layout).
      shard_rows: rows per stored object of a new shard, a multiple of `chunk_rows`; best the rows an actor commits
        at once (see SHARD_ROWS).
      durability: whether local files are fsynced (see `Durability`).
    """
    if chunk_rows < 1 or shard_rows < 1 or shard_rows % chunk_rows:
      raise ValueError(f"shard_rows ({shard_rows}) must be a positive multiple of chunk_rows ({chunk_rows}).")
    self.url = url
    self.writer_id = schema_lib.check_name("Writer id", writer_id)
    self.spec = spec
    self._root = Store(url)
    self._store = Store(join(url, "shards", writer_id))
    self.durability = durability
    self._closed = True  # until the shard is ours: close() and __del__ then release nothing twice
    self._lock = None
    if self._store.spec["driver"] == "file":
      self._lock = _lock_shard(self._store.spec["path"], writer_id, url)
    try:
      self._open(chunk_rows, shard_rows)
    except BaseException:
      self._release()
      raise

  def _open(self, chunk_rows: int, shard_rows: int) -> None:
    url, writer_id, spec, durability = self.url, self.writer_id, self.spec, self.durability
    if self._store.spec["driver"] == "file":
      # Before this writer writes anything: the next write of a key a killed writer was writing (its head.json, the
      # commit record of the group it re-runs, the zarr shards of the rows it overwrites) would otherwise come out
      # as garbage (see storage.remove_unfinished_write).
      stale = storage.remove_unfinished_writes(self._store.spec["path"])
      if stale:
        logging.warning("Shard %r: removed %d write(s) that a killed writer left unfinished (%s).", writer_id,
                        len(stale), ", ".join(stale[:5]) + (", ..." if len(stale) > 5 else ""))
    self._owner = {"token": secrets.token_hex(16), "pid": os.getpid(), "host": socket.gethostname(),
                   "time": time.time()}
    self._store.write_json("owner.json", self._owner)
    # The same directory without fsync (file URLs; other drivers have no such option and need none).
    unsynced = dict(self._store.spec)
    if unsynced["driver"] == "file":
      unsynced["file_io_sync"] = False
    # A commit's objects are written concurrently; an fsync mostly waits for the disk, so more of them may be in
    # flight than there are cores (tensorstore's default limit).
    self._context = ts.Context({"file_io_concurrency": {"limit": _IO_CONCURRENCY}})
    self._unsynced_kv = ts.KvStore.open(unsynced, context=self._context).result()
    # Commit records and tickets: fsynced in FSYNC mode (they are what a commit or begin promises).
    self._record_kv = self._unsynced_kv if durability is Durability.BUFFERED else ts.KvStore.open(
        self._store.spec, context=self._context).result()
    existing = self._store.read("schema.json")
    if existing is None:
      self._store.write_json("schema.json", spec.to_json())
    else:
      try:
        theirs = BufferSpec.from_json(storage.parse_json(existing, "schema.json"))
      except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise BufferRefusal(f"Shard {writer_id!r} of buffer {url} has an unreadable schema.json ({e}); use a new "
                         f"writer id or remove that shard.") from e
      if theirs != spec:
        raise BufferRefusal(f"Shard {writer_id!r} of buffer {url} holds groups of {theirs}, not {spec}; use a new "
                         f"writer id or a new buffer URL.")
    self._arrays = {key: self._open_array(key, path, axis, rest, chunk_rows, shard_rows)
                    for key, path, axis, rest in schema_lib.array_fields(spec)}
    self._axes = {key: axis for key, _, axis, _ in schema_lib.array_fields(spec)}
    self._capacity = min(a.shape[self._axes[k]] for k, a in self._arrays.items())
    self._grow_rows = max(self._write_chunk_rows(k, a) for k, a in self._arrays.items())
    self._closed = False
    self._next_seq, self._next_row = self._recover()
    self._pending = {tid for tid, _ in self._list_pending()}
    self._last_ticket = max((int(t) for t in self._pending if t.isdigit()), default=0)
    self._write_head()
    marker = f"writers/{writer_id}.json"
    if self._root.read(marker) is None:  # written after schema.json: a listed shard always has its schema
      self._root.write_json(marker, {"shard": writer_id, "created": time.time()})

  def __enter__(self) -> RolloutWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    self._release()

  def _release(self) -> None:
    lock, self._lock = getattr(self, "_lock", None), None
    if lock is not None:
      _unlock_shard(lock)

  @property
  def next_seq(self) -> int:
    return self._next_seq

  def begin(self, ticket: Mapping[str, Any]) -> str:
    """Persists the intent to generate a group (e.g. {"task_id": ..., "seed": ...}); returns its ticket id.

    The ticket counts as pending in head.json (admission control) until `commit(..., ticket_id)` or `cancel`;
    after a crash, `pending()` lists it so the restarted actor can re-run the group.
    """
    self._check_open()
    data = storage.json_bytes({"ticket": dict(ticket), "time": time.time()}, "ticket")
    # Ids are increasing wall-clock nanoseconds, so sorted ids are oldest first, across restarts too.
    self._last_ticket = max(self._last_ticket + 1, time.time_ns())
    ticket_id = f"{self._last_ticket:020d}"
    self._record_kv.write(f"pending/{ticket_id}.json", data).result()
    self._pending.add(ticket_id)
    self._write_head()
    return ticket_id

  def pending(self) -> list[tuple[str, dict]]:
    """Unfinished tickets (ticket_id, ticket), oldest first."""
    return self._list_pending()

  def cancel(self, ticket_id: str) -> None:
    """Drops a pending ticket without committing a group (an actor giving up on it)."""
    self._check_open()
    self._store.delete(f"pending/{ticket_id}.json")
    self._pending.discard(ticket_id)
    self._write_head()

  def commit(self, group: Mapping, meta: Mapping[str, Any] | None = None, ticket_id: str | None = None) -> int:
    """Appends one group; returns its sequence number in this shard (`commit_many` of one group)."""
    return self.commit_many([group], [meta], None if ticket_id is None else [ticket_id])[0]

  def commit_many(self, groups: Sequence[Mapping], metas: Sequence[Mapping[str, Any] | None],
                  ticket_ids: Sequence[str | None] | None = None) -> list[int]:
    """Appends several groups (e.g. the groups of one sampler call) at the cost of about one: their rows go into
    one write per array, then one commit record holds them all.

    All groups are checked before anything is written. Once this returns, every group is committed (durable in
    FSYNC mode) under consecutive sequence numbers. The call is atomic: a crash before its commit record lands
    commits none of its groups (their rows are overwritten by the reopened writer, their tickets stay pending, so
    they are re-run).

    Args:
      groups: the groups' arrays (schema in c2jax/rollouts/schema.py).
      metas: one JSON-able metadata dict per group (or None), stored in its commit record; each must hold
        "task_id" unless its ticket does.
      ticket_ids: None, or one `begin` ticket id (or None) per group, deleted after the commit.

    Returns:
      The groups' sequence numbers in this shard, in order.
    """
    self._check_open()
    n = len(groups)
    ticket_ids = [None] * n if ticket_ids is None else list(ticket_ids)
    if len(metas) != n or len(ticket_ids) != n:
      raise ValueError(f"commit_many got {n} groups, {len(metas)} metas and {len(ticket_ids)} ticket ids; pass one "
                       f"of each per group.")
    named = [t for t in ticket_ids if t is not None]
    if len(set(named)) != len(named):
      raise ValueError("commit_many got the same ticket id twice; each ticket completes one group.")
    data, entries = [], []
    seq, row0 = self._next_seq, self._next_row
    for group, meta, ticket_id in zip(groups, metas, ticket_ids):
      data.append(schema_lib.normalize_group(group, self.spec))
      meta = dict(meta or {})
      task_id = meta.pop("task_id", None)
      if ticket_id is not None:
        if ticket_id not in self._pending:
          raise ValueError(f"Ticket {ticket_id!r} is not pending in shard {self.writer_id!r}; pass a ticket id from "
                           f"begin() or pending().")
        if task_id is None:
          task_id = (self._read_ticket(ticket_id) or {}).get("task_id")
      if task_id is None:
        raise ValueError("Commit meta lacks task_id; pass meta={'task_id': ...} (or begin() a ticket with one).")
      rows = schema_lib.group_rows(data[-1])
      entries.append({"row0": row0, "rows": rows, "task_id": str(task_id), "meta": meta, "ticket_id": ticket_id,
                      "row_fields": schema_lib.row_fields_to_json(data[-1], self.spec)})
      seq, row0 = seq + 1, row0 + rows
    if not data:
      return []
    record = records_lib.encode(self._next_seq, self.writer_id, entries, time.time())
    self._check_owner()
    try:
      self._write_rows(data, self._next_row)
      self._check_owner()  # again: rows of a writer that took over meanwhile must not get our record
      # Only once every row is durable.
      self._record_kv.write(commit_key(self._next_seq), record).result()
    except BaseException:
      # The record may be written (and read): only reopening, which resumes after it, is safe.
      self._closed = True
      raise
    first = self._next_seq
    self._next_seq, self._next_row = seq, row0
    # Nothing promised hangs on these: a ticket left behind by a crash here is dropped when the writer reopens.
    futures = [self._unsynced_kv.delete_range(ts.KvStore.KeyRange(k, k + "\0"))
               for k in (f"pending/{t}.json" for t in named)]
    self._pending.difference_update(named)
    for f in futures:
      f.result()
    self._write_head()
    return list(range(first, seq))

  def close(self) -> None:
    if not self._closed:
      self._write_head()
      self._closed = True
    self._release()

  # Internals.

  def _check_open(self) -> None:
    if self._closed:
      raise ValueError(f"RolloutWriter {self.writer_id!r} is closed; open a new one to write again.")

  def _check_owner(self) -> None:
    """WriterConflict (and this writer closed) when another writer opened the shard after this one."""
    try:
      owner = self._store.read_json("owner.json")
    except (ValueError, TypeError) as e:
      owner = {"token": None, "error": str(e)}
    if not isinstance(owner, dict) or owner.get("token") != self._owner["token"]:
      self._closed = True
      self._release()
      who = (f"pid {owner.get('pid')} on {owner.get('host')}" if isinstance(owner, dict) and "pid" in owner
             else "an unknown writer")
      raise WriterConflict(f"Shard {self.writer_id!r} of buffer {self.url} was opened by another writer ({who}) "
                           f"after this one; a writer id must be unique among live writers, so this writer stops.")

  def _open_array(self, key: str, path: str, axis: int, rest: tuple[int, ...], chunk_rows: int,
                  shard_rows: int) -> ts.TensorStore:
    # Every written chunk is stored, all-zero ones too: readers treat a missing chunk as lost data, not as zeros.
    kvstore = self._store.child_spec(f"arrays/{path}")
    if self.durability is Durability.BUFFERED and kvstore["driver"] == "file":
      kvstore["file_io_sync"] = False
    base = {"kvstore": kvstore, "store_data_equal_to_fill_value": True}
    dtype = np.dtype(schema_lib.STORED_DTYPES.get(key, schema_lib.DTYPES.get(key, np.float32)))
    try:
      arr = ts.open({"driver": "zarr3", **base}, open=True, context=self._context).result()
    except ValueError as e:
      if "NOT_FOUND" not in str(e):
        raise
      shape = list(rest)
      shape.insert(axis, -(-INITIAL_ROWS // shard_rows) * shard_rows)
      if rest:
        # One object per `shard_rows` rows (all MoE layers of the expert ids [Lm, rows, T, K] together), holding
        # chunks of `chunk_rows` rows (of one MoE layer) that readers fetch by byte range.
        outer = [rest[0], shard_rows, *rest[1:]] if axis else [shard_rows, *rest]
        inner = [1, chunk_rows, *rest[1:]] if axis else [chunk_rows, *rest]
        codecs: list[dict[str, Any]] = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": inner, "codecs": _ZARR_CODECS, "index_codecs": _SHARD_INDEX_CODECS}}]
      else:
        outer, codecs = [shard_rows], _ZARR_CODECS  # a few bytes per row: not worth an index
      metadata = {"shape": shape, "data_type": dtype.name, "fill_value": 0, "codecs": codecs,
                  "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": outer}}}
      arr = ts.open({"driver": "zarr3", **base, "metadata": metadata}, create=True, open=True,
                    context=self._context).result()
    want: list[int | None] = list(rest)
    want.insert(axis, None)
    got = [None if i == axis else n for i, n in enumerate(arr.shape)]
    if arr.dtype.numpy_dtype != dtype or got != want:
      raise ValueError(f"Array {path} of shard {self.writer_id!r} has dtype {arr.dtype.numpy_dtype} and shape "
                       f"{arr.shape}; the schema needs {dtype.name} with non-row axes {rest}.")
    return arr

  def _write_chunk_rows(self, key: str, arr: ts.TensorStore) -> int:
    """Rows per stored object of the array of `key` (its write chunk along the row axis)."""
    shape = arr.chunk_layout.write_chunk.shape
    rows = None if shape is None else shape[self._axes[key]]
    if rows is None:
      raise ValueError(f"Array {key} of shard {self.writer_id!r} has no regular chunk grid along its row axis (chunk "
                       f"layout {arr.chunk_layout}); the shard was not written by RolloutWriter: use a new writer id.")
    return rows

  def _recover(self) -> tuple[int, int]:
    """(next seq, next row) of a reopened shard, from its last commit record; tickets whose groups did commit (a
    crash between a call's record and its ticket deletions) are deleted.

    Rows after the last commit record are unreferenced and get overwritten, so the next record starts exactly where
    the last one ends (what readers check: `RolloutReader`). A call is one record, so a crash never leaves part of a
    call committed. A record lost after it was written (deleted, a damaged disk) is left as a hole, which readers
    count in `stats["lost_groups"]` once head.json (rewritten by this writer) and a later record show that it was
    committed (see `RolloutReader._record_lost`). A storage error while reading the records is raised (the open
    fails; retry it), never read as an unreadable record.
    """
    seqs = _record_seqs(self._store)
    if not seqs:
      return 0, 0
    pending = [k[len("pending/"):-len(".json")] for k in self._store.list("pending/") if k.endswith(".json")]

    def record_groups(s: int) -> tuple[tuple[records_lib.GroupEntry, ...], Exception | None]:
      """The group entries of record `s` (() and the error when it is unreadable)."""
      raw = self._store.read(commit_key(s))  # storage errors propagate: an unreadable record is a guess
      try:
        return records_lib.decode(raw or b"null", s, self.writer_id, self.spec).groups, None
      except records_lib.RecordError as e:
        return (), e

    last = seqs[-1]
    last_groups, error = record_groups(last)
    if error is None:
      next_seq, end = last + len(last_groups), last_groups[-1].row0 + last_groups[-1].rows
    else:
      # An unreadable last record hides how many groups and rows it held: the next call starts after its first
      # seq, and its rows past everything the arrays ever held.
      logging.warning("Shard %r: last commit record %d is unreadable (%s); new rows start at the array end %d.",
                      self.writer_id, last, error, self._capacity)
      next_seq, end = last + 1, self._capacity
    done: list[str] = []
    covered = 0
    for s in reversed(seqs):  # newest first, until the records read cover as many groups as there are tickets
      groups = last_groups if s == last else record_groups(s)[0]
      done += [g.ticket_id for g in groups if g.ticket_id is not None]
      covered += max(1, len(groups))
      if covered >= len(pending):
        break
    for ticket_id in set(done) & set(pending):
      self._store.delete(f"pending/{ticket_id}.json")
    return next_seq, end

  def _list_pending(self) -> list[tuple[str, dict]]:
    out = []
    for key in self._store.list("pending/"):
      if not key.endswith(".json"):
        continue
      ticket_id = key[len("pending/"):-len(".json")]
      ticket = self._read_ticket(ticket_id)
      if ticket is not None:
        out.append((ticket_id, ticket))
    return out

  def _read_ticket(self, ticket_id: str) -> dict | None:
    try:
      rec = self._store.read_json(f"pending/{ticket_id}.json")
      if rec is None:
        logging.warning("Shard %r: pending ticket %s was deleted after it was listed; ignoring it.", self.writer_id,
                        ticket_id)
        return None
      return dict(rec["ticket"])
    except (ValueError, TypeError, KeyError) as e:
      logging.warning("Shard %r: pending ticket %s is unreadable (%s); ignoring it.", self.writer_id, ticket_id, e)
      return None

  def heartbeat(self, min_interval_s: float = 0.0) -> None:
    """Rewrites head.json with the current time (unless written less than `min_interval_s` ago): the lease that
    keeps this writer's pending tickets counted by admission (c2jax/rollouts/admission.py)."""
    self._check_open()
    if time.time() - self._head_time >= min_interval_s:
      self._write_head()

  def _write_head(self) -> None:
    self._head_time = time.time()
    head = {"committed": self._next_seq, "pending": len(self._pending), "rows": self._next_row,
            "time": self._head_time}
    self._unsynced_kv.write("head.json", storage.json_bytes(head, "head")).result()

  def _write_rows(self, groups: Sequence[dict], row0: int) -> None:
    """Writes the normalized groups' rows, one after the other from row `row0`, into every array (no commit
    record: invisible to readers): one write per array, all in flight together; returns when all are stored
    (durable in FSYNC mode)."""
    rows = sum(schema_lib.group_rows(g) for g in groups)
    self._ensure_capacity(row0 + rows)
    futures = []
    for key, arr in self._arrays.items():
      axis = self._axes[key]
      parts = [g[key] for g in groups]
      # One pass: concatenated and cast to the stored dtype (values were range-checked by normalize_group).
      value = np.concatenate(parts, axis=axis, dtype=arr.dtype.numpy_dtype, casting="unsafe")
      index = (slice(None), slice(row0, row0 + rows)) if axis else slice(row0, row0 + rows)
      futures.append(arr[index].write(value))
    for f in futures:
      f.commit.result()

  def _ensure_capacity(self, end: int) -> None:
    """Grows every array's row extent to at least `end`, doubling so that metadata is rewritten rarely."""
    if end <= self._capacity:
      return
    new = max(end, 2 * self._capacity, self._grow_rows)
    new = -(-new // self._grow_rows) * self._grow_rows
    futures = {}
    for key, arr in self._arrays.items():
      shape = list(arr.shape)
      shape[self._axes[key]] = new
      futures[key] = arr.resize(exclusive_max=shape, expand_only=True, resize_metadata_only=True)
    for key, f in futures.items():
      self._arrays[key] = f.result()
    self._capacity = new


class RowOrder(enum.Enum):
  """What a reader knows of where a shard's next commit record must start (`_Shard.row_end`).

  EXACT: the seq before it was in the verified record read last, so it starts exactly at row_end (a writer appends
    each call's rows right after the last call's).
  AFTER: seqs were skipped since (lost or rejected records, a cursor resumed past an unread record), whose rows are
    unknown: it starts at row_end or later, never inside rows handed out already.
  """

  EXACT = "exact"
  AFTER = "after"


class _Shard:
  """A reader's view of one accepted shard: its store, lazily opened read-only arrays, and what the records read so
  far say about the next one (`row_end`, `order`, `after_rejected`)."""

  def __init__(self, shard_id: str, store: Store, spec: BufferSpec):
    self.id = shard_id
    self.store = store
    self.spec = spec
    self.fields = schema_lib.array_fields(spec)
    self.arrays: dict[str, ts.TensorStore] = {}
    self.row_end: int | None = None  # rows below it belong to records read already (None: none read)
    self.order = RowOrder.AFTER
    self.after_rejected = False  # the last record read was rejected: its groups' count is unknown

  def array(self, key: str, path: str, axis: int, end: int) -> ts.TensorStore:
    """The array, reopened when it holds fewer than `end` rows (the writer grew it since we opened it)."""
    arr = self.arrays.get(key)
    if arr is None or arr.shape[axis] < end:
      arr = ts.open({"driver": "zarr3", "kvstore": self.store.child_spec(f"arrays/{path}"),
                     "fill_missing_data_reads": False}, open=True, read=True).result()
      self.arrays[key] = arr
    if arr.shape[axis] < end:
      raise ValueError(f"array {path} has {arr.shape[axis]} rows but the commit record needs {end}")
    return arr


class _Pending:
  """A commit call whose record is verified and whose groups' array reads are in flight (one dict of futures per
  group), or `span` seqs skipped (`error`): a missing (`lost`) or rejected (`rejected`) record."""

  def __init__(self, shard: _Shard, seq: int, record: records_lib.CommitRecord | None, error: str | None,
               lost: bool = False, rejected: bool = False, span: int = 1):
    self.shard, self.seq, self.record, self.error, self.lost = shard, seq, record, error, lost
    self.rejected, self.span = rejected, span
    self.futures: list[dict[str, Any]] = []
    self.exception: BaseException | None = None


# tensorstore reports storage errors as ValueError("<absl status code>: ..."); these codes are the ones a retry
# can cure (throttling, timeouts, an object store's 503s). Checksum failures (DATA_LOSS), missing chunks
# (NOT_FOUND) and bad data are not retried.
_TRANSIENT_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "CANCELLED")
MAX_TRANSIENT_RETRIES = 5
SKIPS_NAMED = 20  # skipped groups and shards a reader names (`RolloutReader.skipped`); the rest are counted


def _transient(e: BaseException | None) -> bool:
  if isinstance(e, (ConnectionError, TimeoutError)):
    return True
  return e is not None and str(e).split(":", 1)[0].strip() in _TRANSIENT_CODES


class RolloutReader:
  """Yields every committed group of a buffer exactly once, round-robin across shards, from a resumable cursor.

  `cursor` is {shard_id: next seq} over exactly the groups handed out by `poll`/`take` (and the corrupt ones
  skipped before them): store it in the trainer checkpoint and pass it back to resume. Groups fetched ahead of
  what was handed out stay in memory and are not in the cursor.
  """

  def __init__(self, url: str, spec: BufferSpec | None = None, cursor: Mapping[str, int] | None = None):
    """Args:
      url: the buffer's directory URL.
      spec: the expected group shapes; shards of another spec are skipped. None: the first shard's spec.
      cursor: a `cursor` saved earlier; None starts from the beginning.
    """
    self.url = url
    self.spec = spec
    self._root = Store(url)
    self._cursor = self._check_cursor(cursor)
    self._fetched = dict(self._cursor)  # next seq to read from storage, per shard (>= the cursor)
    self._queues: dict[str, collections.deque] = {}  # (seq, Group | None for a skipped corrupt group)
    self._shards: dict[str, _Shard] = {}
    self._skipped: set[str] = set()
    self._turn = 0
    self._stats = {"groups_read": 0, "rows_read": 0, "corrupt_groups": 0, "lost_groups": 0, "rejected_records": 0,
                   "skipped_shards": 0, "bytes_read": 0, "transient_errors": 0}
    self._skips: list[str] = []  # the first SKIPS_NAMED groups and shards skipped, each with why (`skipped`)
    self._retries: dict[tuple[str, int], int] = {}  # (shard, seq) -> transient read failures so far
    self._skip_below: dict[str, int] = {}  # shard -> the cursor inside the call it reads first (see _refresh_shards)
    self._progress_written = False  # by this reader (see publish_progress)

  @property
  def cursor(self) -> dict:
    """JSON-able {shard_id: next seq}: exactly the groups handed out so far."""
    return dict(sorted(self._cursor.items()))

  @property
  def stats(self) -> dict:
    """groups_read, rows_read (read from storage), corrupt_groups (skipped: data that fails its checksums, or a
    rejected commit record's groups), lost_groups (skipped: a commit record lost after it was written),
    rejected_records (commit records that failed their checksum or their checks, `records.decode` and the shard's
    row and seq order; each rejected record's groups are in corrupt_groups), skipped_shards, bytes_read (stored
    bytes, from tensorstore's process-wide kvstore counters around this reader's reads)."""
    return dict(self._stats)

  @property
  def skipped(self) -> list[str]:
    """The first `SKIPS_NAMED` groups and shards this reader skipped, each named with why ("shard 'w' group 1:
    <reason>", "shard 'x': <reason>"): what the counts of `stats` are made of."""
    return list(self._skips)

  def _note_skip(self, what: str) -> None:
    if len(self._skips) < SKIPS_NAMED:
      self._skips.append(what)

  def poll(self, max_groups: int | None = None) -> list[Group]:
    """Hands out committed groups not handed out before (at most `max_groups`), without waiting."""
    want = None if max_groups is None else max_groups - self._buffered()
    if want is None or want > 0:
      self._fill(want)
    return self._hand_out(max_groups)

  def take(self, n: int, timeout_s: float | None = None, poll_interval_s: float = 0.05) -> list[Group]:
    """Blocks until `n` groups are available and hands out exactly `n`; none ([]) when `timeout_s` runs out first.

    All or nothing, so that a caller stopping at a timeout never holds a partial batch whose groups the cursor
    already counts as handed out (the groups read so far stay buffered for the next call)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
      if self._buffered() < n:
        self._fill(n - self._buffered())
      if self._buffered() >= n:
        return self._hand_out(n)
      remaining = None if deadline is None else deadline - time.monotonic()
      if remaining is not None and remaining <= 0:
        return []
      time.sleep(poll_interval_s if remaining is None else min(poll_interval_s, remaining))

  def backlog(self) -> int:
    """Committed groups not yet handed out, across accepted shards (per the shards' head.json)."""
    self._refresh_shards()
    total = 0
    for sid, shard in self._shards.items():
      try:
        head = shard.store.read_json("head.json") or {}
        committed = int(head.get("committed", 0))
      except (ValueError, TypeError, AttributeError):
        committed = 0
      total += max(committed, self._fetched.get(sid, 0)) - self._cursor.get(sid, 0)
    return total

  def publish_progress(self, version: int, groups_per_step: int, cursor: Mapping[str, int] | None = None) -> None:
    """Writes trainer.json for the actors' admission control (c2jax/rollouts/admission.py).

    Args:
      version: the trainer's weights version (updates done).
      groups_per_step: groups consumed per update.
      cursor: the groups the updates so far have consumed; None: every group handed out (`self.cursor`). A trainer
        that reads its next batch ahead passes the cursor of the batches it trained on, so admission does not
        count a batch read ahead as consumed.
    """
    if groups_per_step < 1:
      raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}.")
    cursor = dict(self._cursor if cursor is None else cursor)
    if not self._progress_written and self._root.spec["driver"] == "file":
      # A trainer killed while it wrote trainer.json leaves the write unfinished, and the next one would come out as
      # garbage (storage.remove_unfinished_write) that admission reads as damaged: no actor would start a group.
      storage.remove_unfinished_write(os.path.join(self._root.spec["path"], "trainer.json"))
    self._progress_written = True
    self._root.write_json("trainer.json", {"version": int(version), "groups_consumed": sum(cursor.values()),
                                           "cursor": cursor, "groups_per_step": int(groups_per_step),
                                           "time": time.time()})

  # Internals.

  def _check_cursor(self, cursor: Any) -> dict[str, int]:
    """`cursor` as {shard id: next seq}, each entry checked against the buffer's shards (CursorError, one sentence
    naming the entry): a cursor of another buffer would otherwise skip groups, or make trainer.json count groups
    never consumed (and admission over-admit)."""
    if cursor is None:
      return {}
    if not isinstance(cursor, Mapping):
      raise CursorError(f"The buffer cursor is a {type(cursor).__name__}, not a dict of shard id -> next seq; pass "
                       f"RolloutReader.cursor (as saved in the checkpoint) unchanged.")
    out = {}
    known = None
    for k, v in cursor.items():
      if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise CursorError(f"Buffer cursor entry {k!r}: {v!r} is not shard id -> next seq (int >= 0); pass the "
                         f"dict of RolloutReader.cursor unchanged.")
      if v == 0:
        out[k] = v
        continue
      if known is None:
        known = set(shard_ids(self._root))
      if k not in known:
        raise CursorError(f"Buffer cursor entry {k!r}: {v} names a shard that buffer {self.url} does not hold; the "
                         f"cursor belongs to another buffer (resume with the buffer URL the checkpoint was trained "
                         f"from).")
      if not self._committed(k, v):
        raise CursorError(f"Buffer cursor entry {k!r}: {v} is past the end of that shard of buffer {self.url} (it "
                         f"has no commit record holding seq {v - 1}); the cursor belongs to another buffer, or the "
                         f"shard was rewritten.")
      out[k] = v
    return out

  def _buffered(self) -> int:
    return sum(1 for q in self._queues.values() for _, g in q if g is not None)

  def _refresh_shards(self) -> None:
    """Accepts shards that appeared since the last call (their schema read once)."""
    for sid in shard_ids(self._root):
      if sid in self._shards or sid in self._skipped:
        continue
      store = Store(join(self.url, "shards", sid))
      try:
        raw_spec = store.read_json("schema.json")
        if raw_spec is None:
          self._skip_shard(sid, "its schema.json is missing")
          continue
        theirs = BufferSpec.from_json(raw_spec)
      except Exception as e:  # noqa: BLE001  (any unreadable schema: skip the shard, never crash)
        self._skip_shard(sid, f"its schema.json is unreadable ({e})")
        continue
      if self.spec is None:
        self.spec = theirs
      if theirs != self.spec:
        self._skip_shard(sid, f"it holds groups of {theirs}, not {self.spec}")
        continue
      shard = _Shard(sid, store, self.spec)
      start = self._fetched.get(sid, 0)
      if start:
        # A cursor inside a call (a take() that split its groups): read from the call's record, and hand out only
        # its groups from the cursor on.
        try:
          first = self._locate(store, sid, start, self.spec)
          self._resume_rows(shard, start if first is None else first)
        except Exception as e:  # noqa: BLE001  (storage hiccup: accept the shard on a later call)
          logging.warning("Rollout buffer %s: finding the commit record of seq %d in shard %r failed (%s); will "
                          "retry.", self.url, start, sid, e)
          continue
        if first is not None and first < start:
          self._fetched[sid], self._skip_below[sid] = first, start
      self._shards[sid] = shard
      self._queues[sid] = collections.deque()
      self._fetched.setdefault(sid, 0)
      self._cursor.setdefault(sid, 0)

  def _skip_shard(self, sid: str, why: str) -> None:
    logging.warning("Rollout buffer %s: skipping shard %r because %s.", self.url, sid, why)
    self._skipped.add(sid)
    self._stats["skipped_shards"] += 1
    self._note_skip(f"shard {sid!r}: {why}")

  def _order(self) -> list[str]:
    """Shard ids rotated by one each round, so that no writer is always first."""
    ids = sorted(self._shards)
    if not ids:
      return ids
    k = self._turn % len(ids)
    return ids[k:] + ids[:k]

  def _fill(self, want: int | None) -> None:
    """Reads up to `want` (None: all) newly committed groups into the per-shard queues, round-robin: each round
    reads the next commit record (one call's groups) of every shard, then all their arrays concurrently."""
    self._refresh_shards()
    before = _kvstore_bytes_read()
    active = self._order()
    got = 0
    while active and (want is None or got < want):
      batch: list[_Pending] = []
      idle: set[str] = set()
      for sid in active:
        if want is not None and got + len(batch) >= want:
          break
        p = self._start(self._shards[sid])
        if p is None:
          idle.add(sid)  # nothing new there: not asked again in this call
        else:
          batch.append(p)
      for p in batch:
        done = self._finish(p)
        if done is None:
          idle.add(p.shard.id)  # a transient storage error: this call is read again on a later call
        else:
          got += done
      active = [sid for sid in active if sid not in idle]
    self._turn += 1
    self._stats["bytes_read"] += _kvstore_bytes_read() - before

  def _start(self, shard: _Shard) -> _Pending | None:
    """Reads the shard's next commit record and starts reading its groups' rows; None when there is none yet."""
    seq = self._fetched[shard.id]
    try:
      raw = shard.store.read(commit_key(seq))
    except Exception as e:  # noqa: BLE001  (storage hiccup: retry on the next poll)
      logging.warning("Rollout buffer %s: reading commit record %d of shard %r failed (%s); will retry.",
                      self.url, seq, shard.id, e)
      return None
    if raw is None:
      return self._missing(shard, seq)
    try:
      record = records_lib.decode(raw, seq, shard.id, shard.spec)
      overlap = self._check_order(shard, record)
    except records_lib.RecordError as e:
      return _Pending(shard, seq, None, f"its commit record is rejected ({e})", rejected=True)
    except Exception as e:  # noqa: BLE001  (storage hiccup while checking the order: retry on the next poll)
      logging.warning("Rollout buffer %s: checking commit record %d of shard %r failed (%s); will retry.",
                      self.url, seq, shard.id, e)
      return None
    if overlap is not None:
      return _Pending(shard, seq, None, f"its commit record is rejected (it lists {len(record.groups)} groups, but "
                      f"the record of seq {overlap} exists)", rejected=True, span=overlap - seq)
    p = _Pending(shard, seq, record, None)
    try:
      for entry in record.groups:
        row0, rows = entry.row0, entry.rows
        futures = {}
        for key, path, axis, _ in shard.fields:
          arr = shard.array(key, path, axis, row0 + rows)
          index = (slice(None), slice(row0, row0 + rows)) if axis else slice(row0, row0 + rows)
          futures[key] = arr[index].read()
        p.futures.append(futures)
    except Exception as e:  # noqa: BLE001
      p.error, p.exception = f"its data cannot be read ({e})", e
    return p

  def _missing(self, shard: _Shard, seq: int) -> _Pending | None:
    """The skip of a seq that has no record of its own, or None while it may yet be written (wait)."""
    if shard.after_rejected:
      # The record rejected just before held this seq, or it was lost: a writer writes its records in seq order,
      # so a later record means that every seq before it was committed. head.json is not needed (it may be the
      # damaged object too).
      try:
        later = _record_seqs(shard.store, start=seq + 1)
      except Exception:  # noqa: BLE001  (retry on the next poll)
        return None
      if not later:
        return None
      return _Pending(shard, seq, None, "it was in the rejected commit record before it", rejected=False,
                      span=later[0] - seq)
    if not self._record_lost(shard, seq):
      return None
    # head.json is written after the record: the record may have landed between our two reads. Only a record
    # still missing now that head.json counts it is lost.
    try:
      raw = shard.store.read(commit_key(seq))
    except Exception:  # noqa: BLE001  (retry on the next poll)
      return None
    if raw is None:
      return _Pending(shard, seq, None, "its commit record is missing although head.json counts it", lost=True)
    return None  # it landed: read on the next round

  @staticmethod
  def _check_order(shard: _Shard, record: records_lib.CommitRecord) -> int | None:
    """RecordError when `record` does not follow the shard's records read so far the way a writer appends them:
    rows exactly after the previous record's (`RowOrder`), never inside rows read already. Returns the seq of a
    record that exists inside the seqs `record` lists after its first (then it claims seqs that are not its own),
    or None. One read per seq it lists after its first, in flight together."""
    if shard.row_end is not None:
      if shard.order is RowOrder.EXACT and record.row0 != shard.row_end:
        raise records_lib.RecordError(f"its rows start at {record.row0}, not at row {shard.row_end} where the "
                                      f"shard's previous record ends")
      if record.row0 < shard.row_end:
        raise records_lib.RecordError(f"its rows start at {record.row0}, inside rows of records read already "
                                      f"(below {shard.row_end})")
    later = range(record.seq + 1, record.end_seq)
    found = [s for s, there in zip(later, shard.store.exist([commit_key(s) for s in later])) if there]
    return found[0] if found else None

  @classmethod
  def _resume_rows(cls, shard: _Shard, first: int) -> None:
    """Sets what the reader knows of the rows before seq `first`, where it resumes: the end of the record before
    it (EXACT when that record ends at `first`)."""
    before = _record_seqs(shard.store, end=first)
    if not before:
      return
    try:
      record = records_lib.decode(shard.store.read(commit_key(before[-1])) or b"null", before[-1], shard.id,
                                  shard.spec)
    except records_lib.RecordError:
      return  # unknown: rows are checked against the records read from here on
    shard.row_end = record.row_end
    shard.order = RowOrder.EXACT if record.end_seq == first else RowOrder.AFTER

  def _finish(self, p: _Pending) -> int | None:
    """Queues the call's groups, each as a Group or as a skip marker for a corrupt one (a missing or rejected
    record is a skip marker per seq of its `span`); the shard moves past the call. Returns the groups queued, or
    None: a transient storage error, the shard stays at this call (skipped as corrupt after MAX_TRANSIENT_RETRIES
    failures)."""
    n = p.span if p.record is None else len(p.record.groups)
    groups: list[Group | None] = [None] * n
    errors: list[str | None] = [p.error] * n
    exceptions: list[BaseException | None] = [p.exception] * n
    if p.record is not None and p.error is None:
      for i, (entry, futures) in enumerate(zip(p.record.groups, p.futures)):
        try:
          data = {key: future.result() for key, future in futures.items()}
          data.update(entry.row_fields)
          data = schema_lib.normalize_group(data, p.shard.spec)
          meta = dict(entry.meta)
          meta.update(task_id=entry.task_id, shard=p.shard.id, seq=p.seq + i, rows=entry.rows, row0=entry.row0,
                      time=p.record.time)
          groups[i] = Group(data=data, meta=meta)
        except Exception as e:  # noqa: BLE001  (checksum errors, missing chunks, bad shapes)
          errors[i], exceptions[i] = f"its data cannot be read ({e})", e
    else:
      for futures in p.futures:
        for future in futures.values():
          future.cancel()
    key = (p.shard.id, p.seq)
    transient = next((e for e in exceptions if _transient(e)), None)
    if transient is not None:
      self._retries[key] = self._retries.get(key, 0) + 1
      self._stats["transient_errors"] += 1
      if self._retries[key] <= MAX_TRANSIENT_RETRIES:
        logging.warning("Rollout buffer %s: reading the call at seq %d of shard %r failed (%s); will retry.",
                        self.url, p.seq, p.shard.id, transient)
        return None
    self._retries.pop(key, None)
    self._fetched[p.shard.id] = p.seq + n
    shard = p.shard
    if p.record is not None:  # a verified record: its rows are known even when its data is corrupt
      shard.row_end, shard.order, shard.after_rejected = p.record.row_end, RowOrder.EXACT, False
    else:
      shard.order = RowOrder.AFTER
      shard.after_rejected = p.rejected or (shard.after_rejected and not p.lost)
    if p.rejected:
      self._stats["rejected_records"] += 1
    skip = self._skip_below.pop(p.shard.id, 0)
    queued = 0
    for i, (group, error) in enumerate(zip(groups, errors)):
      seq = p.seq + i
      if seq < skip:
        continue  # handed out before the cursor this reader resumed from
      self._queues[p.shard.id].append((seq, group))
      if group is None:
        logging.warning("Rollout buffer %s: skipping group %d of shard %r because %s.", self.url, seq, p.shard.id,
                        error)
        self._stats["lost_groups" if p.lost else "corrupt_groups"] += 1
        self._note_skip(f"shard {p.shard.id!r} group {seq}: {'lost: ' if p.lost else ''}{error}")
        continue
      queued += 1
      self._stats["groups_read"] += 1
      self._stats["rows_read"] += group.meta["rows"]
    return queued

  @staticmethod
  def _record_lost(shard: _Shard | Store, seq: int) -> bool:
    """True if the missing record of `seq` was lost after it was written: head.json says `seq` was committed, and
    a later record exists.

    head.json is written after the record, so a missing record that it counts was lost; waiting for it would stall
    the shard forever. The later record is asked for too because a damaged head.json that counts records never
    written would otherwise make a reader skip seqs its writer has yet to commit, and lose those groups; a writer
    writes its records in seq order, so a later one means that `seq`'s call returned. A lost LAST record is
    therefore only declared lost once a later record exists; until then the shard waits (a stall of one shard,
    never a lost group)."""
    store = shard if isinstance(shard, Store) else shard.store
    try:
      head = store.read_json("head.json") or {}
      committed = int(head.get("committed", 0))
      return committed > seq and bool(store.list_range(commit_key(seq + 1), commit_key(committed)))
    except Exception:  # noqa: BLE001
      return False

  @staticmethod
  def _locate(store: Store, shard_id: str, seq: int, spec: BufferSpec) -> int | None:
    """The first seq of the verified commit record of shard `shard_id` (at `store`) that holds `seq`, or None when
    no record does (yet)."""
    if store.read(commit_key(seq)) is not None:
      return seq
    before = _record_seqs(store, end=seq)
    if not before:
      return None
    try:
      record = records_lib.decode(store.read(commit_key(before[-1])) or b"null", before[-1], shard_id, spec)
    except records_lib.RecordError:
      return None
    return before[-1] if record.end_seq > seq else None

  def _committed(self, shard_id: str, n: int) -> bool:
    """Whether shard `shard_id` committed seqs 0..n-1: head.json counts them, or a record holds seq n-1."""
    store = Store(join(self.url, "shards", shard_id))
    try:
      if int((store.read_json("head.json") or {}).get("committed", 0)) >= n:
        return True
    except (ValueError, TypeError, AttributeError):
      pass
    try:
      spec = self.spec or BufferSpec.from_json(store.read_json("schema.json") or {})
    except (ValueError, TypeError):
      return False
    return self._locate(store, shard_id, n - 1, spec) is not None

  def _hand_out(self, n: int | None) -> list[Group]:
    """Pops up to `n` queued groups (None: all), round-robin across shards, advancing the cursor past each and
    past the skipped corrupt groups that follow it."""
    out: list[Group] = []
    for sid in self._queues:
      self._drop_skipped(sid)
    while n is None or len(out) < n:
      ready = [sid for sid in self._order() if self._queues[sid]]
      if not ready:
        break
      for sid in ready:
        if n is not None and len(out) >= n:
          break
        seq, group = self._queues[sid].popleft()
        out.append(group)
        self._cursor[sid] = seq + 1
        self._drop_skipped(sid)
      self._turn += 1
    return out

  def _drop_skipped(self, sid: str) -> None:
    q = self._queues[sid]
    while q and q[0][1] is None:
      seq, _ = q.popleft()
      self._cursor[sid] = seq + 1
