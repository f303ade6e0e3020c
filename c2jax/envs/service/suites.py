"""A task suite named as plain data, so that an environment server builds the same suite as the actor that asks for
an episode (never pickled code): its registry name (`TASK_SUITES`) and its fields, as a run config's `task` section
holds them.

  spec = suite_spec(suite)                 # {"suite": "coding", "coding_suite": "tiny_spec", ...}
  cache = SuiteCache()
  env = cache.agent_env(spec, "train", 3)  # agent_env(the suite built from spec, its task 3 of train)
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any, Mapping

from c2jax import typed_config
from c2jax.envs.core.agent_env import AgentEnv, agent_env
from c2jax.envs.token_tasks.suite import TASK_SUITES, TokenTaskSuite, check_split


def suite_spec(suite: TokenTaskSuite) -> dict[str, Any]:
  """{"suite": the suite's registry name, field: value, ...}: JSON data that `build_suite` turns back into an equal
  suite."""
  return {"suite": suite.name, **typed_config.to_plain(suite)}


def build_suite(spec: Mapping[str, Any]) -> TokenTaskSuite:
  """The suite `spec` names; ValueError in one sentence for an unknown name or field."""
  import c2jax.envs  # noqa: F401  (registers the built-in suites)
  if not isinstance(spec, Mapping) or not isinstance(spec.get("suite"), str):
    raise ValueError(f"A suite spec needs a suite name (field 'suite'); known: {', '.join(TASK_SUITES.names())}.")
  options = dict(spec)
  return typed_config.from_plain(TASK_SUITES.get(options.pop("suite"))(), options, "suite")


class SuiteCache:
  """Suites built from specs, the `size` most recently used kept (building one may load tasks and a tokenizer)."""

  def __init__(self, size: int = 8):
    self.size = size
    self._suites: collections.OrderedDict[str, TokenTaskSuite] = collections.OrderedDict()
    self._lock = threading.Lock()

  def suite(self, spec: Mapping[str, Any]) -> TokenTaskSuite:
    key = json.dumps(spec, sort_keys=True)
    with self._lock:
      if key in self._suites:
        self._suites.move_to_end(key)
        return self._suites[key]
    suite = build_suite(spec)  # outside the lock: two first requests may both build, one is kept
    with self._lock:
      self._suites[key] = suite
      while len(self._suites) > self.size:
        self._suites.popitem(last=False)
    return suite

  def agent_env(self, spec: Mapping[str, Any], split: str, index: int) -> AgentEnv:
    """The environment of task `index` of `split` of the suite `spec` names (`agent_env`)."""
    check_split(split)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
      raise ValueError(f"A task index must be an int >= 0, not {index!r}.")
    suite = self.suite(spec)
    return agent_env(suite, suite.task(split, index))
