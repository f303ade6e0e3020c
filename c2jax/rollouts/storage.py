"""Where rollouts and weights live: one URL scheme for a local directory, S3 and GCS, through tensorstore kvstores.

  store = Store("runs/rl/buffer")                  # a local directory (created on first write)
  store = Store("s3://bucket/run1/buffer")         # S3 (or any S3-compatible server, see below)
  store = Store("gs://bucket/run1/buffer")         # Google Cloud Storage
  store.write_json("trainer.json", {"version": 3})  # one atomic object: readers see the old or the new, never half
  store.read_json("trainer.json")                  # -> {"version": 3}, or None when absent

Every write here replaces one whole object atomically (the file driver writes a temporary file and renames it;
S3 / GCS PUTs are atomic), which is what the commit records and "latest" pointers of the rollout buffer and the
weight store rely on: they are written last, so a reader never sees what they point to half-written.

S3-compatible servers (MinIO, moto, Ceph, R2): set `AWS_ENDPOINT_URL_S3` (or `AWS_ENDPOINT_URL`) to the server's
URL and `AWS_REGION` if it is not us-east-1; credentials come from the usual AWS environment variables or files.
"""

from __future__ import annotations

import builtins
import fcntl
import json
import math
import os
import re
from typing import Any

import numpy as np
import tensorstore as ts

_S3_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

# Bounds on every small JSON object of the buffer (commit records, head.json, trainer.json, tickets, ...), checked
# on the raw bytes before parsing: Python's parser recurses once per nesting level (RecursionError past ~1000) and
# builds tens of bytes of objects per input byte, so an unbounded object read from storage could stop a reader.
# Writers refuse to write what exceeds them (`json_bytes`). A commit record holds ~100 bytes per row.
MAX_JSON_BYTES = 4 << 20
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string literal, escapes included


def json_depth(raw: bytes) -> int:
  """The deepest nesting of arrays and objects in the JSON text `raw` (brackets inside strings do not count); in
  linear time, without parsing."""
  codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
  step = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
  return int(np.cumsum(step).max(initial=0))


def _reject_constant(name: str) -> Any:
  raise ValueError(f"the non-finite number {name} is not JSON")


def _finite_float(text: str) -> float:
  value = float(text)
  if not math.isfinite(value):  # 1e999 parses as inf
    raise ValueError(f"the number {text[:20]} overflows a float")
  return value


def parse_json(raw: bytes, what: str) -> Any:
  """The value of the JSON text `raw`; ValueError naming `what` when it is not JSON, is larger than MAX_JSON_BYTES,
  nests deeper than MAX_JSON_DEPTH or holds a non-finite number (never RecursionError or MemoryError)."""
  if len(raw) > MAX_JSON_BYTES:
    raise ValueError(f"{what} has {len(raw)} bytes, more than the {MAX_JSON_BYTES} a buffer object may hold")
  depth = json_depth(raw)
  if depth > MAX_JSON_DEPTH:
    raise ValueError(f"{what} nests {depth} levels deep, more than the {MAX_JSON_DEPTH} a buffer object may")
  try:
    return json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
  except (RecursionError, MemoryError) as e:  # the bounds above should make these unreachable
    raise ValueError(f"{what} cannot be parsed ({type(e).__name__})") from None
  except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    raise ValueError(f"{what} is not JSON ({e})") from e


def json_bytes(value: Any, what: str) -> bytes:
  """`value` as the canonical JSON text of the buffer's objects (sorted keys, no NaN / Infinity); ValueError naming
  `what` when it is not JSON-able or exceeds the bounds `parse_json` enforces (so readers accept what writers
  write)."""
  try:
    raw = json.dumps(value, sort_keys=True, allow_nan=False).encode()
  except (TypeError, ValueError, RecursionError) as e:
    raise ValueError(f"The {what} must be JSON-able (str/int/float/bool/list/dict, finite numbers): {e}.") from e
  if len(raw) > MAX_JSON_BYTES or json_depth(raw) > MAX_JSON_DEPTH:
    raise ValueError(f"The {what} is {len(raw)} bytes nested {json_depth(raw)} deep; buffer objects hold at most "
                     f"{MAX_JSON_BYTES} bytes nested {MAX_JSON_DEPTH} deep (commit fewer groups per call, or "
                     f"flatten the meta).")
  return raw


def kvstore_spec(url: str) -> dict:
  """The tensorstore kvstore spec (JSON) of a directory URL, its path ending in '/'.

  Plain paths (relative or absolute) are local directories; `file://`, `s3://`, `gs://` and `memory://` URLs are
  parsed by tensorstore.
  """
  if not url:
    raise ValueError("Empty storage URL: give a local directory or an s3:// / gs:// URL.")
  if "://" not in url:
    return {"driver": "file", "path": os.path.abspath(url).rstrip("/") + "/"}
  try:
    spec = ts.KvStore.Spec(url).to_json()
  except ValueError as e:
    raise ValueError(f"Unsupported storage URL {url!r} (use a path, file://, s3://, gs:// or memory://): {e}") from e
  if spec.get("path") and not spec["path"].endswith("/"):
    spec["path"] += "/"
  if spec["driver"] == "s3":
    endpoint = next((os.environ[v] for v in _S3_ENDPOINT_VARS if os.environ.get(v)), None)
    if endpoint:
      spec["endpoint"] = endpoint
      spec["aws_region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
  return spec


def join(url: str, *parts: str) -> str:
  """`url/part/part` with exactly one '/' between pieces."""
  return "/".join([url.rstrip("/")] + [p.strip("/") for p in parts if p])


class Store:
  """Whole-object reads and writes of small records under one directory URL (see the module docstring)."""

  def __init__(self, url: str):
    self.url = url
    self.spec = kvstore_spec(url)
    self._kv = ts.KvStore.open(self.spec).result()

  def __repr__(self) -> str:
    return f"Store({self.url!r})"

  def child_spec(self, key: str) -> dict:
    """The kvstore spec of the sub-directory `key` (for opening arrays there with `tensorstore.open`)."""
    spec = dict(self.spec)
    spec["path"] = spec.get("path", "") + key.strip("/") + "/"
    return spec

  def read(self, key: str) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    result = self._kv.read(key).result()
    return bytes(result.value) if result.state == "value" else None

  def exist(self, keys: builtins.list[str]) -> builtins.list[bool]:
    """Whether each object exists (read concurrently: one request each, in flight together)."""
    futures = [self._kv.read(k) for k in keys]
    return [f.result().state == "value" for f in futures]

  def write(self, key: str, data: bytes) -> None:
    """Replaces the object `key` atomically."""
    self._kv.write(key, data).result()

  def read_json(self, key: str) -> Any | None:
    """The object's JSON value, or None when it does not exist; ValueError when it is not bounded JSON
    (`parse_json`)."""
    data = self.read(key)
    return None if data is None else parse_json(data, f"{self.url}/{key}")

  def write_json(self, key: str, value: Any) -> None:
    self.write(key, json_bytes(value, key))

  def list(self, prefix: str = "") -> list[str]:
    """Keys under `prefix` (relative to this store), sorted."""
    if prefix:
      keys = self._kv.list(ts.KvStore.KeyRange(prefix, _prefix_end(prefix))).result()
    else:
      keys = self._kv.list().result()
    return sorted(k.decode() for k in keys)

  # builtins.list: inside this class `list` is the method above.
  def list_range(self, start: str, end: str) -> builtins.list[str]:
    """Keys k with start <= k < end (relative to this store), sorted."""
    return sorted(k.decode() for k in self._kv.list(ts.KvStore.KeyRange(start, end)).result())

  def delete(self, key: str) -> None:
    self._kv.delete_range(ts.KvStore.KeyRange(key, key + "\0")).result()

  def delete_prefix(self, prefix: str) -> None:
    """Deletes every object whose key starts with `prefix` (a whole sub-directory when it ends in '/')."""
    if not prefix:
      raise ValueError("Refusing to delete a whole store; give a non-empty prefix.")
    self._kv.delete_range(ts.KvStore.KeyRange(prefix, _prefix_end(prefix))).result()

  def size(self, prefix: str = "") -> int:
    """Total bytes of the objects under `prefix` (reads them: meant for reports and benchmarks, not hot paths)."""
    return sum(len(self.read(k) or b"") for k in self.list(prefix))


def _prefix_end(prefix: str) -> str:
  """The exclusive end of the key range of all keys starting with `prefix`."""
  last = prefix[-1]
  return prefix[:-1] + chr(ord(last) + 1)


# tensorstore's file kvstore writes an object into `<key>.__lock` (under an open-file-description lock on it), then
# renames that file over the key. A process killed between the two leaves the file behind, and tensorstore 0.1.86
# reuses it for the next write of the key without truncating it: a shorter new value keeps the old one's tail, and
# the object renamed into place is garbage (a commit record that does not parse, a zarr shard whose index at its end
# is not its own, a manifest that does not parse). A writer that takes over keys a killed process was writing
# removes such leftovers first.
TS_LOCK_SUFFIX = ".__lock"


def remove_unfinished_write(path: str) -> bool:
  """Removes what a killed process's unfinished tensorstore write of the local file `path` left (its
  `path + TS_LOCK_SUFFIX`), unless a write in flight holds it; True if it removed one.

  Safe beside live writers of the key: it follows tensorstore's own rule (only the holder of the lock, while the
  file still has its canonical path, may remove it). A POSIX record lock (lockf) conflicts with the
  open-file-description lock tensorstore takes, in this process too, so a write in flight keeps its file.
  """
  lock_path = path if path.endswith(TS_LOCK_SUFFIX) else path + TS_LOCK_SUFFIX
  try:
    fd = os.open(lock_path, os.O_RDWR)
  except FileNotFoundError:
    return False
  try:
    try:
      fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return False  # a write in flight holds it
    try:
      same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
    except FileNotFoundError:
      return False  # renamed or removed by its holder meanwhile
    if same:
      os.unlink(lock_path)
    return same
  finally:
    os.close(fd)  # also releases the record lock


def remove_unfinished_writes(directory: str) -> list[str]:
  """`remove_unfinished_write` for every leftover under the local `directory`; returns the removed files' paths
  relative to it."""
  removed = []
  for parent, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(parent, name)
      if name.endswith(TS_LOCK_SUFFIX) and remove_unfinished_write(path):
        removed.append(os.path.relpath(path, directory))
  return sorted(removed)
