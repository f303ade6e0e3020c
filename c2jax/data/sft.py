"""SFT demonstrations: a coding suite's tasks solved by their reference solutions, in the exact chat format the RL
and evaluation policies see and emit (report section 3: a short SFT phase on coding tasks before RL).

  examples = sft_examples("tiny_functions", "train")      # [(prompt_text, response_text), ...]
  {"kind": "sft", "suite": "tiny_functions", "split": "train"}   # the same as a pipeline source (sources.py)

A demonstration is one episode's first turn:
  prompt   = the environment's first observation (`CodingEnv.reset`: the tool format, the budget line, the
             repository listing and, last, the task prompt). `SamplerPolicy` feeds BOS + the transcript, and the transcript of a
             first turn is exactly this observation;
  response = what `ReferencePolicy` writes: a write_file call per solution file (protocol.render), rm calls for
             the files it deletes, and finish. The sampler stops at EOS, so the tokenized response ends with EOS.
The loss falls on the response tokens (EOS included) only. Nothing is run: no sandbox is started, the listing of a
fresh repository is its sorted file paths (what `Sandbox.list_files` returns for the task's files).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from c2jax.envs.coding_tasks import CODING_SUITES, CodingTask, check_split
from c2jax.envs.env import EnvConfig, first_observation
from c2jax.envs.protocol import HelpDetail
from c2jax.eval.policies import ReferencePolicy

def demonstration(task: CodingTask, config: EnvConfig = EnvConfig()) -> tuple[str, str]:
  """(prompt, response) of one task: the first observation and the reference policy's turn."""
  # A fresh sandbox copy lists exactly the task's files, sorted (what `Sandbox.list_files` returns).
  prompt = first_observation(task, config, sorted(task.files))
  return prompt, ReferencePolicy().act(task, [prompt])


def sft_examples(suite: str, split: str = "train", *, max_examples: int | None = None,
                 max_turns: int | None = None, max_tokens: int | None = None, instructions: str = "full",
                 suite_options: Mapping | None = None) -> list[tuple[str, str]]:
  """Demonstrations of the tasks of `suite` / `split` that have a reference solution, in suite order.

  Args:
    suite: a name in `CODING_SUITES` ("tiny_functions", "realistic").
    split: "train" or "heldout".
    max_examples: the first this many tasks (None: all).
    max_turns, max_tokens: the episode budget the first observation states (the environment's defaults when None;
      set them to the RL / evaluation run's `EnvConfig` so the prompt matches).
    instructions: the first observation's tool-format help, "full", "brief" or "none" (`protocol.HelpDetail`; as the
      RL / evaluation run's `EnvConfig.instructions`).
    suite_options: fields of the suite object to override (e.g. {"max_difficulty": 1} for tiny_functions).

  Returns:
    [(prompt_text, response_text)]; tokenize as BOS + prompt (loss weight 0), response + EOS (loss weight 1).
  """
  import c2jax.envs.suites  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (registers suites)
  check_split(split)
  suite_obj = CODING_SUITES.get(suite)
  if suite_options:
    suite_obj = suite_obj(**dict(suite_options))
  tasks = suite_obj.tasks(split)
  if max_examples is not None:
    tasks = tasks[:max_examples]
  defaults = EnvConfig()
  config = dataclasses.replace(defaults, max_turns=defaults.max_turns if max_turns is None else max_turns,
                               max_tokens=defaults.max_tokens if max_tokens is None else max_tokens,
                               instructions=HelpDetail(instructions))
  return [demonstration(t, config)
          for t in tasks if t.solution is not None]
