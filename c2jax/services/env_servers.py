"""The run's local environment servers (`env_service.local = N`): N `python -m c2jax.envs.service.server` processes
in the job's local pool (`c2jax.services.pool`), started before the actors (docs/design/env_service.md).

  cfg = with_secret(cfg)                           # exports a random shared secret when none is set
  cfg, members, modules = local_servers(cfg)       # fixed free ports; cfg.env_service.servers now names them
  pool = LocalPool(logdir, {**members, **actors}, modules=modules)
  wait_listening(local_addresses(members), pool.check)   # before the trainer's evaluation and the actors' episodes

Each server gets a port of its own, chosen by the job (a free one of `bind`) and kept across its restarts: a server
that dies is restarted by the pool like an actor, on the same address, and the clients that marked it down take it
back (`EnvServerPool`: down for `down_s`, then tried again). The actors, the evaluator and the trainer read the
addresses from the run config the job writes (`servers`, with `local` set to 0 there: the servers are the job's).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import time
from typing import Callable

from c2jax.services.pool import SERVER_MODULE
from c2jax.services.rl_run_config import RLRunConfig

SERVER_PREFIX = "env-server-"  # pool member names, and their log files <workdir>/logs/env-server-<i>.log


def with_secret(cfg: RLRunConfig, environ: dict | None = None) -> str:
  """The shared secret of a run with local servers: the one in `secret_env` if set, else a new random one exported
  there (`environ`, default `os.environ`), which the pool's processes inherit. The secret never appears on a command
  line. Returns the variable's name."""
  environ = os.environ if environ is None else environ
  name = cfg.env_service.secret_env
  if not environ.get(name):
    environ[name] = secrets.token_hex(32)
  return name


def free_ports(n: int, host: str) -> list[int]:
  """`n` distinct ports of `host` that are free now (bound to port 0, then released). Another process may take one
  before its server binds it: that server then fails to start, and the pool's restarts end the run with its log."""
  sockets = []
  try:
    for _ in range(n):
      s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
      sockets.append(s)
      s.bind((host, 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def local_servers(cfg: RLRunConfig, ports: list[int] | None = None,
                  ) -> tuple[RLRunConfig, dict[str, list[str]], dict[str, str]]:
  """(cfg with the local servers' addresses added to `env_service.servers` and `local` 0, {member name: server
  arguments}, {member name: SERVER_MODULE}) of `cfg.env_service.local` servers on `ports` (default: free ones)."""
  es = cfg.env_service
  if es.local == 0:
    return cfg, {}, {}
  ports = free_ports(es.local, es.bind) if ports is None else ports
  host = f"[{es.bind}]" if ":" in es.bind else es.bind
  addresses = [f"{host}:{p}" for p in ports]
  tls = [f"--tls_cert={es.tls_cert}", f"--tls_key={es.tls_key}"] if es.tls_cert else []
  members = {f"{SERVER_PREFIX}{i}": [f"--address={a}", f"--secret_env={es.secret_env}",
                                     f"--max_episodes={es.max_episodes}", *tls] for i, a in enumerate(addresses)}
  resolved = dataclasses.replace(es, servers=",".join(es.addresses + tuple(addresses)), local=0)
  return (dataclasses.replace(cfg, env_service=resolved), members, {name: SERVER_MODULE for name in members})


def local_addresses(members: dict[str, list[str]]) -> list[str]:
  """The addresses of the servers among pool `members` (`local_servers`)."""
  return [a.split("=", 1)[1] for name, args in members.items() if name.startswith(SERVER_PREFIX)
          for a in args if a.startswith("--address=")]


def wait_listening(addresses: list[str], check: Callable[[], None], timeout_s: float = 120.0,
                   clock: Callable[[], float] = time.monotonic) -> None:
  """Returns once each of `addresses` accepts a connection; `check()` between tries (the pool's: restarts a server
  that died, raises when one keeps dying). RuntimeError after `timeout_s`."""
  waiting = list(addresses)
  deadline = clock() + timeout_s
  while waiting:
    host, _, port = waiting[0].rpartition(":")
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
      waiting.pop(0)
      continue
    except OSError:
      pass
    check()
    if clock() > deadline:
      raise RuntimeError(f"Environment server {waiting[0]} does not listen after {timeout_s:.0f} s (see its log "
                         f"under <workdir>/logs/{SERVER_PREFIX}*.log).")
    time.sleep(0.2)
