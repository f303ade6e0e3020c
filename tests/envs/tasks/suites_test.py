"""The registered coding suites: procedural determinism and splits; every realistic task solvable and not solved
from the start (graded in the sandbox, two at a time)."""

import ast
import collections
import hashlib
import random
import re

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tasks import coding_tasks as ct
from c2jax.envs.grading import grading
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tasks import suites  # noqa: F401  (registers the suites)
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, Category
from c2jax.sandbox.sandbox import SandboxPool
from c2jax.envs.tasks.suites import compositions
from c2jax.envs.tasks.suites import procedural


_unavailable_reason = sandbox_lib.unavailable_reason


def _names_only_docstrings(files: dict[str, str]) -> dict[str, str]:
  """docstrings_public_api, gamed: a module docstring, and each function's docstring lists its parameters' names."""
  out = dict(files)
  for path in ("mathx/algebra.py", "mathx/sequences.py"):
    source = re.sub(r"^def (\w+)\((.*)\):$",
                    lambda m: f'{m.group(0)}\n    """{" ".join(re.findall(r"[a-z_]+(?==|,|$)", m.group(2)))}"""',
                    files[path], flags=re.M)
    out[path] = '"""mathx."""\n\n' + source
  return out


def _hash_pinning_tests(files: dict[str, str]) -> dict[str, str]:
  """tests_for_parse_duration, gamed: four tests that only check the bytes of durations/parse.py (so they fail on
  every mutant, and on any other change)."""
  digest = hashlib.sha256(files["durations/parse.py"].encode()).hexdigest()
  methods = "".join(f"\n    def test_{i}(self):\n        self.assertEqual(hashlib.sha256(pathlib.Path("
                    f"'durations/parse.py').read_bytes()).hexdigest(), {digest!r})\n" for i in range(4))
  return {**files, "tests/test_parse.py": f"import hashlib\nimport pathlib\nimport unittest\n\n\n"
                                          f"class T(unittest.TestCase):\n{methods}"}


def _reworded_checks(task: ct.CodingTask) -> dict[str, str]:
  """orders_extract_validation, gamed: the validators exist and their names are used, but the order functions
  keep their own checks, reworded so the old literal text is gone."""
  out = dict(task.files)
  out["orders/validation.py"] = task.solution["orders/validation.py"]
  for path in ("orders/create.py", "orders/update.py"):
    out[path] = ("from orders.validation import validate_quantity, validate_sku\n\n"
                 "VALIDATORS = (validate_quantity, validate_sku)\n" +
                 task.files[path].replace("not 1 <= quantity <= 100", "not (quantity >= 1 and quantity <= 100)"))
  return out


def _grade_both(task: ct.CodingTask) -> tuple[str, dict, dict]:
  """(task id, reference terms, starting-repository terms)."""
  return task.task_id, grading.grade(task, task.solved_files()), grading.grade(task, task.files)


class ProceduralTest(parameterized.TestCase):

  @parameterized.parameters("tiny_functions", "tiny_compositions")
  def test_registered(self, name):
    self.assertIn("realistic", CODING_SUITES)
    suite = CODING_SUITES.get(name)
    self.assertEqual((suite.name, type(suite(seed=3)), suite(seed=3).seed), (name, type(suite), 3))

  def test_thousands_of_disjoint_tasks(self):
    suite = procedural.TinyFunctionsSuite(seed=0)
    train, heldout = suite.tasks("train"), suite.tasks("heldout")
    self.assertGreaterEqual(len(train) + len(heldout), 2000)
    self.assertEqual((suite.size("train"), suite.size("heldout")), (len(train), len(heldout)))
    train_ids, heldout_ids = {t.task_id for t in train}, {t.task_id for t in heldout}
    self.assertLen(train_ids, len(train))
    self.assertEmpty(train_ids & heldout_ids)
    # Distinct functions, not only distinct ids: no reference solution appears in both splits.
    self.assertEmpty({t.solution["solution.py"] for t in train} & {t.solution["solution.py"] for t in heldout})
    self.assertEqual(set(collections.Counter(t.difficulty for t in train)), {1, 2, 3})

  def test_deterministic_from_seed(self):
    a, b = procedural.TinyFunctionsSuite(seed=7), procedural.TinyFunctionsSuite(seed=7)
    for split in ct.SPLITS:
      for i in (0, 17, 400):
        self.assertEqual(a.task(split, i), b.task(split, i))
    other = procedural.TinyFunctionsSuite(seed=8)
    self.assertNotEqual([t.task_id for t in a.tasks("heldout")], [t.task_id for t in other.tasks("heldout")])

  def test_task_shape(self):
    task = procedural.TinyFunctionsSuite().task("train", 0)
    self.assertEqual(list(task.files), [procedural.STUB_PATH])
    self.assertIn("raise NotImplementedError", task.files[procedural.STUB_PATH])
    self.assertRegex(task.prompt, r"^Write `def f\((x|xs|s)\):` in solution.py returning .+\. Example: f\(.*\) == ")
    self.assertIn("hidden_tests/test_solution.py", task.hidden_tests)
    self.assertGreaterEqual(task.hidden_tests["hidden_tests/test_solution.py"].count("def test_"), 5)
    self.assertEqual(task.hidden_tests["hidden_tests/test_solution.py"].count("def test_"), task.expected_tests)
    self.assertNotIn("hidden_tests/test_solution.py", task.files)

  def test_max_difficulty(self):
    easy = procedural.TinyFunctionsSuite(max_difficulty=1)
    self.assertTrue(all(t.difficulty == 1 for t in easy.tasks("train")))
    self.assertGreater(easy.size("train"), 100)

  @parameterized.parameters(procedural.TinyFunctionsSuite, compositions.TinyCompositionsSuite)
  def test_references_match_the_python_functions(self, suite_class):
    # Host-side and cheap: the reference body computes what the spec's Python function computes.
    rng = random.Random(0)
    specs = procedural.GRAMMARS[suite_class.GRAMMAR]()
    for spec in rng.sample(specs, min(300, len(specs))):
      namespace = {}
      exec(procedural.make_task(spec, 0).solution["solution.py"], namespace)  # trusted: generated above
      for _ in range(5):
        value = procedural._input(spec, rng)
        self.assertEqual(namespace["f"](value), spec.fn(value), spec.key)

  @parameterized.parameters(procedural.TinyFunctionsSuite, compositions.TinyCompositionsSuite)
  def test_no_task_is_solved_by_a_constant(self, suite_class):
    # Host-side: read each hidden test's expected outputs (the second argument of every assertEqual). A task whose
    # outputs are all equal would reward `return <constant>` (it was so for str.count_z, int.min-8, ...).
    for seed in (0, 1):
      suite = suite_class(seed=seed)
      tasks = suite.tasks("train") + suite.tasks("heldout")
      self.assertLen(tasks, len(procedural.GRAMMARS[suite_class.GRAMMAR]()))
      for task in tasks:
        tree = ast.parse(task.hidden_tests["hidden_tests/test_solution.py"])
        expected = [ast.dump(node.args[1]) for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "assertEqual"]
        self.assertLen(expected, task.expected_tests, task.task_id)
        self.assertGreater(len(set(expected)), 1, f"{task.task_id} (seed {seed}): a constant passes it")

  def test_string_inputs_hold_the_letter_of_the_task(self):
    for key in ("str.count_z", "str.count_q", "str.replace_ax"):
      spec = next(s for s in procedural.all_specs() if s.key == key)
      rng = random.Random(0)
      inputs = [procedural._input(spec, rng) for _ in range(20)]
      self.assertTrue(all(any(c in s for s in inputs) for c in spec.letters), key)

  @absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
  def test_sample_graded_in_sandbox(self):
    suite = procedural.TinyFunctionsSuite(seed=0)
    rng = random.Random(1)
    sample = [suite.task(split, rng.randrange(suite.size(split))) for split in ct.SPLITS for _ in range(15)]
    # Every reference of the sample, and the stubs of a few (a stub fails every case the same way).
    jobs = [(t, t.solved_files()) for t in sample] + [(t, t.files) for t in sample[::6]]
    with SandboxPool(2) as pool:
      results = pool.map(lambda job: grading.grade(*job), jobs)
    for (task, files), terms in zip(jobs, results):
      if files is task.files:
        self.assertEqual((terms["pass_fraction"], terms["passed"]), (0.0, 0.0), task.task_id)
      else:
        self.assertEqual(terms["passed"], 1.0, task.task_id)
        self.assertGreaterEqual(terms["tests_total"], 6, task.task_id)


class RealisticTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.suite = CODING_SUITES.get("realistic")
    self.tasks = self.suite.tasks("heldout")

  def test_suite_shape(self):
    self.assertGreaterEqual(len(self.tasks), 20)
    self.assertEqual(self.suite.tasks("train"), [])
    self.assertEqual(self.suite.size("heldout"), len(self.tasks))
    self.assertLen({t.task_id for t in self.tasks}, len(self.tasks))
    categories = collections.Counter(t.category for t in self.tasks)
    self.assertGreaterEqual(len(categories), 4)
    for category in (Category.DEBUGGING, Category.FEATURE, Category.REFACTOR):
      self.assertGreaterEqual(categories[category], 3, category)

  def test_each_task_is_a_small_package_with_visible_tests(self):
    for task in self.tasks:
      modules = [p for p in task.files if p.endswith(".py") and not p.startswith("tests/")
                 and not p.endswith("__init__.py")]
      self.assertBetween(len(modules), 1, 6, task.task_id)
      self.assertGreaterEqual(len(task.files), 3, task.task_id)  # package + modules + tests
      self.assertTrue(any(p.startswith("tests/test_") for p in task.files), task.task_id)
      self.assertTrue(task.solution, task.task_id)
      self.assertLess(len(task.prompt), 400, task.task_id)
      self.assertFalse(set(task.files) & set(task.hidden_tests), task.task_id)
      self.assertTrue(all(p.startswith(ct.HIDDEN_TESTS_DIR + "/") for p in task.hidden_tests), task.task_id)

  def test_record_round_trip(self):
    for task in self.tasks:
      self.assertEqual(ct.from_record(ct.to_record(task)), task)

  def test_every_task_states_its_test_count(self):
    for task in self.tasks:
      self.assertIsNotNone(task.expected_tests, task.task_id)

  @absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
  def test_trivial_edits_do_not_pass(self):
    by_id = {t.task_id: t for t in self.tasks}
    docs, tests, orders = (by_id[k] for k in ("docstrings_public_api", "tests_for_parse_duration",
                                                "orders_extract_validation"))
    jobs = [(docs, _names_only_docstrings(docs.files)), (tests, _hash_pinning_tests(tests.files)),
            (orders, _reworded_checks(orders))]
    with SandboxPool(2) as pool:
      results = pool.map(lambda job: grading.grade(*job), jobs)
    for (task, _), terms in zip(jobs, results):
      self.assertEqual(terms["passed"], 0.0, task.task_id)
      self.assertEqual(terms["tests_total"], task.expected_tests, task.task_id)  # they ran, and some failed

  @absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
  def test_every_task_passes_with_its_solution_and_fails_without(self):
    with SandboxPool(2) as pool:
      results = pool.map(_grade_both, self.tasks)
    for task_id, ref, start in results:
      self.assertEqual((ref["passed"], ref["pass_fraction"], ref["timed_out"]), (1.0, 1.0, 0.0), task_id)
      self.assertEqual((ref["over_editing"], ref["lint_errors"]), (0.0, 0.0), task_id)
      self.assertEqual(start["passed"], 0.0, task_id)
      self.assertLess(start["pass_fraction"], 1.0, task_id)


if __name__ == "__main__":
  absltest.main()
