"""Entry points run in processes forked from one that has already imported jax and c2jax's config modules, for the
tests that start an entry point only to see it refuse its input: each such run then costs its own work (parsing,
checking, one line on stderr), not the ~1.5 CPU-s of imports a fresh interpreter pays first (docs/design/tests.md).

A child is a real process with its own stdout, stderr, exit code, working directory and environment, running the
script or module as `__main__` (`runpy`), as `python <script>` or `python -m <module>` would. What a fresh process
would print while importing the preloaded modules, the preloading process would print instead: `Launcher` fails if it
printed anything, so such noise still fails the tests that count stderr's lines. The preloaded modules are never run
as `__main__` (runpy warns about a module already imported), and nothing may initialize a jax backend before the
fork: the environment a child is given (XLA_FLAGS included) takes effect at its first jax call.

  launcher = Launcher(env, preload=ENTRY_POINT_IMPORTS)
  proc = launcher.run(["experiments/rl_main.py", "--config.trainer.steps=x"], cwd=root, timeout=120)
  proc.returncode, proc.stdout, proc.stderr     # a subprocess.CompletedProcess
  launcher.close()
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from typing import Mapping, Sequence

# What experiments/*_main.py, c2jax.services.actor_process and tools/{convert,export}_hf.py import before they parse
# their flags (never a module that a test runs as __main__).
ENTRY_POINT_IMPORTS = (
    "jax", "absl.app", "absl.flags", "absl.logging", "c2jax.parallel.distributed", "c2jax.services.cli",
    "c2jax.services.rl_job", "c2jax.services.rl_report", "c2jax.services.rl_run_config", "c2jax.services.pretrain_loop",
    "c2jax.services.pretrain_run_config", "c2jax.eval.suite_eval", "c2jax.model.hf_convert", "c2jax.model.hf_export",
    "c2jax.actors.placement")

# The forking process: imports `preload`, then for each request line forks a child that runs it and answers its exit
# code. The child: stdin from /dev/null, stdout/stderr to the request's files, the request's cwd and environment,
# SIGALRM after `timeout` seconds (the default action ends it), the script or module as __main__.
_SERVER = r"""
import importlib, json, os, runpy, signal, sys, traceback
for name in json.loads(sys.argv[1]):
  importlib.import_module(name)
sys.stderr.flush()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
  req = json.loads(line)
  pid = os.fork()
  if pid == 0:
    code = 1
    try:
      null = os.open(os.devnull, os.O_RDONLY)
      os.dup2(null, 0)
      for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
      os.chdir(req["cwd"])
      os.environ.clear()
      os.environ.update(req["env"])
      signal.alarm(int(req["timeout"]))
      argv = req["argv"]
      try:
        if argv[0] == "-m":
          sys.argv = [argv[1]] + argv[2:]
          sys.path[0] = req["cwd"]
          runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
          sys.argv = list(argv)
          sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
          runpy.run_path(argv[0], run_name="__main__")
        code = 0
      except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
          code = e.code or 0
        else:
          print(e.code, file=sys.stderr)
    except BaseException:
      traceback.print_exc()
    finally:
      try:
        sys.stdout.flush()
        sys.stderr.flush()
      finally:
        os._exit(code)
  _, status = os.waitpid(pid, 0)
  print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class Launcher:
  """A process that has imported `preload` (module names) under `env`, and runs entry points as its forked
  children (module docstring)."""

  def __init__(self, env: Mapping[str, str], preload: Sequence[str], timeout: float = 120.0):
    self.env = dict(env)
    self._tmp = tempfile.mkdtemp(prefix="c2jax-preloaded-")
    self._errors = os.path.join(self._tmp, "preload.err")
    with open(self._errors, "w") as err:
      self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(list(preload))], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, text=True, env=self.env, cwd=self._tmp)
    ready = self._answer(timeout)
    with open(self._errors) as f:
      printed = f.read()
    if ready != {"ready": True} or printed:
      self.close()
      raise RuntimeError(f"the preloading process printed while importing {list(preload)} (a fresh process would "
                         f"print it too): {printed[-2000:]!r}; answered {ready}")

  def _answer(self, timeout: float) -> dict | None:
    assert self._proc.stdout is not None
    if not select.select([self._proc.stdout], [], [], timeout)[0]:
      return None
    line = self._proc.stdout.readline()
    return json.loads(line) if line else None

  def run(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str] | None = None,
          timeout: float = 120.0) -> subprocess.CompletedProcess:
    """`python <argv>` (a script and its arguments, or "-m", a module and its arguments) in `cwd` under `env` (the
    launcher's by default), ended after `timeout` seconds; its exit code, stdout and stderr."""
    out, err = os.path.join(self._tmp, "stdout"), os.path.join(self._tmp, "stderr")
    request = {"argv": list(argv), "cwd": cwd, "env": dict(env if env is not None else self.env), "stdout": out,
               "stderr": err, "timeout": timeout}
    assert self._proc.stdin is not None
    self._proc.stdin.write(json.dumps(request) + "\n")
    self._proc.stdin.flush()
    answer = self._answer(timeout + 30)
    if answer is None:
      raise RuntimeError(f"the preloading process did not answer for {list(argv)} (exit code {self._proc.poll()})")
    with open(out) as o, open(err) as e:
      return subprocess.CompletedProcess([sys.executable, *argv], answer["returncode"], o.read(), e.read())

  def close(self) -> None:
    if self._proc.stdin:
      self._proc.stdin.close()
    try:
      self._proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()
    if self._proc.stdout:
      self._proc.stdout.close()
    shutil.rmtree(self._tmp, ignore_errors=True)
