"""Coding tasks as actor tasks (report section 4, RL on coding tasks): single-turn samples, or multi-turn episodes
of `CodingEnv` through the agent loop.

  suite = TASK_SUITES.get("coding")(coding_suite="tiny_functions", instructions="brief")
  task = suite.task("train", 17)             # prompt = BOS + the environment's first observation (tokenized)
  suite = TASK_SUITES.get("coding")(coding_suite="swe", tokenizer="/ckpt/hf", chat_format="deepseek_v3",
                                    suite_options={"train": "gym.jsonl"})  # a real model's own format
  terms = suite.reward(task, generated)      # {"outcome": credited pass fraction, "malformed_tool_calls", ...}
  env = suite.agent_env(task)                # a multi-turn episode (`c2jax.envs.core.agent_env.CodingAgentEnv`)

`reward` grades a single-turn sample: the model's first turn, whose tool calls run in a fresh sandbox copy of the
task; then the hidden tests grade the repository as the turn left it, whether or not the turn called finish.
`agent_env` is the multi-turn episode the agent loop (`c2jax.actors.agent_loop`) drives: observations are fed
back until the model finishes or a budget ends it, and the hidden tests grade what it left.

The prompt is the exact text `CodingEnv.reset` returns (and `c2jax.envs.teachers.demonstrations` trains on), so a model
SFT'd on the suite's demonstrations meets the same prompt in RL; with a native chat format (`chat_format`) it is that
text as the user message of the model's own template (`c2jax.envs.chat.chat_tokens.ChatTokens.prompt`), and the
episode speaks the model's tool-call syntax.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Mapping

import numpy as np

from c2jax import typed_config
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs.teachers import suite_tokenizer
from c2jax.envs.core.agent_env import CodingAgentEnv
from c2jax.envs.chat.chat_format import CHAT_FORMATS
from c2jax.envs.chat.chat_tokens import ChatTokens
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig, first_observation
from c2jax.envs.tools.protocol import HelpDetail
from c2jax.envs.token_tasks.suite import TASK_SUITES, TokenTask, check_split


@functools.lru_cache(maxsize=16)
def _tasks(suite: str, split: str, options: tuple[tuple[str, Any], ...] = ()) -> tuple[CodingTask, ...]:
  import c2jax.envs.tasks.suites  # noqa: F401  (registers suites)
  suite_obj = CODING_SUITES.get(suite)
  if options:
    suite_obj = suite_obj(**dict(options))
  tasks = tuple(t for t in suite_obj.tasks(split) if t.solution is not None)
  if not tasks:
    raise ValueError(f"Coding suite {suite!r} ({dict(options) or 'defaults'}) has no {split} tasks with a "
                     "reference solution.")
  return tasks


@functools.lru_cache(maxsize=4)
def _tokenizer(spec: str, suite: str):
  return make_tokenizer(suite_tokenizer.resolve(spec, suite))


@functools.lru_cache(maxsize=4)
def _chat_tokens(name: str, spec: str, suite: str) -> ChatTokens:
  return ChatTokens.of(name, _tokenizer(spec, suite))


@TASK_SUITES.register("coding")
@dataclasses.dataclass(frozen=True)
class CodingTaskSuite:
  """A coding suite (`CODING_SUITES`) as single-turn verifiable tasks over tokens (bytes by default).

  Attributes:
    coding_suite: the coding suite's name in `CODING_SUITES` ("tiny_functions", "realistic"); a run config
      selects it with task.suite="coding", task.coding_suite=<name>.
    seed: unused by the tasks (a coding suite's tasks are fixed); kept so every actor suite takes one.
    max_turns / max_tokens: the budget line of the first observation (as the SFT data's).
    instructions: "full", "brief" or "none" tool-format help in the prompt (`protocol.HelpDetail`).
    suite_options: fields of the coding suite to override, e.g. {"max_difficulty": 1} for tiny_functions (as the
      SFT source's `suite_options`); stored as sorted (name, value) pairs so the suite stays hashable.
    tokenizer: "byte" (the default), the path of a tokenizer.json, or "bpe:<vocab_size>" (a BPE of the suite's own
      train text, trained on first use and cached: `c2jax.envs.teachers.suite_tokenizer`): how prompts are encoded and
      samples decoded; the SFT (`c2jax.services.warm_start`) uses the same one, and the model's vocab_size must
      cover it.
    chat_format: the episodes' chat format (`c2jax.envs.chat.chat_format.CHAT_FORMATS`): "brief" (the raw text the tiny
      models are trained on), or a real model's own, "deepseek_v3" / "kimi_k2", whose control tokens the
      tokenizer must hold (the model's own tokenizer.json).
    reward_workers: samples graded at once (`c2jax.envs.token_tasks.suite.rewards`): each waits on its own sandbox and
      judge processes, so a few threads overlap their start-up (4 give ~2x on 2 cores; tools/bench_sandbox.py).
    name: the registry name, the prefix of task ids.
  """

  coding_suite: str = "tiny_functions"
  seed: int = 0
  max_turns: int = 8
  max_tokens: int = 8192
  instructions: str = "brief"
  suite_options: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
  tokenizer: str = "byte"
  chat_format: str = "brief"
  reward_workers: int = 4
  name: str = dataclasses.field(default="coding", metadata={typed_config.PLAIN: False})  # the registry name
  # What `reward` and the multi-turn episode report (c2jax.envs.token_tasks.suite.reward_terms): stored in the buffer,
  # logged as reward_raw/<term>, and weighted by the run's rl.reward.weights.
  reward_terms: ClassVar[tuple[str, ...]] = ("outcome", "malformed_tool_calls", "hack_attempts")

  def __post_init__(self):
    CHAT_FORMATS.get(self.chat_format)  # an unknown name is refused now, with the known ones
    options = self.suite_options.items() if hasattr(self.suite_options, "items") else self.suite_options
    # Lists (what JSON makes of tuples) become tuples: the options key a cache of the suite's tasks.
    object.__setattr__(self, "suite_options", tuple(sorted(
        (str(k), tuple(v) if isinstance(v, list) else v) for k, v in options)))

  @property
  def env_config(self) -> EnvConfig:
    return EnvConfig(max_turns=self.max_turns, max_tokens=self.max_tokens,
                     instructions=HelpDetail(self.instructions), chat_format=self.chat_format)

  def size(self, split: str) -> int:
    check_split(split)
    return len(_tasks(self.coding_suite, split, self.suite_options))

  def coding_task(self, task: TokenTask) -> CodingTask:
    _, split, index = task.task_id.rsplit("/", 2)
    return _tasks(self.coding_suite, split, self.suite_options)[int(index)]

  def task(self, split: str, index: int) -> TokenTask:
    check_split(split)
    tasks = _tasks(self.coding_suite, split, self.suite_options)
    index = int(index) % len(tasks)
    # What `CodingEnv.reset` returns: a fresh copy lists exactly the task's files, sorted.
    text = first_observation(tasks[index], self.env_config, sorted(tasks[index].files))
    prompt = tuple(int(t) for t in self.chat_tokens().prompt(text))
    return TokenTask(task_id=f"{self.name}/{self.coding_suite}/{split}/{index}", prompt=prompt, text=text)

  def text_tokenizer(self):
    """How this suite's prompts are encoded and samples decoded (`tokenizer`)."""
    return _tokenizer(self.tokenizer, self.coding_suite)

  def chat_tokens(self) -> ChatTokens:
    """The chat format over the suite's tokenizer (prompts, turn texts, the end-of-turn token)."""
    return _chat_tokens(self.chat_format, self.tokenizer, self.coding_suite)

  def agent_env(self, task: TokenTask) -> CodingAgentEnv:
    """A multi-turn episode of `task` (its first observation is `task.prompt`'s text)."""
    return CodingAgentEnv(self.coding_task(task), self.env_config)

  def reward(self, task: TokenTask, generated: np.ndarray) -> dict[str, float]:
    """Runs the sampled turn in a fresh sandbox and grades it: outcome = the hidden tests' credited pass fraction
    (`grading.grade`'s "credited_fraction": a canary passing alone costs a pass); the terms
    of `REWARD_TERMS`."""
    text = self.chat_tokens().turn_text(generated)
    with CodingEnv(self.env_config) as env:
      env.reset(self.coding_task(task))
      env.step(text)
      terms = env.reward()
    return {"outcome": terms["credited_fraction"], "malformed_tool_calls": terms["malformed_tool_calls"],
            "hack_attempts": terms.get("hack_attempts", 0.0)}  # absent when the workdir was not graded
