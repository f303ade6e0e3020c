"""The asynchronous RL job end to end, with real processes killed by SIGKILL (report section 6: fault tolerance).

One run of `experiments/rl_main.py` (trainer + 2 local actor processes on the built-in task) that survives:
  1. an actor SIGKILLed while it holds a begun group: the pool restarts it and it re-runs that group;
  2. the trainer SIGKILLed after a checkpoint (its actors die with it): the same command resumes from the orbax
     checkpoint and the buffer cursor.
Then every committed group that was trained on was trained on exactly once (the last record of each step in
consumed.jsonl, per shard a contiguous run of sequence numbers from 0), and no group was partial.
"""

import json
import shutil
import tempfile
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.storage import Store

pytestmark = pytest.mark.e2e  # real trainer and actor processes, SIGKILLed (`make test-unit` leaves them out)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS, GROUPS_PER_STEP, GROUP = 8, 2, 8


def _env(cache: str) -> dict:
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
  env["PYTHONPATH"] = str(_ROOT)
  env["JAX_COMPILATION_CACHE_DIR"] = cache
  return env


def _pids(pattern: str) -> list[int]:
  out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
  return [int(p) for p in out.split()]


def _wait(what: str, cond, timeout: float, proc: subprocess.Popen | None = None, poll: float = 0.1):
  deadline = time.time() + timeout
  while time.time() < deadline:
    value = cond()
    if value:
      return value
    if proc is not None and proc.poll() is not None:
      raise AssertionError(f"the trainer exited (code {proc.returncode}) while waiting for {what}")
    time.sleep(poll)
  raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# What a miscounted run says in its logs: groups the reader skipped (void, corrupt or lost records), records a
# reopened writer voided or marked lost, unfinished writes a restarted writer removed, and where the resume began.
_DIAGNOSTIC_WORDS = ("skipping", "void", "lost", "unfinished", "resumed from")


def diagnostics(resumed_stderr: str, work: pathlib.Path) -> str:
  """The lines of the resumed run's stderr, the killed run's trainer.log and the actors' logs that hold one of
  _DIAGNOSTIC_WORDS, for assertion messages."""
  logs = [("resumed run", resumed_stderr)]
  for path in [work / "trainer.log", *sorted((work / "logs").glob("*.log"))]:
    if path.exists():
      logs.append((path.name, path.read_text(errors="replace")))
  lines = [f"  [{name}] {line.strip()}" for name, text in logs for line in text.splitlines()
           if any(w in line for w in _DIAGNOSTIC_WORDS)]
  return "\nwarnings of the runs:\n" + ("\n".join(lines) if lines else "  (none)")


def trained_once(test: absltest.TestCase, work: pathlib.Path, steps: int) -> tuple[list, dict]:
  """Checks from WORKDIR/consumed.jsonl that steps 1..`steps` each trained (the last record of a step counts: a
  restart redoes the steps after its checkpoint), no group twice, and per shard a contiguous run of seqs from 0
  (none skipped). Returns (the trained (shard, seq) pairs, their seqs by shard)."""
  last = {}
  for line in (work / "consumed.jsonl").read_text().splitlines():
    record = json.loads(line)
    last[record["step"]] = [tuple(g) for g in record["groups"]]
  test.assertEqual(sorted(last), list(range(1, steps + 1)))
  trained = [g for step in sorted(last) for g in last[step]]
  test.assertLen(trained, len(set(trained)), "a group was trained on twice")
  by_shard = {}
  for shard, seq in trained:
    by_shard.setdefault(shard, []).append(seq)
  for shard, seqs in by_shard.items():
    test.assertEqual(sorted(seqs), list(range(len(seqs))), f"a committed group of {shard} was skipped")
  return trained, by_shard


class AsyncRLTest(absltest.TestCase):

  def test_async_run_survives_actor_and_trainer_sigkill(self):
    work = pathlib.Path(tempfile.mkdtemp())  # not create_tempdir: pytest does not parse absl flags
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    # The session's compiled programs (tests/conftest.py), so what another run of this config compiled is reused.
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(work / "jax_cache")
    cmd = [sys.executable, str(_ROOT / "experiments" / "rl_main.py"), "--config=configs/rl_char_class.py",
           f"--workdir={work}", f"--config.trainer.steps={STEPS}",
           f"--config.trainer.groups_per_step={GROUPS_PER_STEP}", "--config.trainer.checkpoint_every=2",
           "--config.trainer.keep_checkpoints=8",
           "--config.trainer.take_timeout_s=300", f"--config.actors.group_size={GROUP}",
           "--config.actors.groups_per_call=1", "--config.actors.num=2", "--config.eval.process=False",
           "--config.eval.tasks=2", "--config.eval.samples=4", "--config.eval.best_of=4",
           f"--config.compilation_cache={cache}"]
    buffer = work / "buffer"
    log = open(work / "trainer.log", "ab")
    self.addCleanup(log.close)
    trainer = subprocess.Popen(cmd, cwd=_ROOT, env=_env(cache), stdout=log, stderr=subprocess.STDOUT)
    self.addCleanup(lambda: trainer.poll() is None and trainer.kill())

    # 1. SIGKILL actor-0 while it holds a begun, uncommitted group.
    def pending_of_actor0():
      head = Store(str(buffer / "shards" / "actor-0")).read_json("head.json") if buffer.exists() else None
      return head is not None and head.get("pending", 0) > 0
    _wait("actor-0 to begin a group", pending_of_actor0, 240, trainer, poll=0.02)
    victims = _pids(f"{work}.*--actor_id=actor-0")
    self.assertLen(victims, 1)
    os.kill(victims[0], signal.SIGKILL)

    # 2. SIGKILL the trainer once it has gone past a checkpoint (and before its last step).
    def past_checkpoint():
      metrics = work / "metrics.jsonl"
      done = [json.loads(l)["step"] for l in metrics.read_text().splitlines()] if metrics.exists() else []
      ckpts = work / "checkpoints"  # finished checkpoints are named by their step (orbax renames them when done)
      saved = [int(p.name) for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.exists() else []
      return saved and done and max(done) > max(saved)
    _wait("a step past a checkpoint", past_checkpoint, 400, trainer, poll=0.02)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    # Its actors die with it (PR_SET_PDEATHSIG): no orphan keeps writing to the shards.
    _wait("the actors to exit", lambda: not _pids(f"actor_process.*{work}"), 30)

    # 3. The same command resumes and finishes.
    resumed = subprocess.run(cmd, cwd=_ROOT, env=_env(cache), capture_output=True, text=True, timeout=600)
    self.assertEqual(resumed.returncode, 0, resumed.stdout[-3000:] + resumed.stderr[-3000:])
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    resumed_at = int(resumed.stderr.split("resumed from step ")[1].split()[0])
    self.assertLess(resumed_at, STEPS)  # the second run really trained the rest
    diag = diagnostics(resumed.stderr, work)
    self.assertEqual(result["steps"], STEPS, diag)
    self.assertEqual(result["groups_consumed"], STEPS * GROUPS_PER_STEP, diag)
    # The end of the run: the before/after table on stdout, then the JSON with the figures it shows, and the plot.
    self.assertIn("pass@1", resumed.stdout)
    self.assertEqual(result["k"], 4)
    for key in ("pass_at_1_before", "pass_at_1_after", "best_of_k_before", "best_of_k_after", "tokens_trained",
                "samples_per_s", "staleness_mean", "filtered_fraction"):
      self.assertIsNotNone(result[key], key)
    self.assertEqual(result["best_of_k_after"], result["best_of_4_after"])
    self.assertGreater(result["tokens_trained"], 0)
    self.assertTrue((work / "training.png").exists())

    try:
      trained_once(self, work, STEPS)
    except AssertionError as e:
      raise AssertionError(f"{e}{diag}") from e

    # The killed actor re-ran the group it had begun, and no group in the buffer is partial: every row of a group
    # has its task's prompt and tokens stamped with published versions.
    self.assertIn("will be re-run", (work / "logs" / "actor-0.log").read_text())
    reader = RolloutReader(str(buffer))
    groups = reader.poll()
    self.assertGreaterEqual(len(groups), STEPS * GROUPS_PER_STEP)
    self.assertEqual(reader.stats["corrupt_groups"], 0, diag)
    for g in groups:
      self.assertLen(g.data["tokens"], GROUP)
      plen = int(g.data["prompt_length"][0])
      np.testing.assert_array_equal(g.data["tokens"][:, :plen], np.repeat(g.data["tokens"][:1, :plen], GROUP, 0))
      self.assertTrue(np.all(g.data["length"] == 8))

    # Weight versions only grow, across the restart too (the resumed run continues past the killed run's last).
    versions = [json.loads(l)["version"] for l in (work / "metrics.jsonl").read_text().splitlines()]
    self.assertEqual(versions, sorted(set(versions)))
    self.assertEqual(versions[-1], result["version"])


if __name__ == "__main__":
  absltest.main()
