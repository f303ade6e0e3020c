"""A user's own tasks as the "tasks" suite: a JSONL file of records and a directory of task directories load the
same tasks, splits name their own paths, and each bad record or directory is refused naming the file and line (or
the directory) and the field."""

import json
import pathlib
import tempfile

from absl.testing import absltest

from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.tasks import suites  # noqa: F401  (registers the suites)
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, CodingTask, TaskFormatError, save_task, to_record
from c2jax.envs.tasks.user_tasks import load_tasks

_TEST = ("import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n\n"
         "  def test_add(self):\n    self.assertEqual(add(2, 3), 5)\n")


def tiny_task(task_id: str, **overrides) -> CodingTask:
  fields = dict(task_id=task_id, prompt="Make add add.", files={"calc.py": "def add(a, b):\n  return a - b\n"},
                hidden_tests={"hidden_tests/test_calc.py": _TEST}, expected_tests=1,
                solution={"calc.py": "def add(a, b):\n  return a + b\n"})
  fields.update(overrides)
  return CodingTask(**fields)


def write_jsonl(path: pathlib.Path, records) -> pathlib.Path:
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return path


class UserTasksTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = pathlib.Path(tempfile.mkdtemp())
    self.tasks = [tiny_task("a"), tiny_task("b", prompt="Again.")]

  def test_both_forms_and_splits(self):
    jsonl = write_jsonl(self.dir / "train.jsonl", [to_record(t) for t in self.tasks])
    for task in self.tasks:
      save_task(task, self.dir / "heldout" / task.task_id)
    (self.dir / "heldout" / "README.md").write_text("notes beside the tasks\n")  # not a task, not refused
    self.assertEqual(load_tasks(jsonl), self.tasks)
    self.assertEqual(load_tasks(self.dir / "heldout"), self.tasks)
    self.assertEqual(load_tasks(self.dir / "heldout" / "b"), self.tasks[1:])  # one task directory
    suite = CODING_SUITES.get("tasks")(train=str(jsonl), heldout=str(self.dir / "heldout"))
    self.assertEqual((suite.tasks("train"), suite.tasks("heldout"), suite.size("heldout")),
                     (self.tasks, self.tasks, 2))
    self.assertEqual(CODING_SUITES.get("tasks").tasks("train"), [])  # registered with both splits empty
    # The RL job's coding task names it by config (task.coding_suite, task.suite_options).
    rl_suite = CodingTaskSuite(coding_suite="tasks", suite_options={"train": str(jsonl)})
    self.assertEqual(rl_suite.size("train"), 2)
    self.assertEqual(rl_suite.coding_task(rl_suite.task("train", 1)), self.tasks[1])
    write_jsonl(jsonl, [to_record(self.tasks[0])])  # a rewritten file is read again
    self.assertEqual(suite.tasks("train"), self.tasks[:1])

  def test_refusals_name_the_place_and_field(self):
    good = to_record(self.tasks[0])
    cases = [
        ([good, "{not json"], ["line 2", "not valid JSON"]),
        ([good, {k: v for k, v in good.items() if k != "prompt"}], ["line 2", "'prompt'"]),
        ([good, dict(good, task_id="c", difficulty=7)], ["line 2", "difficulty"]),
        ([good, dict(good, task_id="c", hidden_tests={})], ["line 2", "hidden tests"]),
        ([good, good], ["line 2", "'a'", "line 1", "unique"]),
    ]
    for i, (records, words) in enumerate(cases):
      path = write_jsonl(self.dir / f"bad{i}.jsonl", records)
      with self.assertRaises(TaskFormatError) as raised:
        load_tasks(path)
      for word in words + [str(path)]:
        self.assertIn(word, str(raised.exception))
    save_task(self.tasks[0], self.dir / "dirs" / "a")
    (self.dir / "dirs" / "stray").mkdir()
    with self.assertRaisesRegex(TaskFormatError, "stray has no task.json"):
      load_tasks(self.dir / "dirs")
    (self.dir / "dirs" / "stray").rmdir()
    (self.dir / "dirs" / "a" / "task.json").write_text('{"task_id": "a", "prompt": "p", "category": "poetry"}')
    with self.assertRaisesRegex(TaskFormatError, r"dirs/a/task.json has unknown category 'poetry'"):
      load_tasks(self.dir / "dirs")
    with self.assertRaisesRegex(TaskFormatError, "does not exist"):
      load_tasks(self.dir / "missing.jsonl")
    with self.assertRaisesRegex(TaskFormatError, "heldout path .* does not exist"):
      CODING_SUITES.get("tasks")(heldout=str(self.dir / "missing")).tasks("heldout")


if __name__ == "__main__":
  absltest.main()
