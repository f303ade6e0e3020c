"""The policy interface of a coding episode, and scripted policies that prove a suite, its grader and the harness
honest (report section 5: an evaluation is only as good as its checks).

  policy = POLICIES.get("reference")()         # applies each task's reference solution: must score 100%
  text = policy.act(task, observations)         # the model text of the next turn (tool calls, see protocol.py)

  reference      writes the reference solution's files (and deletes what it deletes), then finishes; its turn is also
                 the SFT demonstrations' response (`c2jax.envs.demonstrations`);
  empty          finishes at once: must score 0% (every hidden test fails on a starting repository);
  delete_tests   deletes the repository's own test files and finishes: must not pass (the hidden tests judge).
  explorer       the reference solution over several turns, as an agent works: looks around (1-3 turns), writes the
                 solution, checks it (1-2 turns), finishes: 5-8 tool calls in 4-7 turns, fixed per task (the agent
                 loop's benchmark and tests force it through the engine).

A model is evaluated through the agent loop instead (`c2jax.eval.harness.evaluate_model`).
"""

from __future__ import annotations

import dataclasses
import hashlib
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


@POLICIES.register("explorer")
@dataclasses.dataclass(frozen=True)
class ExplorerPolicy:
  """The reference solution over several turns, as an agent works (scripted; needs `task.solution`): 1-3 turns
  looking around (read a file, grep for definitions, read another), a turn writing the solution, 1-2 turns checking
  (a listing and a syntax check, then printing what it wrote), then finish: 4-7 turns and 5-8 tool calls, the
  counts fixed per task by a hash of its id (episodes of different lengths, as real agents' are)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if task.solution is None:
      raise ValueError(f"Task {task.task_id} has no reference solution for the explorer policy to apply.")
    n = int.from_bytes(hashlib.blake2b(task.task_id.encode(), digest_size=4).digest(), "little")
    reads, checks = 1 + n % 3, 1 + (n // 3) % 2
    files = sorted(task.files) or ["."]
    written = sorted(task.solution)
    looks = [ToolCall(ToolName.READ_FILE, {"path": files[0]}),
             ToolCall(ToolName.GREP, {"pattern": r"def |class ", "path": "."}),
             ToolCall(ToolName.READ_FILE, {"path": files[-1]})]
    py = " ".join(shlex.quote(p) for p in written if p.endswith(".py"))
    verify = [[ToolCall(ToolName.RUN, {"command": "ls -R"}),
               ToolCall(ToolName.RUN, {"command": f"python3 -m py_compile {py} && echo compiled" if py else
                                       "echo nothing to compile"})],
              [ToolCall(ToolName.RUN, {"command": f"cat -- {shlex.quote(written[0])}" if written else "ls"})]]
    turn = len(observations) - 1
    if turn < reads:
      return _calls(looks[turn])
    if turn == reads:
      calls = [ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content})
               for path, content in sorted(task.solution.items())]
      calls += [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(p)}"}) for p in task.solution_deletes]
      return _calls(*calls)
    if turn <= reads + checks:
      return _calls(*verify[turn - reads - 1])
    return _calls(ToolCall(ToolName.FINISH, {}))
