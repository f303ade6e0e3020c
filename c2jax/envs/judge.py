"""The judge: the script that runs a task's hidden tests inside the grading sandbox and reports their counts.

Grading (c2jax/envs/grading.py) runs this file's source as `python3 -I -c <source> <module> ...` in a fresh
sandbox holding the submission with the hidden tests written over it, and feeds it one line on stdin: a random
nonce. The judge

  1. reads the nonce before any submitted code is imported, and leaves stdin at /dev/null for the tests;
  2. puts the repository root (the cwd, /work) LAST on sys.path: `unittest discover` would insert it first, and a
     submitted `inspect.py`, `ast.py` or `signal.py` would then replace the stdlib module a hidden test imports
     later (`-I` already keeps it off the path while the interpreter starts, so `sitecustomize.py` and
     `unittest.py` cannot replace the runner either);
  3. imports exactly the named hidden test modules (an import that fails, even with SystemExit, is one failing
     test) and runs them with a result that counts TESTS, not failures: a test whose subTests fail counts as one
     failed test, a skipped test or an unexpected success as not passed, and an error outside any test (a failing
     setUpClass or tearDownModule) as one more failed test;
  4. prints `<nonce> {"total": n, "passed": p}` as the last line of stdout and exits 0 at once (`os._exit`: no
     atexit handler or leftover thread of the submission runs after the verdict).

Anything else is a verdict of 0: a submission that prints a fake unittest summary and exits (even with
`os._exit(0)` from its package's __init__.py) never produces the nonce line; a crash, a kill or a nonzero exit
neither. The nonce only keeps the submission from forging the line blindly: code that the hidden tests import
runs in this interpreter and could, with effort aimed at this script, find the nonce in memory. The over-editing
and lint signals make such tampering visible in reports.

Stdlib only: this file runs under the sandbox's system python3, never imported there.
"""

import importlib
import json
import os
import sys
import unittest

REPORT_KEYS = ("total", "passed")


class JudgeResult(unittest.TextTestResult):
  """unittest's verbose text result that also counts tests run and tests passed (see the module docstring)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.judged_total = 0
    self.judged_passed = 0
    self._current = None
    self._current_ok = False

  def startTest(self, test):
    super().startTest(test)
    self._current, self._current_ok = test, True

  def stopTest(self, test):
    super().stopTest(test)
    if self._current is not None:
      self.judged_total += 1
      self.judged_passed += self._current_ok
    self._current = None

  def _bad(self):
    if self._current is None:
      self.judged_total += 1  # a fixture outside any test failed (setUpClass, tearDownModule, ...): never passed
    else:
      self._current_ok = False

  def addError(self, test, err):
    super().addError(test, err)
    self._bad()

  def addFailure(self, test, err):
    super().addFailure(test, err)
    self._bad()

  def addSkip(self, test, reason):
    super().addSkip(test, reason)
    self._bad()

  def addUnexpectedSuccess(self, test):
    super().addUnexpectedSuccess(test)
    self._bad()

  def addSubTest(self, test, subtest, err):
    super().addSubTest(test, subtest, err)
    if err is not None:
      self._bad()


class ImportFailed(unittest.TestCase):
  """Stands for a hidden test module that could not be imported: one failing test."""

  def __init__(self, module, error):
    super().__init__("runTest")
    self._module, self._error = module, error

  def id(self):
    return f"{self._module} (import)"

  def __str__(self):
    return self.id()

  def runTest(self):
    self.fail(f"importing the hidden tests {self._module} failed: {self._error}")


def load(modules):
  """A suite of the tests in `modules` (dotted names); each module that fails to import becomes one failing test."""
  loader = unittest.TestLoader()
  suite = unittest.TestSuite()
  for name in modules:
    try:
      module = importlib.import_module(name)
    except BaseException as e:  # pylint: disable=broad-exception-caught  (SystemExit from submitted code too)
      suite.addTest(ImportFailed(name, f"{type(e).__name__}: {e}"))
      continue
    suite.addTest(loader.loadTestsFromModule(module))
  return suite


def run(modules, stream):
  """Runs the hidden test `modules`, writing unittest's verbose log to `stream`; returns the report dict."""
  result = unittest.TextTestRunner(stream=stream, verbosity=2, resultclass=JudgeResult).run(load(modules))
  return {"total": result.judged_total, "passed": result.judged_passed}


def main(argv):
  nonce = sys.stdin.readline().strip()
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  sys.stdin = open(devnull, closefd=False)  # pylint: disable=consider-using-with
  root = os.getcwd()
  sys.path[:] = [p for p in sys.path if p not in ("", ".", root)]
  sys.path.append(root)
  report = run(argv[1:], sys.stderr)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-exception-caught  (a test may have closed or replaced it)
      pass
  # Straight to fd 1: the tests may have replaced sys.stdout. A leading newline ends any unterminated line.
  line = f"\n{nonce} {json.dumps(report, sort_keys=True)}\n".encode()
  while line:
    line = line[os.write(1, line):]
  os._exit(0)


if __name__ == "__main__":
  main(sys.argv)
