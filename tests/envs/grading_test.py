"""Grading: hidden tests in the sandbox decide; submissions that delete, edit or add tests, forge the judge's
report or shadow the stdlib cannot game the judge; nothing a submission holds makes grading raise; the auxiliary
measures (diff size, over-editing, lint) on small examples."""

import dataclasses
import pathlib
import shutil
import subprocess
import sys
import tempfile

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
    expected_tests=3,
)

# Hidden tests that import stdlib modules only while they run: with the repository first on sys.path (as
# `unittest discover` puts it), a submitted fractions.py or statistics.py, which the runner has not imported yet,
# would be imported in their place (inspect, signal and ast too, were they not loaded already).
SHADOW_TASK = dataclasses.replace(TASK, task_id="calc_shadow", expected_tests=1, hidden_tests={
    "hidden_tests/__init__.py": "",
    "hidden_tests/test_late_imports.py": (
        "import unittest\n\nfrom calc.ops import add\n\n\nclass LateImportsTest(unittest.TestCase):\n\n"
        "    def test_add(self):\n        import fractions\n        import inspect\n        import statistics\n\n"
        "        self.assertTrue(inspect.isfunction(add))\n        self.assertEqual(statistics.mean([1, 3]), 2)\n"
        "        self.assertEqual(fractions.Fraction(2, 4), fractions.Fraction(1, 2))\n"
        "        self.assertEqual(add(2, 3), 5)\n")})

# One test whose three subTests fail and one that passes: two tests, one passed.
SUBTESTS = """\
import unittest

from calc.ops import add


class SubTests(unittest.TestCase):

    def test_many_cases(self):
        for a in range(3):
            with self.subTest(a=a):
                self.assertEqual(add(a, 1), a + 1)

    def test_zero(self):
        self.assertEqual(add(0, 0), 0)
"""
SUBTEST_TASK = dataclasses.replace(TASK, task_id="calc_subtests", expected_tests=2,
                                   hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_sub.py": SUBTESTS})

# A fake unittest summary, then an exit that skips everything after it (the real summary never prints).
FAKE_SUMMARY_EXIT = ("import os\nimport sys\n\nsys.stderr.write('\\nRan 3 tests in 0.0s\\n\\nOK\\n')\n"
                     "sys.stderr.flush()\nos._exit(0)\n")

FAKE_PASSES = "import unittest\n\n\nclass Free(unittest.TestCase):\n" + "".join(
    f"\n    def test_{i}(self):\n        pass\n" for i in range(20))


_unavailable_reason = sandbox_lib.unavailable_reason


def grade(files):
  return grading.grade(TASK, files, limits=LIMITS)


def run_judge_on_host(files: dict[str, str], modules: list[str], nonce: str = "n0nce") -> subprocess.CompletedProcess:
  """Runs the judge over trusted `files` without a sandbox (fast: for the judge's own logic)."""
  root = pathlib.Path(tempfile.mkdtemp())
  try:
    for path, content in files.items():
      (root / path).parent.mkdir(parents=True, exist_ok=True)
      (root / path).write_text(content)
    return subprocess.run(["/bin/sh", "-c", grading.judge_command(modules).replace("python3", sys.executable, 1)],
                          input=nonce + "\n", capture_output=True, text=True, cwd=root, timeout=60, check=False)
  finally:
    shutil.rmtree(root, ignore_errors=True)


class ReportTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("ok", 'log\nabc {"passed": 3, "total": 3}\n', grading.TestCounts(3, 3)),
      ("partial", 'abc {"passed": 1, "total": 4}\n', grading.TestCounts(4, 1)),
      ("last_wins", 'abc {"passed": 3, "total": 3}\nabc {"passed": 0, "total": 3}\n', grading.TestCounts(3, 0)),
      ("no_line", "Ran 3 tests in 0.0s\n\nOK\n", None),
      ("other_nonce", 'xyz {"passed": 3, "total": 3}\n', None),
      ("not_at_line_start", 'say abc {"passed": 3, "total": 3}\n', None),
      ("bad_json", "abc {passed: 3}\n", None),
      ("extra_key", 'abc {"passed": 3, "total": 3, "x": 1}\n', None),
      ("more_passed_than_run", 'abc {"passed": 4, "total": 3}\n', None),
      ("bool_counts", 'abc {"passed": true, "total": true}\n', None),
      ("float_counts", 'abc {"passed": 1.0, "total": 1.0}\n', None),
  )
  def test_parse_report(self, stdout, expected):
    self.assertEqual(grading.parse_report(stdout, "abc"), expected)

  def test_hidden_test_modules(self):
    self.assertEqual(grading.hidden_test_modules(TASK), ["hidden_tests.test_ops"])


class JudgeOnHostTest(absltest.TestCase):
  """The judge's counting, run on the host over trusted files (the sandboxed runs are in GradeTest)."""

  def report(self, files, modules):
    proc = run_judge_on_host(files, modules)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    return grading.parse_report(proc.stdout, "n0nce")

  def test_a_test_with_failing_subtests_counts_once(self):
    files = {**TASK.files, "hidden_tests/__init__.py": "", "hidden_tests/test_sub.py": SUBTESTS}
    self.assertEqual(self.report(files, ["hidden_tests.test_sub"]), grading.TestCounts(total=2, passed=1))
    fixed = {**files, **TASK.solution}
    self.assertEqual(self.report(fixed, ["hidden_tests.test_sub"]), grading.TestCounts(total=2, passed=2))

  def test_skips_unexpected_successes_and_fixture_errors_do_not_pass(self):
    source = """\
import unittest


class A(unittest.TestCase):

    def test_ok(self):
        pass

    @unittest.skip("later")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.fail()

    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass


class B(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        raise RuntimeError("fixture")

    def test_never_runs(self):
        pass
"""
    files = {"hidden_tests/__init__.py": "", "hidden_tests/test_kinds.py": source}
    # A: 4 tests, 2 passed (ok, expected failure); B: its setUpClass error counts as one failed test.
    self.assertEqual(self.report(files, ["hidden_tests.test_kinds"]), grading.TestCounts(total=5, passed=2))

  def test_a_module_that_fails_to_import_is_one_failed_test(self):
    files = {"pkg/__init__.py": "raise SystemExit(0)\n", "hidden_tests/__init__.py": "",
             "hidden_tests/test_a.py": "import unittest\nimport pkg\n\n\nclass A(unittest.TestCase):\n\n"
                                       "    def test_a(self):\n        pass\n"}
    self.assertEqual(self.report(files, ["hidden_tests.test_a", "hidden_tests.test_missing"]),
                     grading.TestCounts(total=2, passed=0))

  def test_exit_from_the_submission_leaves_no_report(self):
    files = {**TASK.files, "calc/__init__.py": FAKE_SUMMARY_EXIT, "hidden_tests/__init__.py": "",
             "hidden_tests/test_ops.py": HIDDEN}
    proc = run_judge_on_host(files, ["hidden_tests.test_ops"])
    self.assertIn("Ran 3 tests", proc.stderr)  # the fake summary printed ...
    self.assertIsNone(grading.parse_report(proc.stdout, "n0nce"))  # ... and no report: scores 0


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

  @parameterized.named_parameters(
      ("recursion_bomb", "x = " + "+".join(["1"] * 20_000) + "\n"),  # RecursionError in the AST's construction
      ("deep_unary", "x = " + "-" * 100_000 + "1\n"),  # MemoryError in the parser
      ("oversized", "x = 1\n" * (grading.LINT_MAX_CHARS // 6 + 1)),
  )
  def test_lint_count_never_raises(self, source):
    self.assertEqual(grading.lint_count("m.py", source), 1)

  def test_graded_files_belong_to_the_judge(self):
    submitted = {**TASK.files, "hidden_tests/test_free.py": FAKE_PASSES, "hidden_tests/test_ops.py": "# mine\n",
                 "hidden_tests_notes.txt": "kept"}
    graded = grading.graded_files(TASK, submitted)
    self.assertNotIn("hidden_tests/test_free.py", graded)
    self.assertEqual(graded["hidden_tests/test_ops.py"], HIDDEN)
    self.assertEqual(graded["hidden_tests_notes.txt"], "kept")

  def test_graded_files_drop_paths_that_collide_with_hidden_tests(self):
    # A file where a hidden test needs a directory, and a path under a hidden test's file.
    graded = grading.graded_files(TASK, {**TASK.files, "hidden_tests": "a file", "hidden_tests/test_ops.py/x": "y"})
    self.assertEqual(set(graded), set(TASK.files) | set(TASK.hidden_tests))
    root_level = dataclasses.replace(TASK, hidden_tests={"test_root.py": HIDDEN})
    graded = grading.graded_files(root_level, {**TASK.files, "test_root.py/x": "y", "test_root.pyc": "kept"})
    self.assertEqual(set(graded), set(TASK.files) | {"test_root.py", "test_root.pyc"})


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

  def test_fake_summary_then_exit_scores_zero(self):
    # The package's __init__ prints unittest's "OK" summary and leaves with os._exit(0) before any test runs: the
    # judge never writes its report line.
    for files in (TASK.files, TASK.solved_files()):
      terms = grade({**files, "calc/__init__.py": FAKE_SUMMARY_EXIT})
      self.assertEqual((terms["passed"], terms["pass_fraction"], terms["tests_total"]), (0.0, 0.0, 0.0))

  def test_forged_report_lines_score_zero(self):
    forged = ('import sys\nfor n in ("", "0" * 32, "nonce"):\n'
              '    print(n, \'{"passed": 3, "total": 3}\')\nsys.stdout.flush()\n')
    terms = grade({**TASK.files, "calc/__init__.py": forged})
    self.assertEqual((terms["passed"], terms["tests_total"]), (0.0, 3.0))  # the real report: 1 of 3

  def test_submitted_stdlib_modules_are_not_imported_by_the_hidden_tests(self):
    shadows = {f"{name}.py": FAKE_SUMMARY_EXIT for name in ("fractions", "statistics", "inspect", "signal", "ast")}
    start = grading.grade(SHADOW_TASK, {**SHADOW_TASK.files, **shadows}, limits=LIMITS)
    self.assertEqual((start["passed"], start["tests_total"]), (0.0, 1.0))
    # With the fix the same shadows change nothing: the hidden test ran on the stdlib and passed.
    solved = grading.grade(SHADOW_TASK, {**SHADOW_TASK.solved_files(), **shadows}, limits=LIMITS)
    self.assertEqual((solved["passed"], solved["tests_total"]), (1.0, 1.0))

  def test_subtests_count_per_test(self):
    terms = grading.grade(SUBTEST_TASK, SUBTEST_TASK.files, limits=LIMITS)
    self.assertEqual((terms["tests_total"], terms["tests_passed"], terms["pass_fraction"]), (2.0, 1.0, 0.5))
    self.assertEqual(grading.grade(SUBTEST_TASK, SUBTEST_TASK.solved_files(), limits=LIMITS)["passed"], 1.0)

  def test_a_test_count_other_than_expected_scores_zero(self):
    more = dataclasses.replace(TASK, expected_tests=4)
    terms = grading.grade(more, TASK.solved_files(), limits=LIMITS)
    self.assertEqual((terms["passed"], terms["tests_total"], terms["pass_fraction"]), (0.0, 3.0, 0.75))
    # An import that exits (SystemExit is caught as an import failure): one failed test of three expected.
    terms = grade({**TASK.solved_files(), "calc/__init__.py": "raise SystemExit(0)\n"})
    self.assertEqual((terms["passed"], terms["tests_total"], terms["pass_fraction"]), (0.0, 1.0, 0.0))

  def test_colliding_paths_score_zero_and_never_raise(self):
    for extra in ({"hidden_tests": "a file where the judge needs a directory"}, {"calc/ops.py/x": "under a file"}):
      with self.subTest(extra=sorted(extra)):
        terms = grade({**TASK.files, **extra})
        self.assertEqual(terms["passed"], 0.0)
    # The submission wins nothing from a colliding path, and with the fix it still passes.
    self.assertEqual(grade({**TASK.solved_files(), "hidden_tests": "a file"})["passed"], 1.0)
    root_level = dataclasses.replace(TASK, expected_tests=3, hidden_tests={"test_root.py": HIDDEN})
    terms = grading.grade(root_level, {**TASK.solved_files(), "test_root.py/x": "y"}, limits=LIMITS)
    self.assertEqual(terms["passed"], 1.0)

  def test_recursion_bomb_is_one_lint_finding(self):
    terms = grade({**TASK.solved_files(), "calc/big.py": "x = " + "+".join(["1"] * 20_000) + "\n"})
    self.assertEqual(terms["lint_errors"], 1.0)

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
