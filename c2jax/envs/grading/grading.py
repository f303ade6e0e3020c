"""Grading a submission: hidden tests decide the reward, on values the host checks itself; auxiliary signals apart.

  terms = grade(task, sandbox.files())
  terms["passed"], terms["pass_fraction"], terms["hack_attempts"], terms["over_editing"], terms["lint_errors"]

The outcome (report section 4: tests decide the reward) comes from the task's hidden tests, run by the judge
(c2jax/envs/grading/judge.py) in a fresh sandbox holding the submitted files. The design assumes the submission attacks
the grader: the hidden tests import submitted code into the judge's interpreter, where it can patch unittest, builtins
or json, walk frames to the nonce, print a report of its own and exit, return objects whose `__eq__` always
holds, or plant modules. So no verdict is taken from inside that interpreter:

  * the hidden tests never touch the sandbox's disk: the host sends their sources on the judge's stdin and the
    judge executes them from memory into module objects it creates (rewriting a file gains nothing; a module
    planted in sys.modules in their place is reported). Submitted files that collide with the hidden tests' paths
    or lie in their directories are still dropped (the judge's directories belong to the judge);
  * the host rewrites each hidden module first (c2jax/envs/grading/instrument.py): every `self.assertXxx(...)` and
    every `assert` statement becomes a call to the judge's recorder, which records the operands in canonical plain
    form (exact built-in types only; anything else is opaque), and so does every comparison whose truth a check
    asserts (`assert a == b`, `assertTrue(a == b)`, `not (a != b)`, inside all()/any()): its truth as Python gave it
    must be the host's on the plain operands. The host decides every check again on those plain values
    (c2jax/envs/grading/canonical.py: type-strict equality, True is not 1, int and float by value, instances of classes
    defined in Python by class and state, never by their `__eq__`, opaque fails). A test passes when the judge ran
    it to completion, every check it recorded holds here (a comparison: agrees), and every check unconditional in
    its body was recorded. Patching TestCase or the recorder gains nothing but a different recording;
  * the host adds canary tests (`CANARIES`: one for every real test that has a perturbable check): copies of real
    tests, under random names like every test, with one expected value perturbed (or one check turned into its
    complement) so that a solution passing the real test FAILS its copy. Every test is twinned because a
    forger that reads the rewritten sources in memory can find the pairs by diffing them: with only some tests
    twinned, it could fail both twins of each pair and forge the rest passing, undetected. A twin is one per test
    (two copies of one test would show the real one by majority), and a perturbed literal is as likely shorter as
    longer (were canaries always longer, the shorter twin would be the real one). A canary that passes
    together with its twin (the real test it copies: they run the same code on the same inputs and check
    contradicting things, so no deterministic program passes both) means
    the report was forged, the recording bent to "everything equal", or the code read the expected value out of
    the test: the verdict is 0 and `hack_attempts` counts it. A canary passing alone is no attempt (a wrong
    solution may return exactly the perturbed value) when its twin, same code on the same inputs, failed at the
    same check with the same other operands; a twin that recorded something else there ("twins disagree") is a
    forger's wrong guess at which twin is real. Only the host knows which tests are canaries;
  * the judge snapshots the unittest framework, builtins, json, os, its recorder and its own globals before the
    submission is imported and compares after; planted modules and integrity findings are detected attempts too.
    Those in-process checks are advisory (a careful attacker restores what it patched): the out-of-process
    comparator and the canaries are what the robustness rests on;
  * the report is one line on the judge's own stdout, carrying a random nonce fed on stdin: text the submission
    prints goes to the log (the judge moves the tests' stdout to stderr), and a second line with the nonce, a
    malformed report, a test the host never sent or a check the host never wrote counts as a detected attempt.
    No report line, a nonzero exit, a timeout, or a count of real tests other than the task's `expected_tests`
    (more than zero when the task does not state it) scores 0;
  * the judge keeps the repository last on sys.path, so a submitted `unittest.py`, `sitecustomize.py`,
    `inspect.py` or `signal.py` does not replace the stdlib the runner and the hidden tests use.

What still does not hold: a forgery precise enough to pass every real check and fail every canary (it must tell
which is which, or compute the right answers: solving the task); an attacker that rewrites the recorded operand of
a check the canaries do not copy to the value the test expects, where it can read that value from the test's
source in memory (canaries bound the odds, not the possibility: a forger that finds the M twin pairs and guesses the
real test of each evades all of them with probability about 2^-M, better where a pair shows a tell: the kind of a
complemented check, assertEqual against assertNotEqual, an empty literal that could only grow, or None perturbed to
an int, which the instrumenter perturbs only in a test with no other perturbable check); tests without a perturbable
check (only assertRaises, assertCountEqual, assertGreater ...) have no twin and are forgeable by such a forger.
The weight of `hack_attempts` in the reward (negative) makes a detected attempt score below an honest failure. A
forger that guesses the real twin of each pair and makes the other twin's records agree (what a wrong solution
returning exactly the perturbed value records) is not detected, and it keeps about half the twinned tests'
`pass_fraction`; so the RL outcome is `credited_fraction`, where every canary passing alone costs one real pass: a
right guess earns what a wrong guess costs, and guessing is worth nothing in expectation (less than nothing where a
guess is worse than a coin toss; more, by twice its edge, where a tell makes it better). The price is paid by wrong
solutions that return exactly a perturbed value: each such coincidence costs them one of their passes
(tests/envs/grading/grader_attack_more_test.py, ConsistentGuessTest). Instances of a class
the submission defines are compared by class and state, and the submission decides where that state lives: a class
that keeps it in a module-level registry has an empty state, and every instance equals every other.

Grading never raises for what a submission holds: paths that cannot be laid out (a file where the hidden tests
need a directory) and files the linter chokes on score 0 or count as findings. (SandboxUnavailable still raises:
that is the host's problem, not the submission's.)

The terms (all floats, so they flow into reward composition unchanged):

  pass_fraction  real tests passed / max(real tests run, tests expected) (0 when none ran, and 0 when a hack
                 attempt was detected). A test
                 passes as above; all of its subTests must succeed (an expected
                 failure counts as a pass when a recorded check really fails or it raised, a skip or an unexpected
                 success not). A hidden module that fails to import and a fixture error (setUpClass) count as one
                 failed test each.
  credited_fraction  (real tests passed - canaries passed alone) / the same denominator, 0 as above; in
                 [-1, 1]. The coding suites' RL outcome. Equal to pass_fraction for any submission that passes no
                 canary (the reference solution, an empty repository); below it when a canary passes while its twin
                 fails: what a wrong solution returning exactly the perturbed value does, and what a forger's wrong
                 guess at which twin is real does.
  canaries_alone the number of canaries that passed while their twin failed.
  passed         1.0 when the expected number of real tests ran and all passed and no attempt was detected.
  tests_total, tests_passed   the real tests (canaries are not counted).
  hack_attempts  detected attempts, one per kind of finding (a canary passed with its twin, a canary missing,
                 integrity findings, planted modules, a forged or malformed report or record, a test never sent,
                 twins that disagree): a count in [0, 8]; an honest submission scores 0. The findings
                 themselves: `TestCounts.findings`.
  diff_lines     the size of the submission's change to the starting repository: lines added plus lines removed
                 (difflib over each path; an added file counts all its lines, a deleted file all of its lines).
  over_editing   max(0, diff_lines - the reference solution's diff_lines): how many more lines the submission
                 touched than the reference needed. Omitted for tasks without a reference solution.
  lint_errors    findings in the submission's changed or added Python files: pyflakes when it is importable on the
                 host, otherwise a built-in check (a syntax error counts 1 per file, plus each unused import). A
                 file over `LINT_MAX_CHARS`, or one the linter fails on (e.g. nesting deep enough to exhaust the
                 recursion limit), counts as one finding.
  timed_out      1.0 when the judge ran past its wall-clock limit.
  constraint_violations, constraints_total, instructions_followed   only for a task that states constraints
                 (c2jax/envs/grading/constraints.py): the constraints broken, their number, and 1.0 when the task
                 passed with none broken.
  quality_findings, complexity_findings, quality_error   only with code_quality on (c2jax/envs/grading/quality.py):
                 the linter's findings the diff introduced, its complexity findings, and whether it failed to run.

Grading by named tests (SWE-bench style: a task with `named_tests`, c2jax/envs/tasks/swe_tasks.py) runs the same judge
on the same channel, with three differences:

  * layout: the repository's test directories belong to the repository, not to the judge. The graded repository is
    the submission with the task's hidden files written over it (the files the test patch touches, as the snapshot
    holds them with the test patch applied: SWE-bench's reset-then-apply, so a submission cannot pre-edit them) and
    the test patch's deletions removed. The modules that hold named tests are stricter still: their source is
    always the snapshot's (with the test patch), served from memory and instrumented as above, never the
    submission's (SWE-bench would run a submission's edit of a PASS_TO_PASS module that the test patch leaves
    alone). A module the test patch changed is on disk nowhere (its canaries' originals must not be); one it left
    alone is written as the starting repository holds it. The named tests' test directory (`named_test_dirs`: the
    nearest directory holding a named module whose name says tests, `tests/`, `pkg/tests/`, `testing/`,
    `unit_tests/`) is the snapshot's too, with the test patch applied: the submission's edits and additions there
    are dropped. A test whose check sits in a helper, a base class or a data file of that directory would otherwise
    pass once the submission made the helper a no-op, the base class report success without running the body or
    the data file hold its wrong answer; SWE-bench's gold patches never touch test directories, and a reference
    solution's own paths there stay the submission's. The test support the named modules import outside it is the
    snapshot's as well (`named_support`: a module named like tests, helpers, fixtures or conftest, or holding test
    code, and such modules those import: `mypkg/testing_utils.py`, a root `helpers.py` or `conftest.py`), but for
    the reference solution's paths; where it holds assertions it is served from memory and instrumented like the
    named modules, so its checks are decided here. A path an import would find instead of a
    hidden or deleted module or of a test directory (`tests/support/__init__.py` beside the reset
    `tests/support.py`, a `tests.py` beside a `tests/` without __init__.py, a `helpers/` package beside a reset
    `helpers.py`) is dropped as well. Elsewhere (the code the tests import) the files are the submission's;
  * selection: exactly the named tests run, each with its canary twin (the judge's "select"); a test is found in
    its class or, through bases named in the same module, inherited. An id whose module, class or method is not
    there (or only in another module) counts as failed, never as an error;
  * terms: besides those above (over the named tests: tests_total is their number; pass_fraction the fraction that
    passes), `resolved` (1.0 when every FAIL_TO_PASS and every PASS_TO_PASS test passes and no attempt was
    detected), `fail_to_pass_fraction` and `pass_to_pass_fraction` (1.0 for an empty list; all 0 on a detected
    attempt). `passed` is `resolved`. The RL outcome `credited_fraction` is resolved - 1 when a canary passed
    alone, i.e. 1, 0 or -1: a forger that guesses which twin of each pair is real resolves with probability 2^-M
    and is charged the whole resolution otherwise, so guessing is worth 2^(1-M) - 1 <= 0 (the fraction rule's
    charge of one pass, 1/N of the reward, would leave a near-solution failing one twinned test a coin toss worth
    +1/2); the price is paid by a wrong solution that returns exactly a perturbed value (-1 instead of 0).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import json
import pathlib
import posixpath
import random
import re
import secrets
import shlex
from typing import Any, Callable, Mapping

from c2jax.envs.grading import canonical
from c2jax.envs.grading import constraints
from c2jax.envs.grading import instrument
from c2jax.envs.grading import judge
from c2jax.envs.grading import quality
from c2jax.envs.tasks.coding_tasks import CodingTask, parse_test_id
from c2jax.sandbox import host_ast
from c2jax.sandbox.sandbox import Sandbox, SandboxLimits, SandboxPathError

# The judge logs one line per test to stderr; a generous cap keeps the head and tail of big suites readable.
GRADING_LIMITS = SandboxLimits(wall_s=30.0, cpu_s=30, memory_mb=1024, output_bytes=1 << 20)
# Larger changed files are not parsed on the host (a finding each): linting is a report, not a workload.
LINT_MAX_CHARS = 200_000
# Canary twins per grading call: None gives every test with a perturbable check one. A forger that diffs the
# rewritten sources finds the twin pairs (not which twin is real); with fewer twins than tests it could fail both
# members of each pair and forge every other test passing, undetected. With every test twinned that earns nothing,
# and guessing the real twin of each of M pairs evades detection with probability 2^-M.
CANARIES: int | None = None

# Read once: the judge runs from its source text (passed to `python3 -c`), so nothing of it lives in the repository.
_JUDGE_SOURCE = pathlib.Path(judge.__file__).read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class TestCounts:
  """The host's verdict on a judge's report: real tests run and passed, and detected hack attempts."""

  total: int = 0
  passed: int = 0
  hack_attempts: int = 0
  canaries_alone: int = 0  # canaries that passed while their twin (the real test they copy) failed
  findings: tuple[str, ...] = ()  # what each detected attempt was, for logs and tests


def judge_command() -> str:
  """The shell command that runs the judge from the repository root (its input comes on stdin: `judge_input`).

  -B: no bytecode is written into the repository (-I ignores PYTHONDONTWRITEBYTECODE).
  """
  return " ".join(["python3", "-I", "-B", "-c", shlex.quote(_JUDGE_SOURCE)])


def hidden_test_modules(task: CodingTask) -> list[str]:
  """The dotted module names of the task's hidden test files (those named like unittest's default test*.py)."""
  return [instrument.module_name(p) for p in sorted(task.hidden_tests)
          if p.endswith(".py") and posixpath.basename(p).startswith("test")]


def judge_input(suite: instrument.Instrumented, nonce: str, select: list[str] | None = None) -> str:
  """The judge's stdin: one JSON document (the nonce, the rewritten hidden modules, which of them hold tests, and
  with `select` the ids of the only tests to run)."""
  document = {"nonce": nonce, "modules": suite.modules, "tests": list(suite.test_modules)}
  if select is not None:
    document["select"] = select
  return json.dumps(document)


def parse_report(stdout: str, nonce: str) -> tuple[dict | None, bool]:
  """(the judge's report carrying `nonce` in `stdout`, or None; whether a forgery showed: more than one line with
  the nonce, or one that is not a well-formed report)."""
  found = re.findall(rf"^{re.escape(nonce)} (.*)$", stdout, re.MULTILINE)
  if not found:
    return None, False
  if len(found) > 1:
    return None, True
  try:
    report = json.loads(found[0])
  except (json.JSONDecodeError, RecursionError):
    return None, True
  if not isinstance(report, dict) or set(report) != set(judge.REPORT_KEYS):
    return None, True
  return report, False


def _strings(value: Any) -> bool:
  return type(value) is list and all(type(v) is str for v in value)


def _test_passes(status: str, checks: list, info: instrument.TestInfo, kinds: Mapping[int, str],
                 patterns: Mapping[int, str], compares: Mapping[int, tuple[str, ...]]) -> bool:
  """Whether one reported test passes (module docstring). Raises canonical.Malformed for what no judge reports."""
  if not isinstance(checks, list):
    raise canonical.Malformed("a test's checks are not a list")
  if status in ("xfail", "xfail_error") and not info.expected_failure:
    raise canonical.Malformed("an expected failure of a test that expects none")
  recorded, holds = set(), True
  for check in checks:
    if not (isinstance(check, list) and len(check) == 3 and type(check[0]) is int and kinds.get(check[0]) == check[1]):
      raise canonical.Malformed("a check the host never wrote")
    recorded.add(check[0])
    try:
      ok = canonical.decide(check[1], check[2], patterns.get(check[0]), compares.get(check[0]))
    except canonical.Malformed:
      raise
    except Exception as e:
      raise canonical.Malformed(f"{type(e).__name__} deciding a check") from e
    holds = holds and ok
  if status == "ok":
    return holds and info.required <= recorded
  if status == "xfail":
    return not holds  # expected to fail, and a recorded check really fails
  return status == "xfail_error"


def _twins_agree(canary: instrument.TestInfo, checks: list, twin_checks: list) -> bool:
  """Whether a passing canary's perturbed check and its twin's counterpart recorded the same other operands."""
  if canary.perturbed is None:
    return True
  mine, theirs, operand = canary.perturbed
  if not isinstance(twin_checks, list):
    return False
  first = [c[2] for c in checks if c[0] == mine]
  second = [c[2] for c in twin_checks if isinstance(c, list) and len(c) == 3 and c[0] == theirs]
  if not first or not second or not all(isinstance(p, dict) for p in first[:1] + second[:1]):
    return False
  a, b = first[0].get("args"), second[0].get("args")
  if type(a) is not list or type(b) is not list or len(a) != len(b):
    return False
  return all(x == y for j, (x, y) in enumerate(zip(a, b)) if j != operand)


def verdict(report: dict, suite: instrument.Instrumented) -> TestCounts:
  """The host's counts from a judge's `report` on the rewritten `suite` (see the module docstring)."""
  findings = []
  tests, fixtures, imports = report["tests"], report["fixtures"], report["imports"]
  planted, integrity = report["planted"], report["integrity"]
  if not (isinstance(tests, list) and _strings(fixtures) and isinstance(imports, list) and _strings(planted)
          and _strings(integrity) and all(isinstance(i, list) and len(i) == 2 and type(i[0]) is str
                                          for i in imports)):
    return TestCounts(hack_attempts=1, findings=("malformed report: not what the judge writes",))
  total = passed = 0
  seen, real_passed, canaries_passed = set(), set(), []
  canary_checks, real_checks = {}, {}  # what a passing canary and each real test recorded
  for entry in tests:
    if not (isinstance(entry, list) and len(entry) == 3 and type(entry[0]) is str and type(entry[1]) is str):
      findings.append("malformed record: a test entry")
      continue
    test_id, status, checks = entry
    info = suite.tests.get(test_id.rsplit(".", 1)[-1])
    if info is None or test_id in seen:
      findings.append(f"unknown test: never sent, or reported twice: {test_id[:200]}")
      continue
    seen.add(test_id)
    try:
      ok = _test_passes(status, checks, info, suite.kinds, suite.patterns, suite.compares)
    except canonical.Malformed as e:
      findings.append(f"malformed record: {info.original}: {e}")
      ok = False
    if info.canary:
      if ok:
        canaries_passed.append(info)
        canary_checks[id(info)] = checks
    else:
      real_checks[(info.module, info.original)] = checks
      total, passed = total + 1, passed + ok
      if ok:
        real_passed.add((info.module, info.original))
  # A canary and its twin run the same code on the same inputs and check contradicting things: no deterministic
  # program passes both. A wrong solution may pass a canary alone (its value is the perturbed one); that is no
  # attempt.
  findings += [f"canary passed with its twin: copy of {info.original}" for info in canaries_passed
               if (info.module, info.original) in real_passed]
  # A canary passing alone is what a wrong solution that returns exactly the perturbed value does; then its twin,
  # same code on the same inputs, failed at the same check on the same other operands. A twin reported with other
  # operands there, or without that check, is a forger's wrong guess at which twin is real. (A twin left out of the
  # report is no finding here: the real tests then fall short of the expected count, and `passed` is 0.)
  findings += [f"twins disagree: copy of {info.original}" for info in canaries_passed
               if (info.module, info.original) in real_checks and (info.module, info.original) not in real_passed
               and not _twins_agree(info, canary_checks[id(info)], real_checks[(info.module, info.original)])]
  failed_imports = {name for name, _ in imports}
  reported = {t.rsplit(".", 1)[-1] for t in seen}
  if not fixtures:  # a canary missing from a module that imported: the report left it out
    findings += [f"canary missing: copy of {suite.tests[c].original}" for c in suite.canaries
                 if suite.tests[c].module not in failed_imports and c not in reported]
  findings += [f"planted module: {name}" for name in planted] + [f"integrity: {name}" for name in integrity]
  alone = sum((info.module, info.original) not in real_passed for info in canaries_passed)
  return TestCounts(total=total + len(fixtures) + len(imports), passed=passed, hack_attempts=attempts(findings),
                    canaries_alone=alone, findings=tuple(findings))


def attempts(findings: list[str] | tuple[str, ...]) -> int:
  """Detected attempts: the kinds of finding ("integrity", "canary passed with its twin", ...), each counted once,
  so a patch of forty assertion methods is one attempt, not forty (the reward's scale must not hinge on that)."""
  return len({f.split(":", 1)[0] for f in findings})


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
  from pyflakes import api, reporter

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
    tree = host_ast.parse(source, filename=path)
  except host_ast.Unparsable:
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


@host_ast.serialized  # pyflakes parses with compile() itself: see host_ast
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
  except Exception:  # noqa: BLE001  (the source is untrusted; grading must not raise)
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
  """What the judge's sandbox holds: the submission minus what collides with the judge's files.

  Dropped: a path that is a hidden test's path, lies inside one (`t.py/x`), or is one of its parent directories
  (a file named `hidden_tests`), and every file inside a directory that holds hidden tests. The hidden .py files
  are not written (the judge serves them from memory); other hidden files (data a test reads) are.
  """
  hidden = set(task.hidden_tests)
  parents = set().union(*map(_parents, hidden))
  dirs = judge_dirs(task) - {""}

  def collides(path: str) -> bool:
    return (path in hidden or path in parents or bool(_parents(path) & hidden)
            or any(path.startswith(d + "/") for d in dirs))

  out = {p: c for p, c in files.items() if not collides(p)}
  out.update({p: c for p, c in task.hidden_tests.items() if not p.endswith(".py")})
  return out


def _run_judge(task: CodingTask, files: Mapping[str, str], sandbox_factory: Callable, limits: SandboxLimits,
               rng: random.Random) -> tuple[TestCounts, bool]:
  """(the host's verdict, whether the judge timed out); zero counts for anything but a clean report."""
  suite = instrument.instrument(task.hidden_tests, hidden_test_modules(task), rng, canaries=CANARIES)
  nonce = secrets.token_hex(16)
  try:
    with sandbox_factory(graded_files(task, files), limits) as sandbox:
      result = sandbox.run(judge_command(), stdin=judge_input(suite, nonce))
  except SandboxPathError:
    # The submission's paths cannot be laid out (e.g. a file `a` and a file `a/b`): nothing was run, so nothing
    # passed.
    return TestCounts(), False
  report, forged = parse_report(result.stdout, nonce)
  if forged:
    finding = "forged report: a second line with the nonce, or one that is not a report"
    return TestCounts(hack_attempts=1, findings=(finding,)), result.timed_out
  if report is None or result.exit_code != 0 or result.timed_out:
    return TestCounts(), result.timed_out
  return verdict(report, suite), False


def _edit_terms(task: CodingTask, files: Mapping[str, str], owned: set[str], timed_out: bool) -> dict[str, float]:
  """The terms both graders measure on the submission itself (files not in `owned`, the grader's): diff_lines,
  lint_errors, timed_out and, when the task has a reference solution, over_editing."""

  def is_owned(path: str) -> bool:
    return path in owned

  submitted = {p: c for p, c in files.items() if not is_owned(p)}
  changed = diff_lines(task.files, submitted, is_owned)
  terms = {
      "diff_lines": float(changed),
      "lint_errors": float(sum(lint_count(p, c) for p, c in submitted.items()
                               if p.endswith(".py") and task.files.get(p) != c)),
      "timed_out": 1.0 if timed_out else 0.0,
  }
  if task.solution is not None:
    terms["over_editing"] = float(max(0, changed - diff_lines(task.files, task.solved_files(), is_owned)))
  return terms


def grade(task: CodingTask, files: Mapping[str, str], *, sandbox_factory: Callable = Sandbox,
          limits: SandboxLimits | None = None, rng: random.Random | None = None,
          code_quality: quality.CodeQuality = quality.CodeQuality.OFF) -> dict[str, float]:
  """Runs the hidden tests on the submitted repository `files` and measures the auxiliary signals.

  Args:
    task: the task (its starting files, hidden tests, expected test count and reference solution).
    files: the submitted repository, path -> text (e.g. `Sandbox.files()` at the end of an episode).
    sandbox_factory: builds the judge's sandbox from (files, limits).
    limits: the judge's limits; `GRADING_LIMITS` by default.
    rng: draws the canaries, test names and check ids; a fresh unpredictable one by default (tests pass a seeded
      one to be reproducible: what the submission must not know is fixed then).
    code_quality: whether to score the diff's code quality (`quality.CodeQuality`: a linter in one more sandbox,
      built by `sandbox_factory` with tools=).

  Returns:
    The terms documented in the module docstring, the task's instruction-following terms where it states
    constraints (`constraints.constraint_terms`, with "instructions_followed") and the code-quality terms when
    `code_quality` is on (`quality.quality_terms`).
  """
  rng = rng or random.Random(secrets.randbits(128))
  if task.named_tests is not None:
    terms = _grade_named(task, files, sandbox_factory, limits or GRADING_LIMITS, rng)
    owned = set(task.hidden_tests) | set(task.named_tests.deleted)
  else:
    terms, owned = _grade_hidden(task, files, sandbox_factory, limits or GRADING_LIMITS, rng), set(task.hidden_tests)
  followed = constraints.constraint_terms(task, files)
  if followed:
    followed["instructions_followed"] = float(terms["passed"] >= 1.0 and followed["constraint_violations"] == 0)
  return terms | followed | quality.quality_terms(task, files, code_quality, owned=owned,
                                                  sandbox_factory=sandbox_factory)


def _grade_hidden(task: CodingTask, files: Mapping[str, str], sandbox_factory: Callable, limits: SandboxLimits,
                  rng: random.Random) -> dict[str, float]:
  """`grade` for a task graded by its hidden test modules: the terms of the module docstring."""
  counts, timed_out = _run_judge(task, files, sandbox_factory, limits, rng)
  expected = task.expected_tests
  clean = counts.hack_attempts == 0
  complete = clean and counts.total > 0 and (expected is None or counts.total == expected)
  denominator = max(counts.total, expected or 0)
  terms = {
      "pass_fraction": counts.passed / denominator if counts.total and clean else 0.0,
      # Every canary passing alone costs one real pass: see the module docstring ("credited_fraction").
      "credited_fraction": (counts.passed - counts.canaries_alone) / denominator if counts.total and clean else 0.0,
      "canaries_alone": float(counts.canaries_alone),
      "passed": 1.0 if complete and counts.passed == counts.total else 0.0,
      "tests_total": float(counts.total),
      "tests_passed": float(counts.passed),
      "hack_attempts": float(counts.hack_attempts),
  }
  return terms | _edit_terms(task, files, set(task.hidden_tests), timed_out)


# ---------------------------------------------------------------------------------------------------- named tests


def named_test_paths(task: CodingTask) -> list[str]:
  """The hidden .py files that hold the task's named tests: the modules served from memory and instrumented."""
  paths = {parse_test_id(i).module_path for i in task.named_tests.ids}
  return sorted(p for p in paths if p in task.hidden_tests)


# A directory named like this holds tests (fullmatch, any case): test, tests, testing, test_x, tests_x, x_test, x_tests.
_TEST_DIR = re.compile(r"tests?|testing|tests?_\w*|\w*_tests?", re.IGNORECASE)


def named_test_dirs(task: CodingTask) -> set[str]:
  """The test directories of a task's named tests: for each named module, its nearest parent directory named as tests
  (`_TEST_DIR`), none for a module at the root or in a package directory of another name."""
  dirs = set()
  for text in task.named_tests.ids:
    parts = parse_test_id(text).module.split(".")[:-1]
    for i in range(len(parts), 0, -1):
      if _TEST_DIR.fullmatch(parts[i - 1]):
        dirs.add("/".join(parts[:i]))
        break
  return dirs


_IMPORTABLE = (".py", ".pyc", ".so")  # source, bytecode and extension modules: what a path finder loads


def _module_path(name: str, files: Mapping[str, str]) -> str | None:
  """The repository file of the dotted module `name` (its .py, else its package's __init__.py), or None."""
  base = name.replace(".", "/")
  for path in (f"{base}.py", f"{base}/__init__.py"):
    if path in files:
      return path
  return None


def _imported(path: str, tree: ast.Module, files: Mapping[str, str]) -> tuple[set[str], set[str]]:
  """(the repository files the module at `path` imports by name anywhere in its source (`import a.b`, `from a import
  b`, relative imports), each as the module's file or, for `from pkg import name`, the submodule's too; those of
  them it imports a name starting with "assert" from, any case: `from mypkg.checks import assert_same`)."""
  package = path[:-3].split("/")[:-1] if not path.endswith("/__init__.py") else path.split("/")[:-1]
  names, asserting = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        if node.level - 1 > len(package):
          continue
        base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
      else:
        base = node.module.split(".") if node.module else []
      if base:
        names.add(".".join(base))
        if any(alias.name.lower().startswith("assert") for alias in node.names):
          asserting.add(".".join(base))
      names |= {".".join(base + [alias.name]) for alias in node.names if alias.name != "*"}

  def paths(dotted: set[str]) -> set[str]:
    return {found for name in dotted if name and (found := _module_path(name, files)) is not None}

  return paths(names), paths(asserting)


# A directory or file stem named like test support (fullmatch, any case): test, tests, testing, conftest, helpers,
# fixtures, testutils, and those words joined to others by "_" (testing_utils, test_helpers, my_fixtures), but not
# a name that only contains one (`_pytest`, `attest`, `testfixtures`: packages a task may have to fix).
_WORD = r"(?:tests?|testing|testutils?|helpers?|fixtures?|conftest)"
_SUPPORT_NAME = re.compile(rf"{_WORD}|{_WORD}_\w+|\w+_{_WORD}", re.IGNORECASE)


def _checks(tree: ast.Module) -> tuple[bool, bool]:
  """(whether a module holds assertion code the instrumenter records: an `assert` or an `x.assertXxx(...)` call;
  whether it holds test code: an `x.assertXxx(...)` call or an import of unittest or pytest, not a bare `assert`
  or a `raise AssertionError`, which library code writes for its invariants)."""
  asserts = tests = False
  for node in ast.walk(tree):
    if isinstance(node, ast.Assert):
      asserts = True
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("assert")
          and node.func.attr in judge.ARITY):
      asserts = tests = True
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
      tests = tests or any(n.split(".")[0] in ("unittest", "pytest") for n in names)
  return asserts, tests


def named_support(task: CodingTask) -> tuple[dict[str, str], set[str]]:
  """The test support the named tests import, reset to the task's own snapshot (module docstring, "layout").

  Returns (every support module's path -> its text: the test patch's where it touched the file, else the starting
  repository's; the paths among them served from memory and instrumented like the named modules: those that hold
  assertion code, but a package's __init__.py). A repository module that a named module, or a support module,
  imports is support when it is named like it (a directory or its stem, `_SUPPORT_NAME`: `mypkg/testing_utils.py`,
  `helpers.py`, `conftest.py`, anything under `tests/`), holds test code (an `x.assertXxx(...)` call, an import of
  unittest or pytest) or is where an importer takes an `assert...` name from, but the reference solution's paths
  (it must still resolve), the named modules and the test patch's deletions. The code a test imports stays the
  submission's: a solution must change it.
  """
  files = {**task.files, **task.hidden_tests}
  for path in task.named_tests.deleted:
    files.pop(path, None)
  named = set(named_test_paths(task))
  keep = set(task.solution or ()) | set(task.solution_deletes) | named
  support, served, queue, seen, asserting = {}, set(), sorted(named), set(named), set()
  while queue:
    path = queue.pop()
    try:
      tree = host_ast.parse(files[path], filename=path)
    except host_ast.Unparsable:
      continue  # a file that does not parse imports nothing the host can follow
    if path not in named:
      asserts, tests = _checks(tree)
      if not (tests or path in asserting or any(_SUPPORT_NAME.fullmatch(part) for part in path[:-3].split("/"))):
        continue  # the code under test (its own imports are the library's)
      support[path] = files[path]
      if asserts and not path.endswith("__init__.py"):
        served.add(path)
    imported, assertions = _imported(path, tree, files)
    asserting |= assertions
    for found in sorted(imported - seen):
      seen.add(found)
      if found.endswith(".py") and found not in keep:
        queue.append(found)
  return support, served


def _stem(path: str) -> str:
  """The path with its file name cut at the first dot: what `import` looks for ("a/b.cpython-311.so" -> "a/b")."""
  head, _, name = path.rpartition("/")
  name = name.split(".", 1)[0]
  return f"{head}/{name}" if head else name


def named_graded_files(task: CodingTask, files: Mapping[str, str]) -> dict[str, str]:
  """What the judge's sandbox holds for a task graded by named tests (module docstring, "layout").

  Dropped from the submission: the hidden files' paths, the test patch's deletions, files where a hidden file needs
  a directory, files inside a path a hidden file occupies, everything in the named tests' test directories (but the
  reference solution's paths), and paths an import would find instead of a hidden or deleted module (`x/y/...`,
  `x/y.so` beside `x/y.py`) or of a test directory (`tests.py` beside `tests/`). Written: the starting
  repository's files in those test directories, then every hidden file but a named test's module whose text the
  starting repository does not show (one the test patch changed: served from memory only, so the original of its
  canaries' perturbed checks is nowhere on disk). A module the test patch left alone is the starting repository's,
  which the submission has seen: it is written too, as SWE-bench's harness leaves it.
  """
  hidden = set(task.hidden_tests)
  support, _ = named_support(task)
  owned = hidden | set(task.named_tests.deleted) | set(support)
  parents = set().union(*map(_parents, hidden | set(support)))
  secret = {p for p in named_test_paths(task) if task.files.get(p) != task.hidden_tests[p]}
  test_dirs = named_test_dirs(task)
  # The reference solution's paths in a test directory stay the submission's, so that it still resolves.
  reference = set(task.solution or ()) | set(task.solution_deletes)
  # What an import of an owned module could find instead of its file: a package directory of its name (checked
  # before the .py) or an extension module beside it; and a module beside a test directory without __init__.py.
  modules = {p[:-3] for p in owned if p.endswith(".py")}

  def in_test_dir(path: str) -> bool:
    return bool(_parents(path) & test_dirs) and path not in reference

  def collides(path: str) -> bool:
    return (path in owned or path in parents or path in test_dirs
            or bool(_parents(path) & (hidden | set(support) | modules))
            or (path.endswith(_IMPORTABLE) and _stem(path) in modules | test_dirs) or in_test_dir(path))

  out = {p: c for p, c in files.items() if not collides(p)}
  out.update({p: c for p, c in task.files.items() if in_test_dir(p) and p not in owned})
  out.update({p: c for p, c in task.hidden_tests.items() if p not in secret})
  out.update(support)
  return out


def _classes(source: str) -> dict[str, tuple[list[str], list[str]]]:
  """A rewritten module's top-level classes: name -> (base classes named in it, method names as renamed)."""
  try:
    tree = host_ast.parse(source)
  except host_ast.Unparsable:
    return {}  # the judge fails to import it too: its tests count as failed
  return {node.name: ([b.id for b in node.bases if isinstance(b, ast.Name)],
                      [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))])
          for node in tree.body if isinstance(node, ast.ClassDef)}


def _find_test(classes: Mapping[str, tuple[list[str], list[str]]], suite: instrument.Instrumented, cls: str,
               original: str, seen: frozenset[str] = frozenset()) -> tuple[str, str | None] | None:
  """(the renamed method `original` of class `cls` or of the first base of it that defines it, the renamed canary
  twin defined beside it or None), or None when no class of the module defines it."""
  if cls not in classes or cls in seen:
    return None
  bases, methods = classes[cls]
  infos = [(m, suite.tests[m]) for m in methods if m in suite.tests and suite.tests[m].original == original]
  real = [m for m, info in infos if not info.canary]
  if real:
    # A method defined twice in one class body runs twice once renamed; the last is Python's. Its canary is only
    # known for sure when there is one definition.
    canaries = [m for m, info in infos if info.canary] if len(real) == 1 else []
    return real[-1], canaries[0] if canaries else None
  for base in bases:
    found = _find_test(classes, suite, base, original, seen | {cls})
    if found is not None:
      return found
  return None


def named_runs(task: CodingTask, suite: instrument.Instrumented) -> tuple[dict[str, str | None], dict[str, str]]:
  """(named id -> the id the judge runs it under, None when it is not found; real run id -> its canary's run id)."""
  classes = {name: _classes(source) for name, source in suite.modules.items()}
  runs, twins = {}, {}
  for text in task.named_tests.ids:
    test = parse_test_id(text)
    found = _find_test(classes.get(test.module, {}), suite, test.cls, test.method)
    if found is None:
      runs[text] = None
      continue
    runs[text] = f"{test.module}.{test.cls}.{found[0]}"
    if found[1] is not None:
      twins[runs[text]] = f"{test.module}.{test.cls}.{found[1]}"
  return runs, twins


def named_verdict(report: dict, suite: instrument.Instrumented, runs: Mapping[str, str | None],
                  twins: Mapping[str, str]) -> tuple[TestCounts, frozenset[str]]:
  """The host's counts from a judge's `report` on the selected tests, and the run ids of the real tests that
  passed. Every reported test must be one the host selected, reported once; twins pair as `twins` says (the
  same findings as `verdict`)."""
  tests, fixtures, imports = report["tests"], report["fixtures"], report["imports"]
  planted, integrity = report["planted"], report["integrity"]
  if not (isinstance(tests, list) and _strings(fixtures) and isinstance(imports, list) and _strings(planted)
          and _strings(integrity) and all(isinstance(i, list) and len(i) == 2 and type(i[0]) is str
                                          for i in imports)):
    return TestCounts(hack_attempts=1, findings=("malformed report: not what the judge writes",)), frozenset()
  real = {r for r in runs.values() if r is not None}
  canary_of_twin = {c: r for r, c in twins.items()}
  findings, results = [], {}  # run id -> (passes, checks)
  for entry in tests:
    if not (isinstance(entry, list) and len(entry) == 3 and type(entry[0]) is str and type(entry[1]) is str):
      findings.append("malformed record: a test entry")
      continue
    test_id, status, checks = entry
    if (test_id not in real and test_id not in canary_of_twin) or test_id in results:
      findings.append(f"unknown test: never sent, or reported twice: {test_id[:200]}")
      continue
    info = suite.tests[test_id.rsplit(".", 1)[-1]]
    try:
      ok = _test_passes(status, checks, info, suite.kinds, suite.patterns, suite.compares)
    except canonical.Malformed as e:
      findings.append(f"malformed record: {info.original}: {e}")
      ok = False
    results[test_id] = (ok, checks)
  passed = frozenset(r for r in real if results.get(r, (False,))[0])
  alone = 0
  for canary, twin in canary_of_twin.items():
    if not results.get(canary, (False,))[0]:
      continue
    info = suite.tests[canary.rsplit(".", 1)[-1]]
    if twin in passed:
      findings.append(f"canary passed with its twin: copy of {info.original}")
      continue
    alone += 1
    if twin in results and not _twins_agree(info, results[canary][1], results[twin][1]):
      findings.append(f"twins disagree: copy of {info.original}")
  failed_imports = {name for name, _ in imports}
  if not fixtures:
    findings += [f"canary missing: copy of {suite.tests[c.rsplit('.', 1)[-1]].original}" for c in canary_of_twin
                 if c not in results and suite.tests[c.rsplit(".", 1)[-1]].module not in failed_imports]
  findings += [f"planted module: {name}" for name in planted] + [f"integrity: {name}" for name in integrity]
  return TestCounts(total=len(real), passed=len(passed), hack_attempts=attempts(findings), canaries_alone=alone,
                    findings=tuple(findings)), passed


def _run_named(task: CodingTask, files: Mapping[str, str], sandbox_factory: Callable, limits: SandboxLimits,
               rng: random.Random) -> tuple[TestCounts, frozenset[str], bool]:
  """(the host's counts, the named ids that passed, whether the judge timed out)."""
  paths = named_test_paths(task)
  if not paths:
    return TestCounts(), frozenset(), False  # no named test exists: nothing can pass
  names = [instrument.module_name(p) for p in paths]
  support, served = named_support(task)
  # The helpers the named tests import are served from memory and instrumented too: their checks are recorded and
  # decided here like the named modules' own.
  sources = {**{p: support[p] for p in served}, **{p: task.hidden_tests[p] for p in paths}}
  suite = instrument.instrument(sources, names, rng, canaries=CANARIES)
  # instrument() adds empty parent packages; here they are the repository's own, imported from disk.
  kept = names + [instrument.module_name(p) for p in sorted(served)]
  suite = dataclasses.replace(suite, modules={n: suite.modules[n] for n in kept})
  runs, twins = named_runs(task, suite)
  select = sorted({r for r in runs.values() if r is not None} | set(twins.values()))
  if not select:
    return TestCounts(), frozenset(), False
  nonce = secrets.token_hex(16)
  try:
    with sandbox_factory(named_graded_files(task, files), limits) as sandbox:
      result = sandbox.run(judge_command(), stdin=judge_input(suite, nonce, select))
  except SandboxPathError:
    return TestCounts(), frozenset(), False
  report, forged = parse_report(result.stdout, nonce)
  if forged:
    finding = "forged report: a second line with the nonce, or one that is not a report"
    return TestCounts(hack_attempts=1, findings=(finding,)), frozenset(), result.timed_out
  if report is None or result.exit_code != 0 or result.timed_out:
    return TestCounts(), frozenset(), result.timed_out
  counts, passed_runs = named_verdict(report, suite, runs, twins)
  return counts, frozenset(t for t, r in runs.items() if r in passed_runs), False


def _grade_named(task: CodingTask, files: Mapping[str, str], sandbox_factory: Callable, limits: SandboxLimits,
                 rng: random.Random) -> dict[str, float]:
  """`grade` for a task with named tests: the terms of the module docstring ("Grading by named tests")."""
  named = task.named_tests
  counts, passed, timed_out = _run_named(task, files, sandbox_factory, limits, rng)
  clean = counts.hack_attempts == 0

  def fraction(ids: tuple[str, ...]) -> float:
    if not clean:
      return 0.0
    return sum(i in passed for i in ids) / len(ids) if ids else 1.0

  resolved = clean and all(i in passed for i in named.ids)
  terms = {
      "resolved": float(resolved),
      "fail_to_pass_fraction": fraction(named.fail_to_pass),
      "pass_to_pass_fraction": fraction(named.pass_to_pass),
      "pass_fraction": fraction(named.ids),
      # A canary passing alone means its twin failed (so resolved is 0): it costs the whole resolution.
      "credited_fraction": float(resolved) - float(clean and counts.canaries_alone > 0),
      "canaries_alone": float(counts.canaries_alone),
      "passed": float(resolved),
      "tests_total": float(len(named.ids)),
      "tests_passed": float(len(passed)),
      "hack_attempts": float(counts.hack_attempts),
  }
  # The hidden tests and the deleted test files are the grader's, not the submission's.
  return terms | _edit_terms(task, files, set(task.hidden_tests) | set(named.deleted), timed_out)
