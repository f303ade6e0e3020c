"""The policy interface of a coding episode, and scripted policies that prove a suite, its grader and the harness
honest (report section 5: an evaluation is only as good as its checks).

  policy = POLICIES.get("reference")()         # applies each task's reference solution: must score 100%
  text = policy.act(task, observations)         # the model text of the next turn (tool calls, see protocol.py)

  reference      writes the reference solution's files (and deletes what it deletes), then finishes; its turn is also
                 the SFT demonstrations' response (`c2jax.envs.demonstrations`);
  empty          finishes at once: must score 0% (every hidden test fails on a starting repository);
  delete_tests   deletes the repository's own test files and finishes: must not pass (the hidden tests judge).

A model is a policy too (`c2jax.eval.policies.SamplerPolicy`).
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Protocol, Sequence

from c2jax.envs.coding_tasks import CodingTask
from c2jax.envs.protocol import ToolCall, ToolName, render
from c2jax.registry import Registry


class Policy(Protocol):
  """Produces the model text of one turn from the task and the observations so far (oldest first)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    ...


POLICIES: Registry = Registry("scripted policy")


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
