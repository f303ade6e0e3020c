"""A task's shortcut: a plausible submission that the task's evaluation must score low, kept in the task's metadata.

  task = dataclasses.replace(task, metadata=with_shortcut(task.metadata, {"stats.py": "..."}))
  shortcut(task)   # {"stats.py": "..."}: what the `shortcut` scripted policy writes

The complementary evaluations (report section 5) each need a policy that scores low for the right reason: the
instruction-following suite's shortcut passes the hidden tests but breaks a constraint the prompt stated; the intent
suite's solves the prompt's literal reading, which the hidden tests reject. Metadata is never shown to the agent; the
shortcut is stored there as a JSON object (path -> full new content), so a task keeps one on disk, in a record and in
a tar like the rest of its metadata.
"""

from __future__ import annotations

import json
from typing import Mapping

from c2jax.envs.tasks.coding_tasks import CodingTask, TaskFormatError, check_path

METADATA_KEY = "shortcut"


def with_shortcut(metadata: Mapping[str, str], files: Mapping[str, str]) -> dict[str, str]:
  """`metadata` with the shortcut `files` (path -> full new content) added."""
  return {**metadata, METADATA_KEY: json.dumps(dict(sorted(files.items())))}


def shortcut(task: CodingTask) -> dict[str, str]:
  """The task's shortcut files; a task without one, or with a malformed one, raises one sentence."""
  text = task.metadata.get(METADATA_KEY)
  if text is None:
    raise TaskFormatError(f"Task {task.task_id} has no shortcut (metadata {METADATA_KEY!r}); the shortcut policy "
                          "plays the instruction-following and intent suites.")
  try:
    files = json.loads(text)
  except ValueError:
    files = None
  if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
    raise TaskFormatError(f"Task {task.task_id}'s metadata {METADATA_KEY!r} must be a JSON object of path -> text.")
  return {check_path(p): c for p, c in files.items()}
