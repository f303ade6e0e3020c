"""Checks a user's coding tasks before training: the reference passes, the starting repository fails, and the
hidden tests hold no plain asserts (c2jax.eval.task_validation).

  python tools/validate_tasks.py --tasks=my_tasks.jsonl [--workers=2]    # or --tasks=my_tasks/ (task directories)

Prints one line per invalid task (what failed, why), a summary line, and last a JSON line
{"tasks", "valid", "invalid": [task ids], "problems": {problem: tasks}}. Exit code 0 when every task is valid, 1
when some are not, 2 on bad input (a path that does not exist, a malformed record or directory).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags

from c2jax.envs.tasks.coding_tasks import TaskFormatError
from c2jax.envs.tasks.user_tasks import load_tasks
from c2jax.eval import task_validation
from c2jax.services import cli

_TASKS = flags.DEFINE_string("tasks", None, "A .jsonl file of task records (coding_tasks.to_record) or a directory "
                             "of task directories (coding_tasks.save_task).", required=True)
_WORKERS = flags.DEFINE_integer("workers", 2, "Gradings in flight (sandboxes).", lower_bound=1)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar over the gradings.")


def run(path: str, workers: int = 2, progress: bool = True) -> int:
  """Validates the tasks at `path`, prints the report; returns the exit code (0 all valid, 1 some not). Bad input
  raises TaskFormatError."""
  tasks = load_tasks(path)
  verdicts = task_validation.validate(tasks, workers=workers, progress=progress)
  for verdict in verdicts:
    if not verdict.valid:
      print(verdict.line())
  result = task_validation.summary(verdicts)
  print(f"{result['valid']}/{result['tasks']} tasks valid" +
        (f"; invalid: {', '.join(result['invalid'])}" if result["invalid"] else ""))
  print(json.dumps(result, sort_keys=True), flush=True)
  return 0 if not result["invalid"] else 1


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; use --tasks.")
  try:
    code = run(_TASKS.value, _WORKERS.value, _PROGRESS.value)
  except TaskFormatError as e:  # the loader's one-sentence refusal, naming the file and line or directory
    cli.refuse(str(e))
  sys.exit(code)


if __name__ == "__main__":
  app.run(main)
