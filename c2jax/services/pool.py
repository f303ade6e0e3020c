"""A local pool of actor (and evaluator) processes, and of the run's local environment servers: what the RL job
(`c2jax.services.rl_job`) starts next to the trainer.

Each member is a `python -m c2jax.services.actor_process` subprocess with its own log file (the module path, not a
script's: an installed c2jax starts its own actors; an environment server is `python -m c2jax.envs.service.server`,
`SERVER_MODULE`). The trainer calls `check()`
while it waits for rollouts, so a crashed actor stops the run with its last log lines instead of a silent hang,
and `stop()` on the way out (SIGTERM: actors finish the sampler call in progress, then exit; SIGKILL after a
grace period). External actors (any machine that reaches the buffer and weight URLs) need no pool.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys

from absl import logging

# The directory that holds the c2jax package: first on the members' path, so they run this very copy (a checkout
# that is not installed, or the installed package).
_ROOT = pathlib.Path(__file__).resolve().parents[2]
ACTOR_MODULE = "c2jax.services.actor_process"
SERVER_MODULE = "c2jax.envs.service.server"


def child_env() -> dict:
  """The environment of an actor process: this process's, less the fake-device flag a test may have set.

  Its other XLA flags stay the trainer's: they are part of every compiled program's cache key, so an actor reads the
  programs the trainer's evaluation compiled (the same agent engine at the same shapes) instead of compiling its own.
  One Eigen thread per actor (`--xla_cpu_multi_thread_eigen=false`, set here before) gave the actors their own keys,
  and made no measurable difference to a step (docs/benchmarks.md, tools/bench_model.py)."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags)
  env["PYTHONPATH"] = os.pathsep.join([str(_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  return env


def die_with_parent(parent_pid: int) -> None:
  """Called by a pool member at start-up: the kernel SIGKILLs it when `parent_pid` (the trainer) dies (Linux
  PR_SET_PDEATHSIG), so a SIGKILLed trainer leaves no orphan writing to a shard that its restart gives to a new
  actor of the same id. (A SIGKILLed actor loses nothing: its unfinished groups are re-run.)"""
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
    os._exit(1)


@dataclasses.dataclass
class Member:
  name: str
  argv: list[str]
  log_path: pathlib.Path
  process: subprocess.Popen | None = None
  restarts: int = 0


class LocalPool:
  """Starts, watches and stops a set of actor processes (`ACTOR_MODULE`) and environment servers."""

  def __init__(self, logdir: str | os.PathLike, members: dict[str, list[str]], *, max_restarts: int = 3,
               env: dict | None = None, optional: tuple[str, ...] = (), modules: dict[str, str] | None = None):
    """`optional` members (the evaluator) that keep failing are given up with a warning instead of stopping the
    run. `modules`: {name: the module a member runs} for members other than actors (default `ACTOR_MODULE`); members
    start in the order of `members`, every one with `--exit_with_parent`."""
    modules = modules or {}
    self.optional = set(optional)
    self.max_restarts = max_restarts
    self.env = env if env is not None else child_env()
    self.logdir = pathlib.Path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    parent = [f"--exit_with_parent={os.getpid()}"]
    self.members = [Member(name, [sys.executable, "-m", modules.get(name, ACTOR_MODULE)] + list(args) + parent,
                           self.logdir / f"{name}.log") for name, args in members.items()]

  def _launch(self, m: Member) -> None:
    with open(m.log_path, "ab") as log:
      # A new session: Ctrl-C reaches only the trainer, which then stops the pool in order.
      m.process = subprocess.Popen(m.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                   start_new_session=True)

  def start(self) -> LocalPool:
    for m in self.members:
      self._launch(m)
    return self

  def check(self) -> None:
    """Restarts a member that died (a crash, the OOM killer, a SIGKILL: it resumes its unfinished groups), up to
    `max_restarts` times each; then raises RuntimeError naming it, with the end of its log."""
    for m in self.members:
      if m.process is None or m.process.poll() is None:
        continue
      tail = m.log_path.read_text(errors="replace").splitlines()[-20:]
      if m.restarts >= self.max_restarts and m.name in self.optional:
        logging.warning("%s exited with code %s after %d restart(s); going on without it (see %s)", m.name,
                        m.process.returncode, m.restarts, m.log_path)
        m.process = None
        continue
      if m.restarts >= self.max_restarts:
        raise RuntimeError(f"{m.name} exited with code {m.process.returncode} after {m.restarts} restart(s); "
                           f"last lines of {m.log_path}:\n" + "\n".join(tail))
      m.restarts += 1
      logging.warning("%s exited with code %s; restarting it (%d/%d)", m.name, m.process.returncode, m.restarts,
                      self.max_restarts)
      self._launch(m)

  def pids(self) -> dict[str, int]:
    return {m.name: m.process.pid for m in self.members if m.process is not None}

  def stop(self, grace_s: float = 20.0) -> None:
    for m in self.members:
      if m.process is not None and m.process.poll() is None:
        m.process.send_signal(signal.SIGTERM)
    for m in self.members:
      if m.process is None:
        continue
      try:
        m.process.wait(timeout=grace_s)
      except subprocess.TimeoutExpired:
        m.process.kill()
        m.process.wait()

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()
