"""`EnvServiceConfig`: where a run's environments live and how they are reached (in-process by default).

  EnvServiceConfig()                                      # in-process: each actor runs its episodes' environments
  EnvServiceConfig(servers=("envhost-1:7070", "envhost-2:7070"), tls_ca="/etc/c2jax/ca.pem")
  EnvServiceConfig(local=2)                               # the run starts 2 servers on this machine (loopback)

The shared secret is never in the config: the config names the environment variable that holds it (`secret_env`),
on the actors' and the servers' hosts alike.
"""

from __future__ import annotations

import dataclasses
import os

MIN_SECRET_CHARS = 16


@dataclasses.dataclass(frozen=True)
class EnvServiceConfig:
  """The environment service of a run.

  Attributes:
    servers: addresses (host:port) of running environment servers, separated by commas (kept as one string, so that
      `--config.env_service.servers=envhost-1:7070,envhost-2:7070` is a command-line override; a tuple or list of
      addresses is taken too); `addresses` is the tuple.
    local: servers the run starts on this machine (`c2jax.services.pool`), bound to `bind`; 0: none.
    secret_env: the environment variable holding the shared secret (printable ASCII, at least 16 characters).
    bind: the address local servers listen on (loopback by default: nothing off this machine reaches them).
    max_episodes: episodes one local server hosts at once; Open beyond it is refused (back-pressure).
    call_timeout_s: the deadline of an Open or a Close.
    env_timeout_s: the deadline of a Reset, Step or Reward (they run the environment's tools and grading).
    open_wait_s: how long an episode waits for a server with room (all full or down) before the run stops.
    down_s: a server that stopped answering is left out of new episodes this long, then tried again.
    tls_cert / tls_key: a local server's certificate and key (PEM paths); empty: plaintext.
    tls_ca: the clients' root certificate (PEM path) to verify the servers with; empty: plaintext.
  """

  servers: str | tuple[str, ...] = ""
  local: int = 0
  secret_env: str = "C2JAX_ENV_SECRET"
  bind: str = "127.0.0.1"
  max_episodes: int = 16
  call_timeout_s: float = 30.0
  env_timeout_s: float = 900.0
  open_wait_s: float = 120.0
  down_s: float = 10.0
  tls_cert: str = ""
  tls_key: str = ""
  tls_ca: str = ""

  def __post_init__(self):
    servers = self.servers.split(",") if isinstance(self.servers, str) else self.servers
    object.__setattr__(self, "servers", ",".join(str(s).strip() for s in servers if str(s).strip()))
    if isinstance(self.local, bool) or not isinstance(self.local, int) or self.local < 0:
      raise ValueError(f"EnvServiceConfig.local={self.local!r} must be an integer >= 0 (servers the run starts).")
    if self.max_episodes < 1:
      raise ValueError(f"EnvServiceConfig.max_episodes={self.max_episodes} must be >= 1.")
    for name in ("call_timeout_s", "env_timeout_s", "open_wait_s", "down_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"EnvServiceConfig.{name}={getattr(self, name)} must be > 0.")
    for s in self.addresses:
      host, _, port = s.rpartition(":")
      if not host or not port.isdigit():
        raise ValueError(f"EnvServiceConfig.servers: {s!r} is not host:port.")
    if len(set(self.addresses)) != len(self.addresses):
      raise ValueError(f"EnvServiceConfig.servers={self.servers!r} names a server twice.")
    if not self.bind or any(c.isspace() or c in ",/" for c in self.bind):
      raise ValueError(f"EnvServiceConfig.bind={self.bind!r} must be an address of this host (e.g. 127.0.0.1).")
    if bool(self.tls_cert) != bool(self.tls_key):
      raise ValueError("EnvServiceConfig: tls_cert and tls_key go together (a server needs both).")
    if not (self.secret_env.isidentifier() and self.secret_env.isascii()):
      raise ValueError(f"EnvServiceConfig.secret_env={self.secret_env!r} must name the environment variable holding "
                       "the shared secret (letters, digits, underscores).")

  @property
  def addresses(self) -> tuple[str, ...]:
    """The addresses of `servers` (host:port each)."""
    return tuple(self.servers.split(",")) if self.servers else ()

  @property
  def remote(self) -> bool:
    """Episodes run on environment servers (else in the actor's process)."""
    return bool(self.servers) or self.local > 0


def read_secret(variable: str) -> str:
  """The shared secret from the environment variable `variable`; ValueError in one sentence if it is unset, shorter
  than MIN_SECRET_CHARS or not printable ASCII (gRPC metadata carries ASCII)."""
  secret = os.environ.get(variable, "")
  if len(secret) < MIN_SECRET_CHARS or not (secret.isascii() and secret.isprintable()):
    raise ValueError(f"Environment variable {variable} must hold the environment service's shared secret: printable "
                     f"ASCII of at least {MIN_SECRET_CHARS} characters (e.g. `python -c 'import secrets; "
                     "print(secrets.token_hex(32))'`).")
  return secret
