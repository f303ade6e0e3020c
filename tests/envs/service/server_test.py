"""The environment server as a process: its answers match the in-process environment's, it refuses a missing or
wrong secret and another caller's episode, listens on loopback only by default, refuses Open when full (the pool goes
to another server), speaks TLS, and a server that went away rejoins the pool when it is back.

Every server here is a real `python -m c2jax.envs.service.server` process (tests/envs/service/servers.py), killed in
tearDown; the episodes are char_class's one-turn ones (no sandbox) unless the test says otherwise.
"""

import dataclasses
import datetime
import ipaddress
import os
import signal
import socket
import tempfile
import time

from absl.testing import absltest
import grpc
import numpy as np
import pytest

from c2jax.envs.core.agent_env import agent_env
from c2jax.envs.service import wire
from c2jax.envs.service.client import EnvServerLost, EnvServerPool, EnvServiceUnavailable
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.envs.service.suites import suite_spec
from c2jax.envs.token_tasks.char_class import CharClassSuite
from tests.envs.service import servers as servers_lib
from tests.envs.service.servers import SECRET, ServerProcess

SUITE = CharClassSuite(seed=3)
SPEC = suite_spec(SUITE)
FAST = EnvServiceConfig(call_timeout_s=10.0, env_timeout_s=30.0, open_wait_s=1.0, down_s=0.5)


def _raw_call(address: str, method: str, request: dict, metadata, credentials=None):
  """One call with exactly `metadata` (what a caller that is not `EnvServerPool` may send)."""
  channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
  with channel:
    fn = channel.unary_unary(wire.method_path(method), request_serializer=wire.encode, response_deserializer=None)
    return wire.decode(fn(request, timeout=10, metadata=metadata), method)


def _other_address() -> str | None:
  """A non-loopback IPv4 address of this host, or None."""
  candidates = []
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
      s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent, the kernel only picks the outgoing interface
      candidates.append(s.getsockname()[0])
  except OSError:
    pass
  try:
    candidates += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
  except OSError:
    pass
  for address in candidates:
    if not ipaddress.ip_address(address).is_loopback and not ipaddress.ip_address(address).is_unspecified:
      return address
  return None


def _reachable(host: str, port: int) -> bool:
  try:
    with socket.create_connection((host, port), timeout=2):
      return True
  except OSError:
    return False


class _Servers(absltest.TestCase):
  """Starts servers through `self.server(...)` and kills them in tearDown."""

  def setUp(self):
    super().setUp()
    self.servers: list[ServerProcess] = []

  def tearDown(self):
    for server in self.servers:
      server.kill()
    super().tearDown()

  def server(self, *args, **kwargs) -> ServerProcess:
    server = ServerProcess(*args, **kwargs)
    self.servers.append(server)
    return server

  def start(self, n: int, **kwargs) -> list[ServerProcess]:
    started = servers_lib.start(n, **kwargs)
    self.servers += started
    return started

  def pool(self, *servers: ServerProcess, secret: str = SECRET, config: EnvServiceConfig = FAST, **kw):
    pool = EnvServerPool([s.address for s in servers], secret, config=config, **kw)
    self.addCleanup(pool.close)
    return pool


@pytest.mark.e2e
class SharedServerTest(_Servers):
  """Tests that leave their server as it was share one (started once, killed in tearDownClass)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.shared = ServerProcess()

  @classmethod
  def tearDownClass(cls):
    cls.shared.kill()
    super().tearDownClass()

  def test_an_episode_matches_the_in_process_one(self):
    pool = self.pool(self.shared)
    for index, ids in ((0, [97, 98, 99]), (5, [48, 49]), (7, [])):
      local = agent_env(SUITE, SUITE.task("train", index))
      remote = pool.env(SPEC, "train", index)
      local.reset()
      remote.reset()
      self.assertEqual(remote.step(np.asarray(ids, np.int32), "text"), local.step(np.asarray(ids, np.int32), "text"))
      self.assertEqual(remote.reward(), local.reward())
      remote.close()
      remote.close()  # idempotent
    self.assertEqual(pool.stats.opens, 3)
    self.assertEqual([s.load for s in pool.servers], [0])

  def test_a_missing_or_wrong_secret_is_unauthenticated(self):
    server = self.shared
    token = "ab" * 16
    for metadata in ((), ((wire.CLIENT_KEY, token),), ((wire.SECRET_KEY, SECRET + "x"), (wire.CLIENT_KEY, token)),
                     ((wire.SECRET_KEY, SECRET[:-1]), (wire.CLIENT_KEY, token))):
      with self.assertRaises(grpc.RpcError) as caught:
        _raw_call(server.address, "Open", {"suite": SPEC, "split": "train", "index": 0}, metadata)
      self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED, metadata)
    # The right secret with no caller token, or a malformed one, is refused too.
    for metadata in (((wire.SECRET_KEY, SECRET),), ((wire.SECRET_KEY, SECRET), (wire.CLIENT_KEY, "short"))):
      with self.assertRaises(grpc.RpcError) as caught:
        _raw_call(server.address, "Open", {"suite": SPEC, "split": "train", "index": 0}, metadata)
      self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
    # A pool with the wrong secret cannot run an episode: the run stops (a SandboxUnavailable), never trains on it.
    env = self.pool(server, secret="not-the-secret-0123456789").env(SPEC, "train", 0)
    with self.assertRaisesRegex(EnvServiceUnavailable, "UNAUTHENTICATED"):
      env.reset()
    # The right secret and a token open an episode (the control: the refusals above are the secret's).
    reply = _raw_call(server.address, "Open", {"suite": SPEC, "split": "train", "index": 0},
                      ((wire.SECRET_KEY, SECRET), (wire.CLIENT_KEY, token)))
    self.assertLen(reply["episode"], wire.EPISODE_ID_HEX)

  def test_another_callers_episode_is_refused(self):
    server = self.shared
    mine, theirs = self.pool(server), self.pool(server)
    env = mine.env(SPEC, "train", 1)
    env.reset()
    stolen = theirs.env(SPEC, "train", 1)
    stolen.server, stolen.episode = theirs.servers[0], env.episode  # another caller naming my episode
    for call in (lambda: stolen.step(np.zeros(2, np.int32), "xx"), stolen.reward, stolen.reset):
      with self.assertRaisesRegex(EnvServiceUnavailable, "PERMISSION_DENIED"):
        call()
    with self.assertRaises(grpc.RpcError) as caught:
      _raw_call(server.address, "Close", {"episode": env.episode}, ((wire.SECRET_KEY, SECRET),
                                                                    (wire.CLIENT_KEY, "cd" * 16)))
    self.assertEqual(caught.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
    # The episode is untouched: its owner still steps and grades it.
    self.assertTrue(env.step(np.asarray([97], np.int32), "a").done)
    self.assertIn("outcome", env.reward())
    env.close()

  def test_malformed_requests_are_invalid_arguments(self):
    server = self.shared
    metadata = ((wire.SECRET_KEY, SECRET), (wire.CLIENT_KEY, "ef" * 16))
    for method, request in (("Open", {"suite": {"suite": "no_such_suite"}, "split": "train", "index": 0}),
                            ("Open", {"suite": SPEC, "split": "test", "index": 0}),
                            ("Open", {"suite": {**SPEC, "no_field": 1}, "split": "train", "index": 0}),
                            ("Open", {"suite": SPEC, "split": "train", "index": True}),
                            ("Step", {"episode": "../etc", "ids": [], "text": ""})):
      with self.assertRaises(grpc.RpcError) as caught:
        _raw_call(server.address, method, request, metadata)
      self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, request)
    with self.assertRaises(grpc.RpcError) as caught:
      _raw_call(server.address, "Reset", {"episode": "0" * wire.EPISODE_ID_HEX}, metadata)
    self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)



@pytest.mark.e2e
class ServerTest(_Servers):

  def test_loopback_by_default(self):
    other = _other_address()
    if other is None:
      self.skipTest("This host has no non-loopback IPv4 address to try the server on.")
    server, everywhere = self.server(wait=False), self.server("0.0.0.0:0", wait=False)
    server.wait_ready(), everywhere.wait_ready()
    self.assertTrue(server.address.startswith("127.0.0.1:"))
    self.assertTrue(_reachable("127.0.0.1", server.port))
    self.assertFalse(_reachable(other, server.port), f"a loopback server answered on {other}")
    # The control: a server asked to listen on every address is reachable there (the check above can fail).
    self.assertTrue(_reachable(other, everywhere.port))

  def test_a_full_server_refuses_open_and_the_pool_uses_another(self):
    full, spare = self.start(2, max_episodes=1)
    holder = self.pool(full).env(SPEC, "train", 0)
    holder.reset()  # full's one episode
    pool = self.pool(full, spare)
    env = pool.env(SPEC, "train", 1)
    env.reset()
    self.assertEqual((env.server.address, pool.stats.refused, pool.stats.opens), (spare.address, 1, 1))
    # Both full: the Open waits open_wait_s for room, then the run stops.
    with self.assertRaisesRegex(EnvServiceUnavailable, "took an episode within open_wait_s"):
      pool.env(SPEC, "train", 2).reset()
    # Room again: the next Open takes it.
    holder.close()
    again = pool.env(SPEC, "train", 3)
    again.reset()
    self.assertEqual(again.server.address, full.address)
    env.close()
    again.close()

  def test_a_server_that_went_away_rejoins(self):
    first, second = self.start(2)
    pool = self.pool(first, second)
    env = pool.env(SPEC, "train", 0)
    env.reset()
    self.assertEqual(env.server.address, first.address)
    first.kill()
    with self.assertRaises(EnvServerLost):
      env.step(np.asarray([97], np.int32), "a")
    env.close()
    self.assertEqual(pool.stats.marked_down, 1)
    moved = pool.env(SPEC, "train", 1)
    moved.reset()
    self.assertEqual(moved.server.address, second.address)  # first is down
    back = self.server(first.address)  # restarted on the same port
    time.sleep(FAST.down_s + 0.1)
    rejoined = pool.env(SPEC, "train", 2)
    rejoined.reset()  # least loaded again: first (0 episodes) over second (1)
    self.assertEqual(rejoined.server.address, back.address)
    self.assertTrue(rejoined.step(np.asarray([97], np.int32), "a").done)
    moved.close()
    rejoined.close()

  def test_sigterm_stops_the_server_cleanly(self):
    server = self.server()
    env = self.pool(server).env(SPEC, "train", 0)
    env.reset()
    self.assertEqual(server.terminate(), 0)
    with self.assertRaises(EnvServerLost):
      env.step(np.asarray([97], np.int32), "a")

  def test_log_episodes_prints_the_hosted_count_in_order(self):
    server = self.server(extra=("--log_episodes",))
    pool = self.pool(server)
    first, second = pool.env(SPEC, "train", 0), pool.env(SPEC, "train", 1)
    first.reset()
    second.reset()
    first.close()
    second.close()
    server.proc.send_signal(signal.SIGTERM)
    lines = server.proc.stdout.read().splitlines()
    self.assertEqual(lines, [f"env server hosts {n} episodes" for n in (1, 2, 1, 0)]
                     + ["env server stopped: 2 episodes opened"])

  def test_the_secret_is_required_to_start(self):
    with self.assertRaisesRegex(RuntimeError, "must hold the environment service's shared secret"):
      self.server(secret="short")


def _self_signed(directory: str) -> tuple[str, str]:
  """(certificate, key) PEM paths of a self-signed certificate for 127.0.0.1 and localhost."""
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes, serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import NameOID
  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
  now = datetime.datetime.now(datetime.UTC)
  cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                      x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                         critical=False)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(key, hashes.SHA256()))
  cert_path, key_path = os.path.join(directory, "server.pem"), os.path.join(directory, "server.key")
  with open(cert_path, "wb") as f:
    f.write(cert.public_bytes(serialization.Encoding.PEM))
  with open(key_path, "wb") as f:
    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
  return cert_path, key_path


@pytest.mark.e2e
class TlsTest(_Servers):

  def setUp(self):
    super().setUp()
    try:
      import cryptography  # noqa: F401
    except ImportError:
      self.skipTest("python `cryptography` is not installed: no certificate to test TLS with.")

  def test_tls(self):
    directory = tempfile.mkdtemp()
    cert, key = _self_signed(directory)
    server = self.server(extra=(f"--tls_cert={cert}", f"--tls_key={key}"))
    config = EnvServiceConfig(call_timeout_s=10.0, env_timeout_s=30.0, open_wait_s=1.0, down_s=0.5,
                              servers=(server.address,), tls_ca=cert)
    os.environ["C2JAX_TEST_TLS_SECRET"] = SECRET
    self.addCleanup(os.environ.pop, "C2JAX_TEST_TLS_SECRET")
    pool = EnvServerPool.from_config(dataclasses.replace(config, secret_env="C2JAX_TEST_TLS_SECRET"))
    self.addCleanup(pool.close)
    env = pool.env(SPEC, "train", 4)
    env.reset()
    self.assertTrue(env.step(np.asarray([97], np.int32), "a").done)
    env.close()
    # A plaintext client gets no answer from a TLS server, whatever its secret.
    plain = self.pool(server).env(SPEC, "train", 4)
    with self.assertRaises(EnvServiceUnavailable):
      plain.reset()
    # A client that trusts another certificate refuses this server.
    other_cert, _ = _self_signed(tempfile.mkdtemp())
    with open(other_cert, "rb") as f:
      wrong = self.pool(server, root_certificates=f.read()).env(SPEC, "train", 4)
    with self.assertRaises(EnvServiceUnavailable):
      wrong.reset()


if __name__ == "__main__":
  absltest.main()
