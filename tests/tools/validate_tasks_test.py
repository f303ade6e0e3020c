"""tools/validate_tasks.py: a valid task passes; a failing reference, an already-passing start and a plain assert in
the hidden tests are each flagged with why; the JSON line and exit codes (0, 1, 2 on a malformed record)."""

import contextlib
import io
import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

from c2jax.envs.tasks.coding_tasks import TaskFormatError, save_task, to_record
from c2jax.eval import task_validation
from c2jax.eval.task_validation import Problem
from c2jax.sandbox import sandbox as sandbox_lib
from tests.envs.tasks.user_tasks_test import tiny_task, write_jsonl
from tools import validate_tasks

_REPO = pathlib.Path(__file__).resolve().parents[2]
_PLAIN = "from calc import add\n\n\ndef test_add():\n  assert add(2, 3) == 5\n"


def tasks():
  return [
      tiny_task("valid"),
      tiny_task("bad_reference", solution={"calc.py": "def add(a, b):\n  return a * b\n"}),
      tiny_task("already_solved", files={"calc.py": "def add(a, b):\n  return a + b\n"}),
      # Still a unittest module the judge runs (so the gradings agree), with a plain assert in a helper.
      tiny_task("plain_assert", hidden_tests={"hidden_tests/test_calc.py": (
          "import unittest\nfrom calc import add\n\n\ndef check(x):\n  assert x == 5\n\n\n"
          "class T(unittest.TestCase):\n\n  def test_add(self):\n    check(add(2, 3))\n"),
          "hidden_tests/helpers.py": _PLAIN}),
  ]


class ValidateTasksTest(absltest.TestCase):

  def test_verdicts_and_report(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    path = write_jsonl(pathlib.Path(tempfile.mkdtemp()) / "tasks.jsonl", [to_record(t) for t in tasks()])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      code = validate_tasks.run(str(path), workers=2, progress=False)
    lines = out.getvalue().splitlines()
    self.assertEqual(code, 1)
    self.assertEqual(json.loads(lines[-1]), {
        "tasks": 4, "valid": 1, "invalid": ["bad_reference", "already_solved", "plain_assert"],
        "problems": {"plain_assert": 1, "reference_fails": 1, "start_passes": 1}})
    self.assertEqual(lines[-2], "1/4 tasks valid; invalid: bad_reference, already_solved, plain_assert")
    by_task = {line.split(":")[0]: line for line in lines[:-2]}
    self.assertEqual(set(by_task), {"bad_reference", "already_solved", "plain_assert"})
    self.assertIn("reference solution does not pass", by_task["bad_reference"])
    self.assertIn("already passes", by_task["already_solved"])
    flagged = by_task["plain_assert"]
    for word in ("hidden_tests/helpers.py:5", "hidden_tests/test_calc.py:6", "assert_import.py", "self.assertEqual"):
      self.assertIn(word, flagged)
    self.assertNotIn("reference", flagged)  # the gradings themselves agree: only the scan flags it

  def test_scan_and_missing_reference(self):
    task = tiny_task("broken", solution=None, hidden_tests={"hidden_tests/test_calc.py": "def (:\n"})
    findings = task_validation.plain_asserts(task)
    self.assertEqual([(f.problem, f.detail.split(" does")[0]) for f in findings],
                     [(Problem.UNPARSABLE_TEST, "hidden test hidden_tests/test_calc.py line 1")])
    self.assertEqual(task_validation.plain_asserts(tiny_task("ok")), [])
    # Without a solution nothing is graded for the reference: the verdict says so (no sandbox needed for this).
    verdict = task_validation.Verdict("x", (task_validation.Finding(Problem.NO_REFERENCE, "none"),))
    self.assertEqual((verdict.valid, verdict.line()), (False, "x: no_reference: none"))

  def test_exit_codes(self):
    directory = pathlib.Path(tempfile.mkdtemp())
    bad = write_jsonl(directory / "bad.jsonl", [dict(to_record(tiny_task("a")), category="poetry")])
    with self.assertRaisesRegex(TaskFormatError, r"bad.jsonl line 1: .*category 'poetry'"):
      validate_tasks.run(str(bad), progress=False)
    with self.assertRaisesRegex(TaskFormatError, "missing.jsonl does not exist"):
      validate_tasks.run(str(directory / "missing.jsonl"), progress=False)
    # The command's wiring, once: a refusal exits 2 with its one sentence and no traceback.
    refused = subprocess.run([sys.executable, "tools/validate_tasks.py", f"--tasks={bad}"], cwd=_REPO,
                             capture_output=True, text=True)
    self.assertEqual(refused.returncode, 2, refused.stderr)
    self.assertIn("bad.jsonl line 1", refused.stderr)
    self.assertNotIn("Traceback", refused.stderr)
    if sandbox_lib.unavailable_reason():
      return
    save_task(tiny_task("valid"), directory / "tasks" / "valid")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      self.assertEqual(validate_tasks.run(str(directory / "tasks"), progress=False), 0)
    self.assertEqual(json.loads(out.getvalue().splitlines()[-1])["invalid"], [])


if __name__ == "__main__":
  absltest.main()
