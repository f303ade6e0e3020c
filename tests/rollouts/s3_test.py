"""The rollout buffer on S3, for real: a local S3-compatible server (moto's server mode, a test dependency) on
127.0.0.1, reached through tensorstore's s3 kvstore exactly as a cloud bucket would be."""

import logging as py_logging
import os
import shutil
import tempfile

from absl.testing import absltest
import boto3
from moto.server import ThreadedMotoServer  # a test extra: missing moto must fail this test, not skip it
import numpy as np
import pytest

from c2jax.rollouts import admission
from c2jax.rollouts import schema
from c2jax.rollouts.buffer import RolloutReader, RolloutWriter

pytestmark = pytest.mark.e2e  # a local S3 server process (`make test-unit` leaves them out)

SPEC = schema.BufferSpec(seq_len=16, n_moe_layers=2, experts_per_tok=2, reward_terms=("outcome", "format"))
BUCKET = "c2jax-test"


class S3BufferTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    py_logging.getLogger("werkzeug").setLevel(py_logging.ERROR)  # one access-log line per request otherwise
    self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    self.server.start()
    self.addCleanup(self.server.stop)
    host, port = self.server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # Empty AWS config files keep the SDK from reading (or complaining about) the machine's own.
    aws_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, aws_dir, ignore_errors=True)
    for name in ("config", "credentials"):
      open(os.path.join(aws_dir, name), "w").close()
    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.path.join(aws_dir, "config"),
           "AWS_SHARED_CREDENTIALS_FILE": os.path.join(aws_dir, "credentials")}
    saved = {k: os.environ.get(k) for k in list(env) + ["AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"]}
    self.addCleanup(self._restore_env, saved)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.update(env)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

  @staticmethod
  def _restore_env(saved):
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v

  def test_round_trip_and_cursor(self):
    url = f"s3://{BUCKET}/buffer"
    groups = [schema.example_group(SPEC, rows=r, seed=s, version=s) for s, r in ((0, 3), (1, 2), (2, 4), (3, 1))]
    a, b = RolloutWriter(url, "a", SPEC), RolloutWriter(url, "b", SPEC)
    ticket = a.begin({"task_id": "t0"})
    a.commit(groups[0], {"actor": "a"}, ticket)
    b.commit(groups[1], {"task_id": "t1"})
    a.commit(groups[2], {"task_id": "t2"})
    keys = [o["Key"] for o in self.s3.list_objects_v2(Bucket=BUCKET, Prefix="buffer/")["Contents"]]
    self.assertIn("buffer/shards/a/commits/000000000001.json", keys)
    self.assertIn("buffer/writers/b.json", keys)

    reader = RolloutReader(url, SPEC)
    first = reader.take(2, timeout_s=10)
    self.assertLen(first, 2)
    self.assertEqual(sorted(g.meta["shard"] for g in first), ["a", "b"])  # round-robin
    cursor = reader.cursor
    reader.publish_progress(version=1, groups_per_step=2)
    status = admission.read_status(url)
    self.assertEqual(status, admission.BufferStatus(committed=3, pending=0, consumed=2, trainer_version=1,
                                                    groups_per_step=2))

    b.commit(groups[3], {"task_id": "t3"})
    resumed = RolloutReader(url, cursor=cursor)
    rest = resumed.poll()
    self.assertEqual(sorted((g.meta["shard"], g.meta["seq"]) for g in rest), [("a", 1), ("b", 1)])
    by_task = {g.meta["task_id"]: g for g in first + rest}
    for i, want in enumerate(groups):
      got = by_task[f"t{i}"].data
      for k, v in want.items():
        if k == "reward_terms":
          for name in v:
            np.testing.assert_array_equal(v[name], got[k][name])
        else:
          np.testing.assert_array_equal(v, got[k], err_msg=k)
    self.assertEqual(resumed.backlog(), 0)
    self.assertEqual(resumed.stats["corrupt_groups"], 0)
    self.assertGreater(resumed.stats["bytes_read"], 0)


if __name__ == "__main__":
  absltest.main()
