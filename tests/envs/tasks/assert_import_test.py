"""The plain-assert importer: each rewrite form, check-style and plain-assert files run against right and wrong
candidates, refusals naming the line, and an always-equal object that passes the original asserts but not the
rewritten checks once the grader decides them."""

import ast
import sys
import types
import unittest

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.grading import grading
from c2jax.envs.tasks import assert_import as ai
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.sandbox import sandbox as sandbox_lib

_unavailable_reason = sandbox_lib.unavailable_reason
_SOLUTION = ai.Candidate("solution", "f")


def _calls(source: str) -> list[str]:
  """The rewritten test's assertion calls, as source."""
  tree = ast.parse(source)
  return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
          and n.func.attr.startswith("assert")]


def _run(source: str, **modules: dict) -> unittest.TestResult:
  """Runs a converted module in this process with `modules` (name -> namespace) importable; trusted code only."""
  saved = {name: sys.modules.get(name) for name in modules}
  try:
    for name, namespace in modules.items():
      module = types.ModuleType(name)
      module.__dict__.update(namespace)
      sys.modules[name] = module
    namespace = {"__name__": "converted"}
    exec(compile(source, "converted", "exec"), namespace)  # the test module's own source: trusted
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(namespace[ai.CLASS])
    result = unittest.TestResult()
    suite.run(result)
    return result
  finally:
    for name, module in saved.items():
      if module is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = module


class RewriteFormsTest(parameterized.TestCase):

  @parameterized.parameters(
      ("f(1) == 2", "self.assertEqual(candidate(1), 2)"),
      ("f(1) != 2", "self.assertNotEqual(candidate(1), 2)"),
      ("f(1) < 2", "self.assertLess(candidate(1), 2)"),
      ("f(1) <= 2", "self.assertLessEqual(candidate(1), 2)"),
      ("f(1) > 2", "self.assertGreater(candidate(1), 2)"),
      ("f(1) >= 2", "self.assertGreaterEqual(candidate(1), 2)"),
      ("f(1) is True", "self.assertIs(candidate(1), True)"),
      ("f(1) is not False", "self.assertIsNot(candidate(1), False)"),
      ("f(1) is None", "self.assertIsNone(candidate(1))"),
      ("f(1) is not None", "self.assertIsNotNone(candidate(1))"),
      ("1 in f(1)", "self.assertIn(1, candidate(1))"),
      ("1 not in f(1)", "self.assertNotIn(1, candidate(1))"),
      ("f(1)", "self.assertTrue(candidate(1))"),
      ("all(x > 0 for x in f(1))", "self.assertTrue(all((x > 0 for x in candidate(1))))"),
      ("not f(1)", "self.assertFalse(candidate(1))"),
      ("not f(1) == 2", "self.assertNotEqual(candidate(1), 2)"),
      ("not 1 in f(1)", "self.assertNotIn(1, candidate(1))"),
      ("not f(1) < 2", "self.assertFalse(candidate(1) < 2)"),
      ("isinstance(f(1), int)", "self.assertIsInstance(candidate(1), int)"),
      ("abs(f(1) - 2.5) < 1e-6", "self.assertAlmostEqual(candidate(1), 2.5, delta=1e-06)"),
      ("math.fabs(f(1) - 2.5) <= 1e-6", "self.assertAlmostEqual(candidate(1), 2.5, delta=1e-06)"),
      ("1e-6 > abs(f(1))", "self.assertAlmostEqual(candidate(1), 0, delta=1e-06)"),
      ("f(1) == 2, 'two'", "self.assertEqual(candidate(1), 2, msg='two')"),
  )
  def test_check_style_form(self, assertion, expected):
    source = ai.convert(f"import math\n\ndef check(candidate):\n    assert {assertion.replace('f(', 'candidate(')}\n",
                        ai.Style.CHECK, where="t.py", candidate=_SOLUTION)
    self.assertEqual(_calls(source), [expected])
    self.assertNotIn("assert ", source)  # no plain assert is left

  def test_and_splits_into_checks_in_order(self):
    source = ai.convert("def check(c):\n    assert c(1) == 1 and c(2) > 0, 'm'\n", ai.Style.CHECK, where="t.py",
                        candidate=_SOLUTION)
    self.assertEqual(_calls(source), ["self.assertEqual(c(1), 1, msg='m')", "self.assertGreater(c(2), 0, msg='m')"])

  def test_asserts_in_loops_nested_blocks_and_helpers(self):
    source = ai.convert(
        "def helper(c, x):\n    assert c(x) == x\n\n"
        "def check(candidate):\n"
        "    for i in range(3):\n        if i:\n            assert candidate(i) == i\n"
        "    with open(__file__):\n        assert candidate(0) == 0\n"
        "    def inner():\n        assert candidate(5) == 5\n    inner()\n    helper(candidate, 7)\n",
        ai.Style.CHECK, where="t.py", candidate=_SOLUTION)
    self.assertNotIn("assert ", source)
    self.assertIn(f"{ai.CASE}.assertEqual(c(x), x)", _calls(source))
    self.assertIn("self.assertEqual(candidate(5), 5)", _calls(source))  # the closure keeps the test's receiver
    self.assertIn(f"{ai.CASE} = unittest.TestCase()", source)

  def test_check_style_runs_right_and_wrong_candidates(self):
    test = ("import math\n\ndef check(candidate):\n    assert candidate(2) == 4\n"
            "    for x in range(5):\n        assert candidate(x) >= 0\n        assert not candidate(x) < 0\n"
            "    assert abs(candidate(0.5) - 0.25) < 1e-9\n    assert isinstance(candidate(3), int)\n"
            "    assert helper(candidate(3)) == 10\n")
    source = ai.convert(test, ai.Style.CHECK, where="t.py", candidate=_SOLUTION, provided={"helper": "prompt_defs",
                                                                                            "unused": "prompt_defs"})
    self.assertIn("from prompt_defs import helper\n", source)  # only what the test uses
    self.assertEqual(ai.count_tests(source), 1)
    helper = {"helper": lambda y: y + 1}
    right = _run(source, solution={"f": lambda x: x * x}, prompt_defs=helper)
    self.assertEqual((right.testsRun, len(right.failures), len(right.errors)), (1, 0, 0))
    for wrong in (lambda x: x + x, lambda x: -x * x, lambda x: float(x * x)):
      result = _run(source, solution={"f": wrong}, prompt_defs=helper)
      self.assertEqual((result.testsRun, len(result.failures)), (1, 1))

  def test_plain_assert_file(self):
    source = ai.convert(
        "from solution import f\n\nCASES = [(1, 2), (2, 4)]\n"
        "assert f(1) == 2\n"
        "for x, y in CASES:\n    assert f(x) == y\n"
        "def test_zero():\n    assert f(0) == 0\n\n"
        "def _close(a, b):\n    assert abs(a - b) < 1e-9\n\n"
        "def test_half():\n    _close(f(0.5), 1.0)\n\n"
        "if __name__ == '__main__':\n    test_zero()\n    assert f(2) == 4\n",
        ai.Style.ASSERTS, where="test_f.py")
    self.assertEqual(ai.count_tests(source), 3)
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    self.assertEqual([m.name for m in cls.body], ["test_asserts", "test_zero", "test_half"])
    self.assertNotIn("assert ", source)
    self.assertEqual(_run(source, solution={"f": lambda x: 2 * x}).wasSuccessful(), True)
    result = _run(source, solution={"f": lambda x: x + 1})
    self.assertEqual((result.testsRun, len(result.failures)), (3, 3))


class RefusalTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("chained", ai.Style.CHECK, "def check(c):\n    x = 1\n    assert 0 <= c(x) < 5\n", 3, "chained comparison"),
      ("tuple", ai.Style.CHECK, "def check(c):\n    assert (c(1) == 2, 'msg')\n", 2, "always true"),
      ("try", ai.Style.CHECK, "def check(c):\n    try:\n        assert c(1)\n    except Exception:\n        pass\n", 3,
       "try block"),
      ("yield", ai.Style.CHECK, "def check(c):\n    assert c(1)\n    yield\n", 3, "generator"),
      ("binds_self", ai.Style.CHECK, "def check(c):\n    self = c(1)\n    assert self\n", 1, "'self'"),
      ("no_check", ai.Style.CHECK, "def test(c):\n    assert c(1)\n", None, "no top-level `def check"),
      ("two_params", ai.Style.CHECK, "def check(c, d):\n    assert c(1)\n", 1, "exactly one parameter"),
      ("module_assert", ai.Style.CHECK, "def check(c):\n    assert c(1)\nassert True\n", 3, "outside the check"),
      ("no_assert", ai.Style.ASSERTS, "x = 1\n", None, "no assert"),
      ("fixture", ai.Style.ASSERTS, "def test_x(tmp_path):\n    assert tmp_path\n", 1, "pytest fixtures"),
      ("class_body", ai.Style.ASSERTS, "class T:\n    def m(self):\n        assert 1\n", 1, "class T"),
      ("walrus", ai.Style.ASSERTS, "assert (y := 3)\n", 1, "NamedExpr"),
      ("unparsable", ai.Style.ASSERTS, "assert (\n", None, "does not parse"),
  )
  def test_refused_in_one_sentence_naming_the_line(self, style, source, line, words):
    with self.assertRaises(ai.UnsupportedTest) as caught:
      ai.convert(source, style, where="bad.py", candidate=_SOLUTION)
    message = str(caught.exception)
    self.assertIn("bad.py", message)
    self.assertIn(words, message)
    if line is not None:
      self.assertIn(f"line {line}:", message)
    self.assertEqual(message.count(". "), 0, message)  # one sentence


# An object that equals everything, is always true, and subtracts to zero: each passes a plain assert.
_ALWAYS = '''
class Always:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    def __sub__(self, other):
        return 0.0
    def __bool__(self):
        return True
    __hash__ = object.__hash__


def f(x):
    return Always()
'''
_CHECKS = {
    "eq": "assert candidate(3) == 9",
    "abs": "assert abs(candidate(3) - 9.0) < 1e-6",
    "not_ne": "assert not candidate(3) != 9",
}


class AlwaysEqualTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CHECKS.items())
  def test_plain_asserts_pass_it(self, check):
    namespace = {}
    exec(_ALWAYS, namespace)  # the test module's own object: trusted
    exec(f"def check(candidate):\n    {check}\n", namespace)
    namespace["check"](namespace["f"])  # the original check passes: no AssertionError

  @parameterized.named_parameters(*_CHECKS.items())
  @absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
  def test_rewritten_checks_fail_it_in_the_grader(self, check):
    test = ai.convert(f"def check(candidate):\n    {check}\n", ai.Style.CHECK, where="t.py", candidate=_SOLUTION)
    task = CodingTask(task_id=f"always/{check[:6]}", prompt="Write f.", files={"solution.py": "def f(x):\n  pass\n"},
                      hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_f.py": test},
                      expected_tests=1, solution={"solution.py": "def f(x):\n    return x * x\n"})
    self.assertEqual(grading.grade(task, task.solved_files())["passed"], 1.0)
    self.assertEqual(grading.grade(task, {"solution.py": _ALWAYS})["passed"], 0.0)

  @absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
  def test_a_plain_abs_assert_is_decided_on_the_submitted_difference(self):
    # Why abs(a - b) < tol becomes assertAlmostEqual: left a plain assert, the grader records the comparison's
    # operands, and `a - b` is what the submitted object's __sub__ made of it.
    test = ("import unittest\nfrom solution import f\n\n\nclass T(unittest.TestCase):\n"
            "    def test_check(self):\n        assert abs(f(3) - 9.0) < 1e-6\n")
    task = CodingTask(task_id="always/plain", prompt="Write f.", files={"solution.py": "def f(x):\n  pass\n"},
                      hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_f.py": test},
                      expected_tests=1, solution={"solution.py": "def f(x):\n    return x * x\n"})
    self.assertEqual(grading.grade(task, {"solution.py": _ALWAYS})["passed"], 1.0)


if __name__ == "__main__":
  absltest.main()
