"""Admission control: actors do not start a group more than `max_lag` policy versions ahead of the trainer
(PipelineRL's staleness budget; report section 6, asynchronous RL).

  status = read_status("runs/rl/buffer")
  if admit(status, weights_version=v, max_lag=2):
    ticket = writer.begin({"task_id": task})    # counts as pending from here on
    ...

Groups are trained in commit order, `groups_per_step` per update. Versions are the weight store's counter, which
jumps when a trainer restarts (it resumes past the last published version), so the target is counted from the
trainer's own progress: trainer.json holds its current weights version and the groups its updates have consumed.
committed + pending - consumed started groups wait for updates ahead of a new group, so it lands in the update
that starts from weights version

  target = trainer_version + max(0, committed + pending - consumed) // groups_per_step

(the max: head.json and trainer.json are read at different moments, so consumed may briefly exceed the rest).

An actor holding weights version v may start it iff `target - v <= max_lag`. The trainer publishes trainer.json
only after an update and its weights publish, so trainer_version is always loadable; with max_lag = 0 a group is
started only by the weights that will train on it (synchronous RL).

Races without a lock: actors that read the same status concurrently may all be admitted before any of their
`begin` records lands. So an actor begins its tickets and then verifies them against a fresh status, counting its
own last, and cancels those past the budget (`Actor._verify`): of two racing actors, each sees the other's
tickets, so together they never exceed the budget; both may back off, and retry after a random pause. (This
needs read-after-write consistency of the store, which local files, GCS and S3 give.)
Pending tickets count as started groups while their writer is alive: a live writer rewrites its head.json at least
every `lease / 4` (`RolloutWriter.heartbeat`, between decode chunks and while waiting), and `read_status(...,
pending_lease_s=lease)` ignores the pending tickets of a head older than the lease. Otherwise an actor id that never
comes back (scaled down, renamed, a poison group) would hold its slots forever, and enough of them would stall the
trainer for good. (Clocks of writers and readers are compared: keep the lease well above their skew.)

A head.json that is missing, garbage, partly written or out of range (a negative count) is never read as 0
committed groups, which would over-admit until its writer rewrites it: the shard counts the largest of the last
readable head.json this process saw and what its commit records show committed (`buffer.committed_by_records`), its
pending tickets as that last head counted them (under the same lease) or, without one, as many as its pending/
directory lists; `BufferStatus.damaged_heads` counts such shards, and a shard whose head and records both fail to
read (storage errors, no earlier head) makes the status admit nothing (`BufferStatus.counts_unknown`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from absl import logging

from c2jax.rollouts.buffer import committed_by_records, shard_ids
from c2jax.rollouts.storage import Store, join


@dataclasses.dataclass(frozen=True)
class BufferStatus:
  """What admission needs to know, read from storage.

  Attributes:
    committed: groups committed across all shards (their head.json).
    pending: groups begun but not committed across all shards.
    consumed: groups the trainer has handed to updates (trainer.json).
    trainer_version: the trainer's weights version, i.e. updates done (trainer.json; 0 before it starts).
    groups_per_step: groups per update (trainer.json).
    trainer_damaged: trainer.json exists but cannot be read; admission then admits nothing (see `admit`).
    damaged_heads: shards whose head.json is missing or unreadable, counted conservatively (module docstring).
    counts_unknown: a shard's committed groups could not be read at all (storage errors on its head.json and its
      records, and no earlier head seen); admission then admits nothing, as for a damaged trainer.json.
  """

  committed: int
  pending: int
  consumed: int
  trainer_version: int
  groups_per_step: int
  trainer_damaged: bool = False
  damaged_heads: int = 0
  counts_unknown: bool = False


_STORES: dict[str, Store] = {}  # actors poll the status often: reuse the kvstore handles


def _store(url: str) -> Store:
  if url not in _STORES:
    _STORES[url] = Store(url)
  return _STORES[url]


def _trainer_progress(root: Store) -> tuple[int, int, int | None] | None:
  """(version, groups consumed, groups per step or None) from trainer.json ((0, 0, None) when it is absent), or
  None when it is damaged (logged): no guess at the trainer's progress is safe (a low version over-admits), so the
  status then admits nothing until the trainer rewrites the file, which it does every step."""
  try:
    trainer = root.read_json("trainer.json") or {}
    version, consumed = int(trainer.get("version", 0)), int(trainer.get("groups_consumed", 0))
    per_step = trainer.get("groups_per_step")
    per_step = None if per_step is None else int(per_step)
  except (ValueError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
    logging.warning("Rollout buffer %s: trainer.json is damaged (%s); admitting nothing until the trainer rewrites "
                    "it.", root, e)
    return None
  if version < 0 or consumed < 0 or (per_step is not None and per_step < 1):
    logging.warning("Rollout buffer %s: trainer.json holds version %d, %d groups consumed, %s per step; admitting "
                    "nothing until the trainer rewrites it.", root, version, consumed, per_step)
    return None
  return version, consumed, per_step


def read_status(url: str, default_groups_per_step: int = 1, pending_lease_s: float | None = None,
                now: float | None = None) -> BufferStatus:
  """Sums the shards' head.json and reads trainer.json (absent: trainer not started, version 0, nothing consumed,
  and `default_groups_per_step`; 1 is the conservative choice, the trainer should publish at start-up).

  With `pending_lease_s`, pending tickets of a head.json older than that (its writer is gone) are not counted.
  """
  root = _store(url)
  now = time.time() if now is None else now
  committed = pending = damaged = 0
  unknown = False
  for sid in shard_ids(root):
    c, p, ok = _shard_counts(url, sid, now, pending_lease_s)
    unknown |= c is None
    committed, pending, damaged = committed + (c or 0), pending + p, damaged + (not ok)
  progress = _trainer_progress(root)
  version, consumed, per_step = (0, 0, None) if progress is None else progress
  return BufferStatus(committed=committed, pending=pending, consumed=consumed, trainer_version=version,
                      groups_per_step=max(1, default_groups_per_step if per_step is None else per_step),
                      trainer_damaged=progress is None, damaged_heads=damaged, counts_unknown=unknown)


# (buffer URL, shard id) -> the last readable head.json this process read: (committed, pending, time).
_LAST_HEADS: dict[tuple[str, str], tuple[int, int, float]] = {}


def _head_counts(head: Any) -> tuple[int, int, float]:
  """(committed, pending, time) of a head.json value; ValueError unless it is an object of counts >= 0."""
  if not isinstance(head, dict):
    raise ValueError(f"it is a JSON {type(head).__name__}, not an object")
  counts = [head.get("committed", 0), head.get("pending", 0)]
  if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
    raise ValueError(f"committed {counts[0]!r} and pending {counts[1]!r} are not counts >= 0")
  t = head.get("time", 0.0)
  if not isinstance(t, (int, float)) or isinstance(t, bool):
    raise ValueError(f"time {t!r} is not a number")
  return counts[0], counts[1], float(t)


def _shard_counts(url: str, sid: str, now: float, pending_lease_s: float | None) -> tuple[int | None, int, bool]:
  """(committed or None: unknown, pending, whether head.json was readable) of one shard (module docstring)."""
  store = _store(join(url, "shards", sid))
  last = _LAST_HEADS.get((url, sid))
  try:
    head = store.read_json("head.json")
    if head is None:
      raise ValueError("it is missing")
    committed, pending, t = _head_counts(head)
  except Exception as e:  # noqa: BLE001  (a bad head or a storage error: read the shard conservatively)
    known, listed, lease_time = _conservative_counts(store, sid, last)
    logging.warning("Rollout buffer %s: head.json of shard %r is unreadable (%s); counting %s committed and %d "
                    "pending groups.", url, sid, e, known, listed)
    alive = pending_lease_s is None or lease_time is None or now - lease_time <= pending_lease_s
    return known, listed if alive else 0, False
  _LAST_HEADS[(url, sid)] = (committed, pending, t)
  alive = pending_lease_s is None or now - t <= pending_lease_s
  return committed, pending if alive else 0, True


def _conservative_counts(store: Store, sid: str,
                         last: tuple[int, int, float] | None) -> tuple[int | None, int, float | None]:
  """(committed or None: unknown, pending, time of the lease or None: alive) of a shard whose head.json cannot be
  read."""
  try:
    committed = committed_by_records(store, sid)
  except Exception:  # noqa: BLE001  (storage error: the last head alone, or unknown)
    committed = None
  if last is not None:
    return max(committed or 0, last[0]), last[1], last[2]
  try:
    pending = len([k for k in store.list("pending/") if k.endswith(".json")])
  except Exception:  # noqa: BLE001
    pending = 0
  return committed, pending, None


def read_progress(url: str) -> tuple[int, int]:
  """(trainer_version, groups consumed) from trainer.json alone: one small read, what a refused actor polls.

  Only the trainer's progress lowers the target of a refused actor (other actors' commits and begins leave
  committed + pending as it is or raise it), so an actor re-runs the full `read_status` when this changes instead
  of reading every shard's head.json on each poll.
  """
  progress = _trainer_progress(_store(url))
  return (-1, -1) if progress is None else progress[:2]  # damaged: differs from any real progress


def target_version(status: BufferStatus) -> int:
  """The weights version that will train on the next group started (see the module docstring)."""
  ahead = max(0, status.committed + status.pending - status.consumed)
  return status.trainer_version + ahead // status.groups_per_step


def admit(status: BufferStatus, weights_version: int, max_lag: int) -> bool:
  """Whether an actor holding `weights_version` may start a group now: target_version - weights_version <= max_lag."""
  if max_lag < 0:
    raise ValueError(f"max_lag must be >= 0 (0 is synchronous RL), got {max_lag}.")
  if status.trainer_damaged or status.counts_unknown:
    return False
  return target_version(status) - weights_version <= max_lag
