"""Policies the evaluation harness can run: scripted ones that prove the harness honest, and a model.

  policy = POLICIES.get("reference")()         # applies each task's reference solution: must score 100%
  text = policy.act(task, observations)         # the model text of the next turn (tool calls, see protocol.py)

Scripted policies (report section 5: an evaluation is only as good as its checks):
  reference      writes the reference solution's files (and deletes what it deletes), then finishes;
  empty          finishes at once: must score 0% (every hidden test fails on a starting repository);
  delete_tests   deletes the repository's own test files and finishes: must not pass (the hidden tests judge).
The model policy (`SamplerPolicy`) samples each turn from a c2jax checkpoint through the actors' sampler, with
the byte tokenizer: the conversation so far is the prompt, the sample is the turn.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Protocol, Sequence

import jax
import numpy as np

from c2jax.envs.coding_tasks import CodingTask
from c2jax.envs.protocol import ToolCall, ToolName, render
from c2jax.registry import Registry


class Policy(Protocol):
  """Produces the model text of one turn from the task and the observations so far (oldest first)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    ...


POLICIES: Registry = Registry("evaluation policy")


def _calls(*calls: ToolCall) -> str:
  return "\n".join(render(c) for c in calls)


@POLICIES.register("reference")
@dataclasses.dataclass(frozen=True)
class ReferencePolicy:
  """Writes the task's reference solution in its first turn (scripted; needs `task.solution`)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if task.solution is None:
      raise ValueError(f"Task {task.task_id} has no reference solution for the reference policy to apply.")
    calls = [ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content})
             for path, content in sorted(task.solution.items())]
    calls += [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(path)}"}) for path in task.solution_deletes]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


@POLICIES.register("empty")
@dataclasses.dataclass(frozen=True)
class EmptyPolicy:
  """Changes nothing."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    return _calls(ToolCall(ToolName.FINISH, {}))


@POLICIES.register("delete_tests")
@dataclasses.dataclass(frozen=True)
class DeleteTestsPolicy:
  """Deletes every file of the repository that looks like a test, then finishes (a reward hack that must fail)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    tests = sorted(p for p in task.files if "test" in p.rsplit("/", 1)[-1].lower())
    calls = [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(p)}"}) for p in tests]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


@dataclasses.dataclass
class SamplerPolicy:
  """A c2jax model as the policy of one episode (make one per episode: it keeps the episode's own turns): the
  transcript (observations and its own earlier turns) is the prompt, a sample of up to `max_new_tokens` bytes is
  the turn. The prompt keeps its last `prompt_len` tokens.

  Attributes:
    params, model: the checkpoint (`c2jax.model.checkpoint.load_checkpoint`).
    sampling: `c2jax.actors.sampling.SamplingConfig` (max_new_tokens, temperature, stop tokens).
    prompt_len: the prompt window in tokens.
    seed: sampling key; each call folds in a counter.
  """

  params: object
  model: object
  sampling: object
  prompt_len: int = 1024
  seed: int = 0
  _turns: list = dataclasses.field(default_factory=list)

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    from c2jax.actors import sampler as sampler_lib
    from c2jax.data.byte_tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    own = self._turns
    transcript = "".join(o + (own[i] if i < len(own) else "") for i, o in enumerate(observations))
    ids = tok.encode(transcript, bos=True, eos=False)[-self.prompt_len:]
    prompt = np.zeros((1, self.prompt_len), np.int32)
    prompt[0, :len(ids)] = ids
    key = jax.random.fold_in(jax.random.key(self.seed), len(own))
    out = jax.device_get(sampler_lib.generate(self.params, prompt, np.array([len(ids)], np.int32), key,
                                              cfg=self.model, sampling=self.sampling))
    n = int(out.samples.lengths[0])
    text = tok.decode(out.samples.tokens[0, len(ids):len(ids) + n])
    own.append(text)
    return text
