"""Coding tasks as actor tasks: one turn of `CodingEnv` per sample (report section 4, RL on coding tasks).

  suite = TASK_SUITES.get("coding")(coding_suite="tiny_functions", instructions="brief")
  task = suite.task("train", 17)             # prompt = BOS + the environment's first observation (byte tokens)
  terms = suite.reward(task, generated)      # {"outcome": fraction of hidden tests passed, "malformed_tool_calls": n}

A sample is the model's first (and only) turn: its tool calls run in a fresh sandbox copy of the task, then the
hidden tests grade the repository as the turn left it, whether or not the turn called finish. Single-turn
episodes are what the token-level actor loop samples; multi-turn episodes (observations fed back) are the
evaluation harness's (`c2jax.eval`) and a later actor's.

The prompt is the exact text `CodingEnv.reset` returns (and `c2jax.data.sft` trains on), so a model SFT'd on
the suite's demonstrations meets the same prompt in RL.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.coding_tasks import CODING_SUITES, CodingTask
from c2jax.envs.env import CodingEnv, EnvConfig, first_observation
from c2jax.envs.protocol import HelpDetail
from c2jax.envs.tasks import TASK_SUITES, Task, check_split


@functools.lru_cache(maxsize=16)
def _tasks(suite: str, split: str) -> tuple[CodingTask, ...]:
  import c2jax.envs.suites  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (registers suites)
  tasks = tuple(t for t in CODING_SUITES.get(suite).tasks(split) if t.solution is not None)
  if not tasks:
    raise ValueError(f"Coding suite {suite!r} has no {split} tasks with a reference solution.")
  return tasks


@TASK_SUITES.register("coding")
@dataclasses.dataclass(frozen=True)
class CodingTaskSuite:
  """A coding suite (`CODING_SUITES`) as single-turn verifiable tasks over byte tokens.

  Attributes:
    coding_suite: the coding suite's name in `CODING_SUITES` ("tiny_functions", "realistic"); a run config
      selects it with task.suite="coding", task.coding_suite=<name>.
    seed: unused by the tasks (a coding suite's tasks are fixed); kept so every actor suite takes one.
    max_turns / max_tokens: the budget line of the first observation (as the SFT data's).
    instructions: "full" or "brief" tool-format help in the prompt (`protocol.HelpDetail`).
    name: the registry name, the prefix of task ids.
  """

  coding_suite: str = "tiny_functions"
  seed: int = 0
  max_turns: int = 8
  max_tokens: int = 8192
  instructions: str = "brief"
  name: str = "coding"

  @property
  def env_config(self) -> EnvConfig:
    return EnvConfig(max_turns=self.max_turns, max_tokens=self.max_tokens,
                     instructions=HelpDetail(self.instructions))

  def size(self, split: str) -> int:
    check_split(split)
    return len(_tasks(self.coding_suite, split))

  def coding_task(self, task: Task) -> CodingTask:
    _, split, index = task.task_id.rsplit("/", 2)
    return _tasks(self.coding_suite, split)[int(index)]

  def task(self, split: str, index: int) -> Task:
    check_split(split)
    tasks = _tasks(self.coding_suite, split)
    index = int(index) % len(tasks)
    # What `CodingEnv.reset` returns: a fresh copy lists exactly the task's files, sorted.
    text = first_observation(tasks[index], self.env_config, sorted(tasks[index].files))
    prompt = tuple(int(t) for t in ByteTokenizer().encode(text, bos=True, eos=False))
    return Task(task_id=f"{self.name}/{self.coding_suite}/{split}/{index}", prompt=prompt, text=text)

  def reward(self, task: Task, generated: np.ndarray) -> dict[str, float]:
    """Runs the sampled turn in a fresh sandbox and grades it: outcome = the hidden tests' pass fraction."""
    text = ByteTokenizer().decode(generated)
    with CodingEnv(self.env_config) as env:
      env.reset(self.coding_task(task))
      env.step(text)
      terms = env.reward()
    return {"outcome": terms["pass_fraction"], "malformed_tool_calls": terms["malformed_tool_calls"]}
