"""The run's local environment servers (`c2jax.services.env_servers`): the job's fixed ports and the addresses it
writes into the actors' config, the secret it exports (never on a command line), and a server of the local pool that
is killed being restarted by the pool on its address, where the clients find it again."""

import dataclasses
import os
import signal
import tempfile
import time

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.envs.core.agent_env import agent_env
from c2jax.envs.service.client import EnvServerLost, EnvServerPool
from c2jax.envs.service.factory import InProcessEnvs, RemoteEnvs, env_factory
from c2jax.envs.service.suites import suite_spec
from c2jax.envs.token_tasks.char_class import CharClassSuite
from c2jax.services import env_servers
from c2jax.services import rl_run_config
from c2jax.services.pool import SERVER_MODULE, LocalPool

SECRET_ENV = "C2JAX_TEST_LOCAL_ENV_SECRET"
SUITE = CharClassSuite(seed=3)


def _cfg(**env_service) -> rl_run_config.RLRunConfig:
  return rl_run_config.parse({"actors": {"episodes": "multi_turn"}, "sft": {"enabled": False},
                              "task": {"suite": "char_class"}, "env_service": env_service})


class LocalServersTest(absltest.TestCase):

  def test_no_local_servers_leave_the_config_alone(self):
    cfg = _cfg(servers="envhost:7070")
    self.assertEqual(env_servers.local_servers(cfg), (cfg, {}, {}))

  def test_the_job_fixes_ports_and_writes_the_addresses_for_its_actors(self):
    cfg = _cfg(servers="envhost:7070", local=2, max_episodes=5, secret_env=SECRET_ENV)
    resolved, members, modules = env_servers.local_servers(cfg)
    self.assertEqual(sorted(members), ["env-server-0", "env-server-1"])
    self.assertEqual(modules, {"env-server-0": SERVER_MODULE, "env-server-1": SERVER_MODULE})
    addresses = env_servers.local_addresses(members)
    self.assertLen(set(addresses), 2)
    self.assertTrue(all(a.startswith("127.0.0.1:") and int(a.rpartition(":")[2]) > 0 for a in addresses))
    self.assertEqual(resolved.env_service.addresses, ("envhost:7070", *addresses))
    self.assertEqual(resolved.env_service.local, 0)  # the servers are the job's: an actor starts none
    self.assertEqual(dataclasses.replace(resolved, env_service=cfg.env_service), cfg)  # nothing else changed
    self.assertEqual(members["env-server-1"], [f"--address={addresses[1]}", f"--secret_env={SECRET_ENV}",
                                               "--max_episodes=5"])

  def test_a_secret_is_exported_when_none_is_set_and_kept_when_one_is(self):
    cfg = _cfg(local=1, secret_env=SECRET_ENV)
    environ = {}
    self.assertEqual(env_servers.with_secret(cfg, environ), SECRET_ENV)
    first = environ[SECRET_ENV]
    self.assertLen(first, 64)
    env_servers.with_secret(cfg, environ)
    self.assertEqual(environ[SECRET_ENV], first)
    other = {}
    env_servers.with_secret(cfg, other)
    self.assertNotEqual(other[SECRET_ENV], first)  # random per run, not a constant

  def test_the_factory_follows_the_config(self):
    self.assertIsInstance(env_factory(_cfg().env_service, SUITE), InProcessEnvs)
    with self.assertRaisesRegex(ValueError, "local=2 servers have no addresses yet"):
      env_factory(_cfg(local=2).env_service, SUITE)
    os.environ[SECRET_ENV] = "s" * 32
    self.addCleanup(os.environ.pop, SECRET_ENV, None)
    remote = env_factory(_cfg(servers="127.0.0.1:1", secret_env=SECRET_ENV).env_service, SUITE)
    self.addCleanup(remote.close)
    self.assertIsInstance(remote, RemoteEnvs)
    task = SUITE.task("train", 4)
    with self.assertRaisesRegex(ValueError, "split and index"):
      remote(task, None, None)
    env = remote(task, "train", 4)()
    self.assertEqual(env._request, {"suite": suite_spec(SUITE), "split": "train", "index": 4})

  def test_wait_listening_gives_up_naming_the_server(self):
    checks = []
    with self.assertRaisesRegex(RuntimeError, "Environment server 127.0.0.1:1 does not listen after 0 s"):
      env_servers.wait_listening(["127.0.0.1:1"], lambda: checks.append(1), timeout_s=0.0)
    self.assertNotEmpty(checks)  # the pool was checked while waiting (a dead server is restarted there)


@pytest.mark.e2e  # real server processes in the job's pool
class PoolRestartsServersTest(absltest.TestCase):

  def test_a_killed_server_is_restarted_on_its_address_and_rejoins(self):
    cfg = _cfg(local=1, secret_env=SECRET_ENV, down_s=0.2, open_wait_s=30.0)
    environ = dict(os.environ)
    env_servers.with_secret(cfg, environ)
    os.environ[SECRET_ENV] = environ[SECRET_ENV]
    self.addCleanup(os.environ.pop, SECRET_ENV, None)
    cfg, members, modules = env_servers.local_servers(cfg)
    logdir = tempfile.mkdtemp()
    pool = LocalPool(logdir, members, modules=modules)
    self.addCleanup(pool.stop)
    pool.start()
    addresses = env_servers.local_addresses(members)
    env_servers.wait_listening(addresses, pool.check, timeout_s=60)
    client = EnvServerPool.from_config(cfg.env_service)
    self.addCleanup(client.close)
    task = SUITE.task("train", 2)
    ids = np.array(task.answer if hasattr(task, "answer") else [1], np.int32)

    def episode():
      env = client.env(suite_spec(SUITE), "train", 2)
      env.reset()
      result = env.step(ids, "")
      terms = env.reward()
      env.close()
      return result, terms

    local = agent_env(SUITE, task)
    local.reset()
    want = (local.step(ids, ""), local.reward())
    self.assertEqual(episode(), want)

    os.kill(pool.pids()["env-server-0"], signal.SIGKILL)
    time.sleep(0.5)
    with self.assertRaises(EnvServerLost):  # the client's episode was on the killed server
      env = client.env(suite_spec(SUITE), "train", 2)
      env.server, env.episode = client.servers[0], "0" * 32
      env.reset()
    pool.check()  # what the trainer calls while it waits: restarts the server, same argv, same port
    self.assertEqual(pool.members[0].restarts, 1)
    env_servers.wait_listening(addresses, pool.check, timeout_s=60)
    self.assertEqual(episode(), want)  # the client took the server back once down_s had passed
    pool.stop()
    log = (pool.members[0].log_path).read_text()
    self.assertIn(f"env server listening on {addresses[0]}", log)
    self.assertIn("env server stopped: 1 episodes opened", log)  # the restarted process served the second one
    self.assertNotIn(environ[SECRET_ENV], log + " ".join(pool.members[0].argv))


if __name__ == "__main__":
  absltest.main()
