"""Grading: hidden tests in the sandbox decide; submissions that delete, edit or add tests cannot game the judge;
the auxiliary measures (diff size, over-editing, lint) on small examples."""

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs import grading
from c2jax.envs import sandbox as sandbox_lib
from c2jax.envs.coding_tasks import Category, CodingTask
from c2jax.envs.sandbox import SandboxLimits

LIMITS = SandboxLimits(wall_s=5.0, cpu_s=5, memory_mb=512, output_bytes=1 << 16)

HIDDEN = """\
import unittest

from calc.ops import add, mul


class OpsTest(unittest.TestCase):

    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_negative(self):
        self.assertEqual(add(-2, 1), -1)

    def test_mul(self):
        self.assertEqual(mul(3, 4), 12)
"""

TASK = CodingTask(
    task_id="calc_add",
    prompt="add() subtracts; fix it.",
    files={"calc/__init__.py": "",
           "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
           "tests/__init__.py": "", "tests/test_ops.py": "import unittest\n\nfrom calc.ops import mul\n\n\n"
           "class T(unittest.TestCase):\n\n    def test_mul(self):\n        self.assertEqual(mul(2, 2), 4)\n"},
    hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_ops.py": HIDDEN},
    solution={"calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"},
    category=Category.DEBUGGING,
)

FAKE_PASSES = "import unittest\n\n\nclass Free(unittest.TestCase):\n" + "".join(
    f"\n    def test_{i}(self):\n        pass\n" for i in range(20))


def _unavailable_reason() -> str | None:
  try:
    sandbox_lib.check_available()
  except sandbox_lib.SandboxUnavailable as e:
    return str(e)
  return None


def grade(files):
  return grading.grade(TASK, files, limits=LIMITS)


class SummaryTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("ok", "test_a ... ok\n\n---\nRan 3 tests in 0.001s\n\nOK\n", 3, 3),
      ("ok_skipped", "Ran 4 tests in 0.1s\n\nOK (skipped=1)\n", 4, 3),
      ("failed", "Ran 5 tests in 0.01s\n\nFAILED (failures=1, errors=2)\n", 5, 2),
      ("unexpected_success", "Ran 2 tests in 0.0s\n\nFAILED (unexpected successes=1)\n", 2, 1),
      ("expected_failure_counts", "Ran 2 tests in 0.0s\n\nOK (expected failures=1)\n", 2, 2),
      ("one_test", "Ran 1 test in 0.000s\n\nOK\n", 1, 1),
      ("no_summary", "Traceback (most recent call last):\n  ...\nKilled\n", 0, 0),
      ("summary_cut", "Ran 9 tests in 0.5s\n", 0, 0),
      ("last_summary_wins", "Ran 100 tests in 0.0s\n\nOK\nmore output\nRan 3 tests in 0.2s\n\nFAILED (errors=3)\n",
       3, 0),
  )
  def test_parse(self, output, total, passed):
    self.assertEqual(grading.parse_unittest_summary(output), grading.TestCounts(total, passed))


class MeasuresTest(parameterized.TestCase):

  def test_diff_lines(self):
    before = {"a.py": "x = 1\ny = 2\n", "gone.py": "1\n2\n3\n"}
    after = {"a.py": "x = 1\ny = 3\n", "new.py": "z\n"}
    # a.py: 1 removed + 1 added; gone.py: 3 removed; new.py: 1 added.
    self.assertEqual(grading.diff_lines(before, after), 6)
    self.assertEqual(grading.diff_lines(before, after, ignore=lambda p: p == "gone.py"), 3)
    self.assertEqual(grading.diff_lines(before, before), 0)

  @parameterized.named_parameters(
      ("clean", "import os\n\nprint(os.sep)\n", 0),
      ("unused_import", "import os\nimport sys\n\nprint(os.sep)\n", 1),
      ("unused_from_import", "from os import path, sep\n\nprint(sep)\n", 1),
      ("syntax_error", "def f(:\n  pass\n", 1),
      ("all_counts_as_use", "from os import sep\n\n__all__ = ['sep']\n", 0),
  )
  def test_lint_count(self, source, expected):
    self.assertEqual(grading.lint_count("m.py", source), expected)

  def test_graded_files_belong_to_the_judge(self):
    submitted = {**TASK.files, "hidden_tests/test_free.py": FAKE_PASSES, "hidden_tests/test_ops.py": "# mine\n",
                 "hidden_tests_notes.txt": "kept"}
    graded = grading.graded_files(TASK, submitted)
    self.assertNotIn("hidden_tests/test_free.py", graded)
    self.assertEqual(graded["hidden_tests/test_ops.py"], HIDDEN)
    self.assertEqual(graded["hidden_tests_notes.txt"], "kept")


@absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
class GradeTest(parameterized.TestCase):

  def test_reference_passes(self):
    terms = grade(TASK.solved_files())
    self.assertEqual(terms["passed"], 1.0)
    self.assertEqual(terms["pass_fraction"], 1.0)
    self.assertEqual((terms["tests_total"], terms["tests_passed"]), (3.0, 3.0))
    self.assertEqual((terms["diff_lines"], terms["over_editing"], terms["lint_errors"]), (2.0, 0.0, 0.0))
    self.assertEqual(terms["timed_out"], 0.0)

  def test_starting_repo_fails_with_partial_credit(self):
    terms = grade(TASK.files)
    self.assertEqual(terms["passed"], 0.0)
    self.assertAlmostEqual(terms["pass_fraction"], 1 / 3)

  def test_over_editing_and_lint_of_a_noisy_fix(self):
    noisy = dict(TASK.solved_files())
    noisy["calc/ops.py"] = "import os\n\n\n" + noisy["calc/ops.py"] + "\n\ndef unused_helper():\n    return 0\n"
    terms = grade(noisy)
    self.assertEqual(terms["passed"], 1.0)
    self.assertEqual(terms["diff_lines"], 2.0 + 3 + 4)  # the fix, the import + 2 blank lines, the helper
    self.assertEqual(terms["over_editing"], 7.0)
    self.assertEqual(terms["lint_errors"], 1.0)

  def test_deleting_visible_tests_does_not_pass(self):
    files = {p: c for p, c in TASK.files.items() if not p.startswith("tests/")}
    terms = grade(files)
    self.assertEqual(terms["passed"], 0.0)
    # ... and with the fix, deleting them changes nothing: the hidden tests are the judge.
    files = {p: c for p, c in TASK.solved_files().items() if not p.startswith("tests/")}
    self.assertEqual(grade(files)["passed"], 1.0)

  def test_editing_or_adding_hidden_tests_does_not_pass(self):
    files = {**TASK.files, "hidden_tests/__init__.py": "", "hidden_tests/test_ops.py": FAKE_PASSES,
             "hidden_tests/test_free.py": FAKE_PASSES}
    terms = grade(files)
    self.assertEqual(terms["passed"], 0.0)
    self.assertEqual(terms["tests_total"], 3.0)

  def test_shadowing_unittest_does_not_pass(self):
    fake = "import sys\nsys.stderr.write('Ran 3 tests in 0.0s\\n\\nOK\\n')\nsys.exit(0)\n"
    for path in ("unittest.py", "unittest/__init__.py", "sitecustomize.py"):
      with self.subTest(path=path):
        self.assertEqual(grade({**TASK.files, path: fake})["passed"], 0.0)

  def test_printed_fake_summary_does_not_pass(self):
    files = dict(TASK.files)
    files["calc/__init__.py"] = "import sys\nsys.stderr.write('\\nRan 3 tests in 0.0s\\n\\nOK\\n')\n"
    self.assertEqual(grade(files)["passed"], 0.0)

  def test_zero_tests_run_scores_zero(self):
    empty = CodingTask(task_id="empty", prompt="p", files={"a.py": "x = 1\n"},
                       hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_none.py": "import unittest\n"})
    terms = grading.grade(empty, empty.files, limits=LIMITS)
    self.assertEqual((terms["tests_total"], terms["passed"], terms["pass_fraction"]), (0.0, 0.0, 0.0))
    self.assertNotIn("over_editing", terms)  # no reference solution to measure against

  def test_timeout_scores_zero(self):
    files = dict(TASK.solved_files())
    files["calc/__init__.py"] = "while True:\n    pass\n"
    terms = grading.grade(TASK, files, limits=SandboxLimits(wall_s=1.5, cpu_s=5))
    self.assertEqual((terms["timed_out"], terms["passed"], terms["tests_total"]), (1.0, 0.0, 0.0))


if __name__ == "__main__":
  absltest.main()
