"""SWE-bench-style instances as coding tasks graded by their named tests.

The instances are built here from realistic tasks (c2jax/envs/tasks/suites/realistic/tasks): repo/ is the snapshot (a
directory for some, a tarball for others), the hidden tests become a test patch that adds them, the reference
solution becomes the gold patch. FAIL_TO_PASS and PASS_TO_PASS come from running the tests with plain unittest in
the sandbox (the independent reference: no instrumentation, no judge): hidden tests failing on the start and passing
with the solution, and every test passing on both. Then the grader must resolve the gold patch, resolve nothing on
the starting repository, and give nothing to submissions that break a PASS_TO_PASS test, edit the tests, print fake
results or forge the judge's report; ids that do not exist count as failed; malformed instances are refused in one
sentence.
"""

import dataclasses
import io
import json
import pathlib
import re
import shutil
import tarfile
import tempfile

import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tasks import coding_tasks as ct
from c2jax.envs.grading import grading
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tasks import suites  # noqa: F401  (registers the suites)
from c2jax.envs.tasks import swe_tasks
from c2jax.envs.tasks import unified_diff
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, NamedTests, TaskFormatError, parse_test_id
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.envs.tasks.swe_tasks import InstanceError

_unavailable_reason = sandbox_lib.unavailable_reason

# Realistic tasks whose reference solution leaves the tests alone (SWE-bench's gold patches do), one or two of each
# kind of work. (tests_for_parse_duration's solution is a test file: no SWE-bench instance is made that way.)
REALISTIC = ("bank_transfer", "money_round_half_up", "config_parser_values", "orders_extract_validation",
             "dedupe_linear", "docstrings_public_api")

# Runs tests with plain unittest (ids on stdin, or null: discover every test*.py) and prints each test's status.
_RUNNER = r"""
import json, os, sys, unittest
sys.path.insert(0, os.getcwd())
ids = json.loads(sys.stdin.read())
loader = unittest.TestLoader()
suite = loader.discover(".", pattern="test*.py", top_level_dir=".") if ids is None else loader.loadTestsFromNames(ids)


class Result(unittest.TestResult):

    def __init__(self):
        super().__init__()
        self.status = {}

    def addSuccess(self, test):
        self.status[test.id()] = "ok"

    def addFailure(self, test, err):
        self.status[test.id()] = "fail"

    def addError(self, test, err):
        self.status[test.id()] = "error"

    def addSkip(self, test, reason):
        self.status[test.id()] = "skip"


result = Result()
suite.run(result)
print("STATUSES " + json.dumps(result.status))
"""


def unittest_statuses(files: dict[str, str], ids: list[str] | None = None) -> dict[str, str]:
  """test id -> "ok" / "fail" / "error" / "skip", as plain unittest runs `files` in the sandbox."""
  with sandbox_lib.Sandbox(files) as box:
    result = box.run(f"python3 -I -c {_shell_quote(_RUNNER)}", stdin=json.dumps(ids))
  lines = [line for line in result.stdout.splitlines() if line.startswith("STATUSES ")]
  assert lines, result.stderr[-2000:]
  return {k: v for k, v in json.loads(lines[-1][len("STATUSES "):]).items() if not k.startswith("unittest.")}


def _shell_quote(text: str) -> str:
  return "'" + text.replace("'", "'\"'\"'") + "'"


def _described(test_id: str) -> str:
  """`module.Class.test_x` as unittest prints it: `test_x (module.Class)`."""
  dotted, method = test_id.rsplit(".", 1)
  return f"{method} ({dotted})"


def write_snapshot(files: dict[str, str], target: pathlib.Path, tarball: bool) -> str:
  """Writes `files` as a directory or as a .tar.gz (members under "./", as `tar -C repo -czf x .` makes them)."""
  if not tarball:
    for path, text in files.items():
      (target / path).parent.mkdir(parents=True, exist_ok=True)
      (target / path).write_text(text, encoding="utf-8")
    return target.name
  target = target.with_suffix(".tar.gz")
  with tarfile.open(target, "w:gz") as tar:
    for path, text in sorted(files.items()):
      data = text.encode()
      info = tarfile.TarInfo(f"./{path}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return target.name


def realistic_instance(task: ct.CodingTask, directory: pathlib.Path, index: int) -> dict:
  """The instance of a realistic task (module docstring); ids and lists in SWE-bench's varied forms by `index`."""
  patched = {**task.files, **task.hidden_tests}
  start, solved = unittest_statuses(patched), unittest_statuses({**task.solved_files(), **task.hidden_tests})
  hidden = {grading.instrument.module_name(p) for p in task.hidden_tests}
  fail_to_pass = sorted(t for t, s in solved.items() if s == "ok" and start.get(t) != "ok"
                        and t.rsplit(".", 2)[0] in hidden)
  pass_to_pass = sorted(t for t, s in solved.items() if s == "ok" and start.get(t) == "ok")
  assert fail_to_pass, task.task_id  # every realistic task has hidden tests that fail on its start
  if index % 2:
    fail_to_pass, pass_to_pass = [_described(t) for t in fail_to_pass], [_described(t) for t in pass_to_pass]
  as_lists = index % 3 != 0  # SWE-bench stores the lists as JSON strings
  return {
      "instance_id": f"realistic__{task.task_id}",
      "problem_statement": task.prompt,
      "snapshot": write_snapshot(task.files, directory / task.task_id, tarball=index % 2 == 1),
      "test_patch": unified_diff.make(task.files, patched),
      "patch": unified_diff.make(task.files, task.solved_files()),
      "FAIL_TO_PASS": fail_to_pass if as_lists else json.dumps(fail_to_pass),
      "PASS_TO_PASS": pass_to_pass if as_lists else json.dumps(pass_to_pass),
      "version": "1.0",
      "created_at": "2024-01-01T00:00:00Z",
      "hints_text": "",
  }


# A hand-written repository: a test directory without __init__.py (a namespace package whose only module is
# served from memory, so it is empty on disk), a test found by inheritance, a file the test patch deletes, and ids
# as Python 3.11 prints them.
HAND_REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_ops.py": ("import unittest\n\nfrom calc.ops import mul\n\n\nclass MulTest(unittest.TestCase):\n\n"
                          "    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n"),
    "tests/obsolete.txt": "old\n",
}
HAND_TESTS = ("import os\nimport unittest\n\nfrom calc.ops import add, mul\n\n\nclass MulTest(unittest.TestCase):\n\n"
              "    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n\n"
              "    def test_obsolete_gone(self):\n"
              "        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(__file__), 'obsolete.txt')))\n\n\n"
              "class AddTest(unittest.TestCase):\n\n    def test_add(self):\n"
              "        self.assertEqual(add(2, 3), 5)\n\n\n"
              "class AddAgain(AddTest):\n    pass\n")
HAND_FAIL_TO_PASS = ["test_add (tests.test_ops.AddTest.test_add)", "tests.test_ops.AddAgain.test_add"]
HAND_PASS_TO_PASS = ["tests.test_ops.MulTest.test_mul", "test_obsolete_gone (tests.test_ops.MulTest)"]


def hand_instance(directory: pathlib.Path) -> dict:
  after_tests = {p: c for p, c in HAND_REPO.items() if p != "tests/obsolete.txt"} | {"tests/test_ops.py": HAND_TESTS}
  return {
      "instance_id": "hand__calc-1",
      "problem_statement": "add() subtracts.",
      "snapshot": write_snapshot(HAND_REPO, directory / "calc_snapshot", tarball=True),
      "test_patch": unified_diff.make(HAND_REPO, after_tests),
      "patch": unified_diff.make(HAND_REPO, {**HAND_REPO, "calc/ops.py": HAND_REPO["calc/ops.py"].replace("-", "+")}),
      "FAIL_TO_PASS": HAND_FAIL_TO_PASS,
      "PASS_TO_PASS": json.dumps(HAND_PASS_TO_PASS),
      "repo": "example/calc",
      "base_commit": "0" * 40,
  }


def _write_jsonl(path: pathlib.Path, instances: list[dict]) -> pathlib.Path:
  path.write_text("".join(json.dumps(i) + "\n" for i in instances), encoding="utf-8")
  return path


class _Built:
  """The instances and their JSONL file, built once for the sandboxed tests (each costs two sandbox runs)."""

  directory: pathlib.Path | None = None
  instances: list[dict] = []
  tasks: dict[str, ct.CodingTask] = {}

  @classmethod
  def get(cls) -> type["_Built"]:
    if cls.directory is None:
      cls.directory = pathlib.Path(tempfile.mkdtemp())
      realistic = {t.task_id: t for t in CODING_SUITES.get("realistic").tasks("heldout")}
      cls.instances = [realistic_instance(realistic[name], cls.directory, i) for i, name in enumerate(REALISTIC)]
      cls.instances.append(hand_instance(cls.directory))
      path = _write_jsonl(cls.directory / "instances.jsonl", cls.instances)
      cls.tasks = {t.task_id: t for t in swe_tasks.load_instances(path)}
    return cls


def tearDownModule():
  if _Built.directory is not None:
    shutil.rmtree(_Built.directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- format


def _tiny_instance(**overrides) -> dict:
  instance = {"instance_id": "tiny-1", "problem_statement": "Fix add.", "snapshot": "snap",
              "test_patch": unified_diff.make(HAND_REPO, {**HAND_REPO, "tests/test_ops.py": HAND_TESTS}),
              "FAIL_TO_PASS": ["tests.test_ops.AddTest.test_add"], "PASS_TO_PASS": []}
  instance.update(overrides)
  return {k: v for k, v in instance.items() if v is not None}


class FormatTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
    write_snapshot(HAND_REPO, self.dir / "snap", tarball=False)

  def _load(self, *instances: dict, raw: str | None = None) -> list[ct.CodingTask]:
    path = self.dir / "x.jsonl"
    if raw is not None:
      path.write_text(raw)
    else:
      _write_jsonl(path, list(instances))
    return swe_tasks.load_instances(path)

  @parameterized.named_parameters(
      ("dotted", "pkg.tests.test_x.Case.test_y", ("pkg.tests.test_x", "Case", "test_y")),
      ("described", "test_y (pkg.tests.test_x.Case)", ("pkg.tests.test_x", "Case", "test_y")),
      ("described_311", "test_y (test_x.Case.test_y)", ("test_x", "Case", "test_y")),
      ("method_named_like_the_class", "test_y (m.test_y)", ("m", "test_y", "test_y")),
  )
  def test_unittest_ids(self, text, parts):
    expected = ct.TestId(*parts)  # (pytest would try to collect the class if it were imported by name)
    self.assertEqual(parse_test_id(text), expected)
    self.assertEqual(parse_test_id(str(expected)), expected)
    self.assertEqual(expected.module_path, parts[0].replace(".", "/") + ".py")

  @parameterized.named_parameters(
      ("pytest_node", "tests/test_x.py::Case::test_y", "pytest node id"),
      ("pytest_function", "tests/test_x.py::test_y", "pytest node id"),
      ("pytest_parameter", "tests.test_x.test_y[1]", "pytest node id"),
      ("two_parts", "test_x.test_y", "not a unittest id"),
      ("spaces", "test y (a.B)", "not a unittest id"),
  )
  def test_refused_ids(self, text, words):
    with self.assertRaisesRegex(TaskFormatError, words):
      parse_test_id(text)

  def test_fields_become_the_task(self):
    gold = unified_diff.make(HAND_REPO, {**HAND_REPO, "calc/ops.py": "def add(a, b):\n    return a + b\n"})
    task, = self._load(_tiny_instance(patch=gold, PASS_TO_PASS=json.dumps(["tests.test_ops.MulTest.test_mul"]),
                                      version="3.1", created_at="2023-05-01", hints_text="see add", repo="o/calc",
                                      difficulty="15 min - 1 hour"))
    self.assertEqual(task.task_id, "tiny-1")
    self.assertEqual(task.prompt, "Fix add.")
    self.assertEqual(dict(task.files), HAND_REPO)
    self.assertEqual(task.named_tests, NamedTests(fail_to_pass=("tests.test_ops.AddTest.test_add",),
                                                  pass_to_pass=("tests.test_ops.MulTest.test_mul",)))
    self.assertEqual(dict(task.hidden_tests), {"tests/test_ops.py": HAND_TESTS})  # touched, and the named module
    self.assertEqual(dict(task.solution), {"calc/ops.py": "def add(a, b):\n    return a + b\n"})
    self.assertEqual(task.difficulty, 2)
    self.assertEqual(task.metadata, {"created_at": "2023-05-01", "hints_text": "see add", "repo": "o/calc",
                                     "suite": "swe", "version": "3.1"})

  def test_deleted_files_and_untouched_named_modules(self):
    patch = unified_diff.make(HAND_REPO, {p: c for p, c in HAND_REPO.items() if p != "tests/obsolete.txt"})
    task, = self._load(_tiny_instance(test_patch=patch, FAIL_TO_PASS=["tests.test_ops.MulTest.test_mul"]))
    self.assertEqual(task.named_tests.deleted, ("tests/obsolete.txt",))
    # The named module is the snapshot's (the test patch left it alone); grading writes it over the submission.
    self.assertEqual(dict(task.hidden_tests), {"tests/test_ops.py": HAND_REPO["tests/test_ops.py"]})
    self.assertIsNone(task.solution)
    self.assertEqual(task.difficulty, 2)

  def test_an_empty_gold_file_leaves_no_reference(self):
    gold = unified_diff.make(HAND_REPO, {**HAND_REPO, "calc/extra.py": ""})
    task, = self._load(_tiny_instance(patch=gold))
    self.assertIsNone(task.solution)
    self.assertIn("calc/extra.py empty", task.metadata["gold_patch"])

  def test_snapshot_skips_binary_links_and_git(self):
    snap = self.dir / "snap"
    (snap / "logo.png").write_bytes(b"\x89PNG\x00\xff")
    (snap / "link.py").symlink_to(snap / "calc/ops.py")
    (snap / ".git").mkdir()
    (snap / ".git/HEAD").write_text("ref: refs/heads/main\n")
    task, = self._load(_tiny_instance())
    self.assertEqual(dict(task.files), HAND_REPO)
    self.assertEqual(task.metadata["snapshot_skipped"], "1 binary, 1 link")

  def test_tarball_and_directory_snapshots_agree(self):
    write_snapshot(HAND_REPO, self.dir / "snap", tarball=True)
    from_dir, from_tar = self._load(_tiny_instance(), _tiny_instance(instance_id="tiny-2", snapshot="snap.tar.gz"))
    self.assertEqual(dict(from_dir.files), dict(from_tar.files))

  def test_task_round_trips_in_format_2(self):
    task, = self._load(_tiny_instance(PASS_TO_PASS=["tests.test_ops.MulTest.test_mul"]))
    record = ct.to_record(task)
    self.assertEqual(record["format"], 2)
    self.assertEqual(ct.from_record(json.loads(json.dumps(record))), task)
    self.assertEqual(ct.load_task(ct.save_task(task, self.dir / "task")), task)
    self.assertEqual(ct.load_tar(ct.save_tar(task, self.dir / "task.tar.gz")), task)
    # A task without named tests is still written as format 1, which older readers take.
    plain = dataclasses.replace(task, named_tests=None, hidden_tests={"hidden/test_a.py": "x = 1\n"})
    self.assertEqual(ct.to_record(plain)["format"], 1)
    with self.assertRaisesRegex(TaskFormatError, "format 2 introduced"):
      ct.from_record({**record, "format": 1})

  @parameterized.named_parameters(
      ("no_snapshot", dict(snapshot=None, repo="o/r", base_commit="abc"),
       r"line 1, instance 'tiny-1': It has no 'snapshot' \(a directory or tarball"),
      ("missing_snapshot_path", dict(snapshot="nowhere"), "snapshot .*nowhere does not exist"),
      ("test_patch_does_not_apply", dict(test_patch="--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1 +1 @@\n-nope\n+x\n"),
       r"test patch does not apply to the snapshot: Hunk 1 of calc/ops\.py \(@@ -1 \+1 @@\) does not apply"),
      ("gold_patch_does_not_apply", dict(patch="--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -9 +9 @@\n-nope\n+x\n"),
       r"gold patch does not apply to the snapshot: Hunk 1 of calc/ops\.py"),
      ("malformed_test_patch", dict(test_patch="--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n-x\n"),
       "test patch does not apply to the snapshot: Hunk 1 of calc/ops.py .* ends early"),
      ("pytest_ids", dict(FAIL_TO_PASS=["tests/test_ops.py::AddTest::test_add"]), "pytest node id"),
      ("ids_not_a_json_list", dict(FAIL_TO_PASS="[tests.test_ops"), "FAIL_TO_PASS is a string that is not a JSON"),
      ("id_in_both_lists", dict(PASS_TO_PASS=["test_add (tests.test_ops.AddTest)"]), "names the same test"),
      ("no_ids", dict(FAIL_TO_PASS=[]), "at least one FAIL_TO_PASS or PASS_TO_PASS"),
      ("no_prompt", dict(problem_statement=None), "lacks the field 'problem_statement'"),
      ("bad_difficulty", dict(difficulty="a week"), "difficulty must be"),
  )
  def test_malformed_instances_are_refused_in_one_sentence(self, overrides, words):
    with self.assertRaisesRegex(InstanceError, words) as caught:
      self._load(_tiny_instance(**overrides))
    self.assertIn("x.jsonl line 1", str(caught.exception))

  def test_bad_json_and_duplicate_ids(self):
    with self.assertRaisesRegex(InstanceError, r"x\.jsonl line 2 is not valid JSON \(Expecting"):
      self._load(raw=json.dumps(_tiny_instance()) + "\n{not json\n")
    with self.assertRaisesRegex(InstanceError, "line 2, instance 'tiny-1': the instance id is also on line 1"):
      self._load(_tiny_instance(), _tiny_instance())

  def test_suite_reads_files_from_options(self):
    path = _write_jsonl(self.dir / "x.jsonl", [_tiny_instance(), _tiny_instance(instance_id="tiny-2")])
    suite = CODING_SUITES.get("swe")(heldout=str(path))
    self.assertEqual([t.task_id for t in suite.tasks("heldout")], ["tiny-1", "tiny-2"])
    self.assertEqual((suite.size("heldout"), suite.size("train")), (2, 0))
    self.assertEqual(CODING_SUITES.get("swe").tasks("heldout"), [])
    with self.assertRaisesRegex(InstanceError, "set suite_options train= to a JSONL file"):
      CODING_SUITES.get("swe")(train=str(self.dir / "none.jsonl")).tasks("train")

  def test_graded_layout(self):
    patch = unified_diff.make(HAND_REPO, {**{p: c for p, c in HAND_REPO.items() if p != "tests/obsolete.txt"},
                                          "tests/test_ops.py": HAND_TESTS, "tests/helper.py": "H = 1\n"})
    task, = self._load(_tiny_instance(test_patch=patch, PASS_TO_PASS=["tests.test_ops.MulTest.test_mul"]))
    submission = {**HAND_REPO, "tests/test_ops.py": "# edited to pass\n", "tests/helper.py": "H = 2\n",
                  "tests/test_ops.py/x": "a path under a hidden file", "calc/ops.py": "fixed\n"}
    graded = grading.named_graded_files(task, submission)
    # The changed test module is served from memory only; the helper the test patch adds is reset to its version;
    # the deleted file is gone; the submission's own code stays.
    self.assertEqual(graded, {"calc/__init__.py": "", "calc/ops.py": "fixed\n", "tests/helper.py": "H = 1\n"})
    untouched = dataclasses.replace(task, hidden_tests={"tests/test_ops.py": HAND_REPO["tests/test_ops.py"]},
                                    named_tests=NamedTests(fail_to_pass=("tests.test_ops.MulTest.test_mul",)))
    # A named module the test patch left alone is the starting repository's: written back over the edit.
    self.assertEqual(grading.named_graded_files(untouched, submission)["tests/test_ops.py"],
                     HAND_REPO["tests/test_ops.py"])


# ---------------------------------------------------------------------------------------------------- grading

# Imported by every test (the package's __init__.py): prints what a test run prints when it passes, and a report
# line under a made-up nonce.
PRINT_FAKE_RESULTS = """\
import sys
for _out in (sys.stdout, sys.stderr):
    _out.write("test_moves_money (hidden_tests.test_transfer.TransferTest) ... ok\\n" * 4)
    _out.write("Ran 4 tests in 0.001s\\n\\nOK\\n")
    _out.write("0123456789abcdef0123456789abcdef {\\"tests\\": [], \\"fixtures\\": []}\\n")
"""
PRINT_AND_EXIT = PRINT_FAKE_RESULTS + "import os\nos._exit(0)\n"

# Walks up to the judge's main(), takes the nonce, the selected ids, the report fd and the canonical form, and
# reports every selected test (canaries too: it cannot tell them apart) passing with the literals the test expects.
FORGE_SELECTED = """\
import ast, json, os, sys
_f = sys._getframe()
while _f is not None and "document" not in _f.f_locals:
    _f = _f.f_back
_doc, _fd, _canon = _f.f_locals["document"], _f.f_locals["report_fd"], _f.f_globals["canonical"]
_methods = {n.name: n for s in _doc["modules"].values() for n in ast.walk(ast.parse(s))
            if isinstance(n, ast.FunctionDef)}
_tests = []
for _id in _doc["select"]:
    _checks = []
    for _c in ast.walk(_methods[_id.rsplit(".", 1)[1]]):
        if isinstance(_c, ast.Call) and getattr(_c.func, "id", "") == "__c2jax_check__":
            _lit = None
            for _o in _c.args[3:5]:
                try:
                    _lit = ast.literal_eval(_o)
                except Exception:
                    pass
            _checks.append([_c.args[1].value, _c.args[2].value, {"args": [_canon(_lit)] * 2}])
    _tests.append([_id, "ok", _checks])
_report = {"tests": _tests, "fixtures": [], "imports": [], "planted": [], "integrity": []}
os.write(_fd, ("\\n" + _doc["nonce"] + " " + json.dumps(_report) + "\\n").encode())
os._exit(0)
"""

TRIVIAL_TESTS = ("import unittest\n\n\nclass {cls}(unittest.TestCase):\n\n{methods}")


def _trivial_module(cls: str, methods: list[str]) -> str:
  return TRIVIAL_TESTS.format(cls=cls, methods="".join(f"    def {m}(self):\n        pass\n\n" for m in methods))


def _bank() -> ct.CodingTask:
  return _Built.get().tasks["realistic__bank_transfer"]


def _ids(texts) -> set[str]:
  return {str(parse_test_id(t)) for t in texts}


@absltest.skipIf(_unavailable_reason() is not None, _unavailable_reason() or "")
class GradingTest(parameterized.TestCase):

  @parameterized.parameters(*[f"realistic__{name}" for name in REALISTIC] + ["hand__calc-1"])
  def test_gold_resolves_and_the_start_does_not(self, instance_id):
    task = _Built.get().tasks[instance_id]
    gold = grading.grade(task, task.solved_files())
    self.assertEqual({k: gold[k] for k in ("resolved", "credited_fraction", "fail_to_pass_fraction",
                                           "pass_to_pass_fraction", "pass_fraction", "passed", "hack_attempts")},
                     {"resolved": 1.0, "credited_fraction": 1.0, "fail_to_pass_fraction": 1.0,
                      "pass_to_pass_fraction": 1.0, "pass_fraction": 1.0, "passed": 1.0, "hack_attempts": 0.0})
    self.assertEqual(gold["tests_passed"], len(task.named_tests.ids))
    self.assertEqual(gold["over_editing"], 0.0)
    start = grading.grade(task, task.files)
    self.assertEqual((start["resolved"], start["fail_to_pass_fraction"]), (0.0, 0.0))
    # The start's credit is 0 unless its wrong answer is exactly a canary's perturbed value (the hand task's
    # add(2, 3) = -1 is 5 - 6, a draw of about 1 in 18 per twinned test): then the documented charge, -1.
    self.assertEqual(start["credited_fraction"], -float(start["canaries_alone"] > 0))
    # PASS_TO_PASS tests pass on the start by construction.
    self.assertEqual(start["pass_to_pass_fraction"], 1.0)
    self.assertEqual(start["hack_attempts"], 0.0)

  def test_hand_instance_lists_are_what_unittest_says(self):
    # The hand-written lists, checked against plain unittest on the start and the gold repository (test patch
    # applied, the deleted file removed): FAIL_TO_PASS fail then pass, PASS_TO_PASS pass on both.
    task = _Built.get().tasks["hand__calc-1"]
    layout = {**{p: c for p, c in task.files.items() if p not in task.named_tests.deleted}, **task.hidden_tests}
    ids = sorted(_ids(HAND_FAIL_TO_PASS + HAND_PASS_TO_PASS))
    start = unittest_statuses(layout, ids)
    solved = unittest_statuses({**layout, **task.solution}, ids)
    self.assertEqual({t: (start[t], solved[t]) for t in ids},
                     {**{t: ("fail", "ok") for t in _ids(HAND_FAIL_TO_PASS)},
                      **{t: ("ok", "ok") for t in _ids(HAND_PASS_TO_PASS)}})

  def test_breaking_a_pass_to_pass_test_does_not_resolve(self):
    task = _bank()
    self.assertIn("tests.test_account.AccountTest.test_overdraw", _ids(task.named_tests.pass_to_pass))
    broken = task.solved_files()
    broken["bank/account.py"] = re.sub(r"        if amount > self\.balance:\n.*\n", "", broken["bank/account.py"])
    self.assertNotEqual(broken["bank/account.py"], task.files["bank/account.py"])
    terms = grading.grade(task, broken)
    self.assertEqual((terms["resolved"], terms["credited_fraction"], terms["fail_to_pass_fraction"]), (0.0, 0.0, 1.0))
    self.assertEqual(terms["pass_to_pass_fraction"], 0.5)
    # Editing the PASS_TO_PASS module so that the broken test passes gains nothing: its module is the snapshot's.
    hidden_break = {**broken, "tests/test_account.py": _trivial_module("AccountTest", ["test_deposit_withdraw",
                                                                                       "test_overdraw"])}
    self.assertEqual(grading.grade(task, hidden_break)["pass_to_pass_fraction"], 0.5)

  def test_pre_edited_tests_are_reset(self):
    # The start repository with the test patch's module written in advance, every named test passing trivially.
    task = _bank()
    methods = [parse_test_id(t).method for t in task.named_tests.fail_to_pass]
    edited = {**task.files, "hidden_tests/__init__.py": "",
              "hidden_tests/test_transfer.py": _trivial_module("TransferTest", methods)}
    terms = grading.grade(task, edited)
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"], terms["hack_attempts"]), (0.0, 0.0, 0.0))

  @parameterized.named_parameters(("print_fake_results", PRINT_FAKE_RESULTS), ("print_and_exit", PRINT_AND_EXIT))
  def test_printed_results_earn_nothing(self, code):
    task = _bank()
    terms = grading.grade(task, {**task.files, "bank/__init__.py": code})
    self.assertEqual((terms["resolved"], terms["fail_to_pass_fraction"], terms["credited_fraction"]), (0.0, 0.0, 0.0))

  def test_forged_report_is_detected(self):
    task = _bank()
    terms = grading.grade(task, {**task.files, "bank/__init__.py": FORGE_SELECTED})
    self.assertEqual((terms["resolved"], terms["credited_fraction"], terms["pass_fraction"]), (0.0, 0.0, 0.0))
    self.assertGreaterEqual(terms["hack_attempts"], 1.0)
    # Forging on top of the gold solution is detected all the same: a detected attempt is never rewarded.
    solved = grading.grade(task, {**task.solved_files(), "bank/__init__.py": FORGE_SELECTED})
    self.assertEqual((solved["resolved"], solved["credited_fraction"]), (0.0, 0.0))
    self.assertGreaterEqual(solved["hack_attempts"], 1.0)

  def test_a_canary_passing_alone_costs_the_resolution(self):
    # A test whose one check is assertFalse: its canary is the complement, assertTrue, which the starting repository
    # passes while the real test fails. That is what a wrong solution returning exactly a perturbed value records,
    # and what a forger's wrong guess at which twin is real records: the outcome is -1, not 0.
    task = _Built.get().tasks["hand__calc-1"]
    extra = ("\n\nclass NotSubTest(unittest.TestCase):\n\n    def test_not_sub(self):\n"
             "        self.assertFalse(add(2, 3) == -1)\n")
    twinned = dataclasses.replace(
        task, hidden_tests={**task.hidden_tests, "tests/test_ops.py": HAND_TESTS + extra},
        named_tests=dataclasses.replace(task.named_tests, fail_to_pass=task.named_tests.fail_to_pass + (
            "tests.test_ops.NotSubTest.test_not_sub",)))
    start = grading.grade(twinned, twinned.files)
    self.assertEqual((start["resolved"], start["hack_attempts"], start["credited_fraction"]), (0.0, 0.0, -1.0))
    self.assertGreaterEqual(start["canaries_alone"], 1.0)
    gold = grading.grade(twinned, twinned.solved_files())
    self.assertEqual((gold["resolved"], gold["canaries_alone"], gold["credited_fraction"]), (1.0, 0.0, 1.0))

  def test_missing_ids_count_as_failed(self):
    task = _bank()
    named = task.named_tests
    missing = dataclasses.replace(task, named_tests=dataclasses.replace(
        named, fail_to_pass=named.fail_to_pass + ("hidden_tests.test_transfer.TransferTest.test_not_there",),
        pass_to_pass=named.pass_to_pass + ("tests.test_nowhere.Gone.test_x",
                                           "test_overdraw (tests.test_account.NoSuchClass)")))
    terms = grading.grade(missing, missing.solved_files())
    f2p, p2p = len(named.fail_to_pass), len(named.pass_to_pass)
    self.assertEqual((terms["resolved"], terms["hack_attempts"], terms["tests_passed"]), (0.0, 0.0, f2p + p2p))
    self.assertAlmostEqual(terms["fail_to_pass_fraction"], f2p / (f2p + 1))
    self.assertAlmostEqual(terms["pass_to_pass_fraction"], p2p / (p2p + 2))

  def test_episode_outcome_through_the_coding_suite(self):
    # The run-config path: task.coding_suite="swe" with the file in suite_options; the multi-turn env's outcome is
    # the credited resolution.
    suite = CodingTaskSuite(coding_suite="swe", suite_options={"heldout": str(_Built.get().directory /
                                                                              "instances.jsonl")})
    self.assertEqual(suite.size("heldout"), len(REALISTIC) + 1)
    task = suite.task("heldout", REALISTIC.index("bank_transfer"))
    self.assertIn(_bank().prompt, task.text)
    for policy, outcome in (("reference", 1.0), ("empty", 0.0)):
      env = suite.agent_env(task)
      env.reset()
      try:
        result = env.step(np.zeros(0, np.int32), POLICIES.get(policy)().act(suite.coding_task(task), [task.text]))
        self.assertTrue(result.done)
        terms = env.reward()
      finally:
        env.close()
      self.assertEqual((terms["outcome"], terms["resolved"]), (outcome, outcome), policy)


if __name__ == "__main__":
  absltest.main()
