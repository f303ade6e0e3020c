"""An environment server: a gRPC process hosting episodes of the task suites for actors on other processes or hosts
(report section 6; docs/design/env_service.md).

  C2JAX_ENV_SECRET=... python -m c2jax.envs.service.server --address=127.0.0.1:0 --secret_env=C2JAX_ENV_SECRET \
      --max_episodes=16 [--tls_cert=server.pem --tls_key=server.key]
  # prints "env server listening on 127.0.0.1:<port>" once it serves (with --log_episodes, "env server hosts <n>
  # episodes" whenever an episode opens or closes); SIGTERM or SIGINT stops it, and it prints "env server stopped:
  # <n> episodes opened"

Methods (`wire`): Open builds the environment of a task from the suite's spec (`suites.SuiteCache`: suites are built
from their registry name and fields, cached) and returns a new episode id; Reset, Step, Reward and Close drive that
episode's `AgentEnv`, one call at a time per episode.

Every call is checked in this order, before its payload is read:
  1. the shared secret (metadata `c2jax-env-secret`, compared with `hmac.compare_digest`): UNAUTHENTICATED;
  2. the caller's token (metadata `c2jax-env-client`, 128 random bits in hex that a client draws once): an episode
     belongs to the token that opened it; a call naming another caller's episode: PERMISSION_DENIED;
  3. the payload (`wire`): INVALID_ARGUMENT.
Open beyond `max_episodes` episodes is RESOURCE_EXHAUSTED (back-pressure: the client tries another server); an
unknown episode id is NOT_FOUND (a restarted server lost its episodes); an exception of the environment is
FAILED_PRECONDITION with its one-line message (the episode's own error, ENV_ERROR at the client); a lost sandbox
(`SandboxUnavailable`) is UNAVAILABLE: this server can run no episode, the client re-runs it elsewhere.

Episodes idle for `idle_s` (their client died without closing them) are closed when the next Open arrives.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import dataclasses
import hmac
import os
import secrets
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

import grpc
import numpy as np

from c2jax.envs.core.agent_env import AgentEnv
from c2jax.envs.service import wire
from c2jax.envs.service.config import read_secret
from c2jax.envs.service.suites import SuiteCache
from c2jax.sandbox.sandbox import SandboxUnavailable

ERROR_CHARS = 500  # an environment's error message as the client sees it


@dataclasses.dataclass
class _Hosted:
  """One episode: its environment, the token of the client that opened it, and one call at a time."""

  env: AgentEnv
  client: str
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  last_used: float = dataclasses.field(default_factory=time.monotonic)


class EnvServer:
  """The episodes of one server process and the handlers of its methods (see the module docstring).

  Args:
    secret: the shared secret every call must carry.
    max_episodes: episodes hosted at once (Open beyond it: RESOURCE_EXHAUSTED).
    idle_s: an episode untouched this long is closed by the next Open.
    log: given, called with "env server hosts <n> episodes" whenever an episode opens or closes (under the lock, so
      the lines are in the order of the changes: the last one before a crash says how many episodes it lost).
  """

  def __init__(self, secret: str, max_episodes: int = 16, idle_s: float = 900.0,
               log: Callable[[str], None] | None = None):
    if max_episodes < 1:
      raise ValueError(f"EnvServer: max_episodes={max_episodes} must be >= 1.")
    self._secret = secret.encode("utf-8")
    self.max_episodes, self.idle_s = max_episodes, idle_s
    self._episodes: dict[str, _Hosted] = {}
    self._opening = 0  # Opens admitted and building their environment (they count against max_episodes)
    self.opened = 0  # episodes opened since the server started
    self._lock = threading.Lock()
    self._suites = SuiteCache()
    self._log = log

  def _hosting(self) -> None:
    """Logs how many episodes are hosted; call it holding the lock, after a change."""
    if self._log is not None:
      self._log(f"env server hosts {len(self._episodes)} episodes")

  def handler(self) -> grpc.GenericRpcHandler:
    methods = {"Open": self._open, "Reset": self._reset, "Step": self._step, "Reward": self._reward,
               "Close": self._close}
    return grpc.method_handlers_generic_handler(wire.SERVICE, {
        name: grpc.unary_unary_rpc_method_handler(self._guarded(name, fn), request_deserializer=None,
                                                  response_serializer=wire.encode)
        for name, fn in methods.items()})

  def close_all(self) -> None:
    """Closes every episode (the server stops)."""
    with self._lock:
      hosted, self._episodes = list(self._episodes.values()), {}
    for h in hosted:
      _close_quietly(h.env)

  @property
  def episodes(self) -> int:
    with self._lock:
      return len(self._episodes)

  # -- checks ---------------------------------------------------------------------------------------------------

  def _guarded(self, method: str, fn: Callable[[dict, str, grpc.ServicerContext], Any]):
    """`fn(request, client, context)` behind the secret, the caller's token and the payload's checks."""

    def handle(data: bytes, context: grpc.ServicerContext):
      metadata = dict(context.invocation_metadata())
      given = metadata.get(wire.SECRET_KEY, "")
      if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8"), self._secret):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "The environment server's shared secret is missing or wrong.")
      client = metadata.get(wire.CLIENT_KEY, "")
      if not isinstance(client, str) or not wire.valid_client_token(client):
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"A call needs the caller's token ({wire.CLIENT_TOKEN_HEX} lowercase hex digits) in metadata "
                      f"{wire.CLIENT_KEY!r}.")
      try:
        request = wire.decode(data, method)
        return fn(request, client, context)
      except wire.WireError as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    return handle

  def _hosted(self, request: dict, client: str, context, method: str) -> tuple[str, _Hosted]:
    episode = wire.episode_id(request, method)
    with self._lock:
      hosted = self._episodes.get(episode)
    if hosted is None:
      context.abort(grpc.StatusCode.NOT_FOUND, f"{method}: no episode {episode} on this server (closed, idle past "
                    f"{self.idle_s:.0f} s, or the server restarted).")
    if not hmac.compare_digest(hosted.client.encode(), client.encode()):
      context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: episode {episode} belongs to another caller.")
    return episode, hosted

  def _run_env(self, hosted: _Hosted, context, method: str, call: Callable[[], Any]) -> Any:
    """`call()` on the episode's environment, one at a time; its exception as a status (the module docstring)."""
    with hosted.lock:
      hosted.last_used = time.monotonic()
      try:
        return call()
      except SandboxUnavailable as e:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"{method}: this server's sandbox is unavailable: {e}"[:ERROR_CHARS])
      except Exception as e:  # noqa: BLE001  (whatever the policy's files made the environment raise is the episode's)
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{type(e).__name__}: {e}"[:ERROR_CHARS])
      finally:
        hosted.last_used = time.monotonic()

  # -- methods --------------------------------------------------------------------------------------------------

  def _open(self, request: dict, client: str, context) -> dict:
    spec = wire.field(request, "suite", dict, "Open")
    split = wire.field(request, "split", str, "Open")
    index = wire.field(request, "index", int, "Open")
    self._reap()
    with self._lock:
      if len(self._episodes) + self._opening >= self.max_episodes:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"This environment server hosts its maximum of {self.max_episodes} episodes.")
      self._opening += 1
    try:
      try:
        env = self._suites.agent_env(spec, split, index)
      except ValueError as e:  # an unknown suite, field, split or index: the caller's configuration
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Open: {e}"[:ERROR_CHARS])
      episode = secrets.token_hex(wire.EPISODE_ID_HEX // 2)
      with self._lock:
        self._episodes[episode] = _Hosted(env=env, client=client)
        self.opened += 1
        self._hosting()
    finally:
      with self._lock:
        self._opening -= 1
    return {"episode": episode}

  def _reset(self, request: dict, client: str, context) -> dict:
    _, hosted = self._hosted(request, client, context, "Reset")
    self._run_env(hosted, context, "Reset", hosted.env.reset)
    return {}

  def _step(self, request: dict, client: str, context) -> dict:
    _, hosted = self._hosted(request, client, context, "Step")
    ids = np.asarray(wire.step_ids(request), np.int32)
    text = wire.field(request, "text", str, "Step")
    result = self._run_env(hosted, context, "Step", lambda: hosted.env.step(ids, text))
    return wire.turn_result_plain(result)

  def _reward(self, request: dict, client: str, context) -> dict:
    _, hosted = self._hosted(request, client, context, "Reward")
    return wire.reward_plain(self._run_env(hosted, context, "Reward", hosted.env.reward))

  def _close(self, request: dict, client: str, context) -> dict:
    episode, hosted = self._hosted(request, client, context, "Close")
    with self._lock:
      if self._episodes.pop(episode, None) is not None:
        self._hosting()
    with hosted.lock:  # after a running call of the episode
      _close_quietly(hosted.env)
    return {}

  def _reap(self) -> None:
    """Closes episodes idle past `idle_s` (their client is gone) that no call is running on."""
    now = time.monotonic()
    with self._lock:
      idle = [(k, h) for k, h in self._episodes.items()
              if now - h.last_used > self.idle_s and not h.lock.locked()]
      for k, _ in idle:
        del self._episodes[k]
      if idle:
        self._hosting()
    for _, h in idle:
      _close_quietly(h.env)


def _close_quietly(env: AgentEnv) -> None:
  try:
    env.close()
  except Exception:  # noqa: BLE001  (closing is best effort: the episode is over either way)
    pass


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
  with open(key, "rb") as f:
    private_key = f.read()
  with open(cert, "rb") as f:
    chain = f.read()
  return grpc.ssl_server_credentials([(private_key, chain)])


def serve(env_server: EnvServer, address: str, credentials: grpc.ServerCredentials | None = None,
          ) -> tuple[grpc.Server, int]:
  """Starts a gRPC server for `env_server` on `address` (host:port, port 0: any free one); (server, bound port)."""
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(env_server.max_episodes + 4,
                                                             thread_name_prefix="env-server"),
                       options=[("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
                                ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
                                ("grpc.so_reuseport", 0)])  # a second server on a taken port fails, never shares it
  server.add_generic_rpc_handlers((env_server.handler(),))
  try:
    port = (server.add_secure_port(address, credentials) if credentials is not None
            else server.add_insecure_port(address))
  except RuntimeError as e:
    raise ValueError(f"The environment server cannot listen on {address!r}: {e}") from None
  if not port:
    raise ValueError(f"The environment server cannot listen on {address!r} (taken, or not this host's address).")
  server.start()
  return server, port


def _exit_with_parent(parent_pid: int) -> None:
  """The kernel SIGKILLs this server when `parent_pid` (the job that started it) dies (Linux PR_SET_PDEATHSIG): a
  killed job leaves no server holding its port. (`c2jax.services.pool.die_with_parent`, which this layer cannot
  import.)"""
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
    os._exit(1)


def arg_parser() -> argparse.ArgumentParser:
  """The server's command line (what the launch specs pass: tools/launch/)."""
  parser = argparse.ArgumentParser(prog="python -m c2jax.envs.service.server", description=__doc__.split("\n")[0])
  parser.add_argument("--address", default="127.0.0.1:0", help="host:port to listen on (port 0: any free one)")
  parser.add_argument("--secret_env", default="C2JAX_ENV_SECRET",
                      help="the environment variable holding the shared secret (never the secret itself)")
  parser.add_argument("--max_episodes", type=int, default=16)
  parser.add_argument("--idle_s", type=float, default=900.0)
  parser.add_argument("--tls_cert", default="")
  parser.add_argument("--tls_key", default="")
  parser.add_argument("--log_episodes", action="store_true",
                      help="print 'env server hosts <n> episodes' whenever an episode opens or closes (for a log "
                           "file: a pipe that nobody reads would fill and stop the server)")
  parser.add_argument("--exit_with_parent", type=int, default=0,
                      help="die when this process (the job that started the server) dies (Linux)")
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  parser = arg_parser()
  args = parser.parse_args(argv)
  if args.exit_with_parent:
    _exit_with_parent(args.exit_with_parent)
  if bool(args.tls_cert) != bool(args.tls_key):
    parser.error("--tls_cert and --tls_key go together.")
  try:
    env_server = EnvServer(read_secret(args.secret_env), args.max_episodes, args.idle_s,
                           log=(lambda line: print(line, flush=True)) if args.log_episodes else None)
    credentials = server_credentials(args.tls_cert, args.tls_key) if args.tls_cert else None
    server, port = serve(env_server, args.address, credentials)
  except (ValueError, OSError) as e:
    print(f"env server: {e}", file=sys.stderr)
    return 2
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  host = args.address.rpartition(":")[0]
  print(f"env server listening on {host}:{port}", flush=True)
  while not stop.wait(1.0):  # a timed wait: the signal handler runs between waits
    pass
  server.stop(grace=2.0).wait()
  env_server.close_all()
  print(f"env server stopped: {env_server.opened} episodes opened", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
