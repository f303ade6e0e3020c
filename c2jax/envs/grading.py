"""Grading a submission: hidden tests in a fresh sandbox decide the reward; auxiliary signals are reported apart.

  terms = grade(task, sandbox.files())
  terms["passed"], terms["pass_fraction"], terms["over_editing"], terms["lint_errors"]

The outcome (report section 4: tests decide the reward) comes from the task's hidden tests, run by the judge
(c2jax/envs/judge.py) in a fresh sandbox holding the submitted files with the hidden tests written over them:

  * the hidden tests are written AFTER the submission, so a submission cannot edit or delete them; every submitted
    path that equals, lies inside or is a parent of a hidden-test path is dropped first, and so is every submitted
    file inside a directory that holds hidden tests (the judge's directories belong to the judge: a submitted
    `hidden_tests/test_free_points.py` would otherwise add passing tests);
  * the repository's own tests are not the judge: deleting or weakening them changes nothing;
  * the counts come only from the judge's report line, which carries a random nonce fed to the judge on stdin:
    text the submission prints (a fake unittest summary, even followed by `os._exit(0)`) cannot stand in for it.
    No report line, a nonzero exit, a timeout, or a test count other than the task's `expected_tests` (more than
    zero when the task does not state it) scores 0;
  * the judge keeps the repository last on sys.path, so a submitted `unittest.py`, `sitecustomize.py`,
    `inspect.py` or `signal.py` does not replace the stdlib the runner and the hidden tests use.
The hidden tests import the submitted code into the judge's interpreter, so code written to tamper with the judge
from inside (patching TestCase, searching memory for the nonce) is not caught here: these checks close the cheap
shortcuts, and the over-editing and lint signals make tampering visible in reports.

Grading never raises for what a submission holds: paths that cannot be laid out (a file where the hidden tests
need a directory) and files the linter chokes on score 0 or count as findings. (SandboxUnavailable still raises:
that is the host's problem, not the submission's.)

The terms (all floats, so they flow into reward composition unchanged):

  pass_fraction  tests passed / max(tests run, tests expected) (0 when none ran). A test passes when it and all of
                 its subTests succeed (an expected failure counts as a pass, a skip or unexpected success not).
  passed         1.0 when the expected number of tests ran and all passed, else 0.0.
  tests_total, tests_passed
  diff_lines     the size of the submission's change to the starting repository: lines added plus lines removed
                 (difflib over each path; an added file counts all its lines, a deleted file all of its lines).
  over_editing   max(0, diff_lines - the reference solution's diff_lines): how many more lines the submission
                 touched than the reference needed. Omitted for tasks without a reference solution.
  lint_errors    findings in the submission's changed or added Python files: pyflakes when it is importable on the
                 host, otherwise a built-in check (a syntax error counts 1 per file, plus each unused import). A
                 file over `LINT_MAX_CHARS`, or one the linter fails on (e.g. nesting deep enough to exhaust the
                 recursion limit), counts as one finding.
  timed_out      1.0 when the judge ran past its wall-clock limit.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import json
import pathlib
import posixpath
import re
import secrets
import shlex
from typing import Callable, Mapping

from c2jax.envs import judge
from c2jax.envs.coding_tasks import CodingTask
from c2jax.envs.sandbox import Sandbox, SandboxLimits, SandboxPathError

# The judge logs one line per test to stderr; a generous cap keeps the head and tail of big suites readable.
GRADING_LIMITS = SandboxLimits(wall_s=30.0, cpu_s=30, memory_mb=1024, output_bytes=1 << 20)
# Larger changed files are not parsed on the host (a finding each): linting is a report, not a workload.
LINT_MAX_CHARS = 200_000

# Read once: the judge runs from its source text (passed to `python3 -c`), so nothing of it lives in the repository.
_JUDGE_SOURCE = pathlib.Path(judge.__file__).read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class TestCounts:
  """What the judge reports: tests run and tests passed."""

  total: int = 0
  passed: int = 0


def judge_command(modules: list[str]) -> str:
  """The shell command that runs the judge over the hidden test `modules` (dotted names) from the repository root.

  -B: no bytecode is written into the repository (-I ignores PYTHONDONTWRITEBYTECODE).
  """
  return " ".join(["python3", "-I", "-B", "-c", shlex.quote(_JUDGE_SOURCE), *map(shlex.quote, modules)])


def hidden_test_modules(task: CodingTask) -> list[str]:
  """The dotted module names of the task's hidden test files (those named like unittest's default test*.py)."""
  return [p[:-3].replace("/", ".") for p in task.hidden_tests
          if p.endswith(".py") and posixpath.basename(p).startswith("test")]


def parse_report(stdout: str, nonce: str) -> TestCounts | None:
  """The counts of the judge's last report line carrying `nonce` in `stdout`, or None when there is none valid."""
  found = re.findall(rf"^{re.escape(nonce)} (\{{.*\}})$", stdout, re.MULTILINE)
  if not found:
    return None
  try:
    report = json.loads(found[-1])
  except json.JSONDecodeError:
    return None
  if not isinstance(report, dict) or set(report) != set(judge.REPORT_KEYS):
    return None
  total, passed = report["total"], report["passed"]
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in (total, passed)) or not 0 <= passed <= total:
    return None
  return TestCounts(total=total, passed=passed)


def _lines(text: str | None) -> list[str]:
  return [] if text is None else text.splitlines()


DIFF_MAX_LINES = 20_000  # per file, before + after


def diff_lines(before: Mapping[str, str], after: Mapping[str, str], ignore: Callable[[str], bool] = lambda p: False
               ) -> int:
  """Lines added plus lines removed going from `before` to `after` (paths for which `ignore` holds are skipped)."""
  total = 0
  for path in sorted(set(before) | set(after)):
    if ignore(path) or before.get(path) == after.get(path):
      continue
    a, b = _lines(before.get(path)), _lines(after.get(path))
    if len(a) + len(b) > DIFF_MAX_LINES:  # too big to diff on the host: every line counts as changed
      total += len(a) + len(b)
      continue
    # Opcodes of a plain SequenceMatcher, not ndiff: ndiff's intraline matching is far slower on large files.
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
      if tag != "equal":
        total += (i2 - i1) + (j2 - j1)
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
  """Lint findings in one Python file (pyflakes when available, else the built-in check).

  Never raises: a file over `LINT_MAX_CHARS` is not parsed, and one the linter fails on (RecursionError or
  MemoryError from deeply nested code, anything else) counts as one finding.
  """
  if len(source) > LINT_MAX_CHARS:
    return 1
  try:
    found = _pyflakes_count(path, source)
    return _builtin_lint_count(path, source) if found is None else found
  except Exception:  # pylint: disable=broad-exception-caught  (the source is untrusted; grading must not raise)
    return 1


# ---------------------------------------------------------------------------------------------------- grade


def judge_dirs(task: CodingTask) -> set[str]:
  """The directories that hold hidden tests ("" for the repository root)."""
  return {posixpath.dirname(p) for p in task.hidden_tests}


def _parents(path: str) -> set[str]:
  """The proper parent directories of a repository path ("a/b/c" -> {"a", "a/b"})."""
  parts = path.split("/")
  return {"/".join(parts[:i]) for i in range(1, len(parts))}


def graded_files(task: CodingTask, files: Mapping[str, str]) -> dict[str, str]:
  """What the judge runs on: the submission minus what collides with the judge's files, then the hidden tests.

  Dropped: a path that is a hidden test's path, lies inside one (`t.py/x`), or is one of its parent directories
  (a file named `hidden_tests`), and every file inside a directory that holds hidden tests.
  """
  hidden = set(task.hidden_tests)
  parents = set().union(*map(_parents, hidden))
  dirs = judge_dirs(task) - {""}

  def collides(path: str) -> bool:
    return (path in hidden or path in parents or bool(_parents(path) & hidden)
            or any(path.startswith(d + "/") for d in dirs))

  out = {p: c for p, c in files.items() if not collides(p)}
  out.update(task.hidden_tests)
  return out


def _run_judge(task: CodingTask, files: Mapping[str, str], sandbox_factory: Callable, limits: SandboxLimits
               ) -> tuple[TestCounts, bool]:
  """(the judge's counts, whether it timed out); zero counts for anything but a clean report."""
  nonce = secrets.token_hex(16)
  try:
    with sandbox_factory(graded_files(task, files), limits) as sandbox:
      result = sandbox.run(judge_command(hidden_test_modules(task)), stdin=nonce + "\n")
  except SandboxPathError:
    # The submission's paths cannot be laid out next to the hidden tests (e.g. a file `a` and a file `a/b`):
    # nothing was run, so nothing passed.
    return TestCounts(), False
  counts = parse_report(result.stdout, nonce) if result.exit_code == 0 and not result.timed_out else None
  return counts or TestCounts(), result.timed_out


def grade(task: CodingTask, files: Mapping[str, str], *, sandbox_factory: Callable = Sandbox,
          limits: SandboxLimits | None = None) -> dict[str, float]:
  """Runs the hidden tests on the submitted repository `files` and measures the auxiliary signals.

  Args:
    task: the task (its starting files, hidden tests, expected test count and reference solution).
    files: the submitted repository, path -> text (e.g. `Sandbox.files()` at the end of an episode).
    sandbox_factory: builds the judge's sandbox from (files, limits).
    limits: the judge's limits; `GRADING_LIMITS` by default.

  Returns:
    The terms documented in the module docstring.
  """
  counts, timed_out = _run_judge(task, files, sandbox_factory, limits or GRADING_LIMITS)
  expected = task.expected_tests
  complete = counts.total > 0 and (expected is None or counts.total == expected)
  hidden = set(task.hidden_tests)

  def is_hidden(path: str) -> bool:
    return path in hidden

  submitted = {p: c for p, c in files.items() if not is_hidden(p)}
  changed = diff_lines(task.files, submitted, is_hidden)
  terms = {
      "pass_fraction": counts.passed / max(counts.total, expected or 0) if counts.total else 0.0,
      "passed": 1.0 if complete and counts.passed == counts.total else 0.0,
      "tests_total": float(counts.total),
      "tests_passed": float(counts.passed),
      "diff_lines": float(changed),
      "lint_errors": float(sum(lint_count(p, c) for p, c in submitted.items()
                               if p.endswith(".py") and task.files.get(p) != c)),
      "timed_out": 1.0 if timed_out else 0.0,
  }
  if task.solution is not None:
    terms["over_editing"] = float(max(0, changed - diff_lines(task.files, task.solved_files(), is_hidden)))
  return terms
