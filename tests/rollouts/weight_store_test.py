"""The weight store: versions load bit exact, actors catch up through deltas, deltas are smaller than fulls, old
versions are collected, corruption is an error, and a publisher killed mid-publish leaves nothing visible."""

import logging as py_logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest, parameterized
import ml_dtypes
import numpy as np
import tensorstore as ts

from c2jax.rollouts import storage
from c2jax.rollouts import weight_store
from c2jax.rollouts.weight_store import WeightStore, WeightStoreError

_PUBLISHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weight_store_publisher.py")
_DTYPES = (("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16))


def _params(rng, dtype=np.float32, scale=1.0):
  return {
      "embed": (scale * rng.standard_normal((64, 32))).astype(dtype),
      "layer0": {"w": (scale * rng.standard_normal((32, 48))).astype(dtype), "b": np.zeros(48, dtype)},
      "layer1": {"w": (scale * rng.standard_normal((48, 32))).astype(dtype)},
  }


def _adamw_step(params, rng, lr=1e-3, weight_decay=0.1):
  """One AdamW step (the first: bias-corrected m / sqrt(v) = g / |g|) on random gradients, in float32."""
  def step(p):
    if isinstance(p, dict):
      return {k: step(v) for k, v in p.items()}
    w = p.astype(np.float32)
    g = rng.standard_normal(p.shape).astype(np.float32)
    return (w - lr * (g / (np.abs(g) + 1e-8) + weight_decay * w)).astype(p.dtype)
  return step(params)


def _leaves(tree, prefix=""):
  for k, v in sorted(tree.items()):
    if isinstance(v, dict):
      yield from _leaves(v, prefix + k + "/")
    else:
      yield prefix + k, v


def _tree(leaves):
  out = {}
  for name, v in leaves.items():
    *dirs, leaf = name.split("/")
    node = out
    for d in dirs:
      node = node.setdefault(d, {})
    node[leaf] = v
  return out


def _assert_bit_exact(got, want):
  got, want = dict(_leaves(got)), dict(_leaves(want))
  assert got.keys() == want.keys(), (sorted(got), sorted(want))
  for name, w in want.items():
    w = np.asarray(w)
    g = got[name]
    assert isinstance(g, np.ndarray), (name, type(g))
    assert (g.dtype, g.shape) == (w.dtype, w.shape), (name, g.dtype, g.shape, w.dtype, w.shape)
    u = f"u{w.dtype.itemsize}"
    np.testing.assert_array_equal(g.view(u), w.view(u), err_msg=name)


def _tempdir(test):
  """A fresh directory removed after the test (absltest's create_tempdir needs parsed flags, which pytest skips)."""
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _versions(url):
  return sorted({int(e) for e in os.listdir(os.path.join(url, "versions"))})


class WeightStoreTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.url = _tempdir(self)
    self.rng = np.random.default_rng(0)

  def _publish_sequence(self, store, versions, dtype=np.float32):
    params, history, kinds = _params(self.rng, dtype), {}, {}
    for v in versions:
      params = _adamw_step(params, self.rng)
      kinds[v] = store.publish(v, params).kind
      history[v] = params
    return history, kinds

  @parameterized.named_parameters(*_DTYPES)
  def test_every_version_loads_and_updates_bit_exact(self, dtype):
    store = WeightStore(self.url, full_every=4, keep=10)
    history, kinds = self._publish_sequence(store, range(1, 7), dtype)
    self.assertEqual(list(kinds.values()), ["full", "delta", "delta", "delta", "full", "delta"])
    reader = WeightStore(self.url)
    self.assertEqual(reader.latest(), 6)
    for v, want in history.items():
      got_v, got = reader.load(v)
      self.assertEqual(got_v, v)
      _assert_bit_exact(got, want)
    _assert_bit_exact(reader.load()[1], history[6])
    for have in [None, 1, 2, 3, 4, 5]:
      got_v, got = reader.update(have, None if have is None else history[have])
      self.assertEqual(got_v, 6)
      _assert_bit_exact(got, history[6])
    self.assertIsNone(reader.update(6, history[6]))

  def test_a_publish_is_not_corrupted_by_writes_a_killed_publisher_left_unfinished(self):
    # A publisher killed mid-publish of version 2 leaves tensorstore's unfinished writes (`<key>.__lock`, longer
    # than what the resumed publisher writes there, which tensorstore would reuse untruncated:
    # `storage.remove_unfinished_write`); the resumed one clears the version's debris first, so 2 loads.
    first = WeightStore(self.url, full_every=4, keep=10)
    history, _ = self._publish_sequence(first, [1])
    manifest = os.path.join(self.url, weight_store._manifest_key(2))
    os.makedirs(os.path.dirname(manifest), exist_ok=True)
    with open(manifest + storage.TS_LOCK_SUFFIX, "wb") as f:
      f.write(b"x" * 1_000_000)  # the tail a reused, untruncated lock file would keep
    resumed = WeightStore(self.url, full_every=4, keep=10)
    params = _adamw_step(history[1], self.rng)
    resumed.publish(2, params)
    _assert_bit_exact(WeightStore(self.url).load(2)[1], params)
    self.assertFalse(os.path.exists(manifest + storage.TS_LOCK_SUFFIX))

  def test_update_reads_only_the_deltas(self):
    store = WeightStore(self.url, full_every=4, keep=10)
    history, _ = self._publish_sequence(store, range(1, 7))  # fulls 1 and 5
    reader = WeightStore(self.url)
    read = []
    orig = reader._read_tensors
    with mock.patch.object(reader, "_read_tensors", side_effect=lambda m: read.append(m.version) or orig(m)):
      _assert_bit_exact(reader.update(5, history[5])[1], history[6])
      self.assertEqual(read, [6])
      read.clear()
      _assert_bit_exact(reader.update(2, history[2])[1], history[6])  # the chain from 2 ends at the full 5
      self.assertEqual(read, [5, 6])
    # The caller's arrays are not changed by applying deltas to them.
    before = {k: v.copy() for k, v in _leaves(history[5])}
    got = reader.update(5, history[5])[1]
    self.assertFalse(np.shares_memory(got["embed"], history[5]["embed"]))
    _assert_bit_exact(history[5], _tree(before))

  def test_nothing_new_is_one_small_read(self):
    store = WeightStore(self.url)
    history, _ = self._publish_sequence(store, [1, 2])
    reader = WeightStore(self.url)
    orig = reader._get
    with mock.patch.object(reader, "_get", side_effect=orig) as get:
      self.assertIsNone(reader.update(2, history[2]))
    self.assertEqual([c.args[0] for c in get.call_args_list], ["LATEST"])

  @parameterized.named_parameters(*_DTYPES)
  def test_delta_of_an_adamw_step_is_smaller_than_a_full(self, dtype):
    store = WeightStore(self.url)
    params = {"w1": self.rng.standard_normal((256, 256)).astype(dtype),
              "w2": self.rng.standard_normal((256, 128)).astype(dtype)}
    full = store.publish(1, params)
    delta = store.publish(2, _adamw_step(params, self.rng, lr=1e-3))
    self.assertEqual((full.kind, delta.kind), ("full", "delta"))
    self.assertEqual(full.full_bytes, (256 * 256 + 256 * 128) * np.dtype(dtype).itemsize)
    self.assertEqual(delta.full_bytes, full.full_bytes)
    # Measured: float32 0.68, bfloat16 0.28 of the full's stored bytes.
    self.assertLess(delta.stored_bytes, 0.9 * full.stored_bytes)
    # stored_bytes is every object of the version directory.
    vdir = os.path.join(self.url, "versions", f"{2:012d}")
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(vdir) for f in fs)
    self.assertEqual(delta.stored_bytes, on_disk)

  def test_full_every(self):
    store = WeightStore(self.url, full_every=4, keep=10)
    _, kinds = self._publish_sequence(store, [1, 2, 3, 4, 5, 6, 9, 10, 20])
    self.assertEqual(kinds, {1: "full", 2: "delta", 3: "delta", 4: "delta", 5: "full", 6: "delta", 9: "full",
                             10: "delta", 20: "full"})
    # A new publisher has no previous params in memory: its first version is full.
    _, kinds = self._publish_sequence(WeightStore(self.url, full_every=4, keep=10), [21, 22])
    self.assertEqual(kinds, {21: "full", 22: "delta"})
    _, kinds = self._publish_sequence(WeightStore(self.url, full_every=1, keep=10), [23, 24])
    self.assertEqual(kinds, {23: "full", 24: "full"})

  def test_garbage_collection_keeps_full_snapshots_and_their_deltas(self):
    store = WeightStore(self.url, full_every=3, keep=2)
    history, _ = self._publish_sequence(store, range(1, 9))  # fulls 1, 4, 7
    self.assertEqual(_versions(self.url), [4, 5, 6, 7, 8])
    history.update(self._publish_sequence(store, [9, 10])[0])  # full 10
    self.assertEqual(_versions(self.url), [7, 8, 9, 10])
    reader = WeightStore(self.url)
    for v in [7, 8, 9, 10]:
      _assert_bit_exact(reader.load(v)[1], history[v])
    with self.assertRaisesRegex(WeightStoreError, "not published"):
      reader.load(3)
    # An actor whose version was collected gets the newest by a full load.
    _assert_bit_exact(reader.update(3, history[3])[1], history[10])
    history, _ = self._publish_sequence(WeightStore(self.url, keep=1), [11])
    self.assertEqual(_versions(self.url), [11])
    _assert_bit_exact(reader.load()[1], history[11])

  def test_versions_must_increase(self):
    store = WeightStore(self.url)
    params = _params(self.rng)
    store.publish(3, params)
    for v in [3, 2]:
      with self.assertRaisesRegex(ValueError, "must increase"):
        store.publish(v, params)
      with self.assertRaisesRegex(ValueError, "must increase"):
        WeightStore(self.url).publish(v, params)
    with self.assertRaisesRegex(ValueError, "non-negative"):
      WeightStore(_tempdir(self)).publish(-1, params)

  def test_structure_changes_force_a_full_snapshot(self):
    store = WeightStore(self.url, keep=10)
    p1 = _params(self.rng)
    p2 = {**p1, "head": np.ones((32, 8), np.float32)}
    p3 = _adamw_step(p2, self.rng)
    p4 = {**p3, "head": np.ones((32, 9), np.float32)}
    p5 = {**p4, "head": p4["head"].astype(ml_dtypes.bfloat16)}
    p6 = _adamw_step(p5, self.rng)
    history = dict(enumerate([p1, p2, p3, p4, p5, p6], start=1))
    kinds = [store.publish(v, p).kind for v, p in history.items()]
    self.assertEqual(kinds, ["full", "full", "delta", "full", "full", "delta"])
    for v, p in history.items():
      _assert_bit_exact(store.load(v)[1], p)

  def test_dtypes_shapes_and_odd_values_round_trip(self):
    store = WeightStore(self.url, keep=10)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 0.0], np.float32)
    special.view(np.uint32)[0] |= 0x1234  # a NaN payload, lost by any float arithmetic
    params = {
        "f32": special, "bf16": np.arange(7, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "f16": np.linspace(-1, 1, 5).astype(np.float16), "f64": np.array(np.pi), "i8": np.array([-128, 127], np.int8),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3), "u64": np.array([2**64 - 1], np.uint64),
        "mask": np.array([[True, False]]), "step": np.int32(7), "empty": np.zeros((0, 4), np.float32),
        "a/b": np.ones(2, np.float32), "a": {"b": np.zeros(2, np.float32)}, "nothing": {},
    }
    store.publish(1, params)
    changed = {**params, "i32": params["i32"] + 1, "mask": ~params["mask"], "step": np.int32(8)}
    self.assertEqual(store.publish(2, changed).kind, "delta")
    for v, want in [(1, params), (2, changed)]:
      got = store.load(v)[1]
      _assert_bit_exact(got, want)
      self.assertEqual(got["nothing"], {})
      self.assertEqual(got["step"].shape, ())
    _assert_bit_exact(store.update(1, params)[1], changed)

  def test_memory_url(self):
    store = WeightStore("memory://weights")
    history, kinds = self._publish_sequence(store, [1, 2])
    self.assertEqual(list(kinds.values()), ["full", "delta"])
    _assert_bit_exact(store.load()[1], history[2])
    _assert_bit_exact(store.update(1, history[1])[1], history[2])

  def test_rejects_params_that_are_not_dicts_of_arrays(self):
    store = WeightStore(self.url)
    for bad, pattern in [({"layers": [np.ones(2)]}, "got list at 'layers'"), ({1: np.ones(2)}, "keys must be str"),
                         ([np.ones(2)], "got list"), ({"s": np.array(["x"])}, "Cannot store dtype"),
                         ({"c": np.ones(2, np.complex128)}, "itemsize 16")]:
      with self.assertRaisesRegex(TypeError, pattern):
        store.publish(1, bad)
    self.assertIsNone(store.latest())

  def test_empty_store(self):
    store = WeightStore(self.url)
    self.assertIsNone(store.latest())
    self.assertIsNone(store.update(None, None))
    with self.assertRaisesRegex(WeightStoreError, "No weights published"):
      store.load()
    with self.assertRaisesRegex(WeightStoreError, "not published"):
      store.load(1)


class IntegrityTest(absltest.TestCase):
  """Corruption and interruption: an error or the previous version, never wrong weights."""

  def setUp(self):
    super().setUp()
    self.url = _tempdir(self)
    rng = np.random.default_rng(1)
    self.store = WeightStore(self.url, keep=10)
    self.p1 = _params(rng)
    self.p2 = _adamw_step(self.p1, rng)
    self.store.publish(1, self.p1)
    self.store.publish(2, self.p2)  # a delta

  def _array_dir(self, version, index=0):
    return os.path.join(self.url, "versions", f"{version:012d}", "arrays", f"{index:05d}")

  def test_flipped_chunk_byte_is_an_error(self):
    chunk = os.path.join(self._array_dir(2), "c", "0", "0")
    data = bytearray(open(chunk, "rb").read())
    data[len(data) // 2] ^= 0x40
    with open(chunk, "wb") as f:
      f.write(bytes(data))
    reader = WeightStore(self.url)
    with self.assertRaisesRegex(WeightStoreError, "missing or corrupt array"):
      reader.load(2)
    with self.assertRaises(WeightStoreError):
      reader.update(1, self.p1)
    _assert_bit_exact(reader.load(1)[1], self.p1)

  def test_well_formed_wrong_values_fail_the_tensor_checksum(self):
    # Chunk checksums cannot see this: valid chunks of other values (as if another version's object were here).
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": self._array_dir(2)}}).result()
    arr[0, 0] = arr[0, 0].read().result() ^ 1
    reader = WeightStore(self.url)
    with self.assertRaisesRegex(WeightStoreError, "Checksum mismatch in tensor 'embed' of version 2"):
      reader.load()
    with self.assertRaisesRegex(WeightStoreError, "Checksum mismatch"):
      reader.update(1, self.p1)

  def test_missing_chunk_is_an_error(self):
    os.remove(os.path.join(self._array_dir(2, 1), "c", "0", "0"))
    with self.assertRaisesRegex(WeightStoreError, "missing or corrupt array"):
      WeightStore(self.url).load()

  def test_update_on_params_that_are_not_the_claimed_version(self):
    # Deltas applied to the wrong base fail the checksums; the actor then gets a full load, not wrong weights.
    wrong = {**self.p1, "embed": self.p1["embed"] + 1}
    got_v, got = WeightStore(self.url).update(1, wrong)
    self.assertEqual(got_v, 2)
    _assert_bit_exact(got, self.p2)
    got_v, got = WeightStore(self.url).update(1, {"other": np.ones(3, np.float32)})
    _assert_bit_exact(got, self.p2)

  def test_latest_is_written_after_the_manifest_after_the_arrays(self):
    keys = []
    orig = self.store._put
    with mock.patch.object(self.store, "_put", side_effect=lambda k, d: keys.append(k) or orig(k, d)):
      self.store.publish(3, _adamw_step(self.p2, np.random.default_rng(2)))
    self.assertEqual(keys[-2:], [f"versions/{3:012d}/manifest.json", "LATEST"])
    self.assertNotEmpty(keys[:-2])
    self.assertTrue(all(k.startswith(f"versions/{3:012d}/arrays/") for k in keys[:-2]), keys)

  def test_half_written_version_is_invisible_and_overwritten(self):
    debris = os.path.join(self.url, "versions", f"{3:012d}")
    shutil.copytree(os.path.dirname(self._array_dir(2)), os.path.join(debris, "arrays"))
    shutil.copytree(self._array_dir(2), os.path.join(debris, "arrays", "00099"))  # an object no publish writes
    reader = WeightStore(self.url)
    self.assertEqual(reader.latest(), 2)
    self.assertIsNone(reader.update(2, self.p2))
    _assert_bit_exact(reader.load()[1], self.p2)
    with self.assertRaisesRegex(WeightStoreError, "Version 3 is not published"):
      reader.load(3)
    p3 = _adamw_step(self.p2, np.random.default_rng(3))
    WeightStore(self.url).publish(3, p3)
    self.assertFalse(os.path.exists(os.path.join(debris, "arrays", "00099")))
    _assert_bit_exact(reader.update(2, self.p2)[1], p3)

  def test_garbage_collection_removes_debris_below_latest(self):
    debris = os.path.join(self.url, "versions", f"{3:012d}")
    shutil.copytree(os.path.dirname(self._array_dir(2)), os.path.join(debris, "arrays"))
    self.store.publish(4, self.p2)
    self.assertEqual(_versions(self.url), [1, 2, 4])


class KilledPublisherTest(parameterized.TestCase):

  @parameterized.parameters("arrays", "manifest")
  def test_sigkill_mid_publish(self, stop_at):
    url = _tempdir(self)
    rng = np.random.default_rng(4)
    p1 = _params(rng)
    WeightStore(url).publish(1, p1)
    child = subprocess.Popen([sys.executable, _PUBLISHER, f"--url={url}", "--version=2", "--mb=20",
                              f"--stop_at={stop_at}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      line = child.stdout.readline()
      self.assertEqual(line.strip(), "STOPPED", child.stderr.read() if not line else line)
      vdir = os.path.join(url, "versions", f"{2:012d}")
      written = [f for _, _, fs in os.walk(vdir) for f in fs]
      # Mid-publish: some of version 2 is on storage (one object, or every array object but the manifest)...
      if stop_at == "arrays":
        self.assertLen(written, 1)
      else:
        self.assertEqual(written.count("zarr.json"), 4)
      self.assertNotIn("manifest.json", written)
      self.assertEqual(WeightStore(url).latest(), 1)  # ...but not published
      child.send_signal(signal.SIGKILL)
      self.assertEqual(child.wait(timeout=30), -signal.SIGKILL)
    finally:
      child.kill()
      child.wait()
      child.stdout.close()
      child.stderr.close()
    reader = WeightStore(url)
    self.assertEqual(reader.latest(), 1)
    _assert_bit_exact(reader.load()[1], p1)
    self.assertIsNone(reader.update(1, p1))
    with self.assertRaises(WeightStoreError):
      reader.load(2)
    # A new publisher publishes the next version over the debris.
    p2 = _adamw_step(p1, rng)
    self.assertEqual(WeightStore(url).publish(2, p2).kind, "full")
    _assert_bit_exact(reader.update(1, p1)[1], p2)
    self.assertLess(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(vdir) for f in fs), 1 << 20)


class S3WeightStoreTest(absltest.TestCase):
  """One round trip on S3 through tensorstore's s3 kvstore: a local moto server (as tests/rollouts/s3_test.py)."""

  def setUp(self):
    super().setUp()
    import boto3
    from moto.server import ThreadedMotoServer  # missing: fail, not skip
    py_logging.getLogger("werkzeug").setLevel(py_logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    self.addCleanup(server.stop)
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    aws_dir = _tempdir(self)  # empty AWS config files: the SDK reads nothing of the machine's own
    for name in ("config", "credentials"):
      open(os.path.join(aws_dir, name), "w").close()
    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.path.join(aws_dir, "config"),
           "AWS_SHARED_CREDENTIALS_FILE": os.path.join(aws_dir, "credentials")}
    patcher = mock.patch.dict(os.environ, env)  # restores the whole environment afterwards
    patcher.start()
    self.addCleanup(patcher.stop)
    for k in ("AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
      os.environ.pop(k, None)
    self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    self.s3.create_bucket(Bucket="c2jax-weights")

  def test_round_trip(self):
    url = "s3://c2jax-weights/run/weights"
    rng = np.random.default_rng(6)
    history = {1: _params(rng, ml_dtypes.bfloat16)}
    for v in (2, 3):
      history[v] = _adamw_step(history[v - 1], rng)
    store = WeightStore(url, full_every=2, keep=1)
    self.assertEqual([store.publish(v, p).kind for v, p in history.items()], ["full", "delta", "full"])
    reader = WeightStore(url)
    _assert_bit_exact(reader.load()[1], history[3])
    _assert_bit_exact(reader.update(1, history[1])[1], history[3])
    self.assertIsNone(reader.update(3, history[3]))
    keys = [o["Key"] for o in self.s3.list_objects_v2(Bucket="c2jax-weights", Prefix="run/")["Contents"]]
    self.assertIn("run/weights/LATEST", keys)
    # keep=1: only version 3 is left.
    self.assertEqual({k.split("/")[3] for k in keys if k.startswith("run/weights/versions/")}, {f"{3:012d}"})


class DeltaHelpersTest(parameterized.TestCase):

  @parameterized.named_parameters(*_DTYPES, ("int64", np.int64), ("bool", np.bool_))
  def test_xor_delta_round_trip(self, dtype):
    rng = np.random.default_rng(5)
    old = rng.integers(0, 256, (3, 5, 8), dtype=np.uint8).view(dtype)
    new = rng.integers(0, 256, (3, 5, 8), dtype=np.uint8).view(dtype)
    delta = weight_store.xor_delta(new, old)
    self.assertEqual(delta.dtype, np.dtype(f"u{np.dtype(dtype).itemsize}"))
    got = weight_store.apply_delta(old, delta)
    self.assertEqual(got.dtype, np.dtype(dtype))
    _assert_bit_exact({"x": got}, {"x": new})
    np.testing.assert_array_equal(weight_store.xor_delta(new, new), 0)

  def test_mismatched_arrays_are_refused(self):
    with self.assertRaisesRegex(ValueError, "one dtype and shape"):
      weight_store.xor_delta(np.ones(2, np.float32), np.ones(2, np.int32))
    with self.assertRaisesRegex(ValueError, "does not fit"):
      weight_store.apply_delta(np.ones(2, np.float32), np.ones(3, np.uint32))


if __name__ == "__main__":
  absltest.main()
