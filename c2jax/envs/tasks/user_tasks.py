"""A user's own coding tasks as a suite: a JSONL file of `to_record` records or a directory of task directories.

  tasks = load_tasks("my_tasks.jsonl")                        # list[CodingTask], file order
  tasks = load_tasks("my_tasks/")                             # every task directory under it (save_task layout)
  suite = CODING_SUITES.get("tasks")(heldout="my_tasks.jsonl")  # the "tasks" suite over such paths
  # a run config: task.coding_suite="tasks", task.suite_options={"train": "train.jsonl", "heldout": "eval/"}

A path is either

  a .jsonl file   one `coding_tasks.to_record` record per line (blank lines skipped)
  a directory     one `coding_tasks.save_task` directory per task: a child holding task.json, or the directory
                  itself when it holds task.json (one task); children without task.json are refused

Splits follow the swe suite: each split names its own path ("" leaves it empty). Task ids must be unique within a
path. Every bad record or directory is refused in one sentence (`TaskFormatError`) that names the file and line, or
the directory, and the field (the checks of `coding_tasks.from_record` / `load_task`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib

from c2jax.envs.tasks.coding_tasks import (CODING_SUITES, CodingTask, TaskFormatError, check_split, from_record,
                                           load_task)

_TASK_JSON = "task.json"


def _load_jsonl(path: pathlib.Path) -> list[tuple[str, CodingTask]]:
  out = []
  with path.open(encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path} line {number}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise TaskFormatError(f"{where} is not valid JSON ({e.msg} at column {e.colno}).") from None
      try:
        out.append((where, from_record(record)))
      except TaskFormatError as e:
        raise TaskFormatError(f"{where}: {e}") from None
  return out


def _load_directory(path: pathlib.Path) -> list[tuple[str, CodingTask]]:
  if (path / _TASK_JSON).is_file():
    return [(str(path), load_task(path))]  # load_task's errors already name the directory
  out = []
  for child in sorted(path.iterdir()):
    if child.name.startswith(".") or not child.is_dir():
      continue  # a README or .git beside the tasks is not a task
    if not (child / _TASK_JSON).is_file():
      raise TaskFormatError(f"{child} has no {_TASK_JSON}; each directory under {path} must be one task "
                            "(coding_tasks.save_task's layout).")
    out.append((str(child), load_task(child)))
  return out


def load_tasks(path: str | os.PathLike) -> list[CodingTask]:
  """The tasks at `path` (a .jsonl file of records or a directory of task directories), in file or name order.

  Raises:
    TaskFormatError: the path does not exist or holds no task, or a record or directory is malformed (the message
      names the file and line, or the directory), or two tasks share an id.
  """
  path = pathlib.Path(path).expanduser()
  if path.is_dir():
    located = _load_directory(path)
  elif path.is_file():
    located = _load_jsonl(path)
  else:
    raise TaskFormatError(f"The task path {path} does not exist; give a .jsonl file of task records or a directory "
                          "of task directories.")
  if not located:
    raise TaskFormatError(f"The task path {path} holds no task.")
  seen: dict[str, str] = {}
  for where, task in located:
    if task.task_id in seen:
      raise TaskFormatError(f"{where}: task id {task.task_id!r} is also at {seen[task.task_id]}; ids must be unique.")
    seen[task.task_id] = where
  return [task for _, task in located]


def _stamp(path: pathlib.Path) -> tuple:
  """What changes when the tasks at `path` change: the (mtime, size) of every file under it."""
  files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
  return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)


@functools.lru_cache(maxsize=8)
def _cached(path: str, stamp: tuple) -> tuple[CodingTask, ...]:
  del stamp  # the cache key: rewritten tasks are read again
  return tuple(load_tasks(path))


@dataclasses.dataclass(frozen=True)
class UserTasksSuite:
  """A user's tasks as a coding suite: `train` and `heldout` name each split's path ("": empty).

  Registered as "tasks" with both empty; a run config picks the paths through the coding task's `suite_options`
  (`CODING_SUITES.get("tasks")(heldout=path)`), as for the swe suite.
  """

  train: str = ""
  heldout: str = ""
  name: str = "tasks"

  def tasks(self, split: str) -> list[CodingTask]:
    check_split(split)
    path = getattr(self, split)
    if not path:
      return []
    resolved = pathlib.Path(path).expanduser().resolve()
    if not resolved.exists():
      raise TaskFormatError(f"The tasks suite's {split} path {path} does not exist; set suite_options {split}= to "
                            "a .jsonl file of task records or a directory of task directories.")
    return list(_cached(str(resolved), _stamp(resolved)))

  def size(self, split: str) -> int:
    return len(self.tasks(split))

  def __call__(self, **overrides) -> UserTasksSuite:
    """The suite with other fields (the split paths)."""
    return dataclasses.replace(self, **overrides)


TASKS = CODING_SUITES.register("tasks")(UserTasksSuite())
