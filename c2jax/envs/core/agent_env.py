"""Environments as the agent loop drives them: one turn in (the sampled ids and their text), one observation out
(report section 4: RL episodes are multi-turn sessions in environments like real coding sessions).

  env = agent_env(suite, task)        # the suite's own multi-turn env, or the one-turn case of any TokenTaskSuite
  env.reset()                         # on a tool worker (a sandbox starts)
  result = env.step(ids, text)        # TurnResult(observation, notice, done, reason)
  terms = env.reward()                # the raw reward terms of the episode
  env.close()

`CodingAgentEnv` runs `CodingEnv` over a coding task in its chat format (`EnvConfig.chat_format`): the observation
is the tool results and the notice the budget line (brief), or the two pieces the model's template writes after
a turn (`chat_format.Continuation`: the tool messages, then the harness's message and the next generation prompt).
`OneTurnEnv` is the single-turn case of the same path: the episode ends after the first turn and its reward is
the suite's verifier on the sampled ids (char_class, today's single-turn coding tasks).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol

import numpy as np

from c2jax.envs.chat.chat_format import Continuation, ToolResult
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.token_tasks.suite import TokenTask, TokenTaskSuite


@dataclasses.dataclass(frozen=True)
class TurnResult:
  """What an environment returns for one model turn.

  Attributes:
    observation: the turn's tool results (appended to the trajectory as OBSERVATION tokens).
    notice: the budget line (NOTICE tokens); may be empty.
    done: the episode is over.
    reason: why, as `CodingEnv` says it ("finish", "turn_budget", "token_budget", "time_budget",
      "workdir_limit"); "finish" for an environment that ended the episode itself.
    results: the turn's tool results and the harness's notes, in order (`chat_format.ToolResult`): what a native
      chat format re-renders when the engine asks for a summary in place of the next generation prompt.
    budget: the budget line alone.
    continuation: `observation` and `notice` as markup (a native chat format's control tokens apart from the
      environment's text); None: both are the environment's text alone, without a control token (the engine
      encodes them with special-token matching off either way).
  """

  observation: str
  notice: str = ""
  done: bool = False
  reason: str = ""
  results: tuple[ToolResult, ...] = ()
  budget: str = ""
  continuation: Continuation | None = None

  def __post_init__(self):
    if self.continuation is not None and (self.continuation.observation, self.continuation.notice) != (
        self.observation, self.notice):
      raise ValueError("TurnResult: continuation must spell the observation and the notice.")


class EnvLost(Exception):
  """The episode's environment was lost with its host (a remote environment server that stopped answering), not
  ended by anything the episode did: the agent loop runs the episode again from its start in a fresh environment
  (`c2jax.actors.agent_loop`), where any other exception of an environment ends that episode alone (ENV_ERROR)."""


class AgentEnv(Protocol):
  """An episode's environment as the agent loop drives it (from a tool worker thread, one call at a time).

  Any method may raise `EnvLost` when the environment's host is gone; other exceptions are the episode's own."""

  def reset(self) -> None:
    """Starts the episode (the prompt is the task's; this prepares the tools, e.g. a sandbox)."""

  def step(self, ids: np.ndarray, text: str) -> TurnResult:
    """Runs one model turn: its sampled ids and their decoded text."""

  def reward(self) -> Mapping[str, float]:
    """The raw reward terms of the finished episode."""

  def close(self) -> None:
    """Releases the episode's resources (idempotent)."""


class CodingAgentEnv:
  """A `CodingEnv` episode over one coding task; reward terms as `CodingTaskSuite.reward` names them (outcome =
  the hidden tests' credited pass fraction, malformed_tool_calls, hack_attempts) plus the environment's own counters."""

  def __init__(self, task: CodingTask, config: EnvConfig):
    self.task = task
    self.env = CodingEnv(config)

  def reset(self) -> None:
    self.env.reset(self.task)

  def step(self, ids: np.ndarray, text: str) -> TurnResult:
    del ids
    result = self.env.step(text)
    # A step after the episode's end has no continuation: its observation alone (the engine never asks for one).
    cont = result.continuation or Continuation.plain(result.observation)
    return TurnResult(observation=cont.observation, notice=cont.notice,
                      done=result.done, reason=result.info.get("done_reason", ""), results=result.results,
                      budget=result.notice, continuation=cont)

  def reward(self) -> dict[str, float]:
    terms = dict(self.env.reward())
    # hack_attempts is absent when the workdir was past its caps and not graded: nothing was detected then.
    return {"outcome": terms["credited_fraction"], "hack_attempts": 0.0, **terms}

  def close(self) -> None:
    self.env.close()


class OneTurnEnv:
  """The one-turn case: the episode ends after the first turn; the reward is `suite.reward(task, ids)`."""

  def __init__(self, suite: TokenTaskSuite, task: TokenTask):
    self.suite, self.task = suite, task
    self._ids = np.zeros(0, np.int32)

  def reset(self) -> None:
    pass

  def step(self, ids: np.ndarray, text: str) -> TurnResult:
    del text
    self._ids = np.asarray(ids, np.int32)
    return TurnResult(observation="", done=True, reason="finish")

  def reward(self) -> Mapping[str, float]:
    return self.suite.reward(self.task, self._ids)

  def close(self) -> None:
    pass


def agent_env(suite: TokenTaskSuite, task: TokenTask) -> AgentEnv:
  """The suite's multi-turn environment for `task` (`suite.agent_env(task)`) where it has one, else the one-turn
  case over its verifier."""
  make = getattr(suite, "agent_env", None)
  return make(task) if make is not None else OneTurnEnv(suite, task)
