"""The rollout buffer with writers in other processes: concurrent commits (one group or several per call) read
exactly once and never partially,
and a writer SIGKILLed mid-commit leaves nothing visible until its successor (same id) resumes the shard."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.rollouts import schema
from c2jax.rollouts.buffer import RolloutReader, RolloutWriter

pytestmark = pytest.mark.e2e  # concurrent writer processes, one SIGKILLed (`make test-unit` leaves them out)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = schema.BufferSpec(seq_len=32, n_moe_layers=1, experts_per_tok=2)

# A writer process. Every token of group `seq` of writer `w`, row r, is w * 100000 + seq * 100 + r, so a group
# holding another commit's rows (or a mix) is detected. Modes: "commit" commits N groups with small random pauses,
# 1 + w % 3 groups per call;
# "kill" commits N groups, then writes the rows of one more group (tokens with seq 99), reports "ready" and sleeps
# before the commit record: the test SIGKILLs it there.
WORKER = r"""
import sys, time
import numpy as np
from c2jax.rollouts import schema
from c2jax.rollouts.buffer import RolloutWriter

url, w, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spec = schema.BufferSpec(seq_len=32, n_moe_layers=1, experts_per_tok=2)

def group(seq, rows):
  g = schema.example_group(spec, rows=rows, seed=seq)
  g["tokens"] = np.broadcast_to((w * 100000 + seq * 100 + np.arange(rows))[:, None], (rows, 32)).astype(np.int32)
  g["expert_ids"][:] = w
  return g

writer = RolloutWriter(url, f"writer-{w}", spec, chunk_rows=2, shard_rows=4)  # calls straddle objects
rng = np.random.default_rng(w)
per_call = 1 + w % 3  # commit (1) and commit_many (2, 3 groups)
for first in range(0, n, per_call):
  seqs = range(first, min(n, first + per_call))
  got = writer.commit_many([group(seq, 1 + seq % 3) for seq in seqs],
                           [{"task_id": f"{w}/{seq}", "writer": w} for seq in seqs])
  assert got == list(seqs), (got, seqs)
  time.sleep(float(rng.uniform(0, 0.03)))
if mode == "kill":
  writer._write_rows([schema.normalize_group(group(99, 4), spec)], writer._next_row)
  print("ready", flush=True)
  time.sleep(60)
"""


def start_worker(url, w, n, mode):
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.Popen([sys.executable, "-c", WORKER, url, str(w), str(n), mode], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_group(test, g):
  """The group's rows all carry its own (writer, seq) and row index."""
  w, seq = map(int, g.meta["task_id"].split("/"))
  rows = g.data["tokens"].shape[0]
  test.assertEqual(rows, 1 + seq % 3 if seq != 99 else 4)
  want = (w * 100000 + seq * 100 + np.arange(rows))[:, None]
  np.testing.assert_array_equal(g.data["tokens"], np.broadcast_to(want, (rows, 32)))
  np.testing.assert_array_equal(g.data["expert_ids"], w)
  test.assertEqual(g.meta["shard"], f"writer-{w}")
  test.assertEqual(g.meta["seq"], seq)


class MultiprocessTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.url = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.url, ignore_errors=True)

  def test_concurrent_writers_read_exactly_once(self):
    n_writers, n_groups = 4, 8
    procs = [start_worker(self.url, w, n_groups, "commit") for w in range(n_writers)]
    for p in procs:
      self.addCleanup(p.kill)
    reader = RolloutReader(self.url, SPEC)
    seen, polls = [], 0
    deadline = time.monotonic() + 60
    while len(seen) < n_writers * n_groups and time.monotonic() < deadline:
      if any(p.poll() for p in procs):  # a writer failed: its error is reported below
        break
      seen += reader.poll(max_groups=3)
      polls += 1
      time.sleep(0.01)
    for p in procs:
      _, err = p.communicate(timeout=30)
      self.assertEqual(p.returncode, 0, err)
    seen += reader.poll()
    keys = [(g.meta["shard"], g.meta["seq"]) for g in seen]
    self.assertLen(keys, len(set(keys)))
    self.assertEqual(sorted(keys), sorted((f"writer-{w}", s) for w in range(n_writers) for s in range(n_groups)))
    for g in seen:
      check_group(self, g)
    self.assertGreater(polls, 1)  # the reader ran while the writers committed
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    self.assertEqual(reader.cursor, {f"writer-{w}": n_groups for w in range(n_writers)})

  def test_writer_killed_mid_commit_is_resumed(self):
    proc = start_worker(self.url, 7, 3, "kill")
    self.addCleanup(proc.kill)
    line = proc.stdout.readline()
    self.assertEqual(line.strip(), "ready", proc.stderr.read() if not line else line)
    reader = RolloutReader(self.url, SPEC)
    self.assertEqual([g.meta["seq"] for g in reader.poll()], [0, 1, 2])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    self.assertEqual(proc.returncode, -signal.SIGKILL)
    self.assertEqual(reader.poll(), [])  # the partial group is invisible
    resumed = RolloutWriter(self.url, "writer-7", SPEC)
    self.assertEqual(resumed.next_seq, 3)
    for seq in (3, 4):
      g = schema.example_group(SPEC, rows=1 + seq % 3, seed=seq)
      g["tokens"] = np.broadcast_to((700000 + seq * 100 + np.arange(1 + seq % 3))[:, None],
                                    g["tokens"].shape).astype(np.int32)
      g["expert_ids"][:] = 7
      resumed.commit(g, {"task_id": f"7/{seq}"})
    out = reader.poll()
    self.assertEqual([g.meta["seq"] for g in out], [3, 4])
    for g in out:
      check_group(self, g)  # the killed writer's rows (seq 99) were overwritten, not mixed in
    self.assertEqual(reader.stats["corrupt_groups"], 0)


if __name__ == "__main__":
  absltest.main()
