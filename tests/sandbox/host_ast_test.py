"""The host's one parser of Python text (c2jax/sandbox/host_ast.py), attacked: files written to break the parser
and parses raced against grading in other threads, through the real callers (search_code's chunking, lint,
instrumentation)."""

import ast
import pathlib
import random
import re
import sys
import threading

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.coding_rl import _tasks
from c2jax.envs.grading import grading
from c2jax.envs.grading import instrument
from c2jax.envs.tools import code_search
from c2jax.sandbox import host_ast

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Model-written files that reach the parser's and the AST constructor's limits, or its error paths.
HOSTILE = {
    "deep_chain": "x = " + "+".join(f"a{i}" for i in range(40_000)) + "\n",  # RecursionError in AST construction
    "deep_nesting": "x = " + "[" * 150 + "1" + "]" * 150 + "\n",  # parses; a deep tree to construct
    "too_nested": "x = " + "(" * 400 + ")" * 400 + "\n",  # the parser's own nesting limit
    "many_functions": "".join(f"def f{i}(a):\n  return [[[a]]]\n" for i in range(3000)),
    "many_classes": "".join(f"class C{i}:\n  def m(self):\n    return {{1: [(self,)]}}\n" for i in range(2000)),
    "nul_byte": "def f():\n  return 1\0\n",
    "not_python": "def f(:\n",
}
PARSES = ("deep_nesting", "many_functions", "many_classes")


class ParseTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(k, v) for k, v in HOSTILE.items() if k not in PARSES])
  def test_every_failure_is_the_files_and_names_it(self, source):
    with self.assertRaisesRegex(host_ast.Unparsable, r"^evil\.py does not parse as Python \(.+\)\.$"):
      host_ast.parse(source, filename="evil.py")
    self.assertIsInstance(host_ast.parse(HOSTILE["deep_nesting"]), ast.Module)

  @parameterized.named_parameters(*HOSTILE.items())
  def test_search_code_and_lint_take_a_hostile_file_as_that_files_failure(self, source):
    chunks = code_search.chunk_file("pkg/evil.py", source)
    self.assertNotEmpty(chunks)
    self.assertGreaterEqual(grading.lint_count("pkg/evil.py", source), 0)

  def test_no_other_module_of_the_library_parses_python_text(self):
    # One home: every parse, unparse and compile of Python text in the host process goes through host_ast, under
    # its lock. The judge's compile runs inside the sandbox; the realistic tasks' files are task data.
    allowed = {"c2jax/sandbox/host_ast.py", "c2jax/envs/grading/judge.py"}
    call = re.compile(r"\bast\.parse\(|\bast\.unparse\(|(?<![.\w])compile\(")
    found = []
    for path in sorted((ROOT / "c2jax").rglob("*.py")):
      rel = path.relative_to(ROOT).as_posix()
      if rel in allowed or rel.startswith("c2jax/envs/tasks/suites/realistic/tasks/"):
        continue
      for n, line in enumerate(path.read_text().splitlines(), 1):
        if call.search(line.split("#")[0]):
          found.append(f"{rel}:{n}: {line.strip()}")
    self.assertEqual(found, [])


class RaceTest(parameterized.TestCase):
  """search_code indexes a model's files on a tool worker while grading parses on another thread (an actor runs
  both at once): on CPython 3.11 an unlocked parse on either side trips the other's AST recursion counter
  ("SystemError: AST constructor recursion depth mismatch"), which ended the agent loop's whole run."""

  @parameterized.named_parameters(("deep_nesting", "deep_nesting"), ("many_functions", "many_functions"),
                                  ("many_classes", "many_classes"))
  def test_indexing_a_hostile_file_never_breaks_a_concurrent_grading(self, kind):
    tasks = list(_tasks("tiny_compositions", "train"))[:4]
    errors = []
    stop = threading.Event()

    def index():
      while not stop.is_set():
        try:
          code_search.chunk_file("pkg/evil.py", HOSTILE[kind])
        except Exception as e:  # noqa: BLE001  (any raise of the tool's side is a failure of the test too)
          errors.append(f"chunk_file: {type(e).__name__}: {e}")

    def grade(seed):
      rng = random.Random(seed)
      for i in range(12):
        task = tasks[(seed + i) % len(tasks)]
        try:
          instrument.instrument(task.hidden_tests, grading.hidden_test_modules(task), rng)
          for path, source in task.solved_files().items():
            if path.endswith(".py"):
              grading.lint_count(path, source)
        except Exception as e:  # noqa: BLE001
          errors.append(f"grading: {type(e).__name__}: {e}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
      indexers = [threading.Thread(target=index) for _ in range(3)]
      graders = [threading.Thread(target=grade, args=(s,)) for s in range(3)]
      for t in indexers + graders:
        t.start()
      for t in graders:
        t.join()
      stop.set()
      for t in indexers:
        t.join()
    finally:
      sys.setswitchinterval(interval)
    self.assertEqual(errors, [])


if __name__ == "__main__":
  absltest.main()
