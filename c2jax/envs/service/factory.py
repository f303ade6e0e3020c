"""Where an episode's environment is built: in the caller's process, or on the environment servers of a run's
`EnvServiceConfig` (docs/design/env_service.md). What the actors and the held-out evaluation take, so that one run
config switch moves a run's environments without changing an episode.

  envs = env_factory(config, suite)            # config: EnvServiceConfig; in-process when not `config.remote`
  make_env = envs(task, "train", 17)           # an Episode's make_env: task 17 of the train split
  envs.close()                                 # the servers' channels (nothing in-process)

An `EnvFactory` takes the task itself and its split and index: in-process the task builds the environment
(`agent_env(suite, task)`); a server is sent the suite's spec, the split and the index (never the task's code or
files), and builds the same task from them.
"""

from __future__ import annotations

import functools
from typing import Callable, Protocol

from c2jax.envs.core.agent_env import AgentEnv, agent_env
from c2jax.envs.service.client import EnvServerPool
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.envs.service.suites import suite_spec
from c2jax.envs.token_tasks.suite import TokenTask, TokenTaskSuite


class EnvFactory(Protocol):
  """(task, split, index) -> the episode's `make_env` (called on the agent loop's thread, nothing run yet)."""

  def __call__(self, task: TokenTask, split: str | None, index: int | None) -> Callable[[], AgentEnv]: ...

  def close(self) -> None: ...


class InProcessEnvs:
  """Environments built in this process: `agent_env(suite, task)`."""

  def __init__(self, suite: TokenTaskSuite):
    self.suite = suite

  def __call__(self, task: TokenTask, split: str | None = None, index: int | None = None) -> Callable[[], AgentEnv]:
    del split, index  # the task itself builds it
    return functools.partial(agent_env, self.suite, task)

  def close(self) -> None:
    pass


class RemoteEnvs:
  """Environments on the servers of `pool`, for tasks of `suite` named by split and index."""

  def __init__(self, pool: EnvServerPool, suite: TokenTaskSuite):
    self.pool, self.spec = pool, suite_spec(suite)

  def __call__(self, task: TokenTask, split: str | None, index: int | None) -> Callable[[], AgentEnv]:
    if split is None or index is None:
      raise ValueError(f"Task {task.task_id}: an environment server builds a task from its split and index; give "
                       "both.")
    return functools.partial(self.pool.env, self.spec, split, index)

  def close(self) -> None:
    self.pool.close()


def env_factory(config: EnvServiceConfig, suite: TokenTaskSuite) -> InProcessEnvs | RemoteEnvs:
  """The environments of `suite` as `config` places them: on its servers (`config.addresses`, which a run with local
  servers has filled in with theirs: `c2jax.services.env_servers`) when it is remote, else in-process."""
  if not config.remote:
    return InProcessEnvs(suite)
  if not config.addresses:
    raise ValueError(f"EnvServiceConfig.local={config.local} servers have no addresses yet: the job that starts them "
                     "fills in `servers` for its actors.")
  return RemoteEnvs(EnvServerPool.from_config(config), suite)
