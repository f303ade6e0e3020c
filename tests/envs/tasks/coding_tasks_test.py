"""The coding task format: construction checks, and exact round trips through a directory, a JSON record and a tar."""

import io
import json
import pathlib
import shutil
import tarfile
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tasks import coding_tasks as ct
from c2jax.envs.tasks.coding_tasks import Category, CodingTask, TaskFormatError


def make_task(**overrides) -> CodingTask:
  fields = dict(
      task_id="demo/add",
      prompt="Make add() add.",
      files={"pkg/__init__.py": "", "pkg/core.py": "def add(a, b):\n    return a - b\n",
             "tests/test_core.py": "import unittest\n"},
      hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_add.py": "# the judge\n"},
      solution={"pkg/core.py": "def add(a, b):\n    return a + b\n", "pkg/extra.py": "X = 1\n"},
      solution_deletes=("tests/test_core.py",),
      category=Category.DEBUGGING,
      difficulty=2,
      expected_tests=4,
      metadata={"suite": "demo", "n": 3},
  )
  fields.update(overrides)
  return CodingTask(**fields)


class CodingTaskTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def test_normalizes_fields(self):
    task = make_task()
    self.assertEqual(task.metadata, {"n": "3", "suite": "demo"})
    self.assertEqual(list(task.files), sorted(task.files))
    self.assertEqual(task.expected_tests, 4)
    self.assertIsNone(make_task(expected_tests=None).expected_tests)
    self.assertEqual(task.solved_files(), {"pkg/__init__.py": "", "pkg/core.py": "def add(a, b):\n    return a + b\n",
                                           "pkg/extra.py": "X = 1\n"})

  @parameterized.named_parameters(
      ("absolute_path", dict(files={"/etc/passwd": "x"}), "relative"),
      ("dotdot_path", dict(files={"../x.py": "x"}), "relative"),
      ("unnormalized_path", dict(files={"a//b.py": "x"}), "normalized"),
      ("empty_solution_file", dict(solution={"pkg/core.py": ""}), "solution_deletes"),
      ("delete_missing_file", dict(solution_deletes=("nope.py",)), "lacks"),
      ("no_hidden_tests", dict(hidden_tests={}), "no hidden tests"),
      ("bad_difficulty", dict(difficulty=5), "difficulty"),
      ("bool_difficulty", dict(difficulty=True), "difficulty"),
      ("string_difficulty", dict(difficulty="2"), "difficulty"),
      ("dot_path", dict(files={".": "x"}), "relative"),
      ("dot_part", dict(files={"a/./b.py": "x"}), "normalized"),
      ("no_hidden_test_module", dict(hidden_tests={"hidden_tests/helpers.py": "X = 1\n"}), "test\\*.py"),
      ("zero_expected_tests", dict(expected_tests=0), "expected_tests"),
      ("float_expected_tests", dict(expected_tests=2.0), "expected_tests"),
      ("category_as_string", dict(category="feature"), "Category"),
      ("bytes_content", dict(files={"a.py": b"x"}), "text"),
  )
  def test_rejects(self, overrides, words):
    with self.assertRaisesRegex(TaskFormatError, words):
      make_task(**overrides)

  def test_directory_round_trip(self):
    task = make_task()
    root = ct.save_task(task, self.dir / "t")
    self.assertTrue((root / "task.json").is_file())
    self.assertEqual((root / "repo" / "pkg" / "core.py").read_text(), task.files["pkg/core.py"])
    self.assertTrue((root / "hidden_tests" / "hidden_tests" / "test_add.py").is_file())
    self.assertTrue((root / "solution" / "pkg" / "extra.py").is_file())
    header = json.loads((root / "task.json").read_text())
    self.assertNotIn("files", header)  # the trees live in their directories, not in task.json
    self.assertEqual(ct.load_task(root), task)
    with self.assertRaises(FileExistsError):
      ct.save_task(task, root)

  def test_load_ignores_bytecode(self):
    root = ct.save_task(make_task(), self.dir / "t")
    (root / "repo" / "pkg" / "__pycache__").mkdir()
    (root / "repo" / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\x00\xff")
    self.assertEqual(ct.load_task(root), make_task())

  def test_record_round_trip(self):
    for task in (make_task(), make_task(solution=None, solution_deletes=())):
      record = ct.to_record(task)
      self.assertEqual(ct.from_record(json.loads(json.dumps(record))), task)

  def test_tar_round_trip_is_deterministic(self):
    task = make_task()
    a = ct.save_tar(task, self.dir / "a.tar.gz")
    b = ct.save_tar(task, self.dir / "b.tar.gz")
    self.assertEqual(ct.load_tar(a), task)
    with tarfile.open(a) as ta, tarfile.open(b) as tb:
      self.assertEqual([(m.name, m.size, m.mtime) for m in ta], [(m.name, m.size, m.mtime) for m in tb])
      self.assertTrue(all(m.name.startswith("demo__add/") for m in ta))

  def test_directory_errors_name_the_piece(self):
    root = ct.save_task(make_task(), self.dir / "t")
    shutil.rmtree(root / "hidden_tests")
    with self.assertRaisesRegex(TaskFormatError, "no hidden_tests/"):
      ct.load_task(root)
    shutil.rmtree(root / "repo")
    with self.assertRaisesRegex(TaskFormatError, "no repo/"):
      ct.load_task(root)
    (root / "task.json").unlink()
    with self.assertRaisesRegex(TaskFormatError, "no task.json"):
      ct.load_task(root)
    with self.assertRaisesRegex(TaskFormatError, "does not exist"):
      ct.load_task(self.dir / "missing")

  def test_record_errors_name_the_piece(self):
    record = ct.to_record(make_task())
    with self.assertRaisesRegex(TaskFormatError, "unknown category 'poetry'"):
      ct.from_record({**record, "category": "poetry"})
    with self.assertRaisesRegex(TaskFormatError, "field 'prompt'"):
      ct.from_record({k: v for k, v in record.items() if k != "prompt"})
    with self.assertRaisesRegex(TaskFormatError, "lacks its hidden_tests"):
      ct.from_record({k: v for k, v in record.items() if k != "hidden_tests"})
    with self.assertRaisesRegex(TaskFormatError, "format 99"):
      ct.from_record({**record, "format": 99})
    # Malformed field types are format errors too, never a TypeError or ValueError from deep inside.
    for bad in ({"difficulty": None}, {"difficulty": "hard"}, {"difficulty": [2]}, {"expected_tests": "4"},
                {"metadata": [1]}, {"solution_deletes": 3}, {"files": ["pkg/core.py"]}, {"solution": "x"}):
      with self.subTest(bad=bad), self.assertRaises(TaskFormatError):
        ct.from_record({**record, **bad})
    with self.assertRaisesRegex(TaskFormatError, "through the judge"):
      ct.from_record({**record, "test_command": "true"})

  def test_reads_records_of_the_legacy_test_command(self):
    record = ct.to_record(make_task())
    legacy = {**record, "test_command": "python3 -I -m unittest discover -s hidden_tests -t . -v"}
    self.assertEqual(ct.from_record(legacy), make_task())

  def test_tar_refuses_links_and_escapes(self):
    for name, kind in [("t/repo/link.py", tarfile.SYMTYPE), ("t/../evil.py", tarfile.REGTYPE)]:
      path = self.dir / f"{kind!r}.tar.gz"
      with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
        tar.addfile(info, io.BytesIO(b""))
      with self.assertRaises(TaskFormatError):
        ct.load_tar(path)


if __name__ == "__main__":
  absltest.main()
