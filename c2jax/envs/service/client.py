"""Episodes on environment servers: `EnvServerPool` picks a server per episode, `RemoteEnv` is the episode's
`AgentEnv` over it (docs/design/env_service.md).

  pool = EnvServerPool.from_config(EnvServiceConfig(servers=("envhost-1:7070", "envhost-2:7070")))
  make_env = functools.partial(pool.env, suite_spec(suite), "train", 17)   # an Episode's make_env
  env = make_env()          # nothing on the network yet (the agent loop calls this on its own thread)
  env.reset()               # on a tool worker: Open on a server, then Reset there
  result = env.step(ids, text); terms = env.reward(); env.close()

Choosing a server (`EnvServerPool.open`): the least loaded of the servers not marked down (episodes this pool has
open on each; ties in turn), sticky for the episode's life. A server that answers RESOURCE_EXHAUSTED (full) is passed
over for this Open; one that does not answer (unreachable, past the deadline) is marked down for `down_s` and then
tried again (a restarted server rejoins). When every server is full or down the Open waits and retries, up to
`open_wait_s`.

What a caller sees:
  EnvServerLost          the episode's server stopped answering, or lost the episode (restarted): an `EnvLost`,
                         which the agent loop answers by running the episode again from its start, elsewhere;
  RemoteEnvError         the environment raised on the server (the episode's own error: ENV_ERROR);
  EnvServiceUnavailable  no server will run episodes for this pool: the secret, the token or the suite spec was
                         refused, or no server had room within `open_wait_s`. A `SandboxUnavailable`, which the agent
                         loop lets end the run (training on episodes that never ran would hide it).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import grpc
import numpy as np

from c2jax.envs.core.agent_env import EnvLost, TurnResult
from c2jax.envs.service import wire
from c2jax.envs.service.config import EnvServiceConfig, read_secret
from c2jax.sandbox.sandbox import SandboxUnavailable

_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)


class EnvServerLost(EnvLost):
  """The episode's environment server stopped answering or lost the episode (see the module docstring)."""


class RemoteEnvError(RuntimeError):
  """The episode's environment raised on its server, or answered something that is not a result."""


class EnvServiceUnavailable(SandboxUnavailable):
  """No environment server will run this pool's episodes (see the module docstring)."""


class _ServerFull(Exception):
  """An Open answered RESOURCE_EXHAUSTED."""


@dataclasses.dataclass
class PoolStats:
  """opens: episodes opened; refused: Opens a full server refused; marked_down: times a server was marked down;
  lost: calls that found their episode's server gone."""

  opens: int = 0
  refused: int = 0
  marked_down: int = 0
  lost: int = 0


class _Server:
  """One server as this pool sees it: its channel's methods, the episodes it holds for the pool, when it is up."""

  def __init__(self, address: str, channel: grpc.Channel):
    self.address, self.channel = address, channel
    self.methods = {name: channel.unary_unary(wire.method_path(name), request_serializer=wire.encode,
                                              response_deserializer=None) for name in wire.METHODS}
    self.load = 0
    self.down_until = 0.0


class EnvServerPool:
  """The environment servers of one client (an actor process); thread-safe.

  Args:
    addresses: the servers, host:port.
    secret: the shared secret.
    config: deadlines, down time, the wait for room (`EnvServiceConfig`; its `servers` are not read here).
    root_certificates: PEM of the CA to verify the servers with (TLS); None: plaintext channels.
    clock, sleep: time (tests).
  """

  def __init__(self, addresses: Sequence[str], secret: str, *, config: EnvServiceConfig = EnvServiceConfig(),
               root_certificates: bytes | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep):
    if not addresses:
      raise ValueError("EnvServerPool needs at least one server address.")
    self.config, self._clock, self._sleep = config, clock, sleep
    self._metadata = ((wire.SECRET_KEY, secret), (wire.CLIENT_KEY, secrets.token_hex(wire.CLIENT_TOKEN_HEX // 2)))
    backoff_ms = max(100, int(config.down_s * 1000))
    # A channel to a server that went away reconnects within down_s of its return (gRPC's default backoff grows to
    # two minutes, which would keep a restarted server out long after it is marked up).
    options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
               ("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)),
               ("grpc.min_reconnect_backoff_ms", min(backoff_ms, 1000)),
               ("grpc.max_reconnect_backoff_ms", backoff_ms)]
    credentials = grpc.ssl_channel_credentials(root_certificates) if root_certificates is not None else None
    self.servers = [_Server(a, grpc.secure_channel(a, credentials, options) if credentials is not None
                            else grpc.insecure_channel(a, options)) for a in addresses]
    self.stats = PoolStats()
    self._lock = threading.Lock()
    self._turn = 0  # where ties between equally loaded servers start (round-robin)

  @classmethod
  def from_config(cls, config: EnvServiceConfig, addresses: Sequence[str] | None = None) -> EnvServerPool:
    """The pool of `addresses` (default: `config.addresses`), its secret read from `config.secret_env`."""
    root = None
    if config.tls_ca:
      with open(config.tls_ca, "rb") as f:
        root = f.read()
    return cls(tuple(addresses if addresses is not None else config.addresses), read_secret(config.secret_env),
               config=config, root_certificates=root)

  def env(self, suite: Mapping[str, Any], split: str, index: int) -> RemoteEnv:
    """The environment of task `index` of `split` of the suite named by `suite` (`suites.suite_spec`), on a server
    chosen at its `reset`."""
    return RemoteEnv(self, dict(suite), split, int(index))

  def close(self) -> None:
    for server in self.servers:
      server.channel.close()

  def __enter__(self) -> EnvServerPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- choosing a server ----------------------------------------------------------------------------------------

  def _pick(self, passed: set[str]) -> _Server | None:
    """The least loaded server that is up and not in `passed`, its load counted (None: none)."""
    now = self._clock()
    with self._lock:
      n = len(self.servers)
      up = [(s.load, (i - self._turn) % n, i) for i, s in enumerate(self.servers)
            if s.down_until <= now and s.address not in passed]
      if not up:
        return None
      _, _, i = min(up)
      self._turn = (i + 1) % n
      self.servers[i].load += 1
      return self.servers[i]

  def release(self, server: _Server) -> None:
    with self._lock:
      server.load -= 1

  def open(self, request: Mapping[str, Any]) -> tuple[_Server, str]:
    """(the server, the episode id) of an Open of `request` on the first server that takes it (the module
    docstring)."""
    deadline = self._clock() + self.config.open_wait_s
    passed: set[str] = set()
    pause = 0.05
    while True:
      server = self._pick(passed)
      if server is None:
        if self._clock() >= deadline:
          raise EnvServiceUnavailable(
              f"No environment server of {', '.join(s.address for s in self.servers)} took an episode within "
              f"open_wait_s={self.config.open_wait_s} s (all full or not answering).")
        passed.clear()
        self._sleep(pause)
        pause = min(2 * pause, 1.0)
        continue
      passed.add(server.address)
      try:
        reply = self.call(server, "Open", request, self.config.call_timeout_s)
        episode = wire.episode_id(reply, "Open")
      except (_ServerFull, EnvServerLost):
        self.release(server)
        continue
      except BaseException:
        self.release(server)
        raise
      with self._lock:
        self.stats.opens += 1
      return server, episode

  def call(self, server: _Server, method: str, request: Mapping[str, Any], timeout: float) -> dict:
    """`method` on `server`; its failure as the module docstring's exceptions."""
    try:
      reply = server.methods[method](request, timeout=timeout, metadata=self._metadata)
    except grpc.RpcError as e:
      code, details = e.code(), e.details()
      said = f"environment server {server.address}: {method}: {code.name}: {details}"
      if code is grpc.StatusCode.RESOURCE_EXHAUSTED and method == "Open":
        with self._lock:
          self.stats.refused += 1
        raise _ServerFull(said) from None
      if code in _LOST or code is grpc.StatusCode.NOT_FOUND:
        with self._lock:
          self.stats.lost += 1
          if code in _LOST:  # not answering; NOT_FOUND: it answers, but restarted without the episode
            server.down_until = self._clock() + self.config.down_s
            self.stats.marked_down += 1
        raise EnvServerLost(said) from None
      if code in _REFUSED:
        raise EnvServiceUnavailable(f"The {said} (a run's configuration: the secret in "
                                    f"{self.config.secret_env}, the suite spec).") from None
      raise RemoteEnvError(said) from None
    try:
      return wire.decode(reply, method)
    except wire.WireError as e:
      raise RemoteEnvError(f"environment server {server.address}: {e}") from None


class RemoteEnv:
  """An `AgentEnv` on an environment server: Open at `reset`, every later call on the same server."""

  def __init__(self, pool: EnvServerPool, suite: dict, split: str, index: int):
    self.pool = pool
    self._request = {"suite": suite, "split": split, "index": index}
    self.server: _Server | None = None
    self.episode: str | None = None
    self._released = False
    self._lost = False

  def _call(self, method: str, **request) -> dict:
    if self.server is None or self.episode is None:
      raise RuntimeError(f"RemoteEnv.{method.lower()} before reset: the episode has no server yet.")
    if self._released:
      raise RuntimeError(f"RemoteEnv.{method.lower()} after close.")
    try:
      return self.pool.call(self.server, method, {"episode": self.episode, **request},
                            self.pool.config.env_timeout_s)
    except EnvServerLost:
      self._lost = True
      raise

  def reset(self) -> None:
    if self.server is None:
      self.server, self.episode = self.pool.open(self._request)
    self._call("Reset")

  def step(self, ids: np.ndarray, text: str) -> TurnResult:
    reply = self._call("Step", ids=[int(i) for i in np.asarray(ids).reshape(-1)], text=text)
    try:
      return wire.turn_result(reply)
    except wire.WireError as e:
      raise RemoteEnvError(f"environment server {self.server.address}: {e}") from None

  def reward(self) -> dict[str, float]:
    try:
      return wire.reward_terms(self._call("Reward"))
    except wire.WireError as e:
      raise RemoteEnvError(f"environment server {self.server.address}: {e}") from None

  def close(self) -> None:
    """Closes the episode on its server (best effort: a lost server has nothing to close); idempotent."""
    if self.server is None or self._released:
      return
    self._released = True
    if self._lost:
      self.pool.release(self.server)
      return
    try:
      self.pool.call(self.server, "Close", {"episode": self.episode}, self.pool.config.call_timeout_s)
    except (EnvServerLost, RemoteEnvError, EnvServiceUnavailable):
      pass  # the server is gone or forgot the episode; its idle reaper closes what is left
    finally:
      self.pool.release(self.server)
