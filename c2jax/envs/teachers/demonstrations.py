"""SFT demonstrations: a coding suite's tasks solved by their reference solutions, in the exact chat format the RL
and evaluation policies see and emit (report section 3: a short SFT phase on coding tasks before RL).

  examples = sft_examples("tiny_functions", "train")      # [(prompt_text, response_text), ...]
  {"kind": "sft", "suite": "tiny_functions", "split": "train"}   # the same as a data source (`c2jax.data.sources`,
                                                                 # the kind registered on import of this module)

A demonstration is one episode's first turn:
  prompt   = the environment's first observation (`CodingEnv.reset`: the tool format, the budget line, the
             repository listing and, last, the task prompt); the agent loop's prompt is BOS + this observation;
  response = what `ReferencePolicy` writes: a write_file call per solution file (protocol.render), rm calls for
             the files it deletes, and finish. The sampler stops at EOS, so the tokenized response ends with EOS.
The loss falls on the response tokens (EOS included) only. Nothing is run: no sandbox is started, the listing of a
fresh repository is its sorted file paths (what `Sandbox.list_files` returns for the task's files).

An imperfect teacher. Real SFT data are traces of people or earlier models, and some of them are wrong; what RL
adds after SFT is, in part, unlearning what the demonstrations got wrong (report section 4 names one such
behaviour: incomplete tool calls, which it penalizes in RL). `copies` demonstrations per task of which exactly
`flawed` carry a `FLAWS` entry model a teacher that makes that mistake at the rate flawed / copies on every task
alike (exactly, not at random per task: a rate that varied by task would be something to memorize per prompt):

  sft_examples("tiny_compositions", copies=4, flawed=1)     # every task: 3 correct turns and 1 incomplete call

  incomplete_call   the first write_file call of the turn is cut off after its content (no closing </arg> and
                    </tool>): the parser drops it as malformed, nothing is written, the hidden tests fail.
"""

from __future__ import annotations

import dataclasses
import random
import re
import shlex
from typing import Callable, Mapping

import grain

from c2jax.data.sources import SOURCES, document_bytes
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, CodingTask, check_split
from c2jax.envs.core.env import EnvConfig, first_observation
from c2jax.envs.tools.protocol import HelpDetail, ToolCall, ToolName, render
from c2jax.envs.teachers.scripted_policies import ReferencePolicy
from c2jax.registry import Registry

# Mistakes of an imperfect teacher: (task) -> the text of a flawed turn.
FLAWS: Registry = Registry("SFT demonstration flaw")


@FLAWS.register("incomplete_call")
def incomplete_call(task: CodingTask) -> str:
  """The reference turn with its first write_file call cut off after the content (no closing tags)."""
  if not task.solution:
    raise ValueError(f"Task {task.task_id} writes no file: an incomplete write_file call needs one.")
  (path, content), *rest = sorted(task.solution.items())
  # render() closes the last argument with </arg> (or </WORD> for a value holding tags), then \n</tool>.
  call = render(ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content}))
  head = re.sub(r"</[A-Za-z0-9]+>\n</tool>$", "", call).rstrip("\n")
  calls = [ToolCall(ToolName.WRITE_FILE, {"path": p, "content": c}) for p, c in rest]
  calls += [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(p)}"}) for p in task.solution_deletes]
  return "\n".join([head] + [render(c) for c in calls] + [render(ToolCall(ToolName.FINISH, {}))])


def demonstration(task: CodingTask, config: EnvConfig = EnvConfig()) -> tuple[str, str]:
  """(prompt, response) of one task: the first observation and the reference policy's turn."""
  # A fresh sandbox copy lists exactly the task's files, sorted (what `Sandbox.list_files` returns).
  prompt = first_observation(task, config, sorted(task.files))
  return prompt, ReferencePolicy().act(task, [prompt])


def suite_tasks(suite: str, split: str, suite_options: Mapping | None = None) -> list[CodingTask]:
  """The tasks of `suite` / `split` (every task, in suite order), with `suite_options` overriding the suite's
  fields."""
  import c2jax.envs.tasks.suites  # noqa: F401  (registers suites)
  check_split(split)
  suite_obj = CODING_SUITES.get(suite)
  if suite_options:
    suite_obj = suite_obj(**dict(suite_options))
  return list(suite_obj.tasks(split))


def sft_examples(suite: str, split: str = "train", *, max_examples: int | None = None,
                 max_turns: int | None = None, max_tokens: int | None = None, instructions: str = "full",
                 suite_options: Mapping | None = None, copies: int = 1, flawed: int = 0,
                 flaw: str = "incomplete_call", seed: int = 0) -> list[tuple[str, str]]:
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
    copies: demonstrations per task (same prompt), consecutive in the result.
    flawed: how many of a task's `copies` carry `flaw` (an imperfect teacher; see the module docstring).
    flaw: a `FLAWS` name.
    seed: which of a task's copies are the flawed ones.

  Returns:
    [(prompt_text, response_text)]; tokenize as BOS + prompt (loss weight 0), response + EOS (loss weight 1).
  """
  if copies < 1 or not 0 <= flawed <= copies:
    raise ValueError(f"sft_examples: copies={copies} must be >= 1 and flawed={flawed} in [0, copies].")
  make_flawed: Callable[[CodingTask], str] = FLAWS.get(flaw)
  tasks = suite_tasks(suite, split, suite_options)
  if max_examples is not None:
    tasks = tasks[:max_examples]
  defaults = EnvConfig()
  config = dataclasses.replace(defaults, max_turns=defaults.max_turns if max_turns is None else max_turns,
                               max_tokens=defaults.max_tokens if max_tokens is None else max_tokens,
                               instructions=HelpDetail(instructions))
  rng = random.Random(seed)
  out = []
  for task in tasks:
    if task.solution is None:
      continue
    prompt, response = demonstration(task, config)
    bad = set(rng.sample(range(copies), flawed))
    out += [(prompt, make_flawed(task) if i in bad else response) for i in range(copies)]
  return out


@SOURCES.register("sft")
def sft_source(suite: str = "tiny_functions", split: str = "train", max_examples: int | None = None,
               max_turns: int | None = None, max_tokens: int | None = None, instructions: str = "full",
               suite_options: Mapping | None = None, min_bytes: int = 0, copies: int = 1, flawed: int = 0,
               flaw: str = "incomplete_call", seed: int = 0) -> grain.MapDataset:
  """The data source kind "sft": `sft_examples` as (prompt, 0) + (response, 1) parts, so the loss is on the
  assistant turn only; documents shorter than `min_bytes` UTF-8 bytes are dropped."""
  examples = sft_examples(suite, split, max_examples=max_examples, max_turns=max_turns, max_tokens=max_tokens,
                          instructions=instructions, suite_options=suite_options, copies=copies, flawed=flawed,
                          flaw=flaw, seed=seed)
  docs = [((p, 0.0), (r, 1.0)) for p, r in examples]
  return grain.MapDataset.source([d for d in docs if document_bytes(d) >= min_bytes])
