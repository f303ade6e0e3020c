"""Small hand-written tasks kept inline (the instruction-following, intent and interruption suites): a repository of a
file or two, one hidden test module, a reference solution and a shortcut (`c2jax.envs.tasks.shortcuts`); and the
suite that holds such tasks for evaluation only.

  task = inline_task("instructions", "tax_total", prompt, files={...}, tests="...", solution={...},
                     shortcut={...}, evaluation="instruction_following")
  SUITE = CODING_SUITES.register("instructions")(HeldOutSuite("instructions", (task, ...)))

The hidden test module is hidden_tests/test_<task id>.py; its tests use `self.assertXxx` (the grader decides each
check on the host), and `expected_tests` counts its `def test_` methods.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from c2jax.envs.tasks import shortcuts
from c2jax.envs.tasks.coding_tasks import Category, CodingTask, HIDDEN_TESTS_DIR, check_split

_TEST_METHOD = re.compile(r"^    def test_\w+\(self", re.M)


def inline_task(suite: str, task_id: str, prompt: str, *, files: Mapping[str, str], tests: str,
                solution: Mapping[str, str], shortcut: Mapping[str, str], evaluation: str,
                category: Category = Category.FEATURE, metadata: Mapping[str, str] | None = None) -> CodingTask:
  """The `CodingTask` (module docstring); `metadata` adds to {"suite", "evaluation", "shortcut"}."""
  meta = shortcuts.with_shortcut({"suite": suite, "evaluation": evaluation, **(metadata or {})}, shortcut)
  return CodingTask(
      task_id=f"{suite}/{task_id}",
      prompt=prompt,
      files=dict(files),
      hidden_tests={f"{HIDDEN_TESTS_DIR}/__init__.py": "", f"{HIDDEN_TESTS_DIR}/test_{task_id}.py": tests},
      expected_tests=len(_TEST_METHOD.findall(tests)),
      solution=dict(solution),
      category=category,
      difficulty=1,
      metadata=meta,
  )


@dataclasses.dataclass(frozen=True)
class HeldOutSuite:
  """An evaluation suite of hand-written tasks: all of them in "heldout"; "train" is empty. Registered as its own
  factory (calling it returns it), as `CODING_SUITES` entries are."""

  name: str
  held_out: tuple[CodingTask, ...]

  def tasks(self, split: str) -> list[CodingTask]:
    check_split(split)
    return list(self.held_out) if split == "heldout" else []

  def size(self, split: str) -> int:
    return len(self.tasks(split))

  def __call__(self) -> HeldOutSuite:
    return self
