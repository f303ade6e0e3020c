"""The "tiny_spec" suite: tiny_compositions' functions, specified in the repository instead of the prompt, so that an
agent must read before it writes, and may test before it finishes (report section 4: RL in environments like real
coding sessions, where tools matter; small enough for a 2-layer model on a CPU).

  prompt (the same for every task):
    Implement `f(xs)` in solution.py as SPEC.md says; tests/test_visible.py has examples (run: python3 -m unittest -q).
  SPEC.md:
    `f(xs)` takes a list of integers `xs` and returns the sum of the squares of the even numbers in xs.
                                                           ->   return sum(x * x for x in xs if x % 2 == 0)

The repository: SPEC.md (a title, the composition's sentence, a line of context), solution.py (the stub, raising
NotImplementedError), tests/__init__.py and tests/test_visible.py (`VISIBLE` unittest examples computed by the
reference, one method each: on the stub they error, on a wrong body they print "AssertionError: <actual> !=
<expected>"). The prompt and the file listing are the same for every task: nothing but SPEC.md (and the visible
tests' examples) tells tasks apart, so a policy that never reads the repository is left to guessing
(`blind_guess`).

Everything else is tiny_compositions' (`compositions.TinyCompositionsSuite`, not copied): the grammar, the seed's
train / held-out split (held-out tasks are compositions never trained on, of trained parts), the hidden tests (the
compositions task's example and cases, the same file), the reference solution, difficulty and expected test count.
The visible examples are drawn apart from the hidden inputs (seeded by (seed, task key)), never one of them.

Sizes at the defaults (seed 0, heldout_fraction 0.2): 138 train and 35 held-out tasks. Tokens under the suite's BPE
"bpe:512:repository" (`c2jax.envs.teachers.suite_tokenizer`: trained on the train split's demonstrations and repository
files), measured over all 173 tasks with instructions "none" ("brief" in brackets):
  * the first observation: 79 tokens [196], the same text for every task;
  * a full reference episode, `spec_reader` through CodingEnv (BOS, the first observation, its 3 turns with their
    EOS: read SPEC.md; write solution.py and run the visible tests; finish, and the 2 observations between them):
    481-542 tokens, mean 516 [598-659, mean 633], 1,030-1,125 bytes. Most of it is the two observations (about 115
    tokens for SPEC.md's, 180 for the test run's): the tool-result wrappers, the budget line and unittest's output
    are not in the BPE's training text, so they stay close to bytes. It fits one 1,280-byte context (the agent-loop
    tests' engine) with no summary.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import random
import re
from typing import Any, ClassVar

from c2jax.envs.tasks.coding_tasks import CODING_SUITES, CodingTask, check_split
from c2jax.envs.tasks.suites import compositions
from c2jax.envs.tasks.suites.procedural import STUB_PATH, FunctionSpec
from c2jax.sandbox import host_ast

SPEC_PATH = "SPEC.md"
VISIBLE_TESTS_PATH = "tests/test_visible.py"
TEST_COMMAND = "python3 -m unittest -q"
VISIBLE = 3  # visible examples per task
PROMPT = (f"Implement `f(xs)` in {STUB_PATH} as {SPEC_PATH} says; {VISIBLE_TESTS_PATH} has examples "
          f"(run: {TEST_COMMAND}).")
# SPEC.md's sentence, or a summary's short line "f returns <phrase>." (`summary_line`).
_SPEC_LINE = re.compile(r"(?:`f\(xs\)` takes a list of integers `xs` and returns|^f returns) (.+?)\.[ \t]*$", re.M)


def spec_text(spec: FunctionSpec) -> str:
  """SPEC.md of one composition: a title, the sentence that names it, and a line of context."""
  return (f"# f\n\n`f(xs)` takes a list of integers `xs` and returns {spec.phrase}.\n\n"
          f"Write it in {STUB_PATH} as one return statement.\n")


@functools.lru_cache(maxsize=1)
def _by_phrase() -> dict[str, FunctionSpec]:
  return {s.phrase: s for s in compositions.all_specs()}


def summary_line(spec: FunctionSpec) -> str:
  """The composition in a line shorter than SPEC.md's sentence, which `find_spec` reads too (for summaries: 16-54
  tokens under the suite's bpe:512:repository, the sentence 39-77)."""
  return f"f returns {spec.phrase}."


def find_spec(text: str) -> FunctionSpec | None:
  """The composition whose SPEC.md sentence (or `summary_line`) appears in `text` (a file, an observation), or None
  (the last one when several do)."""
  found = None
  for m in _SPEC_LINE.finditer(text):
    found = _by_phrase().get(m.group(1), found)
  return found


def solution_source(spec: FunctionSpec) -> str:
  """solution.py of one composition (the reference's text)."""
  return f"def f({spec.arg}):\n    return {spec.body}\n"


def hidden_cases(task: CodingTask) -> list[tuple[Any, Any]]:
  """(input, expected) of each assertEqual(f(v), expected) in a task's hidden tests."""
  return _cases(task.hidden_tests["hidden_tests/test_solution.py"])


def visible_cases(task: CodingTask) -> list[tuple[Any, Any]]:
  """(input, expected) of each example in a task's tests/test_visible.py."""
  return _cases(task.files[VISIBLE_TESTS_PATH])


def _cases(source: str) -> list[tuple[Any, Any]]:
  tree = host_ast.parse(source)
  return [(ast.literal_eval(node.args[0].args[0]), ast.literal_eval(node.args[1])) for node in ast.walk(tree)
          if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "assertEqual"]


def _visible_inputs(spec: FunctionSpec, hidden: list[Any], rng: random.Random) -> list[list[int]]:
  """VISIBLE distinct inputs, none of them a hidden input, whose outputs say something (not 0 or [], not the input
  itself) where the function allows, and are not all equal."""
  seen = {repr(v) for v in hidden}
  said, plain = [], []
  for _ in range(400):
    if len(said) == VISIBLE:
      break
    value = [rng.randint(-5, 15) for _ in range(rng.randint(2, 6))]
    if repr(value) in seen:
      continue
    seen.add(repr(value))
    out = spec.fn(value)
    informative = out not in (0, []) and out != value
    # The last example must not make the outputs all equal (then a constant would pass the visible tests).
    same = len(said) == VISIBLE - 1 and len({repr(spec.fn(v)) for v in said} | {repr(out)}) == 1
    (said if informative and not same else plain).append(value)
  return (said + plain)[:VISIBLE]


def _visible_tests(spec: FunctionSpec, inputs: list[list[int]]) -> str:
  # `__unittest = True` is unittest's own switch to leave this module's frames out of a failure's traceback: a
  # failing example reads "AssertionError: <actual> != <expected>" without the three traceback lines of each, which
  # would be over half of a failing run's observation in a context of 1024.
  lines = ["import unittest", "", "from solution import f", "", "__unittest = True", "", "",
           "class TestExamples(unittest.TestCase):", ""]
  for i, value in enumerate(inputs):
    lines += [f"    def test_example_{i}(self):", f"        self.assertEqual(f({value!r}), {spec.fn(value)!r})", ""]
  lines += ["", 'if __name__ == "__main__":', "    unittest.main()"]
  return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def _specs_by_key() -> dict[str, FunctionSpec]:
  return {s.key: s for s in compositions.all_specs()}


def make_task(base: CodingTask, seed: int, suite: str = "tiny_spec") -> CodingTask:
  """The tiny_spec task of a tiny_compositions task (made with `suite` as its name): the composition moves from
  the prompt into SPEC.md, visible tests join the repository; hidden tests, solution and the rest are kept."""
  key = base.task_id.split("/", 1)[1]
  spec = _specs_by_key()[key]
  rng = random.Random(f"{seed}/{key}/visible")
  inputs = _visible_inputs(spec, [v for v, _ in hidden_cases(base)], rng)
  files = {SPEC_PATH: spec_text(spec), STUB_PATH: base.files[STUB_PATH], "tests/__init__.py": "",
           VISIBLE_TESTS_PATH: _visible_tests(spec, inputs)}
  metadata = {**base.metadata, "suite": suite, "composition": key, "relevant_files": SPEC_PATH}
  return dataclasses.replace(base, task_id=f"{suite}/{key}", prompt=PROMPT, files=files, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class TinySpecSuite:
  """tiny_compositions' split, each task's composition in SPEC.md.

  Attributes:
    seed: as tiny_compositions' (which compositions are held out, the hidden inputs), and draws the visible ones.
    heldout_fraction: the share of tasks in the "heldout" split.
    max_difficulty: keeps only tasks of difficulty <= this.
  """

  # The scripted teacher whose episodes show the suite's observations (`c2jax.envs.teachers.suite_tokenizer`'s
  # "episodes").
  TEACHER: ClassVar[str] = "spec_fixer"

  seed: int = 0
  heldout_fraction: float = 0.2
  max_difficulty: int = 3
  name: str = "tiny_spec"

  def _base(self) -> compositions.TinyCompositionsSuite:
    return compositions.TinyCompositionsSuite(seed=self.seed, heldout_fraction=self.heldout_fraction,
                                              max_difficulty=self.max_difficulty, name=self.name)

  def size(self, split: str) -> int:
    return self._base().size(split)

  def task(self, split: str, index: int) -> CodingTask:
    """Task `index` (modulo the split's size) of `split`."""
    return make_task(self._base().task(split, index), self.seed, self.name)

  def tasks(self, split: str) -> list[CodingTask]:
    check_split(split)
    return [make_task(t, self.seed, self.name) for t in self._base().tasks(split)]

  def __call__(self, **overrides) -> TinySpecSuite:
    """The suite with other fields: `CODING_SUITES.get("tiny_spec")(seed=3)`."""
    return dataclasses.replace(self, **overrides)


@functools.lru_cache(maxsize=8)
def blind_guess(seed: int = 0) -> FunctionSpec:
  """The composition a policy that never reads would best write: the one whose reference passes the most hidden
  tests of the train split of `TinySpecSuite(seed=seed)` (host-side; what `spec_guess` writes)."""
  tasks = TinySpecSuite(seed=seed).tasks("train")
  cases = [c for t in tasks for c in hidden_cases(t)]

  def hits(spec: FunctionSpec) -> int:
    return sum(spec.fn(v) == e for v, e in cases)

  return max(compositions.all_specs(), key=hits)  # first in grammar order among ties


TINY_SPEC = CODING_SUITES.register("tiny_spec")(TinySpecSuite())
