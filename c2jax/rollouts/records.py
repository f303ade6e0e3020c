"""The commit record: one per commit call of a shard, what makes its groups visible (layout in
c2jax/rollouts/schema.py).

  raw = encode(seq=5, shard="actor-3", entries=[{"row0": 12, "rows": 3, "task_id": "t7", "meta": {},
               "ticket_id": None, "row_fields": schema.row_fields_to_json(group, spec)}], time=t)
  record = decode(raw, seq=5, shard="actor-3", spec=spec)   # RecordError unless it is what that writer wrote
  record.groups[0].row_fields["reward_terms"]["outcome"]   # float32 [3]

The record carries the few numbers per row of the [R] fields (rewards among them) as JSON, so it is checksummed as
a whole: "checksum" is "sha256:" and the hex digest of the record's canonical JSON (`storage.json_bytes`) without
that field. A reader re-serializes what it parsed and compares, so a changed digit anywhere (a reward, a row range,
the group count, the checksum itself) rejects the record. The checksum guards against damage and against edits
that do not recompute it; it is not a signature: whoever may write the shard may write any record.

`decode` also checks the structure against what `RolloutWriter` writes, so a record is never trusted for more than
it proves: exactly the known fields with their JSON types (bools are not ints), its own seq and shard (a record
copied to another seq or shard is refused), bounded JSON
(`storage.parse_json`), groups on consecutive rows in seq order, and row fields of the spec's names, R values each,
within the schema's ranges (`schema.check_row_fields`: finite rewards, lengths in [0, T], ...). The reader checks
the rest against the shard's other records (rows never reused, seqs never claimed twice: `RolloutReader`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Mapping, Sequence

from c2jax.rollouts import schema as schema_lib
from c2jax.rollouts import storage
from c2jax.rollouts.schema import BufferSpec

CHECKSUM_PREFIX = "sha256:"
_RECORD_FIELDS = frozenset({"schema_version", "shard", "seq", "time", "groups", "checksum"})
_ENTRY_FIELDS = frozenset({"row0", "rows", "task_id", "meta", "ticket_id", "row_fields"})


class RecordError(ValueError):
  """A commit record that is not exactly what a writer wrote: readers skip its groups and count them."""


@dataclasses.dataclass(frozen=True)
class GroupEntry:
  """One group of a record.

  Attributes:
    row0: its first row in the shard's arrays.
    rows: R, its rows (>= 1).
    task_id: the task it was sampled from.
    meta: the writer's extra metadata (a JSON object).
    ticket_id: the `begin` ticket it completed, or None.
    row_fields: its [R] fields as in-memory arrays (`schema.row_fields_from_json`), range-checked.
  """

  row0: int
  rows: int
  task_id: str
  meta: dict
  ticket_id: str | None
  row_fields: dict


@dataclasses.dataclass(frozen=True)
class CommitRecord:
  """A verified record of the call whose first group has `seq`; its groups have seqs seq, seq + 1, ..."""

  seq: int
  time: float
  groups: tuple[GroupEntry, ...]

  @property
  def end_seq(self) -> int:
    """The seq after its last group."""
    return self.seq + len(self.groups)

  @property
  def row0(self) -> int:
    return self.groups[0].row0

  @property
  def row_end(self) -> int:
    """The row after its last group's rows."""
    return self.groups[-1].row0 + self.groups[-1].rows


def _digest(body: Mapping[str, Any]) -> str:
  return CHECKSUM_PREFIX + hashlib.sha256(storage.json_bytes(body, "commit record")).hexdigest()


def encode(seq: int, shard: str, entries: Sequence[Mapping[str, Any]], time: float) -> bytes:
  """The stored bytes of the record of shard `shard`'s call whose first group has `seq`; `entries` are its groups'
  dicts of exactly row0, rows, task_id, meta, ticket_id and row_fields (`schema.row_fields_to_json`), on
  consecutive rows. ValueError (one sentence) when it is not JSON-able or exceeds the bounds readers accept
  (`storage.json_bytes`)."""
  body = {"schema_version": schema_lib.SCHEMA_VERSION, "shard": shard, "seq": seq, "time": time,
          "groups": [dict(e) for e in entries]}
  return storage.json_bytes({**body, "checksum": _digest(body)}, "commit record")


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def decode(raw: bytes, seq: int, shard: str, spec: BufferSpec) -> CommitRecord:
  """The record in `raw`, stored under `seq` in shard `shard`, verified (checksum) and checked (structure, row
  fields against `spec`); RecordError naming the first problem otherwise. Never raises anything else on any input
  bytes."""
  try:
    return _decode(raw, seq, shard, spec)
  except RecordError:
    raise
  except (ValueError, TypeError, KeyError, OverflowError) as e:  # a row field the arrays cannot hold, ...
    raise RecordError(str(e)) from e


def _decode(raw: bytes, seq: int, shard: str, spec: BufferSpec) -> CommitRecord:
  rec = _verified(raw, seq, shard)
  groups = rec["groups"]
  if not isinstance(groups, list) or not groups:
    raise RecordError("groups is not a non-empty list")
  out: list[GroupEntry] = []
  for i, g in enumerate(groups):
    out.append(_entry(g, seq + i, out[-1].row0 + out[-1].rows if out else None, spec))
  return CommitRecord(seq=seq, time=float(rec["time"]), groups=tuple(out))


def _verified(raw: bytes, seq: int, shard: str) -> dict:
  """The record's JSON object, its fields, version, checksum, seq, shard and time checked (not its groups)."""
  rec = storage.parse_json(raw, "the commit record")
  if not isinstance(rec, dict):
    raise RecordError(f"the commit record is a JSON {type(rec).__name__}, not an object")
  if set(rec) != _RECORD_FIELDS:
    odd = sorted(set(rec) ^ _RECORD_FIELDS)
    raise RecordError(f"the commit record lacks or adds field {odd[0]!r}")
  version = rec["schema_version"]
  if not _is_int(version) or version != schema_lib.SCHEMA_VERSION:
    raise RecordError(f"schema_version is {version!r}; this code reads version {schema_lib.SCHEMA_VERSION}")
  checksum = rec.pop("checksum")
  if not isinstance(checksum, str) or checksum != _digest(rec):
    raise RecordError("its checksum does not match its content")
  if not _is_int(rec["seq"]) or rec["seq"] != seq:
    raise RecordError(f"seq {rec['seq']!r} in the record stored as seq {seq}")
  if rec["shard"] != shard:
    raise RecordError(f"shard {rec['shard']!r} in a record of shard {shard!r}")
  if not isinstance(rec["time"], (int, float)) or isinstance(rec["time"], bool):
    raise RecordError(f"time {rec['time']!r} is not a number")
  return rec


def _entry(g: Any, seq: int, row0_want: int | None, spec: BufferSpec) -> GroupEntry:
  """The checked entry of group `seq`; `row0_want`: where the group before it in the record ends (None: first)."""
  where = f"group {seq}"
  if not isinstance(g, dict) or set(g) != _ENTRY_FIELDS:
    odd = sorted(set(g) ^ _ENTRY_FIELDS) if isinstance(g, dict) else [type(g).__name__]
    raise RecordError(f"{where} is not an object of exactly {sorted(_ENTRY_FIELDS)} ({odd[0]!r})")
  row0, rows = g["row0"], g["rows"]
  if not _is_int(row0) or row0 < 0 or not _is_int(rows) or rows < 1:
    raise RecordError(f"{where} has row0 {row0!r} and rows {rows!r}; they must be ints >= 0 and >= 1")
  if row0_want is not None and row0 != row0_want:  # a writer puts a call's groups on consecutive rows
    raise RecordError(f"{where} starts at row {row0}, not at row {row0_want} where the group before it ends")
  if not isinstance(g["task_id"], str) or not isinstance(g["meta"], dict):
    raise RecordError(f"{where} has a task_id that is not a string or a meta that is not an object")
  if g["ticket_id"] is not None and not isinstance(g["ticket_id"], str):
    raise RecordError(f"{where} has a ticket_id that is neither a string nor null")
  try:
    fields = schema_lib.row_fields_from_json(g["row_fields"], rows, spec)
    schema_lib.check_row_fields(fields, rows, spec)
  except ValueError as e:
    raise RecordError(f"{where}: {e}") from e
  return GroupEntry(row0=row0, rows=rows, task_id=g["task_id"], meta=g["meta"], ticket_id=g["ticket_id"],
                    row_fields=fields)
