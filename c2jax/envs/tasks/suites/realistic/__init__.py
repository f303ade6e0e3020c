"""The "realistic" suite: hand-written multi-file Python repository tasks with short prompts (CursorBench style).

Each task is a directory under tasks/ in the layout of `c2jax.envs.tasks.coding_tasks` (task.json, repo/, hidden_tests/,
solution/): a small package of 2-6 modules with its own visible tests under tests/, a prompt of a sentence or two
(bugs to fix, features to add, refactors that must keep the tests green, a little performance, docs and test
writing), hidden tests that fail on the starting repository and pass with the reference solution. Stdlib only
(unittest), Python 3.11, each task's hidden tests run in well under a second (the performance tasks' slow starting
code is cut off by a 1 s deadline inside the tests).

All tasks form the "heldout" split (an evaluation suite); "train" is empty. tests/envs/tasks/suites_test.py grades every
task's reference solution and starting repository in the sandbox.

  tasks = CODING_SUITES.get("realistic").tasks("heldout")
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

from c2jax.envs.tasks.coding_tasks import CODING_SUITES, CodingTask, check_split, load_task

TASKS_DIR = pathlib.Path(__file__).resolve().parent / "tasks"


@functools.lru_cache(maxsize=4)
def _load(directory: str) -> tuple[CodingTask, ...]:
  root = pathlib.Path(directory)
  if not root.is_dir():
    raise FileNotFoundError(f"The realistic suite's task directory {root} is missing; reinstall c2jax (its "
                            "package data ships the tasks).")
  return tuple(load_task(d) for d in sorted(root.iterdir()) if (d / "task.json").is_file())


@dataclasses.dataclass(frozen=True)
class RealisticSuite:
  """The task directories under `directory`, all held out."""

  directory: str = str(TASKS_DIR)
  name: str = "realistic"

  def tasks(self, split: str) -> list[CodingTask]:
    check_split(split)
    return list(_load(self.directory)) if split == "heldout" else []

  def size(self, split: str) -> int:
    return len(self.tasks(split))

  def __call__(self, **overrides) -> RealisticSuite:
    """The suite with other fields (e.g. another `directory` of tasks in the same layout)."""
    return dataclasses.replace(self, **overrides)


REALISTIC = CODING_SUITES.register("realistic")(RealisticSuite())
