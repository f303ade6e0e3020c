"""Grading a submission: hidden tests in a fresh sandbox decide the reward; auxiliary signals are reported apart.

  terms = grade(task, sandbox.files())
  terms["passed"], terms["pass_fraction"], terms["over_editing"], terms["lint_errors"]

The outcome (report section 4: tests decide the reward) comes from the task's hidden tests, run by
`task.test_command` in a fresh sandbox holding the submitted files with the hidden tests written over them:

  * the hidden tests are written AFTER the submission, so a submission cannot edit or delete them, and every
    submitted file inside a directory that holds hidden tests is dropped first (the judge's directories belong to
    the judge: a submitted `hidden_tests/test_free_points.py` would otherwise add passing tests);
  * the repository's own tests are not the judge: deleting or weakening them changes nothing;
  * the counts come from the LAST unittest summary in the output ("Ran N tests" then "OK" / "FAILED (failures=a,
    errors=b, ...)"), so text printed by the submission while the tests run cannot stand in for it; no summary
    (a crash, a timeout, an interpreter killed by a limit) or zero tests run scores 0;
  * `python3 -I` starts the runner with the repository off sys.path, so a submitted `unittest.py` or
    `sitecustomize.py` does not replace it.
The hidden tests import the submitted code into the judge's interpreter, so code written to tamper with unittest
from inside (patching TestCase, an atexit handler printing a summary) is not caught here: these checks close the
cheap shortcuts, and the over-editing and lint signals make tampering visible in reports.

The terms (all floats, so they flow into reward composition unchanged):

  pass_fraction  tests passed / tests run (0 when none ran). Passed = ran - failures - errors - skipped -
                 unexpected successes.
  passed         1.0 when at least one test ran and all passed, else 0.0.
  tests_total, tests_passed
  diff_lines     the size of the submission's change to the starting repository: lines added plus lines removed
                 (difflib over each path; an added file counts all its lines, a deleted file all of its lines).
  over_editing   max(0, diff_lines - the reference solution's diff_lines): how many more lines the submission
                 touched than the reference needed. Omitted for tasks without a reference solution.
  lint_errors    findings in the submission's changed or added Python files: pyflakes when it is importable on the
                 host, otherwise a built-in check (a syntax error counts 1 per file, plus each unused import).
  timed_out      1.0 when the test command ran past its wall-clock limit.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import posixpath
import re
from typing import Callable, Mapping

from c2jax.envs.coding_tasks import CodingTask
from c2jax.envs.sandbox import Sandbox, SandboxLimits

# The judge's run prints one line per test with -v; a generous cap keeps the final summary for big suites.
GRADING_LIMITS = SandboxLimits(wall_s=30.0, cpu_s=30, memory_mb=1024, output_bytes=1 << 20)

_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*$", re.MULTILINE)
_STATUS = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class TestCounts:
  """What unittest's summary says."""

  total: int = 0
  passed: int = 0


def parse_unittest_summary(output: str) -> TestCounts:
  """The counts of the last unittest summary in `output` (zero counts when there is none)."""
  runs = list(_RAN.finditer(output))
  if not runs:
    return TestCounts()
  last = runs[-1]
  status = _STATUS.search(output, last.end())
  if status is None:
    return TestCounts()  # the summary was cut (killed, truncated): nothing is known to have passed
  total = int(last.group(1))
  bad = 0
  for part in (status.group(2) or "").split(","):
    key, _, value = part.strip().partition("=")
    if key in ("failures", "errors", "skipped", "unexpected successes") and value.strip().isdigit():
      bad += int(value)
  return TestCounts(total=total, passed=max(0, total - bad))


def _lines(text: str | None) -> list[str]:
  return [] if text is None else text.splitlines()


def diff_lines(before: Mapping[str, str], after: Mapping[str, str], ignore: Callable[[str], bool] = lambda p: False
               ) -> int:
  """Lines added plus lines removed going from `before` to `after` (paths for which `ignore` holds are skipped)."""
  total = 0
  for path in sorted(set(before) | set(after)):
    if ignore(path) or before.get(path) == after.get(path):
      continue
    for line in difflib.ndiff(_lines(before.get(path)), _lines(after.get(path))):
      total += line[:2] in ("+ ", "- ")
  return total


# ---------------------------------------------------------------------------------------------------- lint


def _pyflakes_count(path: str, source: str) -> int | None:
  """pyflakes' finding count, or None when pyflakes is not installed."""
  if importlib.util.find_spec("pyflakes") is None:
    return None
  from pyflakes import api, reporter  # pylint: disable=import-outside-toplevel

  class Counter(reporter.Reporter):

    def __init__(self):
      self.count = 0

    def unexpectedError(self, filename, message):
      self.count += 1

    def syntaxError(self, filename, msg, lineno, offset, text):
      self.count += 1

    def flake(self, message):
      self.count += 1

  counter = Counter()
  api.check(source, path, counter)
  return counter.count


def _builtin_lint_count(path: str, source: str) -> int:
  """Syntax errors (1) or unused module-level and function-level imports (re-exports of __init__.py and names in
  __all__ excepted), from the AST alone."""
  try:
    tree = ast.parse(source, filename=path)
  except (SyntaxError, ValueError):
    return 1
  imported: dict[str, int] = {}
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      for alias in node.names:
        if alias.name == "*" or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
          continue
        name = alias.asname or alias.name.split(".")[0]
        imported[name] = imported.get(name, 0) + 1
  if posixpath.basename(path) == "__init__.py":
    return 0
  used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
  # Names in __all__ and in string annotations count as used: pyflakes does the same.
  used |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
  return sum(count for name, count in imported.items() if name not in used)


def lint_count(path: str, source: str) -> int:
  """Lint findings in one Python file (pyflakes when available, else the built-in check)."""
  found = _pyflakes_count(path, source)
  return _builtin_lint_count(path, source) if found is None else found


# ---------------------------------------------------------------------------------------------------- grade


def judge_dirs(task: CodingTask) -> set[str]:
  """The directories that hold hidden tests ("" for the repository root)."""
  return {posixpath.dirname(p) for p in task.hidden_tests}


def graded_files(task: CodingTask, files: Mapping[str, str]) -> dict[str, str]:
  """What the judge runs on: the submission minus anything in the judge's directories, then the hidden tests."""
  dirs = judge_dirs(task) - {""}
  out = {p: c for p, c in files.items()
         if p not in task.hidden_tests and not any(p.startswith(d + "/") for d in dirs)}
  out.update(task.hidden_tests)
  return out


def grade(task: CodingTask, files: Mapping[str, str], *, sandbox_factory: Callable = Sandbox,
          limits: SandboxLimits | None = None) -> dict[str, float]:
  """Runs the hidden tests on the submitted repository `files` and measures the auxiliary signals.

  Args:
    task: the task (its starting files, hidden tests, test command and reference solution).
    files: the submitted repository, path -> text (e.g. `Sandbox.files()` at the end of an episode).
    sandbox_factory: builds the judge's sandbox from (files, limits).
    limits: the judge's limits; `GRADING_LIMITS` by default.

  Returns:
    The terms documented in the module docstring.
  """
  limits = limits or GRADING_LIMITS
  with sandbox_factory(graded_files(task, files), limits) as sandbox:
    result = sandbox.run(task.test_command)
  # unittest reports on stderr; stdout only for a command that reports there.
  counts = parse_unittest_summary(result.stderr)
  if not counts.total:
    counts = parse_unittest_summary(result.stdout)
  hidden = set(task.hidden_tests)

  def is_hidden(path: str) -> bool:
    return path in hidden

  submitted = {p: c for p, c in files.items() if not is_hidden(p)}
  changed = diff_lines(task.files, submitted, is_hidden)
  terms = {
      "pass_fraction": counts.passed / counts.total if counts.total else 0.0,
      "passed": 1.0 if counts.total and counts.passed == counts.total else 0.0,
      "tests_total": float(counts.total),
      "tests_passed": float(counts.passed),
      "diff_lines": float(changed),
      "lint_errors": float(sum(lint_count(p, c) for p, c in submitted.items()
                               if p.endswith(".py") and task.files.get(p) != c)),
      "timed_out": 1.0 if result.timed_out else 0.0,
  }
  if task.solution is not None:
    terms["over_editing"] = float(max(0, changed - diff_lines(task.files, task.solved_files(), is_hidden)))
  return terms
