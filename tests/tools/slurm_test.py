"""The Slurm launch specs (tools/launch/slurm/*.sbatch) run as they are on a real one-node Slurm cluster, and the run
survives Slurm's own kills and requeues (report section 6: fault tolerance).

tools/launch/slurm/local_cluster.sh brings up a private slurmctld + slurmd + munged; the actors (an array of 2) and
the trainer are submitted from the same sbatch files a user submits, with CPU-sized sbatch options and overrides
on the built-in task. Then:
  1. once the trainer trained past a checkpoint, one actor array task is cancelled (scancel: SIGTERM to the script
     and the actor, and the job ends CANCELLED) and requeued (scontrol requeue): the same actor id comes back;
  2. at the same moment the trainer's step alone gets SIGTERM (scancel --signal=TERM: the path of the time limit's
     SIGINT): it checkpoints, exits 130, and the spec requeues its own job;
  3. once resumed and a step further, the trainer is cancelled outright (scancel): it checkpoints, the job stays
     CANCELLED (the spec requeues only what the user did not cancel), and is requeued by hand;
  4. the third attempt finishes (COMPLETED) and cancels the actors.
Then the run reached its last step, every committed group that was trained on was trained on exactly once and none
was skipped (consumed.jsonl), no group in the buffer is corrupt, and Slurm counted the restarts. The counts are
printed as one JSON line. Slurm delays a requeued job's next start by about two minutes (Reason=BeginTime); the test
releases it at once (scontrol update StartTime=now), which changes when it starts, not how.

Needs root and `apt-get install slurmctld slurmd munge` (make setup). Without them it skips, unless
C2JAX_REQUIRE_SLURM=1 (CI: .ci/run), where a missing Slurm fails.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.rollouts.buffer import RolloutReader
from tests.services.async_rl_test import trained_once

pytestmark = pytest.mark.e2e  # a Slurm cluster, real trainer and actor jobs (`make test-unit` leaves them out)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_SPECS = _ROOT / "tools" / "launch" / "slurm"
STEPS, GROUPS_PER_STEP, GROUP = 20, 2, 8  # steps take ~0.3 s once compiled: room for two kills mid-run
_LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD")
_DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel")


def _missing_reason() -> str | None:
  """Why this machine cannot run a private Slurm cluster, or None."""
  missing = [d for d in _DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
  if missing:
    return f"{', '.join(missing)} not installed (make setup, as root: apt-get install slurmctld slurmd munge)."
  if os.geteuid() != 0:
    return "slurmd must run as root (it starts jobs as their users)."
  return None


def _wait(what: str, cond, timeout: float, poll: float = 0.1, check=None):
  """Polls `cond` (keep it cheap: a kill must land before the fast steps run out) and, once a second, `check`."""
  deadline, checked = time.time() + timeout, 0.0
  while time.time() < deadline:
    if check is not None and time.time() > checked + 1:
      check()
      checked = time.time()
    value = cond()
    if value:
      return value
    time.sleep(poll)
  raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class SlurmCluster:
  """The cluster of local_cluster.sh: its clients' environment, and job queries."""

  def __init__(self, env: dict):
    out = subprocess.run([str(_SPECS / "local_cluster.sh"), "start"], env=env, capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
      raise AssertionError(f"local_cluster.sh start failed: {out.stderr}")
    self.conf = out.stdout.strip().split("SLURM_CONF=")[1]
    self.env = {**env, "SLURM_CONF": self.conf}

  def stop(self):
    subprocess.run([str(_SPECS / "local_cluster.sh"), "stop"], env=self.env, timeout=120, check=True)

  def __call__(self, *args: str) -> str:
    out = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
      raise AssertionError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr}")
    return out.stdout

  def job(self, job: str) -> dict:
    """scontrol's fields of `job` (JobState, Reason, Restarts, ExitCode, ...)."""
    text = self("scontrol", "show", "job", "-o", job)
    return dict(f.split("=", 1) for f in text.split() if "=" in f)

  def release(self, job: str, timeout: float = 60):
    """Waits for `job` to be pending again after a requeue, and lets it start now (Slurm's requeue delay)."""
    _wait(f"job {job} to be requeued", lambda: self.job(job)["JobState"] == "PENDING", timeout)
    # Not "now": a requeue revokes the job's credential on the node, and slurmd compares the new credential's time
    # with the revocation's in whole seconds, so a start in the same second fails ("Job credential revoked", the
    # job FAILED). Slurm's own requeue delay (~120 s) is what normally avoids it.
    self("scontrol", "update", f"JobId={job}", "StartTime=now+2")


def _result(out: pathlib.Path) -> dict:
  """rl_main's result for one attempt's stdout file `out`: the JSON line rl_main wrote to `<out>.json`
  (--result_file; what trainer.sbatch decides on)."""
  return json.loads(out.with_name(out.name + ".json").read_text())


def _steps(work: pathlib.Path) -> list[int]:
  metrics = work / "metrics.jsonl"
  if not metrics.exists():
    return []
  # Only whole lines: this polls while the trainer appends, and a read can land between two writes of one line.
  lines = metrics.read_text().split("\n")[:-1]
  return [json.loads(l)["step"] for l in lines if l]


def _checkpoints(work: pathlib.Path) -> list[int]:
  ckpts = work / "checkpoints"  # finished checkpoints are named by their step (orbax renames them when done)
  return [int(p.name) for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.exists() else []


class SlurmLaunchTest(absltest.TestCase):

  def test_specs_run_and_survive_scancel_and_requeue(self):
    reason = _missing_reason()
    if reason:
      if os.environ.get("C2JAX_REQUIRE_SLURM") == "1":  # CI (.ci/run): the specs must run there, not skip
        self.fail(f"C2JAX_REQUIRE_SLURM=1 but {reason}")
      self.skipTest(reason)
    t0 = time.time()
    work = pathlib.Path(tempfile.mkdtemp(prefix="c2jax-slurm-run-"))  # not create_tempdir: pytest skips absl flags
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir()
    # The session's compiled programs (tests/conftest.py), so what another run of this config compiled is reused.
    buffer, cache = work / "buffer", os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(work / "jax_cache")
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    # What the specs read (tools/launch/slurm/*.sbatch); the jobs inherit it (sbatch --export=ALL, the default).
    env.update(REPO=str(_ROOT), VENV=sys.prefix, CONFIG="configs/rl_char_class.py", WORKDIR=str(work),
               BUFFER=str(buffer), WEIGHTS=str(work / "weights"), MESH="", JAX_COMPILATION_CACHE_DIR=str(cache),
               WAIT_CONFIG_S="600")
    cluster = SlurmCluster(env)
    self.addCleanup(cluster.stop)
    started = time.time() - t0

    # The GPU cluster's #SBATCH values, replaced on the command line for one 2-core CPU node.
    cpu_node = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--ntasks-per-node=1"]
    actors = cluster("sbatch", "--parsable", "--array=0-1", *cpu_node, f"--output={logs}/actors-%A_%a.log",
                     str(_SPECS / "actors.sbatch")).strip()
    trainer = cluster("sbatch", "--parsable", *cpu_node, f"--output={logs}/trainer-%j.log",
                      f"--export=ALL,ACTORS_JOB={actors}", str(_SPECS / "trainer.sbatch"),
                      f"--config.trainer.steps={STEPS}", f"--config.trainer.groups_per_step={GROUPS_PER_STEP}",
                      "--config.trainer.checkpoint_every=2", "--config.trainer.keep_checkpoints=16",
                      "--config.trainer.take_timeout_s=300", f"--config.actors.group_size={GROUP}",
                      "--config.actors.groups_per_call=1", "--config.eval.process=False", "--config.eval.tasks=2",
                      "--config.eval.samples=4", "--config.eval.best_of=4", f"--config.compilation_cache={cache}"
                      ).strip()
    victim = f"{actors}_1"

    trainer_log = logs / f"trainer-{trainer}.log"  # the job's stdout and stderr, appended by every attempt

    def trainer_alive():
      state = cluster.job(trainer)["JobState"]
      if state not in _LIVE:
        raise AssertionError(f"the trainer job ended {state} early: {trainer_log.read_text()[-3000:]}")
      return state

    def past_checkpoint():
      saved, done = _checkpoints(work), _steps(work)
      return saved and done and max(done) > max(saved)

    # 1 + 2. Once the trainer trained past a checkpoint: cancel actor 1 mid-run, and signal the trainer's step alone
    # (the batch script sees nothing, as with the time limit).
    _wait("a step past a checkpoint", past_checkpoint, 400, poll=0.02, check=trainer_alive)
    phases = {"first_checkpoint": time.time() - t0}
    cluster("scancel", victim)
    cluster("scancel", "--signal=TERM", trainer)
    _wait("the actor task to be cancelled", lambda: cluster.job(victim)["JobState"] == "CANCELLED", 120)
    cluster("scontrol", "requeue", victim)
    cluster.release(victim)
    # The trainer checkpoints and exits 130; the spec sees "interrupted" and requeues its own job.
    cluster.release(trainer, timeout=120)
    phases["trainer_requeued_by_the_spec"] = time.time() - t0
    first_stop = _result(logs / f"trainer-{trainer}-0.out")["steps"]
    self.assertLess(first_stop, STEPS)  # stopped mid-run

    # 3. Once resumed and a step further, cancel the trainer outright: SIGTERM to the script and the step; the
    # trainer checkpoints, and the job stays CANCELLED (the spec does not requeue what a user cancelled) until
    # requeued.
    _wait("a step after the resume", lambda: max(_steps(work), default=0) > first_stop, 300, poll=0.02,
          check=trainer_alive)
    phases["resumed"] = time.time() - t0
    cluster("scancel", trainer)
    _wait("the trainer to be cancelled", lambda: cluster.job(trainer)["JobState"] not in _LIVE, 120)
    phases["trainer_cancelled"] = time.time() - t0
    time.sleep(2)  # time for a (wrong) requeue by the spec to show
    self.assertEqual(cluster.job(trainer)["JobState"], "CANCELLED")
    second_stop = _result(logs / f"trainer-{trainer}-1.out")["steps"]
    self.assertLess(first_stop, second_stop)
    self.assertLess(second_stop, STEPS)
    cluster("scontrol", "requeue", trainer)
    cluster.release(trainer)

    # 4. The third attempt finishes, and cancels the actors.
    _wait("the trainer to complete", lambda: cluster.job(trainer)["JobState"] not in _LIVE, 400)
    phases["trainer_completed"] = time.time() - t0
    log = trainer_log.read_text()
    final = cluster.job(trainer)
    self.assertEqual(final["JobState"], "COMPLETED", log[-3000:])
    _wait("the actors to be cancelled", lambda: all(cluster.job(f"{actors}_{i}")["JobState"] == "CANCELLED"
                                                    for i in range(2)), 120)

    # One result line per attempt (the spec's trainer-<job>-<SLURM_RESTART_COUNT>.out): two stops, then the end.
    attempts = [_result(logs / f"trainer-{trainer}-{i}.out") for i in range(3)]
    self.assertEqual([a["interrupted"] for a in attempts], [True, True, False])
    self.assertFalse((logs / f"trainer-{trainer}-3.out").exists())
    resumed_at = [int(s) for s in re.findall(r"resumed from step (\d+)", log)]
    self.assertLen(resumed_at, 2)
    self.assertTrue(0 < resumed_at[0] < resumed_at[1] < STEPS, resumed_at)  # each attempt trained some steps
    result = attempts[-1]
    self.assertEqual(result["steps"], STEPS)
    self.assertEqual(result["groups_consumed"], STEPS * GROUPS_PER_STEP)

    trained, by_shard = trained_once(self, work, STEPS)
    self.assertLen(trained, STEPS * GROUPS_PER_STEP)
    self.assertEqual(sorted(by_shard), ["actor-0-0", "actor-1-0"])  # ids from the array index, across the requeue

    # No group in the buffer is partial or corrupt.
    reader = RolloutReader(str(buffer))
    groups = reader.poll()
    self.assertGreaterEqual(len(groups), STEPS * GROUPS_PER_STEP)
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    for g in groups:
      self.assertLen(g.data["tokens"], GROUP)
      plen = int(g.data["prompt_length"][0])
      np.testing.assert_array_equal(g.data["tokens"][:, :plen], np.repeat(g.data["tokens"][:1, :plen], GROUP, 0))
    versions = [json.loads(l)["version"] for l in (work / "metrics.jsonl").read_text().splitlines()]
    self.assertEqual(versions, sorted(set(versions)))

    # Slurm's own count of the restarts, and the requeued actor ran twice under the same id.
    actor_runs = [cluster.job(f"{actors}_{i}") for i in range(2)]
    self.assertEqual(final["Restarts"], "2")
    self.assertEqual([a["Restarts"] for a in actor_runs], ["0", "1"])
    victim_log = (logs / f"actors-{actors}_1.log").read_text()
    self.assertLen(re.findall(r'"actor": "actor-1-0"', victim_log), 2)  # a result line per run: both stopped by TERM
    jobcomp = (pathlib.Path(cluster.conf).parent / "log" / "jobcomp.txt").read_text()
    print(json.dumps({
        "slurm_test": {"seconds": round(time.time() - t0, 1), "cluster_start_s": round(started, 2),
                       "steps": result["steps"], "groups_consumed": result["groups_consumed"],
                       "trainer": {"kills": 2, "kills_by": ["scancel --signal=TERM", "scancel"],
                                   "requeues": {"by_the_spec": 1, "by_hand": 1},
                                   "slurm_restarts": int(final["Restarts"]), "attempts": len(attempts),
                                   "stopped_at": [a["steps"] for a in attempts[:2]], "resumed_at": resumed_at},
                       "actor_1": {"kills": 1, "requeues": 1, "slurm_restarts": int(actor_runs[1]["Restarts"])},
                       "actor_0": {"kills": 0, "slurm_restarts": int(actor_runs[0]["Restarts"])},
                       "phases_s": {k: round(v, 1) for k, v in phases.items()},
                       "jobcomp_records": len(jobcomp.splitlines()),
                       "groups_by_shard": {k: len(v) for k, v in sorted(by_shard.items())}}}), flush=True)


if __name__ == "__main__":
  absltest.main()
