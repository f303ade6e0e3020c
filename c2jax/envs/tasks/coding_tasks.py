"""Coding tasks: a repository to start from, a short prompt, hidden tests that judge, and a reference solution.

The coding environment (report section 4: environments that mimic real software work) hands the model a
`CodingTask`: the prompt and the starting files. The hidden tests are added only at grading
(c2jax/envs/grading/grading.py) and never shown; the reference solution proves the task solvable and measures
over-editing.

On disk a task is a directory:

  <task_dir>/
    task.json        {"format": 1, "task_id", "prompt", "category", "difficulty", "metadata", "expected_tests",
                      "solution_deletes"}
    repo/            the starting repository, one file per path
    hidden_tests/    an overlay on the repository root written at grading: hidden_tests/hidden_tests/test_x.py
                     becomes hidden_tests/test_x.py in the graded repository; its test*.py files are the modules
                     the judge (c2jax/envs/grading/judge.py) runs, the rest support them
    solution/        (optional) the reference solution's changed or added files, full new contents, same overlay

A task graded by named tests (SWE-bench style, `NamedTests`; built by c2jax/envs/tasks/swe_tasks.py) adds
"named_tests" to task.json (format 2): the test ids that must go from failing to passing and those that must keep
passing, and the paths its test patch deletes. Its hidden_tests/ then hold the test files as grading lays them out
(the snapshot's version with the test patch applied): the files the test patch touches and the modules of the named
tests, which may be named anything (tests.py too) and may be none.

`save_task` / `load_task` write and read that layout, `save_tar` / `load_tar` the same tree as a .tar.gz (one
top-level directory named after the task), and `to_record` / `from_record` a JSON-able dict (one task per line in a
JSONL file). All of them round-trip exactly, and each error names the missing or bad piece in one sentence.

Suites are registered by name in `CODING_SUITES` (c2jax/envs/tasks/suites/ registers "tiny_functions" and "realistic"):

  suite = CODING_SUITES.get("realistic")
  tasks = suite.tasks("heldout")          # list[CodingTask]; splits "train" and "heldout"; size(split) counts them
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import os
import pathlib
import posixpath
import re
import tarfile
from typing import Mapping, Protocol

from c2jax.registry import Registry

# Format 2 adds "named_tests"; a task without them is still written as format 1, which older readers take.
FORMAT_VERSION = 2
_FORMATS = (1, 2)
SPLITS = ("train", "heldout")
# Hidden tests live in this repository directory by convention: grading drops whatever a submission puts there.
HIDDEN_TESTS_DIR = "hidden_tests"
# Records written before the judge ran the hidden tests carry this command; it is what the judge does, so reading
# one is fine. Any other command is refused: grading would not honour it.
_LEGACY_TEST_COMMAND = f"python3 -I -m unittest discover -s {HIDDEN_TESTS_DIR} -t . -v"

_TASK_JSON = "task.json"
_REPO, _HIDDEN, _SOLUTION = "repo", "hidden_tests", "solution"


class Category(enum.Enum):
  """What kind of work a task asks for (CursorBench-style categories)."""

  FEATURE = "feature"
  DEBUGGING = "debugging"
  REFACTOR = "refactor"
  TESTS = "tests"
  DOCS = "docs"
  PERFORMANCE = "performance"


class TaskFormatError(ValueError):
  """A task (directory, tar, record or object) is malformed; the message names the piece."""


def check_path(path: str) -> str:
  """A repository path must be relative POSIX, normalized, without '..' or empty parts; returns it."""
  if not isinstance(path, str) or not path:
    raise TaskFormatError(f"A repository path must be a non-empty string, got {path!r}.")
  if (path.startswith("/") or "\\" in path or posixpath.normpath(path) != path or path.split("/")[0] == ".."
      or path == "."):
    raise TaskFormatError(f"Repository path {path!r} must be relative, normalized and inside the repository.")
  return path


def _check_files(what: str, files: Mapping[str, str]) -> dict[str, str]:
  out = {}
  for path, content in files.items():
    check_path(path)
    if not isinstance(content, str):
      raise TaskFormatError(f"{what} file {path!r} must hold text (str), got {type(content).__name__}.")
    out[path] = content
  return dict(sorted(out.items()))


def _is_int(value: object) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Matched with fullmatch: `$` also matches before a trailing newline, which let "a.B.test_x\n" through as a test
# whose method is named "test_x\n" (one that no module defines, counted failed whatever the code does).
_DOTTED_ID = re.compile(rf"{_IDENT}(?:\.{_IDENT}){{2,}}")  # module.Class.test_name
_DESCRIBED_ID = re.compile(rf"({_IDENT}) \(({_IDENT}(?:\.{_IDENT})+)\)")  # test_name (module.Class)


@dataclasses.dataclass(frozen=True)
class TestId:
  """One unittest test: `module` (dotted, from the repository root), its TestCase `cls` and `method`."""

  module: str
  cls: str
  method: str

  @property
  def module_path(self) -> str:
    """The repository path of the test's module ("a.b" -> "a/b.py")."""
    return self.module.replace(".", "/") + ".py"

  def __str__(self) -> str:
    return f"{self.module}.{self.cls}.{self.method}"


def parse_test_id(text: str) -> TestId:
  """A unittest id, written as `module.Class.test_name` or as unittest prints it, `test_name (module.Class)` (Python
  3.11 and later print `test_name (module.Class.test_name)`: taken too). pytest node ids are refused: the sandbox's
  Python has no pytest."""
  if not isinstance(text, str):
    raise TaskFormatError(f"A test id must be a string, got {text!r}.")
  if "::" in text or ".py" in text or "[" in text:
    raise TaskFormatError(f"Test id {text!r} is a pytest node id; the sandbox's Python has no pytest, so give the "
                          "unittest id ('module.Class.test_name' or 'test_name (module.Class)').")
  described = _DESCRIBED_ID.fullmatch(text)
  if described:
    method, dotted = described.groups()
    if dotted.endswith("." + method) and dotted.count(".") >= 2:
      dotted = dotted[:-len(method) - 1]
    text = f"{dotted}.{method}"
  if not _DOTTED_ID.fullmatch(text):
    raise TaskFormatError(f"Test id {text!r} is not a unittest id; write 'module.Class.test_name' or "
                          "'test_name (module.Class)'.")
  module, cls, method = text.rsplit(".", 2)
  return TestId(module=module, cls=cls, method=method)


def _id_list(value: object, what: str) -> tuple[str, ...]:
  if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
    raise TaskFormatError(f"{what} must be a list of test ids (strings), got {value!r:.200}.")
  return tuple(value)


@dataclasses.dataclass(frozen=True)
class NamedTests:
  """Grading by named tests (SWE-bench style): which tests decide the reward, and what the test patch deletes.

  The graded repository is the submission with the task's hidden_tests written over it (the test files as the
  snapshot holds them with the test patch applied, so a submission cannot pre-edit them), `deleted` removed and the
  rest of the named tests' test directories as `CodingTask.files` holds them; then exactly these tests run
  (c2jax/envs/grading/grading.py, "Grading by named tests").

  Attributes:
    fail_to_pass: test ids that fail on the starting repository and pass once the task is solved.
    pass_to_pass: test ids that pass on both (what a solution must not break).
    deleted: paths the test patch deletes.
  """

  fail_to_pass: tuple[str, ...]
  pass_to_pass: tuple[str, ...] = ()
  deleted: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "fail_to_pass", _id_list(self.fail_to_pass, "FAIL_TO_PASS"))
    object.__setattr__(self, "pass_to_pass", _id_list(self.pass_to_pass, "PASS_TO_PASS"))
    if isinstance(self.deleted, str) or not isinstance(self.deleted, (list, tuple)):
      raise TaskFormatError(f"Named tests' deleted paths must be a list, got {self.deleted!r:.200}.")
    object.__setattr__(self, "deleted", tuple(sorted(check_path(p) for p in self.deleted)))
    if not self.ids:
      raise TaskFormatError("Named tests need at least one FAIL_TO_PASS or PASS_TO_PASS test id.")
    seen: dict[TestId, str] = {}
    for text in self.ids:
      test = parse_test_id(text)
      if test in seen:
        raise TaskFormatError(f"Test id {text!r} names the same test as {seen[test]!r}; list each test once, in "
                              "FAIL_TO_PASS or PASS_TO_PASS.")
      seen[test] = text

  @property
  def ids(self) -> tuple[str, ...]:
    """FAIL_TO_PASS then PASS_TO_PASS, as given."""
    return self.fail_to_pass + self.pass_to_pass

  def to_json(self) -> dict:
    return {"fail_to_pass": list(self.fail_to_pass), "pass_to_pass": list(self.pass_to_pass),
            "deleted": list(self.deleted)}

  @classmethod
  def from_json(cls, value: object, where: str) -> NamedTests:
    if not isinstance(value, Mapping) or set(value) - {"fail_to_pass", "pass_to_pass", "deleted"}:
      raise TaskFormatError(f"{where} field 'named_tests' must be an object with fail_to_pass, pass_to_pass and "
                            "deleted.")
    return cls(fail_to_pass=value.get("fail_to_pass", ()), pass_to_pass=value.get("pass_to_pass", ()),
               deleted=value.get("deleted", ()))


@dataclasses.dataclass(frozen=True)
class CodingTask:
  """One coding task.

  Attributes:
    task_id: unique within its suite; names the group in the rollout buffer and the row in eval reports.
    prompt: the short request the model sees (CursorBench style: a sentence or two).
    files: the starting repository, path -> text.
    hidden_tests: files written over the submission at grading, path -> text; never shown to the model. Its
      test*.py files are the unittest modules the judge runs (at least one).
    expected_tests: how many tests the hidden tests hold (what the reference solution runs); a grading run that
      counts another number scores 0. None: unknown, then any number above zero is accepted.
    solution: the reference solution's changed or added files, path -> full new content (never ""; a deletion
      goes in `solution_deletes`), or None for a task without one.
    solution_deletes: paths the reference solution deletes.
    category: the kind of work.
    difficulty: 1 (one small step) .. 3 (several coordinated steps).
    metadata: free-form string pairs (e.g. the suite, the generator family).
    named_tests: grading by named tests (`NamedTests`) instead of every hidden test*.py module, or None. Then
      hidden_tests are the test files grading writes over the submission (possibly none, any names), and
      expected_tests is None.
  """

  task_id: str
  prompt: str
  files: Mapping[str, str]
  hidden_tests: Mapping[str, str]
  expected_tests: int | None = None
  solution: Mapping[str, str] | None = None
  solution_deletes: tuple[str, ...] = ()
  category: Category = Category.FEATURE
  difficulty: int = 1
  metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
  named_tests: NamedTests | None = None

  def __post_init__(self):
    if not isinstance(self.task_id, str) or not self.task_id or ".." in self.task_id.split("/"):
      raise TaskFormatError(f"Task id {self.task_id!r} must be non-empty and free of '..'.")
    if not isinstance(self.category, Category):
      raise TaskFormatError(f"Task {self.task_id}: category must be a Category, got {self.category!r}.")
    if not _is_int(self.difficulty) or self.difficulty not in (1, 2, 3):
      raise TaskFormatError(f"Task {self.task_id}: difficulty must be 1, 2 or 3, got {self.difficulty!r}.")
    named = self.named_tests
    if named is not None and not isinstance(named, NamedTests):
      raise TaskFormatError(f"Task {self.task_id}: named_tests must be a NamedTests, got {type(named).__name__}.")
    if named is None and not self.hidden_tests:
      raise TaskFormatError(f"Task {self.task_id} has no hidden tests; the hidden tests are its only judge.")
    object.__setattr__(self, "files", _check_files(f"Task {self.task_id}: repository", self.files))
    object.__setattr__(self, "hidden_tests", _check_files(f"Task {self.task_id}: hidden test", self.hidden_tests))
    if named is None and not any(posixpath.basename(p).startswith("test") and p.endswith(".py")
                                 for p in self.hidden_tests):
      raise TaskFormatError(f"Task {self.task_id}: no hidden test module; the judge runs the hidden files named "
                            "test*.py.")
    if named is not None and self.expected_tests is not None:
      raise TaskFormatError(f"Task {self.task_id}: a task graded by named tests counts them itself; leave "
                            "expected_tests None.")
    if named is not None and set(named.deleted) & set(self.hidden_tests):
      raise TaskFormatError(f"Task {self.task_id}: {sorted(set(named.deleted) & set(self.hidden_tests))[0]!r} is "
                            "both a hidden test file and deleted by the test patch.")
    if self.expected_tests is not None and (not _is_int(self.expected_tests) or self.expected_tests < 1):
      raise TaskFormatError(f"Task {self.task_id}: expected_tests must be a positive int or None, got "
                            f"{self.expected_tests!r}.")
    if self.solution is not None:
      solution = _check_files(f"Task {self.task_id}: solution", self.solution)
      empty = [p for p, c in solution.items() if c == ""]
      if empty:
        raise TaskFormatError(f"Task {self.task_id}: solution file {empty[0]!r} is empty; list deletions in "
                              "solution_deletes instead.")
      object.__setattr__(self, "solution", solution)
    deletes = tuple(sorted(check_path(p) for p in self.solution_deletes))
    missing = [p for p in deletes if p not in self.files]
    if missing:
      raise TaskFormatError(f"Task {self.task_id}: solution deletes {missing[0]!r}, which the repository lacks.")
    object.__setattr__(self, "solution_deletes", deletes)
    object.__setattr__(self, "metadata", {str(k): str(v) for k, v in sorted(self.metadata.items())})

  def solved_files(self) -> dict[str, str]:
    """The repository after the reference solution (raises when the task has none)."""
    if self.solution is None:
      raise TaskFormatError(f"Task {self.task_id} has no reference solution.")
    files = {p: c for p, c in self.files.items() if p not in self.solution_deletes}
    files.update(self.solution)
    return files


# ---------------------------------------------------------------------------------------------------- records


def to_record(task: CodingTask) -> dict:
  """A JSON-able dict holding the whole task."""
  record = {
      "format": 1 if task.named_tests is None else 2,
      "task_id": task.task_id,
      "prompt": task.prompt,
      "category": task.category.value,
      "difficulty": task.difficulty,
      "metadata": dict(task.metadata),
      "expected_tests": task.expected_tests,
      "files": dict(task.files),
      "hidden_tests": dict(task.hidden_tests),
      "solution": None if task.solution is None else dict(task.solution),
      "solution_deletes": list(task.solution_deletes),
  }
  if task.named_tests is not None:
    record["named_tests"] = task.named_tests.to_json()
  return record


def _header(record: Mapping, where: str) -> dict:
  """The fields of task.json (everything but file trees), checked."""
  if not isinstance(record, Mapping):
    raise TaskFormatError(f"{where} must be a JSON object.")
  if record.get("format", 1) not in _FORMATS or isinstance(record.get("format"), bool):
    raise TaskFormatError(f"{where} has format {record.get('format')!r}; this code reads formats "
                          f"{', '.join(map(str, _FORMATS))}.")
  if "named_tests" in record and record.get("format") != 2:
    raise TaskFormatError(f"{where} holds named_tests, which format 2 introduced; set \"format\": 2.")
  for key in ("task_id", "prompt", "category"):
    if key not in record:
      raise TaskFormatError(f"{where} lacks the field {key!r}.")
  try:
    category = Category(record["category"])
  except ValueError:
    raise TaskFormatError(f"{where} has unknown category {record['category']!r}; known: "
                          f"{', '.join(c.value for c in Category)}.") from None
  command = record.get("test_command", _LEGACY_TEST_COMMAND)
  if command != _LEGACY_TEST_COMMAND:
    raise TaskFormatError(f"{where} has test_command {command!r}; hidden tests always run through the judge "
                          "(c2jax/envs/grading/judge.py): drop the field.")
  if not isinstance(record.get("metadata", {}), Mapping):
    raise TaskFormatError(f"{where} field 'metadata' must be a JSON object.")
  if not isinstance(record.get("solution_deletes", []), (list, tuple)):
    raise TaskFormatError(f"{where} field 'solution_deletes' must be a JSON list.")
  named = record.get("named_tests")
  return dict(task_id=record["task_id"], prompt=record["prompt"], category=category,
              difficulty=record.get("difficulty", 1), metadata=dict(record.get("metadata", {})),
              expected_tests=record.get("expected_tests"),
              solution_deletes=tuple(record.get("solution_deletes", ())),
              named_tests=None if named is None else NamedTests.from_json(named, where))


def from_record(record: Mapping) -> CodingTask:
  """The inverse of `to_record`."""
  header = _header(record, "The task record")
  if "files" not in record or "hidden_tests" not in record:
    raise TaskFormatError(f"Task record {header['task_id']!r} lacks its "
                          f"{'files' if 'files' not in record else 'hidden_tests'}.")
  for key in ("files", "hidden_tests", "solution"):
    if not isinstance(record.get(key, {}), Mapping) and not (key == "solution" and record[key] is None):
      raise TaskFormatError(f"Task record {header['task_id']!r}: {key!r} must map paths to texts.")
  return CodingTask(files=record["files"], hidden_tests=record["hidden_tests"], solution=record.get("solution"),
                    **header)


# ---------------------------------------------------------------------------------------------------- trees


def _tree(task: CodingTask) -> dict[str, str]:
  """The task's on-disk layout as one mapping: relative path in the task directory -> text."""
  header = {k: v for k, v in to_record(task).items() if k not in ("files", "hidden_tests", "solution")}
  tree = {_TASK_JSON: json.dumps(header, indent=1, sort_keys=True) + "\n"}
  tree.update({f"{_REPO}/{p}": c for p, c in task.files.items()})
  tree.update({f"{_HIDDEN}/{p}": c for p, c in task.hidden_tests.items()})
  tree.update({f"{_SOLUTION}/{p}": c for p, c in (task.solution or {}).items()})
  return tree


def _from_tree(tree: Mapping[str, str], where: str) -> CodingTask:
  if _TASK_JSON not in tree:
    raise TaskFormatError(f"{where} has no {_TASK_JSON}.")
  try:
    header = _header(json.loads(tree[_TASK_JSON]), f"{where}/{_TASK_JSON}")
  except json.JSONDecodeError as e:
    raise TaskFormatError(f"{where}/{_TASK_JSON} is not valid JSON ({e}).") from None

  def sub(prefix: str) -> dict[str, str]:
    return {p[len(prefix) + 1:]: c for p, c in tree.items() if p.startswith(prefix + "/")}

  files, hidden, solution = sub(_REPO), sub(_HIDDEN), sub(_SOLUTION)
  if not files:
    raise TaskFormatError(f"{where} has no {_REPO}/ directory (the starting repository).")
  if not hidden and header["named_tests"] is None:
    raise TaskFormatError(f"{where} has no {_HIDDEN}/ directory (the hidden tests).")
  return CodingTask(files=files, hidden_tests=hidden, solution=solution or None, **header)


def save_task(task: CodingTask, directory: str | os.PathLike) -> pathlib.Path:
  """Writes the task's directory (created; must not already hold a task); returns its path."""
  root = pathlib.Path(directory)
  if (root / _TASK_JSON).exists():
    raise FileExistsError(f"{root} already holds a task; remove it first or pick another directory.")
  for rel, content in _tree(task).items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
  return root


def load_task(directory: str | os.PathLike) -> CodingTask:
  """Reads a task directory written by `save_task` (or by hand in the same layout)."""
  root = pathlib.Path(directory)
  if not root.is_dir():
    raise TaskFormatError(f"Task directory {root} does not exist.")
  tree = {}
  for path in sorted(root.rglob("*")):
    if "__pycache__" in path.parts or path.suffix == ".pyc":
      continue  # bytecode left by running a task's tests in place is not part of the task
    if path.is_symlink():
      raise TaskFormatError(f"Task directory {root} holds a symlink ({path.relative_to(root)}); tasks hold files.")
    if path.is_file():
      tree[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
  return _from_tree(tree, str(root))


def save_tar(task: CodingTask, path: str | os.PathLike) -> pathlib.Path:
  """Writes the task's directory layout into a .tar.gz under one top-level directory named by the task id."""
  top = task.task_id.replace("/", "__")
  path = pathlib.Path(path)
  with tarfile.open(path, "w:gz") as tar:
    for rel, content in sorted(_tree(task).items()):
      data = content.encode("utf-8")
      info = tarfile.TarInfo(f"{top}/{rel}")
      info.size, info.mode, info.mtime = len(data), 0o644, 0  # mtime 0: the same task gives the same bytes
      tar.addfile(info, io.BytesIO(data))
  return path


def load_tar(path: str | os.PathLike) -> CodingTask:
  """Reads a .tar.gz written by `save_tar`, in memory (nothing is extracted; links and odd members refused)."""
  tree, tops = {}, set()
  with tarfile.open(path, "r:*") as tar:
    for member in tar.getmembers():
      if member.isdir():
        continue
      if not member.isfile():
        raise TaskFormatError(f"Task archive {path} holds {member.name!r}, which is not a plain file.")
      top, _, rel = member.name.partition("/")
      if not rel:
        raise TaskFormatError(f"Task archive {path} holds {member.name!r} outside a top-level task directory.")
      check_path(rel)
      tops.add(top)
      tree[rel] = tar.extractfile(member).read().decode("utf-8")
  if len(tops) != 1:
    raise TaskFormatError(f"Task archive {path} must hold exactly one task directory, found {len(tops)}.")
  return _from_tree(tree, f"{path}:{tops.pop()}")


# ---------------------------------------------------------------------------------------------------- suites


class CodingSuite(Protocol):
  """A named set of coding tasks with train and held-out splits."""

  name: str

  def tasks(self, split: str) -> list[CodingTask]:
    """All tasks of `split` ("train" or "heldout"; a suite without a train split returns [] for it)."""

  def size(self, split: str) -> int:
    """len(tasks(split)), without building them where the suite can."""


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r}; use one of {', '.join(SPLITS)}.")


# Holds suite objects (not factories): `CODING_SUITES.get(name).tasks(split)`.
CODING_SUITES: Registry = Registry("coding task suite")
