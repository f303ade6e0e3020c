"""Versioned, delta-compressed weights in object storage: the trainer publishes, actors load the newest.

Composer 2 updates the actors' weights in flight (report section 4, as in PipelineRL: actors keep generating and
pick up new weights between decode chunks) and synchronizes them through object storage with delta compression
(report section 6). Here:

  store = WeightStore("s3://bucket/run1/weights", full_every=8, keep=2)
  stats = store.publish(step, params)           # trainer, after each update step; params: nested dicts of arrays
  version, params = store.load()                 # an actor starting up: the newest version, checksums verified
  got = store.update(version, params)            # an actor between decode chunks: None, or (newer version, params)

Layout under the URL (any of storage.py's: a local directory, s3://, gs://, memory://):

  versions/<version:012d>/arrays/<i:05d>/      one zarr3 array per tensor (i: its index in manifest "tensors")
  versions/<version:012d>/manifest.json        kind, base version, tree, shapes, dtypes, checksums; written after
                                               every array object
  LATEST                                       {"version": v}, written last

A version is published exactly when its manifest exists, and LATEST only ever names published versions, so a
publisher killed mid-write leaves debris no reader looks at (the next publish of that version number deletes it).

Encoding. Every tensor is stored as its bit pattern (the unsigned integer view of its dtype, so float32,
bfloat16 and ints are all exact), flattened to an [n, itemsize] uint8 array whose zarr3 codecs transpose it to
byte planes (all low bytes, then the next byte, ...) before zstd and a crc32c chunk checksum. A delta version
stores XOR(new bits, previous version's bits): a small update leaves the sign, exponent and high mantissa bits
alone, so the high byte planes are nearly all zeros and compress away; byte planes compress deltas ~15% better
than plain zstd (a float32 AdamW step: 0.58 vs 0.69 of the raw bytes). A full snapshot is written every
`full_every` versions, so a new actor replays at most full_every - 1 deltas.

Checksums: the manifest holds, per tensor, zlib.crc32 of the reconstructed tensor's little-endian bytes. The
crc32c codec already catches a damaged chunk; the tensor checksum also catches what decodes cleanly but is wrong:
a delta applied on top of weights that are not really the version the actor claims, a chunk replaced by another.
Missing chunks are errors (not zarr's fill value), and every failure is a WeightStoreError, never wrong weights.

One publisher per URL. Readers need no coordination: everything they read is immutable once LATEST names it,
except that garbage collection (keep the newest `keep` full snapshots and their deltas) may delete an old version
under a slow reader; `update` then falls back to a full load of the newest.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import time
import zlib
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import tensorstore as ts

from c2jax.rollouts import storage

_FORMAT = 1
_LATEST = "LATEST"
_VERSIONS = "versions/"
_CHUNK_BYTES = 8 << 20  # raw bytes per zarr chunk: big enough for zstd, small enough to parallelize a tensor
_BATCH_BYTES = 256 << 20  # raw bytes encoded before their objects are uploaded (bounds the publisher's memory)
_CHECKSUM = "zlib.crc32 of the tensor's little-endian bytes"


class WeightStoreError(RuntimeError):
  """A version that cannot be loaded (missing, interrupted, garbage-collected, failing its checksums), a damaged
  LATEST or manifest, or a failed storage read: every read error of the store, in one sentence."""


class Kind(str, enum.Enum):
  """How a version is stored: its whole bit patterns, or XOR against the version it names as its base."""
  FULL = "full"
  DELTA = "delta"


@dataclasses.dataclass(frozen=True)
class PublishStats:
  """What one publish wrote.

  Attributes:
    version: the published version.
    kind: "full" or "delta" (Kind's values).
    stored_bytes: bytes of every object under versions/<version>/ (arrays, their metadata, the manifest).
    full_bytes: raw bytes of the params (sum of the tensors' nbytes).
    seconds: wall time of the publish, garbage collection included.
  """
  version: int
  kind: str
  stored_bytes: int
  full_bytes: int
  seconds: float


def xor_delta(new: np.ndarray, old: np.ndarray) -> np.ndarray:
  """XOR of the bit patterns of two arrays of one dtype and shape: an unsigned array of the same itemsize.

  Exact for every dtype (NaN payloads, -0.0 and subnormals included), unlike a float difference.
  """
  new, old = np.asarray(new), np.asarray(old)
  if new.dtype != old.dtype or new.shape != old.shape:
    raise ValueError(f"xor_delta needs one dtype and shape; got {new.dtype}{list(new.shape)} and "
                     f"{old.dtype}{list(old.shape)}.")
  return np.bitwise_xor(_bits(new), _bits(old))


def apply_delta(old: np.ndarray, delta: np.ndarray) -> np.ndarray:
  """The array whose bit patterns are old's XOR delta (the inverse of xor_delta): a new array of old's dtype."""
  old = np.asarray(old)
  bits = _bits(old)
  delta = np.asarray(delta)
  if delta.dtype != bits.dtype or delta.shape != bits.shape:
    raise ValueError(f"Delta {delta.dtype}{list(delta.shape)} does not fit an array {old.dtype}{list(old.shape)} "
                     f"(want {bits.dtype}{list(bits.shape)}).")
  return np.bitwise_xor(bits, delta).view(old.dtype)


@dataclasses.dataclass(frozen=True)
class _Flat:
  """A params tree taken apart: `tree` is its nested-dict skeleton (JSON) with leaf indices in place of arrays."""
  tree: dict
  names: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[np.dtype, ...]
  bits: tuple[np.ndarray, ...]  # unsigned views of the tensors, native byte order

  def signature(self) -> tuple:
    return (json.dumps(self.tree, sort_keys=True), self.shapes, tuple(d.name for d in self.dtypes))


@dataclasses.dataclass(frozen=True)
class _Manifest:
  version: int
  kind: Kind
  base: int | None
  tree: dict
  names: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[np.dtype, ...]
  checksums: tuple[int, ...]

  def signature(self) -> tuple:
    return (json.dumps(self.tree, sort_keys=True), self.shapes, tuple(d.name for d in self.dtypes))


@dataclasses.dataclass(frozen=True)
class WeightStoreConfig:
  """How a publisher stores versions (a run config's `weight_store` section).

  Attributes:
    full_every: a version is a full snapshot when it is at least this far past the last full one (or when the
      delta would have no base: a new publisher, a changed tree, shapes or dtypes); 1 makes every version full.
    keep: full snapshots kept, each with the deltas that follow it; older versions are deleted after a publish.
    zstd_level: zstd level of the array chunks.
  """

  full_every: int = 8
  keep: int = 2
  zstd_level: int = 3


_DEFAULTS = WeightStoreConfig()


class WeightStore:
  """Publishes and loads versioned params under one storage URL (see the module docstring).

  Args:
    url: a local directory or an s3:// / gs:// / memory:// URL (storage.py).
    full_every, keep, zstd_level: see `WeightStoreConfig` (its defaults are these).
  """

  def __init__(self, url: str, *, full_every: int = _DEFAULTS.full_every, keep: int = _DEFAULTS.keep,
               zstd_level: int = _DEFAULTS.zstd_level):
    if full_every < 1 or keep < 1:
      raise ValueError(f"full_every and keep must be >= 1; got full_every={full_every}, keep={keep}.")
    self.url = url
    self.full_every = full_every
    self.keep = keep
    self.zstd_level = zstd_level
    self._spec = storage.kvstore_spec(url)
    # One context for every object of the store (a memory:// URL is then one store within this object), and a
    # separate one for the in-memory kvstore that publishes encode into.
    self._context = ts.Context()
    self._kv = ts.KvStore.open(self._spec, context=self._context).result()
    self._scratch = ts.Context()
    self._mem = ts.KvStore.open({"driver": "memory"}, context=self._scratch).result()
    self._prev: tuple[int, _Flat] | None = None  # the last version this publisher wrote, kept for its delta
    self._last_full: int | None = None
    # of published versions (a published manifest never changes); None: a damaged or unreadable manifest
    self._kinds: dict[int, str | None] = {}

  def __repr__(self) -> str:
    return f"WeightStore({self.url!r}, full_every={self.full_every}, keep={self.keep})"

  # -- publishing --------------------------------------------------------------------------------------------

  def publish(self, version: int, params: Mapping[str, Any]) -> PublishStats:
    """Writes `params` as `version`: arrays, then the manifest, then LATEST; then deletes old versions.

    Args:
      version: a non-negative int greater than the latest published version.
      params: nested dicts (string keys) of arrays (numpy, jax, or scalars); any dtype of itemsize 1, 2, 4, 8.

    Returns:
      PublishStats of this version.

    Raises:
      ValueError: the version is not greater than the latest one.
      TypeError: params are not nested dicts of arrays.
    """
    start = time.perf_counter()
    version = int(version)
    latest = self.latest()
    if version < 0:
      raise ValueError(f"Cannot publish version {version}: versions are non-negative ints.")
    if latest is not None and version <= latest:
      raise ValueError(f"Cannot publish version {version}: versions must increase and the latest is {latest}; "
                       f"publish a version > {latest}.")
    flat = _flatten(params, copy=True)
    kind, base = Kind.FULL, None
    if (self._prev is not None and self._prev[0] == latest and self._last_full is not None
        and version - self._last_full < self.full_every and self._prev[1].signature() == flat.signature()
        and self._get(_manifest_key(latest)) is not None):
      kind, base = Kind.DELTA, latest
    stored = [self._put_arrays(version, flat, self._prev[1] if kind == Kind.DELTA else None)]
    manifest = {
        "format": _FORMAT, "version": version, "kind": kind.value, "base": base, "checksum": _CHECKSUM,
        "tree": flat.tree,
        "tensors": [{"name": n, "shape": list(s), "dtype": d.name, "crc32": _crc32(b)}
                    for n, s, d, b in zip(flat.names, flat.shapes, flat.dtypes, flat.bits)],
    }
    data = json.dumps(manifest, sort_keys=True).encode()
    stored.append(len(data))
    self._put(_manifest_key(version), data).result()
    # The commit point: only now can a reader find this version.
    self._put(_LATEST, json.dumps({"version": version}).encode()).result()
    self._prev = (version, flat)
    self._kinds[version] = kind.value
    if kind == Kind.FULL:
      self._last_full = version
    self._collect_garbage(version)
    return PublishStats(version=version, kind=kind.value, stored_bytes=sum(stored),
                        full_bytes=sum(b.nbytes for b in flat.bits), seconds=time.perf_counter() - start)

  def _put_arrays(self, version: int, flat: _Flat, prev: _Flat | None) -> int:
    """Encodes the tensors (or their XOR against `prev`) in memory and uploads the objects; returns their bytes.

    Encoding into a memory kvstore first gives the exact stored size on any backend, and uploads each object as
    one atomic write.
    """
    vdir = _version_dir(version)
    self._delete_prefix(vdir)  # debris of a publisher killed while writing this version number
    self._mem.delete_range(_key_range(vdir)).result()  # of a publish that raised
    total = 0
    pending: list[ts.Future] = []
    batch: list[int] = []
    batch_bytes = 0

    def flush():
      nonlocal total, pending
      opened = [ts.open(self._array_spec({"driver": "memory", "path": f"{vdir}arrays/{i:05d}/"}, flat.bits[i]),
                        create=True, context=self._scratch) for i in batch]
      writes = []
      for i, f in zip(batch, opened):
        bits = flat.bits[i] if prev is None else np.bitwise_xor(flat.bits[i], prev.bits[i])
        writes.append(f.result().write(_as_planes(bits)))
      for w in writes:
        w.result()
      for p in pending:  # one batch uploading while the next encodes
        p.result()
      pending = []
      keys = self._mem.list(_key_range(vdir)).result()
      for key in keys:
        value = self._mem.read(key).result().value
        total += len(value)
        pending.append(self._put(key.decode(), value))
      self._mem.delete_range(_key_range(vdir)).result()

    for i, bits in enumerate(flat.bits):
      batch.append(i)
      batch_bytes += bits.nbytes
      if batch_bytes >= _BATCH_BYTES:
        flush()
        batch, batch_bytes = [], 0
    if batch:
      flush()
    for p in pending:
      p.result()
    return total

  def _array_spec(self, kvstore: dict, bits: np.ndarray) -> dict:
    n, k = bits.size, bits.dtype.itemsize
    chunk = max(1, min(n, _CHUNK_BYTES // k))
    return {
        # Every chunk is written, zeros too (an unchanged tensor's delta), so that a missing chunk is an error.
        "driver": "zarr3", "kvstore": kvstore, "store_data_equal_to_fill_value": True,
        "metadata": {
            "shape": [n, k], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk, k]}},
            # [n, itemsize] stored transposed: byte planes, where the zeros of a delta line up for zstd.
            "codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes"},
                       {"name": "zstd", "configuration": {"level": self.zstd_level}}, {"name": "crc32c"}],
        },
    }

  def _collect_garbage(self, version: int) -> None:
    """Keeps the newest `keep` full snapshots and every version after the oldest of them; deletes older versions
    and the debris of interrupted publishes below `version` (the version LATEST now names)."""
    present, published = set(), set()
    for key in self._kv.list(_key_range(_VERSIONS)).result():
      name, _, rest = key.decode()[len(_VERSIONS):].partition("/")
      if name.isdigit():
        present.add(int(name))
        if rest == "manifest.json":
          published.add(int(name))
    versions = sorted(present)
    fulls = []
    for v in versions:
      if v in published and v <= version:
        if v not in self._kinds:
          data = self._get(_manifest_key(v))
          try:
            self._kinds[v] = json.loads(data)["kind"] if data is not None else None
          except (ValueError, KeyError, TypeError):  # a damaged manifest: not a full snapshot to keep
            self._kinds[v] = None
        if self._kinds[v] == Kind.FULL.value:
          fulls.append(v)
    cutoff = fulls[-self.keep] if len(fulls) >= self.keep else (fulls[0] if fulls else version)
    for v in versions:
      if v < version and (v < cutoff or v not in published):
        # The manifest first: a version is then unpublished before any of its arrays go.
        self._delete_prefix(_manifest_key(v))
        self._delete_prefix(_version_dir(v))
        self._kinds.pop(v, None)

  # -- loading -----------------------------------------------------------------------------------------------

  def latest(self) -> int | None:
    """The version LATEST names (one small read), or None when nothing is published.

    Raises:
      WeightStoreError: LATEST is unreadable (not {"version": int >= 0}) or storage fails.
    """
    data = self._get(_LATEST)
    if data is None:
      return None
    try:
      version = json.loads(data)["version"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
      raise WeightStoreError(f"{_LATEST} at {self.url!r} is damaged ({type(e).__name__}: {e}); republish, or "
                             f"point the run at a healthy weight store.") from e
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
      raise WeightStoreError(f"{_LATEST} at {self.url!r} names version {version!r}, not an int >= 0; republish, or "
                             f"point the run at a healthy weight store.")
    return version

  def load(self, version: int | None = None) -> tuple[int, dict]:
    """A published version's params, checksums verified.

    Args:
      version: the version to load; None for the latest.

    Returns:
      (version, params): params as nested dicts of numpy arrays with the published shapes and dtypes.

    Raises:
      WeightStoreError: nothing is published, the version is missing (never published, interrupted,
        garbage-collected), or an array or checksum fails.
    """
    if version is not None:
      return int(version), self._reconstruct(int(version))
    for attempt in range(3):
      latest = self.latest()
      if latest is None:
        raise WeightStoreError(f"No weights published at {self.url!r} yet (no {_LATEST}).")
      try:
        return latest, self._reconstruct(latest)
      except WeightStoreError:
        # A newer LATEST means garbage collection may have deleted what we were reading: try the newest.
        if attempt == 2 or self.latest() == latest:
          raise
    raise AssertionError("unreachable")

  def update(self, have_version: int | None, have_params: Mapping[str, Any] | None) -> tuple[int, dict] | None:
    """What an actor calls between decode chunks: the newest version when it is newer than `have_version`.

    Applies only the deltas from `have_version` on top of `have_params` when the store's chain reaches back to
    it; otherwise (no params held, or `have_version` is too old or garbage-collected) loads the newest in full.
    The result's checksums are verified either way; `have_params` is not modified.

    Args:
      have_version: the version the actor holds, or None.
      have_params: its params (nested dicts of numpy or jax arrays), or None.

    Returns:
      None when nothing newer than `have_version` is published (after one small read), else (version, params).

    Raises:
      WeightStoreError: the newest version cannot be loaded.
    """
    latest = self.latest()
    if latest is None or (have_version is not None and latest <= have_version):
      return None
    if have_version is not None and have_params is not None:
      try:
        return latest, self._reconstruct(latest, have_version, _flatten(have_params, copy=False))
      except (WeightStoreError, TypeError):
        pass  # a broken chain or params that are not what have_version says: a full load decides
    return self.load()

  def _reconstruct(self, version: int, have_version: int | None = None, have: _Flat | None = None) -> dict:
    """The params of `version`: a full snapshot (or `have`, when the chain reaches `have_version`) plus deltas."""
    chain: list[_Manifest] = []
    v = version
    while True:
      if have is not None and v == have_version:
        break
      m = self._manifest(v)
      chain.append(m)
      if m.kind == Kind.FULL:
        have = None
        break
      if m.base is None or not 0 <= m.base < v:
        raise WeightStoreError(f"The manifest of version {v} at {self.url!r} names an invalid base {m.base}.")
      v = m.base
    first = chain[-1]
    if have is not None:
      if have.signature() != first.signature():
        raise WeightStoreError(f"The params held as version {have_version} do not have its tree, shapes or dtypes.")
      bits, owned = list(have.bits), False  # the caller's arrays: the first delta writes new ones
      steps = chain[::-1]
    else:
      bits, owned = self._read_tensors(first), True
      steps = chain[-2::-1]
    for m in steps:
      deltas = self._read_tensors(m)
      if owned:
        for acc, delta in zip(bits, deltas):
          np.bitwise_xor(acc, delta, out=acc)
      else:
        bits, owned = [np.bitwise_xor(b, d) for b, d in zip(bits, deltas)], True
    target = chain[0]
    for name, b, want in zip(target.names, bits, target.checksums):
      if _crc32(b) != want:
        raise WeightStoreError(f"Checksum mismatch in tensor {name!r} of version {version} at {self.url!r}: its "
                               "arrays are corrupt (or the params it was applied to are not its base version).")
    leaves = [b.view(d).reshape(s) for b, d, s in zip(bits, target.dtypes, target.shapes)]
    return _unflatten(target.tree, leaves)

  def _manifest(self, version: int) -> _Manifest:
    data = self._get(_manifest_key(version))
    if data is None:
      raise WeightStoreError(f"Version {version} is not published at {self.url!r} (never published, interrupted "
                             f"mid-publish, or garbage-collected; the latest is {self.latest()}).")
    try:
      m = json.loads(data)
      if m["version"] != version:
        raise ValueError(f"it is the manifest of version {m['version']}")
      return _Manifest(version=int(m["version"]), kind=Kind(m["kind"]), base=m["base"], tree=m["tree"],
                       names=tuple(t["name"] for t in m["tensors"]),
                       shapes=tuple(tuple(t["shape"]) for t in m["tensors"]),
                       dtypes=tuple(_dtype(t["dtype"]) for t in m["tensors"]),
                       checksums=tuple(int(t["crc32"]) for t in m["tensors"]))
    except (ValueError, KeyError, TypeError) as e:
      raise WeightStoreError(f"The manifest of version {version} at {self.url!r} is unreadable: {e!r}.") from e

  def _read_tensors(self, m: _Manifest) -> list[np.ndarray]:
    """The stored bit arrays of one version (its full bits, or its XOR delta), native byte order, flat."""
    vdir = _version_dir(m.version)
    try:
      opened = [ts.open({"driver": "zarr3", "kvstore": self._child_spec(f"{vdir}arrays/{i:05d}/"),
                         "fill_missing_data_reads": False}, open=True, read=True, context=self._context)
                for i in range(len(m.names))]
      reads = [f.result().read() for f in opened]
      out = []
      for r, d, s in zip(reads, m.dtypes, m.shapes):
        planes = r.result()
        k = d.itemsize
        if planes.shape != (int(np.prod(s)), k):
          raise ValueError(f"stored shape {planes.shape} is not [{int(np.prod(s))}, {k}]")
        out.append(np.ascontiguousarray(planes).reshape(-1).view(f"<u{k}").astype(f"=u{k}", copy=False))
      return out
    except ValueError as e:  # tensorstore's errors: a missing array or chunk, a failed chunk checksum
      raise WeightStoreError(f"Version {m.version} at {self.url!r} has a missing or corrupt array: {e}") from e

  def _child_spec(self, directory: str) -> dict:
    return {**self._spec, "path": self._spec.get("path", "") + directory}

  def _delete_prefix(self, prefix: str) -> None:
    self._kv.delete_range(_key_range(prefix)).result()
    if self._spec["driver"] == "file" and prefix.endswith("/"):
      # The file driver deletes files but leaves their directories: a long run would pile up empty ones.
      top = os.path.join(self._spec["path"], prefix)
      for directory, _, _ in sorted(os.walk(top), reverse=True):  # children sort after their parents
        try:
          os.rmdir(directory)
        except OSError:  # not empty (written meanwhile) or already gone
          pass

  # Every object read and write goes through these two (the tests instrument them).

  def _get(self, key: str) -> bytes | None:
    try:
      result = self._kv.read(key).result()
    except ValueError as e:  # tensorstore's storage errors (permissions, a directory where a file should be, ...)
      raise WeightStoreError(f"Reading {key} at {self.url!r} failed: {e}") from e
    return bytes(result.value) if result.state == "value" else None

  def _put(self, key: str, data: bytes) -> ts.Future:
    return self._kv.write(key, data)


def _version_dir(version: int) -> str:
  return f"{_VERSIONS}{version:012d}/"


def _manifest_key(version: int) -> str:
  return f"{_version_dir(version)}manifest.json"


def _key_range(prefix: str) -> ts.KvStore.KeyRange:
  """All keys that start with `prefix`."""
  return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


def _bits(x: np.ndarray) -> np.ndarray:
  """The unsigned-integer view of an array's bit patterns (contiguous, native byte order)."""
  x = np.ascontiguousarray(x)
  dt = x.dtype
  if dt.kind in "OSU" or (dt.kind == "V" and not _is_ml_dtype(dt)):
    raise TypeError(f"Cannot store dtype {dt}: params must be numeric arrays.")
  if dt.itemsize not in (1, 2, 4, 8):
    raise TypeError(f"Cannot store dtype {dt}: itemsize {dt.itemsize} has no unsigned view (1, 2, 4 or 8 bytes).")
  return x.view(f"u{dt.itemsize}")


def _is_ml_dtype(dtype: np.dtype) -> bool:
  return isinstance(getattr(ml_dtypes, dtype.name, None), type)


def _dtype(name: str) -> np.dtype:
  ml = getattr(ml_dtypes, name, None)
  return np.dtype(ml) if isinstance(ml, type) else np.dtype(name)


def _crc32(bits: np.ndarray) -> int:
  return zlib.crc32(np.ascontiguousarray(bits.astype(bits.dtype.newbyteorder("<"), copy=False)))


def _as_planes(bits: np.ndarray) -> np.ndarray:
  """[n, itemsize] uint8 view of little-endian bit patterns (the stored array; its codec transposes it)."""
  le = np.ascontiguousarray(bits.astype(bits.dtype.newbyteorder("<"), copy=False)).reshape(-1)
  return le.view(np.uint8).reshape(le.size, bits.dtype.itemsize)


def _flatten(params: Mapping[str, Any], copy: bool) -> _Flat:
  """Takes nested dicts apart in sorted-key order (jax's order for dicts); leaf names join keys with '/'.

  `copy`: copy the bits (a publisher keeps them, and the caller may change or donate its arrays afterwards).
  """
  names, shapes, dtypes, bits = [], [], [], []

  def walk(node, path):
    if isinstance(node, Mapping):
      out = {}
      for key in sorted(node):
        if not isinstance(key, str):
          raise TypeError(f"Params keys must be strings; got {key!r} under {'/'.join(path) or 'the root'!r}.")
        out[key] = walk(node[key], path + (key,))
      return out
    if isinstance(node, (list, tuple)) or node is None or not (
        isinstance(node, (np.ndarray, np.generic, int, float, bool)) or hasattr(node, "__array__")):
      raise TypeError(f"Params must be nested dicts of arrays; got {type(node).__name__} at {'/'.join(path)!r}.")
    x = np.asarray(node)
    index = len(names)
    b = _bits(x)
    names.append("/".join(path))
    shapes.append(tuple(int(d) for d in x.shape))
    dtypes.append(x.dtype)
    bits.append(b.reshape(-1).copy() if copy else b.reshape(-1))
    return index

  if not isinstance(params, Mapping):
    raise TypeError(f"Params must be nested dicts of arrays; got {type(params).__name__}.")
  tree = walk(params, ())
  return _Flat(tree=tree, names=tuple(names), shapes=tuple(shapes), dtypes=tuple(dtypes), bits=tuple(bits))


def _unflatten(tree: dict, leaves: list[np.ndarray]) -> dict:
  return {k: (_unflatten(v, leaves) if isinstance(v, dict) else leaves[v]) for k, v in tree.items()}
