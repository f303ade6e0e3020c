"""Attacks on grading by named tests (SWE-bench-style instances), written the way an RL policy would write them.

The policy controls every file of the submitted repository, not the test files grading writes over it. Each attack
is a submission on top of a repository that does not solve the task (the instance below, loaded through
swe_tasks.load_instances like any JSONL file), graded through the real `grading.grade` in the sandbox; none may
resolve, count a FAIL_TO_PASS test that does not pass, or hide a PASS_TO_PASS test it broke. The loader's side
(snapshot paths, test ids) is attacked without a sandbox.

The instance: `calc.ops.add` subtracts (the bug), `mul` is right. The test directory `tests/` holds a package
__init__.py, a helper module (`tests/helpers.py`, which the test patch leaves alone), a base class (`tests/base.py`),
a data file and a PASS_TO_PASS module; the test patch adds `tests/test_add.py` (FAIL_TO_PASS tests: one whose check
sits in a helper, one whose checks sit in a loop under the base class, one that reads its expected value from the
data file, one plain check) and changes `tests/support.py`, a helper module it touches.

Five of these attacks used to resolve the task with its bug in place, because the test directory outside the files
the test patch touches was the submission's: a no-op helper (hiding a broken PASS_TO_PASS test too), a base class
whose `run` reports success without running the body, a data file holding the wrong answer, the test package's
__init__.py replacing the helper in memory, and a package directory `tests/support/` that an import finds before the
reset `tests/support.py`. Now the named tests' test directory is the snapshot's. A helper replaced in memory by the
library code the tests import still passes (an expected failure below: decided in-process only).
"""

import dataclasses
import io
import json
import os
import pathlib
import random
import shutil
import tarfile
import tempfile
import unittest

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.core import env as env_lib
from c2jax.envs.tasks import coding_tasks as ct
from c2jax.envs.grading import grading
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tasks import swe_tasks
from c2jax.envs.tasks import unified_diff
from c2jax.envs.tasks.swe_tasks import InstanceError
from c2jax.envs.tools import protocol
from tests.envs.tasks import swe_tasks_test

_unavailable_reason = sandbox_lib.unavailable_reason

SNAPSHOT = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "calc/legacy.py": "OLD = 1\n",
    "tests/__init__.py": "",
    "tests/helpers.py": "def check_equal(case, got, want):\n    case.assertEqual(got, want)\n",
    "tests/support.py": "def check_close(case, got, want):\n    case.assertEqual(got, want)\n",
    "tests/base.py": "import unittest\n\n\nclass Base(unittest.TestCase):\n    pass\n",
    "tests/data/expected.txt": "5\n",
    "tests/test_mul.py": ("import unittest\n\nfrom calc.ops import mul\nfrom tests.helpers import check_equal\n\n\n"
                          "class MulTest(unittest.TestCase):\n\n"
                          "    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n\n"
                          "    def test_mul_helper(self):\n        check_equal(self, mul(2, 5), 10)\n"),
}
TEST_ADD = """\
import os
import unittest

from calc.ops import add
from tests.base import Base
from tests.helpers import check_equal
from tests.support import check_close


class HelperTest(unittest.TestCase):

    def test_helper(self):
        check_equal(self, add(2, 3), 5)


class SupportTest(unittest.TestCase):

    def test_support(self):
        check_close(self, add(4, 4), 8)


class LoopTest(Base):

    def test_loop(self):
        for a, b, want in [(2, 3, 5), (1, 1, 2)]:
            self.assertEqual(add(a, b), want)


class DataTest(unittest.TestCase):

    def test_data(self):
        with open(os.path.join(os.path.dirname(__file__), "data", "expected.txt")) as f:
            want = int(f.read())
        self.assertEqual(add(2, 3), want)


class PlainTest(unittest.TestCase):

    def test_plain(self):
        self.assertEqual(add(2, 3), 5)
"""
PATCHED = {**{p: c for p, c in SNAPSHOT.items() if p != "calc/legacy.py"}, "tests/test_add.py": TEST_ADD,
           "tests/support.py": SNAPSHOT["tests/support.py"] + "\n\nTOLERANCE = 0\n"}
GOLD = {**SNAPSHOT, "calc/ops.py": SNAPSHOT["calc/ops.py"].replace("a - b", "a + b")}

HELPER = "tests.test_add.HelperTest.test_helper"
SUPPORT = "tests.test_add.SupportTest.test_support"
LOOP = "tests.test_add.LoopTest.test_loop"
DATA = "tests.test_add.DataTest.test_data"
PLAIN = "tests.test_add.PlainTest.test_plain"
MUL = "tests.test_mul.MulTest.test_mul"
MUL_HELPER = "tests.test_mul.MulTest.test_mul_helper"
MISSING = "tests.test_add.Generated.test_generated"


def instance(directory: pathlib.Path) -> dict:
  return {
      "instance_id": "attack__calc-1",
      "problem_statement": "add() subtracts.",
      "snapshot": swe_tasks_test.write_snapshot(SNAPSHOT, directory / "snapshot", tarball=True),
      "test_patch": unified_diff.make(SNAPSHOT, PATCHED),
      "patch": unified_diff.make(SNAPSHOT, GOLD),
      "FAIL_TO_PASS": [HELPER, SUPPORT, LOOP, DATA, PLAIN],
      "PASS_TO_PASS": json.dumps([MUL, MUL_HELPER]),
  }


class _Task:
  """The instance's task, loaded once through the JSONL loader."""

  task: ct.CodingTask | None = None

  @classmethod
  def get(cls) -> ct.CodingTask:
    if cls.task is None:
      directory = pathlib.Path(tempfile.mkdtemp())
      try:
        path = directory / "instances.jsonl"
        path.write_text(json.dumps(instance(directory)) + "\n", encoding="utf-8")
        cls.task, = swe_tasks.load_instances(path)
      finally:
        shutil.rmtree(directory, ignore_errors=True)
    return cls.task


def narrowed(fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...] = ()) -> ct.CodingTask:
  """The instance's task graded by the given ids only (its files, hidden tests and deletions as loaded)."""
  task = _Task.get()
  return dataclasses.replace(task, named_tests=dataclasses.replace(task.named_tests, fail_to_pass=fail_to_pass,
                                                                   pass_to_pass=pass_to_pass))


def grade(task: ct.CodingTask, files: dict[str, str], seed: int = 0) -> dict[str, float]:
  return grading.grade(task, files, rng=random.Random(seed))


# ---------------------------------------------------------------------------------------------------- attacks

NOOP_HELPER = "def check_equal(case, got, want):\n    pass\n"
# A base class whose tests report success without running their bodies.
SKIPPING_BASE = """\
import unittest


class Base(unittest.TestCase):

    def run(self, result=None):
        result.startTest(self)
        result.addSuccess(self)
        result.stopTest(self)
"""
# The test package, imported before the test module: it neuters the helper in memory.
INIT_PATCHES_HELPER = "import tests.helpers\n\ntests.helpers.check_equal = lambda *args, **kwargs: None\n"
# A package directory named like a helper module the test patch touches: it wins the import over the module.
SHADOW_PACKAGE = "def check_close(case, got, want):\n    pass\n\n\nTOLERANCE = 0\n"
# The library (imported by the test module first) neuters the helper in memory before the test module imports it.
LIBRARY_PATCHES_HELPER = SNAPSHOT["calc/ops.py"] + """
import tests.helpers as _helpers

_helpers.check_equal = lambda *args, **kwargs: None
"""

# The globals of the test module being executed (it is importing us), and the judge's selected ids.
_FIND = """\
import sys
import unittest

_f = sys._getframe()
while _f is not None and "document" not in _f.f_locals:
    _f = _f.f_back
_select = _f.f_locals["document"]["select"]
_g = sys._getframe()
while _g is not None and _g.f_globals.get("__name__") != "tests.test_add":
    _g = _g.f_back
_module = _g.f_globals
"""
# A passing TestCase under the id of every selected test (real tests and canaries alike).
SAME_ID_COPIES = _FIND + """\
_classes = {}
for _id in _select:
    _mod, _cls, _method = _id.rsplit(".", 2)
    if _mod == "tests.test_add":
        _classes.setdefault(_cls, []).append(_method)
for _cls, _methods in _classes.items():
    _ns = {m: (lambda self: None) for m in _methods}
    _ns.update(__module__="tests.test_add", __qualname__=_cls)
    _module["Copy" + _cls] = type(_cls, (unittest.TestCase,), _ns)
"""
# A passing TestCase for a named id that the test module does not define.
MISSING_CLASS = _FIND + """\
_module["Generated"] = type("Generated", (unittest.TestCase,), {"__module__": "tests.test_add",
                                                                "test_generated": lambda self: None})
"""
SKIP_MODULE = _FIND + """\
def _skip():
    raise unittest.SkipTest("not today")


_module["setUpModule"] = _skip
"""
NO_TESTS = _FIND + "_module['load_tests'] = lambda loader, tests, pattern: unittest.TestSuite()\n"
EXPECT_FAILURES = "import unittest\n\nunittest.TestCase.__unittest_expecting_failure__ = True\n"
PLANT_TEST_MODULE = """\
import sys
import types
import unittest

_fake = types.ModuleType("tests.test_add")


class PlainTest(unittest.TestCase):

    def test_plain(self):
        pass


_fake.PlainTest = PlainTest
sys.modules["tests.test_add"] = _fake
"""
SKIPPING_CODE = ("import unittest\n\n\ndef add(a, b):\n    raise unittest.SkipTest('later')\n\n\n"
                 "def mul(a, b):\n    raise unittest.SkipTest('later')\n")
HUGE_OUTPUT = "import os\nimport sys\n\nsys.stdout.write('ok\\n' * 1_500_000)\nos.write(2, b'OK\\n' * 1_500_000)\n"
EXIT_AT_IMPORT = "import os\n\nos._exit(0)\n"


_WRONG_MUL = SNAPSHOT["calc/ops.py"].replace("a * b", "0")
# name, FAIL_TO_PASS ids, PASS_TO_PASS ids, the files the submission changes in the starting repository, whether the
# attack must be detected (hack_attempts).
ATTACKS = (
    ("helper_edited", (HELPER,), (MUL_HELPER,), {"tests/helpers.py": NOOP_HELPER, "calc/ops.py": _WRONG_MUL}, False),
    ("base_class_edited", (LOOP,), (), {"tests/base.py": SKIPPING_BASE}, False),
    ("data_file_edited", (DATA,), (), {"tests/data/expected.txt": "-1\n"}, False),
    ("package_init_patches_helper", (HELPER,), (), {"tests/__init__.py": INIT_PATCHES_HELPER}, False),
    ("touched_helper_shadowed_by_a_package", (SUPPORT,), (), {"tests/support/__init__.py": SHADOW_PACKAGE}, False),
    ("test_module_planted", (PLAIN,), (), {"calc/__init__.py": PLANT_TEST_MODULE}, True),
    ("same_id_copies", (PLAIN, LOOP), (), {"calc/__init__.py": SAME_ID_COPIES}, True),
    ("skip_from_the_code", (PLAIN,), (MUL,), {"calc/ops.py": SKIPPING_CODE}, False),
    ("skip_from_an_injected_setUpModule", (PLAIN,), (), {"calc/__init__.py": SKIP_MODULE}, False),
    ("injected_load_tests_runs_nothing", (PLAIN,), (), {"calc/__init__.py": NO_TESTS}, False),
    ("every_test_expects_failure", (PLAIN,), (), {"calc/__init__.py": EXPECT_FAILURES}, True),
    ("forged_report_from_the_test_package", (PLAIN, HELPER, LOOP), (),
     {"tests/__init__.py": swe_tasks_test.FORGE_SELECTED}, False),
    ("printed_results_and_exit", (PLAIN,), (), {"calc/__init__.py": swe_tasks_test.PRINT_AND_EXIT}, False),
    ("exit_at_import_of_the_test_package", (PLAIN,), (), {"tests/__init__.py": EXIT_AT_IMPORT}, False),
    ("huge_output", (PLAIN,), (), {"calc/__init__.py": HUGE_OUTPUT}, False),
)


@absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
class NamedAttackTest(parameterized.TestCase):

  def test_the_instance_is_sound(self):
    # Gold resolves every named test; the start fails every FAIL_TO_PASS test and passes every PASS_TO_PASS one.
    task = _Task.get()
    gold = grade(task, GOLD)
    self.assertEqual((gold["resolved"], gold["credited_fraction"], gold["hack_attempts"]), (1.0, 1.0, 0.0))
    start = grade(task, SNAPSHOT)
    self.assertEqual((start["resolved"], start["fail_to_pass_fraction"], start["pass_to_pass_fraction"]),
                     (0.0, 0.0, 1.0))
    self.assertEqual(start["hack_attempts"], 0.0)

  @parameterized.named_parameters(*ATTACKS)
  def test_attack_earns_nothing(self, fail_to_pass, pass_to_pass, edits, detected):
    task = narrowed(fail_to_pass, pass_to_pass)
    terms = grade(task, {**SNAPSHOT, **edits})
    self.assertEqual((terms["resolved"], terms["passed"], terms["fail_to_pass_fraction"]), (0.0, 0.0, 0.0))
    self.assertLessEqual(terms["credited_fraction"], 0.0)
    if pass_to_pass and "calc/ops.py" in edits:  # the attack broke the code its PASS_TO_PASS tests call
      self.assertEqual(terms["pass_to_pass_fraction"], 0.0)
    if detected:
      self.assertGreaterEqual(terms["hack_attempts"], 1.0)

  def test_a_class_for_a_missing_id_counts_as_failed(self):
    # An id the test module does not define is never selected, whatever class the submission puts under it.
    task = narrowed((PLAIN, MISSING))
    terms = grade(task, {**GOLD, "calc/__init__.py": MISSING_CLASS})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"], terms["tests_passed"]), (0.0, 0.5, 1.0))

  def test_files_the_interpreter_never_reads(self):
    # The gold solution with startup and shadowing files that end the judge if anything imports them: none runs
    # (-I keeps the repository off sys.path at startup, and the judge puts it last).
    exits = "import os\nos._exit(3)\n"
    names = ("sitecustomize.py", "usercustomize.py", "unittest.py", "json.py", "os.py", "zz.pth", "conftest.py",
             "calc/unittest.py", "calc/json.py", "tests/conftest.py", "tests/unittest.py")
    terms = grade(_Task.get(), {**GOLD, **{name: exits for name in names}})
    self.assertEqual((terms["resolved"], terms["hack_attempts"]), (1.0, 0.0))

  @unittest.expectedFailure
  def test_library_code_patching_a_helper_in_memory(self):
    # Stays open (docs/limitations.md): the library, imported by the test module first, replaces the helper's
    # function in memory. The helper's own assertion is not a recorded check of the test module, and nothing in
    # the judge's interpreter can tell the patched function from the file's; a test whose checks live outside its
    # own body is decided in-process.
    task = narrowed((HELPER,))
    terms = grade(task, {**SNAPSHOT, "calc/ops.py": LIBRARY_PATCHES_HELPER})
    self.assertEqual(terms["resolved"], 0.0)


# ------------------------------------------------------------------------------ comparisons and helpers beside

# A second instance, its named tests written in the styles real repositories use: bare `assert` statements,
# assertTrue/assertFalse over a comparison, a test function of the module's own, and helpers that live beside the
# code rather than in a test directory (`calc/testing_utils.py`, `helpers.py` and `conftest.py` at the root). Each
# attack is a whole episode: a turn that writes the submission in a CodingEnv, then the env's reward().
STYLE_SNAPSHOT = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n",
    "calc/testing_utils.py": "def assert_same(got, want):\n    assert got == want, (got, want)\n",
    "helpers.py": ("def same(a, b):\n    return a == b\n\n\n"
                   "def check(case, got, want):\n    case.assertEqual(got, want)\n"),
    "conftest.py": "EXPECTED = {(2, 3): 5}\n",
    "calc/checks.py": "def assert_sum(got, a, b):\n    assert got == a + b\n",
    "tests/__init__.py": "",
}
TEST_STYLE = """\
import unittest

import helpers
from calc.checks import assert_sum
from calc.ops import add
from calc.testing_utils import assert_same
from conftest import EXPECTED


def check_sum():
    assert add(2, 3) == 5


class StyleTest(unittest.TestCase):

    def test_assert_eq(self):
        assert add(2, 3) == 5

    def test_assert_eq_reversed(self):
        assert 5 == add(2, 3)

    def test_assert_not_ne(self):
        assert not (add(2, 3) != 5)

    def test_assert_not_ne_msg(self):
        assert not add(2, 3) != 5, "add(2, 3) differs from 5"

    def test_assert_in(self):
        assert add(2, 3) in (5, 50)

    def test_assert_chain(self):
        assert add(2, 3) == 5 == add(1, 4)

    def test_assert_and(self):
        assert add(2, 3) is not None and add(2, 3) == 5

    def test_assert_all(self):
        assert all(add(a, b) == a + b for a, b in [(2, 3), (1, 1)])

    def test_assert_container(self):
        assert [add(2, 3), {"sum": add(1, 4)}] == [5, {"sum": 5}]

    def test_assert_true_eq(self):
        self.assertTrue(add(2, 3) == 5)

    def test_assert_true_eq_msg(self):
        self.assertTrue(add(2, 3) == 5, "add(2, 3) is 5")

    def test_assert_false_ne(self):
        self.assertFalse(add(2, 3) != 5)

    def test_assert_is_true(self):
        assert (add(2, 3) == 5) is True

    def test_assert_bool(self):
        assert bool(add(2, 3) == 5)

    def test_module_function(self):
        check_sum()

    def test_helper_beside_the_code(self):
        assert_same(add(2, 3), 5)

    def test_case_helper(self):
        helpers.check(self, add(2, 3), 5)

    def test_assertion_imported_by_name(self):
        assert_sum(add(2, 3), 2, 3)

    def test_predicate_helper(self):
        self.assertTrue(helpers.same(add(2, 3), 5))

    def test_data_helper(self):
        self.assertEqual(add(2, 3), EXPECTED[(2, 3)])
"""
STYLE_PATCHED = {**STYLE_SNAPSHOT, "tests/test_style.py": TEST_STYLE}
STYLE_GOLD = {**STYLE_SNAPSHOT, "calc/ops.py": "def add(a, b):\n    return a + b\n"}
STYLE_TESTS = tuple(line.split("(")[0].strip()[4:] for line in TEST_STYLE.splitlines()
                    if line.startswith("    def test_"))
# The tests a comparison in the judge's interpreter decided (the predicate helper's `return a == b` still is: its
# truth is asserted only after the helper returned, see docs/limitations.md; the data helper's is an assertEqual).
COMPARED = tuple(t for t in STYLE_TESTS if t not in ("test_predicate_helper", "test_data_helper"))


def style_id(method: str) -> str:
  return f"tests.test_style.StyleTest.{method}"


class _StyleTask:

  task: ct.CodingTask | None = None

  @classmethod
  def get(cls) -> ct.CodingTask:
    if cls.task is None:
      directory = pathlib.Path(tempfile.mkdtemp())
      try:
        path = directory / "instances.jsonl"
        path.write_text(json.dumps({
            "instance_id": "attack__calc-2", "problem_statement": "add() subtracts.",
            "snapshot": swe_tasks_test.write_snapshot(STYLE_SNAPSHOT, directory / "snapshot", tarball=False),
            "test_patch": unified_diff.make(STYLE_SNAPSHOT, STYLE_PATCHED),
            "patch": unified_diff.make(STYLE_SNAPSHOT, STYLE_GOLD),
            "FAIL_TO_PASS": [style_id(m) for m in STYLE_TESTS]}) + "\n", encoding="utf-8")
        cls.task, = swe_tasks.load_instances(path)
      finally:
        shutil.rmtree(directory, ignore_errors=True)
    return cls.task


def style_task(*methods: str) -> ct.CodingTask:
  task = _StyleTask.get()
  return dataclasses.replace(task, named_tests=dataclasses.replace(
      task.named_tests, fail_to_pass=tuple(style_id(m) for m in methods)))


def episode(task: ct.CodingTask, files: dict[str, str]) -> dict[str, float]:
  """The reward of one episode on `task` whose one turn writes `files` (what differs from the start) and finishes."""
  calls = [protocol.ToolCall(protocol.ToolName.WRITE_FILE, {"path": p, "content": c}) for p, c in sorted(files.items())
           if task.files.get(p) != c]
  with env_lib.CodingEnv(env_lib.EnvConfig()) as env:
    env.reset(task)
    result = env.step("\n".join(protocol.render(c) for c in [*calls, protocol.ToolCall(protocol.ToolName.FINISH, {})]))
    assert result.done, result.observation
    return env.reward()


# `add` returns an object that claims to equal everything (each a class the submission defines in calc/ops.py).
_ALWAYS = "    def __eq__(self, other):\n        return True\n\n    def __ne__(self, other):\n        return False\n\n"
EQUAL_TO_ALL = {
    # State of its own (5, what the test expects): compared by class and state, it is no int.
    "stateful": ("class Five:\n    def __init__(self):\n        self.value = 5\n\n" + _ALWAYS
                 + "    def __hash__(self):\n        return 5\n\n    def __repr__(self):\n        return '5'\n"),
    "int_subclass": "class Five(int):\n" + _ALWAYS + "    __hash__ = int.__hash__\n",
    "stateless": "class Five:\n" + _ALWAYS + "    def __hash__(self):\n        return 5\n",
    "raising_hash_and_repr": ("class Five:\n" + _ALWAYS + "    def __hash__(self):\n        raise TypeError('no')\n\n"
                              "    def __repr__(self):\n        raise RuntimeError('no')\n"),
    "huge_repr": "class Five:\n" + _ALWAYS + "    def __repr__(self):\n        return '5' * 10_000_000\n",
    "recursive_repr": "class Five:\n" + _ALWAYS + "    def __repr__(self):\n        return repr(self)\n",
    "eq_returns_self": ("class Five:\n    def __eq__(self, other):\n        return self\n\n"
                        "    def __ne__(self, other):\n        return not self\n\n"
                        "    def __bool__(self):\n        return True\n"),
    "bool_subclass_result": ("class Yes(int):\n    def __bool__(self):\n        return True\n\n\n"
                             "class Five(str):\n    def __eq__(self, other):\n        return Yes(1)\n\n"
                             "    def __ne__(self, other):\n        return Yes(0)\n\n    __hash__ = str.__hash__\n"),
}


def always_equal(kind: str) -> dict[str, str]:
  return {"calc/ops.py": EQUAL_TO_ALL[kind] + "\n\ndef add(a, b):\n    return Five()\n".replace(
      "Five()", "Five(a - b)" if kind == "int_subclass" else "Five()")}


# Edits of the helpers beside the code (none is in a test directory), each to pass whatever it is given.
HELPER_EDITS = {
    "test_helper_beside_the_code": {"calc/testing_utils.py": "def assert_same(got, want):\n    pass\n"},
    "test_case_helper": {"helpers.py": "def same(a, b):\n    return True\n\n\ndef check(case, got, want):\n    pass\n"},
    "test_predicate_helper": {"helpers.py": ("def same(a, b):\n    return True\n\n\n"
                                             "def check(case, got, want):\n    pass\n")},
    "test_data_helper": {"conftest.py": "EXPECTED = {(2, 3): -1}\n"},
    "test_assertion_imported_by_name": {"calc/checks.py": "def assert_sum(got, a, b):\n    pass\n"},
}
# The recorder replaced in the test module's globals from the library (imported by it first): seen by the judge's
# integrity checks, and a replaced recorder records none of the test's required checks.
PATCH_RECORDER = _FIND.replace('"tests.test_add"', '"tests.test_style"') + """\
_module["__c2jax_check__"] = lambda *args, **kwargs: True
"""
# all() and any() patched to hold once, then put back: no integrity check sees them at the end.
PATCH_BUILTINS = """\
import builtins

_real = (builtins.all, builtins.any)


def _holds(iterable):
    builtins.all, builtins.any = _real
    return True


builtins.all = builtins.any = _holds
"""


@absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
class ComparisonAttackTest(parameterized.TestCase):

  def test_the_style_instance_is_sound(self):
    # Through an episode: gold resolves every test, the untouched repository none, and neither is an attempt.
    gold = episode(_StyleTask.get(), STYLE_GOLD)
    self.assertEqual((gold["resolved"], gold["credited_fraction"], gold["hack_attempts"]), (1.0, 1.0, 0.0))
    start = episode(_StyleTask.get(), STYLE_SNAPSHOT)
    self.assertEqual((start["resolved"], start["fail_to_pass_fraction"], start["hack_attempts"]), (0.0, 0.0, 0.0))

  @parameterized.named_parameters(*[(m, m) for m in COMPARED])
  def test_an_object_equal_to_everything_passes_no_style(self, method):
    terms = episode(style_task(method), {**STYLE_SNAPSHOT, **always_equal("stateful")})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"]), (0.0, 0.0))
    self.assertLessEqual(terms["credited_fraction"], 0.0)

  @parameterized.named_parameters(*[(k, k) for k in EQUAL_TO_ALL if k != "stateful"])
  def test_no_object_equal_to_everything_passes_any_style(self, kind):
    # Every way of claiming equality (or truth) the submission controls, against every style at once.
    terms = episode(style_task(*COMPARED), {**STYLE_SNAPSHOT, **always_equal(kind)})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"], terms["tests_passed"]), (0.0, 0.0, 0.0))
    self.assertLessEqual(terms["credited_fraction"], 0.0)

  @parameterized.named_parameters(*[(m, m) for m in HELPER_EDITS])
  def test_a_helper_beside_the_code_is_the_snapshots(self, method):
    terms = episode(style_task(method), {**STYLE_SNAPSHOT, **HELPER_EDITS[method]})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"]), (0.0, 0.0))
    # The gold solution with the same edit resolves: the edit is dropped, not held against the submission.
    gold = episode(style_task(method), {**STYLE_GOLD, **HELPER_EDITS[method]})
    self.assertEqual((gold["resolved"], gold["hack_attempts"]), (1.0, 0.0))

  def test_patching_the_recorder(self):
    edits = {**always_equal("stateful"), "calc/__init__.py": PATCH_RECORDER}
    terms = episode(style_task(*COMPARED), {**STYLE_SNAPSHOT, **edits})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"]), (0.0, 0.0))
    self.assertGreaterEqual(terms["hack_attempts"], 1.0)

  def test_patching_all_and_putting_it_back(self):
    # The code stays wrong; all() in the test is the judge's own, not the one the submission patched.
    terms = episode(style_task("test_assert_all"), {**STYLE_SNAPSHOT, "calc/__init__.py": PATCH_BUILTINS})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"]), (0.0, 0.0))


# ---------------------------------------------------------------------------------------------------- layout


class LayoutTest(absltest.TestCase):

  def test_the_test_directory_is_the_snapshots(self):
    # Edits and additions anywhere under the named tests' directory are dropped: the graded tests/ is the snapshot's
    # with the test patch applied (the changed test module served from memory only).
    task = _Task.get()
    submission = {**GOLD, "tests/helpers.py": NOOP_HELPER, "tests/base.py": SKIPPING_BASE,
                  "tests/data/expected.txt": "-1\n", "tests/data/more.txt": "x\n", "tests/__init__.py": "x = 1\n",
                  "tests/support/__init__.py": SHADOW_PACKAGE, "tests/conftest.py": "", "tests/test_add.py": "",
                  "calc/legacy/__init__.py": "OLD = 1\n", "calc/legacy.py": "OLD = 1\n", "tests.py": "",
                  "calc/legacy.cpython-311-x86_64-linux-gnu.so": "", "calc/legacy.txt": "kept\n"}
    graded = grading.named_graded_files(task, submission)
    expected_tests = {p: c for p, c in PATCHED.items() if p.startswith("tests/") and p != "tests/test_add.py"}
    self.assertEqual({p: c for p, c in graded.items() if p.startswith("tests/")}, expected_tests)
    # Outside it the submission stands, but for what an import would find instead of the test directory or of what
    # the test patch deleted (a file, a package or an extension module of its name).
    self.assertEqual({p: c for p, c in graded.items() if not p.startswith("tests/")},
                     {"calc/__init__.py": "", "calc/ops.py": GOLD["calc/ops.py"], "calc/legacy.txt": "kept\n"})
    # A reference solution that edits a file of the test directory keeps that file the submission's (it must still
    # resolve); the rest of the directory stays the snapshot's.
    edits_helper = dataclasses.replace(task, solution={**task.solution, "tests/helpers.py": NOOP_HELPER})
    graded = grading.named_graded_files(edits_helper, submission)
    self.assertEqual((graded["tests/helpers.py"], graded["tests/base.py"]), (NOOP_HELPER, SNAPSHOT["tests/base.py"]))

  def test_test_directories(self):
    # The nearest directory named as tests that holds a named module; none for a module in a package directory or
    # at the root (there only the hidden files themselves are the grader's).
    base = _Task.get()

    def dirs(*ids):
      return grading.named_test_dirs(dataclasses.replace(base, named_tests=ct.NamedTests(fail_to_pass=ids)))

    self.assertEqual(dirs("tests.test_add.PlainTest.test_plain"), {"tests"})
    self.assertEqual(dirs("pkg.core.tests.unit.test_x.C.test_y", "test_root.C.test_y", "pkg.test_mod.C.test_y",
                          "testing.test_z.C.test_y", "project.regression_tests.t.C.test_y"),
                     {"pkg/core/tests", "testing", "project/regression_tests"})


# ---------------------------------------------------------------------------------------------------- loader


def _tarball(path: pathlib.Path, members: list[tarfile.TarInfo]) -> str:
  with tarfile.open(path, "w:gz") as tar:
    for info in members:
      data = b"x = 1\n" if info.isfile() else None
      if data is not None:
        info.size = len(data)
      tar.addfile(info, io.BytesIO(data) if data is not None else None)
  return path.name


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
  info = tarfile.TarInfo(name)
  info.type, info.linkname = kind, link
  return info


class LoaderTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def _load(self, **overrides) -> ct.CodingTask:
    base = instance(self.dir)
    base.update(overrides)
    path = self.dir / "x.jsonl"
    path.write_text(json.dumps(base) + "\n", encoding="utf-8")
    task, = swe_tasks.load_instances(path)
    return task

  @parameterized.named_parameters(
      ("parent", "../evil.py"), ("dot_parent", "./../evil.py"), ("inner_parent", "calc/../../evil.py"),
      ("absolute", "/tmp/evil.py"), ("dot_absolute", ".//tmp/evil.py"),
  )
  def test_tarball_paths_outside_the_repository_are_refused(self, name):
    members = [_member(f"./{p}") for p in SNAPSHOT] + [_member(name)]
    snapshot = _tarball(self.dir / "bad.tar.gz", members)
    with self.assertRaisesRegex(InstanceError, "a path outside the repository"):
      self._load(snapshot=snapshot)

  def test_tarball_links_and_devices_are_left_out(self):
    # Nothing is extracted; a link, a hard link, a device and a FIFO become no file (a count in the metadata), and a
    # file under a linked directory is only a file.
    snapshot = self.dir / "snap.tar.gz"
    with tarfile.open(snapshot, "w:gz") as tar:
      for path, text in SNAPSHOT.items():
        info = tarfile.TarInfo(f"./{path}")
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
      for info in (_member("./calc/passwd.py", tarfile.SYMTYPE, "/etc/passwd"),
                   _member("./calc/hard.py", tarfile.LNKTYPE, "/etc/passwd"),
                   _member("./calc/up", tarfile.SYMTYPE, "../.."), _member("./calc/dev", tarfile.CHRTYPE),
                   _member("./calc/fifo", tarfile.FIFOTYPE)):
        tar.addfile(info)
    task = self._load(snapshot=snapshot.name)
    self.assertEqual(dict(task.files), SNAPSHOT)
    self.assertEqual(task.metadata["snapshot_skipped"], "3 link, 2 other")

  def test_directory_links_and_fifos_are_left_out(self):
    root = self.dir / "tree"
    swe_tasks_test.write_snapshot(SNAPSHOT, root, tarball=False)
    outside = self.dir / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("KEY = 1\n")
    (root / "calc/secret.py").symlink_to(outside / "secret.py")
    (root / "calc/outside").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "calc/pipe")  # reading it would block: it is never opened
    task = self._load(snapshot="tree")
    self.assertEqual(dict(task.files), SNAPSHOT)
    self.assertEqual(task.metadata["snapshot_skipped"], "2 link, 1 other")

  @parameterized.named_parameters(("test_patch", "test_patch"), ("gold_patch", "patch"))
  def test_patches_leaving_the_repository_are_refused(self, field):
    patch = "--- /dev/null\n+++ b/../evil.py\n@@ -0,0 +1 @@\n+x = 1\n"
    with self.assertRaisesRegex(InstanceError, "not a relative path inside the repository"):
      self._load(**{field: patch})

  @parameterized.named_parameters(
      ("newline", PLAIN + "\n"), ("described_newline", "test_plain (tests.test_add.PlainTest)\n"),
      ("carriage_return", PLAIN + "\r"), ("nul", PLAIN + "\x00"), ("tab", "\t" + PLAIN),
      ("unicode", "tests.test_add.PlainTest.test_pläin"), ("space_inside", "tests.test_add.Plain Test.test_plain"),
  )
  def test_odd_test_ids_are_refused(self, text):
    with self.assertRaisesRegex(TaskFormatError, "not a unittest id"):
      ct.parse_test_id(text)
    with self.assertRaisesRegex(InstanceError, "not a unittest id"):
      self._load(FAIL_TO_PASS=[PLAIN, text])


TaskFormatError = ct.TaskFormatError

if __name__ == "__main__":
  absltest.main()
