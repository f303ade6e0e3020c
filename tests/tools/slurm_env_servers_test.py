"""The environment servers' Slurm spec (tools/launch/slurm/env_servers.sbatch) runs as its own job beside the actors
and the trainer on a real one-node Slurm cluster, and the run survives a server SIGKILLed mid-episode.

On a private cluster (tools/launch/slurm/local_cluster.sh, as tests/tools/slurm_test.py) the three jobs are submitted
from the specs a user submits: 2 servers (one node, 2 tasks), 1 actor, and the trainer with multi-turn episodes (the
cheap config of tests/services/multi_turn_rl_test.py, a few steps), the shared secret exported in the environment.
Once the trainer has trained a step (its held-out evaluation before RL is over: every episode from then on is the
actor's) and a server's log says it hosts an episode, that server process is SIGKILLed. Then:
  - the trainer job COMPLETED with every step, every group trained exactly once and none skipped, no corrupt group;
  - the spec's loop restarted the killed server on the same address (a second "listening" line of that task);
  - trainer.sbatch cancelled the servers' job and the actors' job;
  - the episodes the server hosted when it died (its last "env server hosts <n> episodes" line, n >= 1: the kill
    landed mid-episode) are the episodes the actor ran again (`env_reruns` in its result line).
"""

import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import pytest

from c2jax.rollouts.buffer import RolloutReader
from c2jax.sandbox import sandbox as sandbox_lib
from tests.services.async_rl_test import trained_once
from tests.services.multi_turn_rl_test import FLAGS as MULTI_TURN_FLAGS
from tests.tools.slurm_test import _LIVE, SlurmCluster, _missing_reason, _result, _steps, _wait

pytestmark = pytest.mark.e2e  # a Slurm cluster, real trainer, actor and environment server jobs

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_SPECS = _ROOT / "tools" / "launch" / "slurm"
STEPS, GROUPS_PER_STEP, GROUP = 6, 2, 2  # room after the kill for the killed server to come back before the end
_HOSTS = re.compile(r"^(\d+): env server hosts (\d+) episodes$", re.M)


def _free_port_pair() -> int:
  """A port p with p and p + 1 free: the servers' ENV_PORT (task i listens on ENV_PORT + i)."""
  for _ in range(100):
    with socket.socket() as s:
      s.bind(("", 0))
      port = s.getsockname()[1]
    try:
      with socket.socket() as s:
        s.bind(("", port + 1))
      return port
    except OSError:
      continue
  raise AssertionError("no two consecutive free ports")


def _listening(log: str, task: str) -> list[str]:
  """The addresses task `task` of the servers' job announced, one per start of its server."""
  return re.findall(rf"^{task}: env server listening on (\S+)$", log, re.M)


class SlurmEnvServersTest(absltest.TestCase):

  def test_env_servers_job_survives_a_sigkilled_server(self):
    reason = _missing_reason() or sandbox_lib.unavailable_reason()
    if reason:
      if os.environ.get("C2JAX_REQUIRE_SLURM") == "1" and _missing_reason():
        self.fail(f"C2JAX_REQUIRE_SLURM=1 but {reason}")
      self.skipTest(reason)
    t0 = time.time()
    work = pathlib.Path(tempfile.mkdtemp(prefix="c2jax-slurm-env-"))  # not create_tempdir: pytest skips absl flags
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir()
    buffer, cache = work / "buffer", os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(work / "jax_cache")
    servers_file = work / "env_servers"
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    # What the specs read; the jobs inherit it (sbatch --export=ALL, the default), the secret included.
    env.update(REPO=str(_ROOT), VENV=sys.prefix, CONFIG="configs/rl_tiny.py:single_turn", WORKDIR=str(work),
               BUFFER=str(buffer), WEIGHTS=str(work / "weights"), MESH="", JAX_COMPILATION_CACHE_DIR=str(cache),
               WAIT_CONFIG_S="600", ENV_SERVERS_FILE=str(servers_file), ENV_PORT=str(_free_port_pair()),
               C2JAX_ENV_SECRET=secrets.token_hex(16))
    cluster = SlurmCluster(env)
    self.addCleanup(cluster.stop)

    cpu_node = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1"]
    servers = cluster("sbatch", "--parsable", *cpu_node, "--ntasks-per-node=2", f"--output={logs}/env-%j.log",
                      str(_SPECS / "env_servers.sbatch")).strip()
    actors = cluster("sbatch", "--parsable", "--array=0-0", *cpu_node, "--ntasks-per-node=1",
                     f"--output={logs}/actors-%A_%a.log", str(_SPECS / "actors.sbatch")).strip()
    flags = [f for f in MULTI_TURN_FLAGS if not f.startswith(("--config.trainer.", "--config.actors.group_size"))]
    trainer = cluster("sbatch", "--parsable", *cpu_node, "--ntasks-per-node=1", f"--output={logs}/trainer-%j.log",
                      f"--export=ALL,ACTORS_JOB={actors},ENV_JOB={servers},ENV_SERVERS=2",
                      str(_SPECS / "trainer.sbatch"), *flags, f"--config.trainer.steps={STEPS}",
                      f"--config.trainer.groups_per_step={GROUPS_PER_STEP}", f"--config.actors.group_size={GROUP}",
                      "--config.trainer.take_timeout_s=300", f"--config.compilation_cache={cache}").strip()
    env_log, trainer_log = logs / f"env-{servers}.log", logs / f"trainer-{trainer}.log"

    def alive():
      for job in (trainer, servers):
        state = cluster.job(job)["JobState"]
        if state not in _LIVE:
          raise AssertionError(f"job {job} ended {state} early: {trainer_log.read_text()[-3000:]}"
                               f"{env_log.read_text()[-2000:]}")

    # The trainer read both addresses; once it trained a step, the episodes the servers host are the actor's.
    _wait("a trained step", lambda: _steps(work), 400, poll=0.05, check=alive)
    phases = {"first_step": time.time() - t0}
    self.assertLen(servers_file.read_text().split(), 2)

    def hosting() -> str | None:  # the task of a server whose last line says it hosts an episode
      last = {task: int(n) for task, n in _HOSTS.findall(env_log.read_text())}
      return next((task for task, n in sorted(last.items()) if n > 0), None)

    task = _wait("a server hosting an episode", hosting, 120, poll=0.01, check=alive)
    (address,) = _listening(env_log.read_text(), task)
    pids = subprocess.run(["pgrep", "-f", "--", f"--address={re.escape(address)}( |$)"], capture_output=True,
                          text=True).stdout.split()
    self.assertLen(pids, 1, f"the server on {address}")
    os.kill(int(pids[0]), signal.SIGKILL)
    killed_at_step = max(_steps(work))
    phases["killed"] = time.time() - t0
    self.assertLess(killed_at_step, STEPS)  # mid-run
    _wait("the killed server's restart", lambda: len(_listening(env_log.read_text(), task)) == 2, 60, check=alive)
    phases["restarted"] = time.time() - t0

    _wait("the trainer to complete", lambda: cluster.job(trainer)["JobState"] not in _LIVE, 400)
    phases["trainer_completed"] = time.time() - t0
    self.assertEqual(cluster.job(trainer)["JobState"], "COMPLETED", trainer_log.read_text()[-3000:])
    # trainer.sbatch cancels both jobs once training is over.
    _wait("the servers and the actors to be cancelled",
          lambda: [cluster.job(j)["JobState"] for j in (servers, f"{actors}_0")] == ["CANCELLED"] * 2, 120)

    # The killed server came back on its address; nothing else restarted.
    log = env_log.read_text()
    self.assertEqual(_listening(log, task), [address, address])
    other = "1" if task == "0" else "0"
    self.assertLen(_listening(log, other), 1)
    self.assertCountEqual(servers_file.read_text().split(), [address, *_listening(log, other)])

    result = _result(logs / f"trainer-{trainer}-0.out")
    self.assertEqual((result["steps"], result["groups_consumed"], result["interrupted"]),
                     (STEPS, STEPS * GROUPS_PER_STEP, False))
    trained, by_shard = trained_once(self, work, STEPS)
    self.assertLen(trained, STEPS * GROUPS_PER_STEP)
    self.assertEqual(sorted(by_shard), ["actor-0-0"])
    reader = RolloutReader(str(buffer))
    groups = reader.poll()
    self.assertGreaterEqual(len(groups), STEPS * GROUPS_PER_STEP)
    self.assertEqual(reader.stats["corrupt_groups"], 0)
    for g in groups:
      self.assertLen(g.data["tokens"], GROUP)

    # The episodes the server hosted when it died (its last line before the restart; the lines are written in the
    # order of the changes) were lost, and the actor ran each of them again.
    before_restart = log[:[m.start() for m in re.finditer(rf"^{task}: env server listening", log, re.M)][1]]
    lost = [int(n) for t, n in _HOSTS.findall(before_restart) if t == task][-1]
    self.assertGreaterEqual(lost, 1)  # the kill landed mid-episode: the count below is not vacuous
    actor_log = (logs / f"actors-{actors}_0.log").read_text()
    (line,) = [l for l in actor_log.splitlines() if l.startswith('{"actor": ')]  # its result line, on SIGTERM
    actor = json.loads(line)
    self.assertEqual(actor["env_reruns"], lost)
    print(json.dumps({"slurm_env_servers_test": {
        "seconds": round(time.time() - t0, 1), "steps": result["steps"], "killed_at_step": killed_at_step,
        "killed_task": int(task), "episodes_lost": lost, "env_reruns": actor["env_reruns"],
        "actor_groups": actor["groups"], "phases_s": {k: round(v, 1) for k, v in phases.items()}}}), flush=True)


if __name__ == "__main__":
  absltest.main()
