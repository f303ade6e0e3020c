"""The host's rewriting of hidden tests: recorder calls with random ids, random names in the real tests' order,
required checks, and canaries that an honest solution fails (run here through the judge's loader and recorder)."""

import ast
import random
import sys
import threading

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs import coding_rl
from c2jax.envs.grading import grading
from c2jax.envs.grading import instrument
from c2jax.envs.grading import judge
from tests.envs.grading.grader_references_test import judge_in_process
from tests.envs.grading.grading_test import TASK

SOURCE = """\
import unittest

from solution import f


class T(unittest.TestCase):

    def test_b_flags(self):
        self.assertTrue(f(1) > 0)
        for x in [1, 2]:
            self.assertGreater(f(x), 0)

    def test_a_values(self):
        self.assertEqual(f(2), 4)
        with self.subTest(x=3):
            self.assertEqual(f(3), 9)
        with self.assertRaises(TypeError):
            f(None)
            self.fail("no error")
        if f(0) == 0:
            self.assertIsNone(None)

    @unittest.skip("decorated: never a canary")
    def test_c_skipped(self):
        self.assertEqual(f(1), 1)

    def helper(self):
        self.assertEqual(1, 1)
"""
HIDDEN = {"hidden_tests/__init__.py": "", "hidden_tests/test_t.py": SOURCE}


def calls(source):
  return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
          judge.RECORDER]


class InstrumentTest(parameterized.TestCase):

  def test_every_assertion_becomes_a_recorded_check(self):
    suite = instrument.instrument(HIDDEN, ["hidden_tests.test_t"], random.Random(0), canaries=0)
    source = suite.modules["hidden_tests.test_t"]
    self.assertNotIn("self.assert", source)
    self.assertNotIn("self.fail", source)
    found = calls(source)
    self.assertLen(found, 10)  # nine assertions and the comparison asserted by assertTrue(f(1) > 0)
    self.assertEqual({c.args[1].value: c.args[2].value for c in found}, suite.kinds)
    self.assertEqual(suite.modules["hidden_tests"], "")
    compile(source, "t.py", "exec")

  def test_names_are_random_and_keep_the_order(self):
    a = instrument.instrument(HIDDEN, ["hidden_tests.test_t"], random.Random(1), canaries=0)
    b = instrument.instrument(HIDDEN, ["hidden_tests.test_t"], random.Random(2), canaries=0)
    self.assertNotEqual(set(a.tests), set(b.tests))
    self.assertNotEqual(set(a.kinds), set(b.kinds))
    for suite in (a, b):
      by_order = [suite.tests[n].original for n in sorted(suite.tests)]
      self.assertEqual(by_order, ["test_a_values", "test_b_flags", "test_c_skipped"])
      self.assertTrue(all(n.startswith("test_") and len(n) == 17 for n in suite.tests))

  def test_required_checks_are_the_unconditional_ones(self):
    suite = instrument.instrument(HIDDEN, ["hidden_tests.test_t"], random.Random(0), canaries=0)
    by_original = {i.original: i for i in suite.tests.values()}
    # test_a_values: the top-level assertEqual, the one in subTest, the assertRaises (not the fail inside it, not
    # the assertIsNone under the if).
    self.assertEqual(sorted(suite.kinds[i] for i in by_original["test_a_values"].required),
                     ["assertEqual", "assertEqual", "assertRaises"])
    self.assertEqual([suite.kinds[i] for i in by_original["test_b_flags"].required], ["assertTrue"])

  @parameterized.parameters(range(6))
  def test_canaries_copy_real_tests_and_an_honest_solution_fails_them(self, seed):
    suite = instrument.instrument(HIDDEN, ["hidden_tests.test_t"], random.Random(seed), canaries=2)
    canaries = [suite.tests[n] for n in suite.canaries]
    self.assertLen(canaries, 2)
    self.assertTrue(all(c.original in ("test_a_values", "test_b_flags") for c in canaries))
    # Run for real: the honest f passes its two undecorated real tests (the skipped one is a skip, not a pass)
    # and fails both canaries without a finding.
    task = instrument_task()
    counts = judge_in_process(task, "def f(x):\n    if x is None:\n        raise TypeError\n    return x * x\n", seed)
    self.assertEqual((counts.total, counts.passed, counts.hack_attempts), (3, 2, 0), counts.findings)

  def test_a_test_without_a_perturbable_check_gets_no_canary(self):
    hidden = {"hidden_tests/test_x.py": "import unittest\n\n\nclass X(unittest.TestCase):\n\n"
                                        "    def test_x(self):\n        for i in range(2):\n"
                                        "            self.assertEqual(i, i)\n"}
    suite = instrument.instrument(hidden, ["hidden_tests.test_x"], random.Random(0), canaries=2)
    self.assertEqual(suite.canaries, [])
    self.assertIn("hidden_tests", suite.modules)  # the parent package is made up (empty)

  @parameterized.parameters(range(8))
  def test_a_canary_perturbs_a_check_without_a_tell_when_the_test_has_one(self, seed):
    # An empty list can only grow, None only becomes an int, a complemented assertEqual reads assertNotEqual: a
    # forger that diffs the twins would know the real one. The int check has no such tell, so it is the one moved.
    hidden = {"hidden_tests/test_x.py": "import unittest\n\nfrom m import f\n\n\nclass X(unittest.TestCase):\n\n"
                                        "    def test_x(self):\n        self.assertEqual(f(0), [])\n"
                                        "        self.assertIsNone(f(None))\n        self.assertEqual(f(1), None)\n"
                                        "        self.assertEqual(f(2), 4)\n        self.assertEqual(f(3), '')\n"}
    suite = instrument.instrument(hidden, ["hidden_tests.test_x"], random.Random(seed), canaries=None)
    (canary,) = [suite.tests[n] for n in suite.canaries]
    mine, theirs, operand = canary.perturbed
    self.assertEqual((suite.kinds[mine], suite.kinds[theirs], operand), ("assertEqual", "assertEqual", 1))
    tree = ast.parse(suite.modules["hidden_tests.test_x"])
    (call,) = [c for c in ast.walk(tree) if instrument._recorder_call(c) and c.args[1].value == mine]
    self.assertEqual(ast.unparse(call.args[3]), "f(2)")  # the int check, not one of the others

  @parameterized.parameters(range(20))
  def test_perturbed_literals_are_unequal(self, seed):
    rng = random.Random(seed)
    for value in (0, -3, 2.5, "", "abc", b"x", None, True, [1], (), {"a": 1}, {1, 2}, [[1, 2], "x"]):
      perturbed = instrument._perturb(value, rng)
      self.assertIsNotNone(perturbed, value)
      self.assertNotEqual(repr(perturbed[0]), repr(value))
      self.assertFalse(type(perturbed[0]) is type(value) and perturbed[0] == value, value)

  def test_the_reference_task_is_instrumented_whole(self):
    suite = instrument.instrument(TASK.hidden_tests, ["hidden_tests.test_ops"], random.Random(0), canaries=2)
    self.assertEqual(sum(not i.canary for i in suite.tests.values()), TASK.expected_tests)
    self.assertLen(suite.canaries, 2)


ASSERTS = """\
import unittest

from solution import f


class A(unittest.TestCase):

    def test_eq(self):
        assert f(2) == 4, "f(2)"

    def test_in(self):
        assert f(3) in [9, 10]

    def test_is(self):
        assert f(None) is None
"""


class AssertTest(parameterized.TestCase):

  def test_assert_statements_are_recorded_and_required(self):
    suite = instrument.instrument({"hidden_tests/test_a.py": ASSERTS}, ["hidden_tests.test_a"], random.Random(0),
                                  canaries=0)
    source = suite.modules["hidden_tests.test_a"]
    self.assertNotIn("assert f(", source)
    self.assertEqual(sorted(suite.compares.values()), [("==",), ("in",), ("is",)])
    for info in suite.tests.values():
      self.assertEqual([suite.kinds[i] for i in info.required], ["assert"])

  @parameterized.parameters(range(4))
  def test_asserts_get_canaries_that_an_honest_solution_fails(self, seed):
    suite = instrument.instrument({"hidden_tests/test_a.py": ASSERTS}, ["hidden_tests.test_a"],
                                  random.Random(seed), canaries=None)
    self.assertLen(suite.canaries, 3)  # a perturbed literal (==) or a complemented operator (in, is)
    task = TASK.__class__(task_id="t", prompt="p", files={"solution.py": "f = None\n"},
                          hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_a.py": ASSERTS},
                          expected_tests=3)
    honest = "def f(x):\n    return None if x is None else x * x\n"
    counts = judge_in_process(task, honest, seed)
    self.assertEqual((counts.total, counts.passed, counts.hack_attempts, counts.canaries_alone), (3, 3, 0, 0),
                     counts.findings)
    wrong = judge_in_process(task, "def f(x):\n    return 0\n", seed)
    self.assertEqual((wrong.total, wrong.passed, wrong.hack_attempts), (3, 0, 0), wrong.findings)


def instrument_task():
  return TASK.__class__(task_id="t", prompt="p", files={"solution.py": "f = None\n"}, hidden_tests=HIDDEN,
                        expected_tests=3)


class ThreadsTest(absltest.TestCase):

  def test_grading_threads_parse_without_tripping_cpython(self):
    # An actor grades its samples in `reward_workers` threads. CPython 3.11's AST construction is not thread safe
    # ("SystemError: AST constructor recursion depth mismatch": it crashed actors of the main job); forcing
    # thread switches every microsecond made 8 unserialized threads hit it 15 times in 320 calls.
    tasks = list(coding_rl._tasks("tiny_compositions", "train"))[:8] + list(coding_rl._tasks("realistic", "heldout"))
    errors = []

    def work(seed):
      rng = random.Random(seed)
      for i in range(20):
        task = tasks[(seed + i) % len(tasks)]
        try:
          instrument.instrument(task.hidden_tests, grading.hidden_test_modules(task), rng)
          for path, source in task.solved_files().items():
            if path.endswith(".py"):
              grading.lint_count(path, source)
        except SystemError as e:
          errors.append(str(e))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
      threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
    finally:
      sys.setswitchinterval(interval)
    self.assertEqual(errors, [])


if __name__ == "__main__":
  absltest.main()
