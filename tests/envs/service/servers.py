"""Environment servers for the tests: real `python -m c2jax.envs.service.server` processes on this machine."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
SECRET_ENV = "C2JAX_TEST_ENV_SECRET"
SECRET = "test-secret-0123456789abcdef0123"


class ServerProcess:
  """One server process; `address` is where it listens (host:port, read from its first line). `wait=False` returns
  once it is started (`start` starts several at once: each takes ~2 s of imports)."""

  def __init__(self, address: str = "127.0.0.1:0", *, max_episodes: int = 8, secret: str = SECRET,
               extra: tuple[str, ...] = (), wait: bool = True):
    env = {**os.environ, SECRET_ENV: secret, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "cpu"}
    # stderr to a file: a pipe nobody reads would block a server that logs past its buffer.
    self.log = tempfile.TemporaryFile(mode="w+")
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "c2jax.envs.service.server", f"--address={address}", f"--secret_env={SECRET_ENV}",
         f"--max_episodes={max_episodes}", *extra],
        stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=ROOT)
    self.address, self.port = "", 0
    if wait:
      self.wait_ready()

  def wait_ready(self) -> ServerProcess:
    """Reads the server's first line: where it listens."""
    line = self.proc.stdout.readline()
    if not line.startswith("env server listening on "):
      self.kill()
      raise RuntimeError(f"The environment server did not start: {line!r} {self.stderr()[-2000:]}")
    self.address = line.split()[-1]
    self.port = int(self.address.rpartition(":")[2])
    return self

  def kill(self) -> None:
    """SIGKILL (a lost host), then reap the process."""
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGKILL)
    self.proc.wait(timeout=30)
    self.proc.stdout.close()

  def terminate(self) -> int:
    """SIGTERM (a clean stop); its exit status."""
    self.proc.send_signal(signal.SIGTERM)
    code = self.proc.wait(timeout=30)
    self.proc.stdout.close()
    return code

  def stderr(self) -> str:
    self.log.seek(0)
    return self.log.read()


def start(n: int, **kwargs) -> list[ServerProcess]:
  """`n` servers started together, each ready."""
  servers = [ServerProcess(wait=False, **kwargs) for _ in range(n)]
  try:
    return [s.wait_ready() for s in servers]
  except BaseException:
    for s in servers:
      s.kill()
    raise
