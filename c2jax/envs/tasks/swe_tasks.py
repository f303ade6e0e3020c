"""SWE-bench / SWE-Gym-style task instances (one JSON object per line) as coding tasks graded by their named tests.

  tasks = load_instances("instances.jsonl")                  # list[CodingTask], one per line
  suite = CODING_SUITES.get("swe")(heldout="instances.jsonl")  # the "swe" suite over such files
  # a run config: task.coding_suite="swe", task.suite_options={"train": "gym.jsonl", "heldout": "bench.jsonl"}

An instance is an object with

  instance_id        the task id (unique in its file)
  problem_statement  the prompt
  snapshot           the repository at its base commit: a directory or a tarball (.tar, .tar.gz, ...) holding the
                     repository's files at its root (`tar -C repo -czf snap.tar.gz .`), relative paths resolved
                     against the JSONL file's directory. SWE-bench names `repo` and `base_commit` instead, which
                     cannot be fetched here: an instance without a snapshot is refused
  test_patch         a unified diff (c2jax/envs/tasks/unified_diff.py) adding or changing tests, applied only at grading
  FAIL_TO_PASS       test ids that the task must make pass; a list, or (as SWE-bench stores it) a JSON string of one
  PASS_TO_PASS       test ids that must keep passing (default none); the same forms
  patch              (optional) the gold patch: the reference solution
  hints_text, version, created_at, repo, base_commit, environment_setup_commit   (optional) kept in metadata
  category, difficulty   (optional) a `Category` value; 1-3 or SWE-bench Verified's time buckets ("<15 min fix",
                     "15 min - 1 hour", "1-4 hours", ">4 hours"). Without one, difficulty follows the gold patch: one
                     hunk 1, one file 2, more 3 (2 without a gold patch)

Test ids are unittest ids, `module.Class.test_name` or `test_name (module.Class)`, modules dotted from the
repository root; pytest node ids are refused (`coding_tasks.parse_test_id`: the sandbox's Python has no pytest).

The task (`CodingTask` with `NamedTests`): files = the snapshot; hidden_tests = the files the test patch touches, as
the snapshot holds them with the test patch applied, plus the modules of the named tests (snapshot with the test
patch); named_tests = the two id lists and the test patch's deletions; solution = the gold patch's result. Grading
(c2jax/envs/grading/grading.py, "Grading by named tests") writes those files over the submission, which is SWE-bench's
harness resetting the test files and applying the test patch, resets the rest of the named tests' test directory
(`tests/`, `pkg/tests/`: helpers, base classes and data) and the test support the named tests import elsewhere
(`pkg/testing_utils.py`, a root `helpers.py`) to the snapshot's, and runs exactly the named tests.

Snapshot files that are not UTF-8 text, links and other non-regular files are left out (a count goes into
metadata["snapshot_skipped"]), as are `.git/` and `__pycache__/`. A gold patch that leaves a file empty cannot be a
reference solution here (`CodingTask` keeps deletions apart from contents): the task then has none, and
metadata["gold_patch"] says why. Every other problem refuses the file in one sentence that names its line and
instance.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import tarfile
from typing import Mapping

from c2jax.envs.tasks import unified_diff
from c2jax.envs.tasks.coding_tasks import (CODING_SUITES, Category, CodingTask, NamedTests, TaskFormatError, check_path,
                                     check_split, parse_test_id)

REQUIRED = ("instance_id", "problem_statement", "snapshot", "test_patch", "FAIL_TO_PASS")
METADATA = ("repo", "base_commit", "environment_setup_commit", "version", "created_at", "hints_text")
# SWE-bench Verified's annotated time to solve, as a difficulty.
VERIFIED_DIFFICULTY = {"<15 min fix": 1, "15 min - 1 hour": 2, "1-4 hours": 3, ">4 hours": 3}
_SKIPPED_DIRS = (".git", "__pycache__")


class InstanceError(TaskFormatError):
  """An instance (or its file) that cannot become a task; the message names the line and the instance."""


# ---------------------------------------------------------------------------------------------------- snapshots


def _keep(rel: str) -> bool:
  parts = rel.split("/")
  return not any(p in _SKIPPED_DIRS for p in parts) and not rel.endswith(".pyc")


def _decode(data: bytes) -> str | None:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def read_snapshot(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, int]]:  # noqa: C901
  """(the repository's text files, path -> text; counts of what was left out by kind: "binary", "link", "other").

  `path` is a directory or a tarball with the files at its root (a leading "./" is dropped).
  """
  root = pathlib.Path(path)
  files: dict[str, str] = {}
  skipped = {"binary": 0, "link": 0, "other": 0}
  if root.is_dir():
    for directory, dirs, names in os.walk(root, followlinks=False):
      dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
      for name in sorted(names):
        full = pathlib.Path(directory) / name
        rel = full.relative_to(root).as_posix()
        if not _keep(rel):
          continue
        if full.is_symlink() or not full.is_file():
          skipped["link" if full.is_symlink() else "other"] += 1
          continue
        text = _decode(full.read_bytes())
        if text is None:
          skipped["binary"] += 1
          continue
        files[check_path(rel)] = text
      for d in list(dirs):
        if (pathlib.Path(directory) / d).is_symlink():
          dirs.remove(d)
          skipped["link"] += 1
  elif root.is_file() and tarfile.is_tarfile(root):
    with tarfile.open(root, "r:*") as tar:
      for member in tar.getmembers():
        rel = member.name[2:] if member.name.startswith("./") else member.name
        rel = rel.rstrip("/")
        if member.isdir() or not rel or rel == "." or not _keep(rel):
          continue
        if not member.isfile():
          skipped["link" if member.issym() or member.islnk() else "other"] += 1
          continue
        try:
          check_path(rel)
        except TaskFormatError:
          raise InstanceError(f"The snapshot {root} holds {member.name!r}, a path outside the repository.") from None
        text = _decode(tar.extractfile(member).read())
        if text is None:
          skipped["binary"] += 1
          continue
        files[rel] = text
  else:
    raise InstanceError(f"The snapshot {root} is neither a directory nor a tarball.")
  if not files:
    raise InstanceError(f"The snapshot {root} holds no text file.")
  return dict(sorted(files.items())), {k: v for k, v in skipped.items() if v}


# ---------------------------------------------------------------------------------------------------- instances


def _id_list(value: object, field: str) -> list[str]:
  """A list of test ids, given as a list or as a JSON string of one (SWE-bench's form)."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError:
      raise InstanceError(f"{field} is a string that is not a JSON list of test ids.") from None
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise InstanceError(f"{field} must be a list of test ids (or a JSON string of one), got {value!r:.120}.")
  return value


def _difficulty(instance: Mapping, gold: list[unified_diff.FilePatch] | None) -> int:
  value = instance.get("difficulty")
  if value is None:
    if not gold:
      return 2
    hunks = sum(len(fp.hunks) for fp in gold)
    return 1 if len(gold) == 1 and hunks <= 1 else 2 if len(gold) == 1 else 3
  if isinstance(value, str) and value in VERIFIED_DIFFICULTY:
    return VERIFIED_DIFFICULTY[value]
  if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2, 3):
    return value
  raise InstanceError(f"difficulty must be 1, 2, 3 or one of {', '.join(map(repr, VERIFIED_DIFFICULTY))}, got "
                      f"{value!r}.")


def _reference(files: dict[str, str], gold: list[unified_diff.FilePatch]
               ) -> tuple[dict[str, str] | None, tuple[str, ...], str | None]:
  """(solution, solution_deletes, why there is none) from the gold patch applied to the snapshot."""
  solved = unified_diff.apply(files, gold)
  solution = {p: c for p, c in solved.items() if files.get(p) != c}
  deletes = tuple(sorted(p for p in files if p not in solved))
  empty = sorted(p for p, c in solution.items() if c == "")
  if empty:
    return None, (), f"none: it leaves {empty[0]} empty, which a reference solution cannot hold"
  if not solution and not deletes:
    return None, (), "none: it changes nothing"
  return solution, deletes, None


def instance_task(instance: Mapping, base_dir: str | os.PathLike, snapshots: dict | None = None) -> CodingTask:
  """The `CodingTask` of one instance (module docstring); relative snapshot paths resolve against `base_dir`.

  `snapshots` caches read snapshots by resolved path across the instances of one file.
  """
  if not isinstance(instance, Mapping):
    raise InstanceError("An instance must be a JSON object.")
  if "snapshot" not in instance:
    raise InstanceError("It has no 'snapshot' (a directory or tarball of the repository at its base commit, relative "
                        "to the JSONL file); repo and base_commit cannot be fetched here.")
  missing = [k for k in REQUIRED if k not in instance]
  if missing:
    raise InstanceError(f"It lacks the field {missing[0]!r}.")
  for key in ("instance_id", "problem_statement", "snapshot", "test_patch"):
    if not isinstance(instance[key], str):
      raise InstanceError(f"Its field {key!r} must be a string.")
  if "patch" in instance and instance["patch"] is not None and not isinstance(instance["patch"], str):
    raise InstanceError("Its field 'patch' (the gold patch) must be a string.")
  location = pathlib.Path(base_dir) / instance["snapshot"]
  key = str(location.resolve())
  cache = {} if snapshots is None else snapshots
  if key not in cache:
    if not location.exists():
      raise InstanceError(f"Its snapshot {location} does not exist.")
    cache[key] = read_snapshot(location)
  files, skipped = cache[key]

  fail_to_pass = _id_list(instance["FAIL_TO_PASS"], "FAIL_TO_PASS")
  pass_to_pass = _id_list(instance.get("PASS_TO_PASS", []), "PASS_TO_PASS")
  try:
    test_patch = unified_diff.parse(instance["test_patch"])
    patched = unified_diff.apply(files, test_patch)
  except unified_diff.PatchError as e:
    raise InstanceError(f"Its test patch does not apply to the snapshot: {e}") from None
  touched = unified_diff.touched(test_patch)
  named_paths = {parse_test_id(i).module_path for i in fail_to_pass + pass_to_pass}
  hidden = {p: patched[p] for p in sorted(set(touched) | named_paths) if p in patched}
  named = NamedTests(fail_to_pass=tuple(fail_to_pass), pass_to_pass=tuple(pass_to_pass),
                     deleted=tuple(p for p in touched if p not in patched))

  metadata = {"suite": "swe"}
  metadata.update({k: str(instance[k]) for k in METADATA if instance.get(k) is not None})
  if skipped:
    metadata["snapshot_skipped"] = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items()))
  solution, deletes, gold = None, (), None
  if instance.get("patch"):
    try:
      gold = unified_diff.parse(instance["patch"])
      solution, deletes, why = _reference(files, gold)
    except unified_diff.PatchError as e:
      raise InstanceError(f"Its gold patch does not apply to the snapshot: {e}") from None
    if why is not None:
      metadata["gold_patch"] = why
  try:
    category = Category(instance.get("category", Category.DEBUGGING.value))
  except ValueError:
    raise InstanceError(f"Its category {instance['category']!r} is unknown; known: "
                        f"{', '.join(c.value for c in Category)}.") from None
  return CodingTask(task_id=instance["instance_id"], prompt=instance["problem_statement"], files=files,
                    hidden_tests=hidden, solution=solution, solution_deletes=deletes, category=category,
                    difficulty=_difficulty(instance, gold), metadata=metadata, named_tests=named)


def load_instances(path: str | os.PathLike) -> list[CodingTask]:
  """The tasks of a JSONL file of instances, in file order (blank lines skipped). Raises InstanceError naming the
  line and the instance for the first one that cannot become a task."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise InstanceError(f"The instance file {path} does not exist.")
  tasks, seen, snapshots = [], {}, {}
  with path.open(encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path} line {number}"
      try:
        instance = json.loads(line)
      except json.JSONDecodeError as e:
        raise InstanceError(f"{where} is not valid JSON ({e.msg} at column {e.colno}).") from None
      name = instance.get("instance_id") if isinstance(instance, dict) else None
      if isinstance(name, str):
        where += f", instance {name!r}"
      try:
        task = instance_task(instance, path.parent, snapshots)
      except (TaskFormatError, unified_diff.PatchError) as e:
        raise InstanceError(f"{where}: {e}") from None
      if task.task_id in seen:
        raise InstanceError(f"{where}: the instance id is also on line {seen[task.task_id]}; ids must be unique.")
      seen[task.task_id] = number
      tasks.append(task)
  return tasks


@functools.lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int, size: int) -> tuple[CodingTask, ...]:
  del mtime_ns, size  # the cache key: a rewritten file is read again
  return tuple(load_instances(path))


# ---------------------------------------------------------------------------------------------------- suite


@dataclasses.dataclass(frozen=True)
class SweSuite:
  """Instances from JSONL files as a coding suite: `train` and `heldout` name each split's file ("": empty).

  Registered as "swe" with both empty; a run config picks the files through the coding task's `suite_options`
  (`CODING_SUITES.get("swe")(heldout=path)` is what the actor builds from them).
  """

  train: str = ""
  heldout: str = ""
  name: str = "swe"

  def tasks(self, split: str) -> list[CodingTask]:
    check_split(split)
    path = getattr(self, split)
    if not path:
      return []
    resolved = pathlib.Path(path).expanduser().resolve()
    if not resolved.is_file():
      raise InstanceError(f"The swe suite's {split} file {path} does not exist; set suite_options {split}= to a "
                          "JSONL file of instances.")
    stat = resolved.stat()
    return list(_cached(str(resolved), stat.st_mtime_ns, stat.st_size))

  def size(self, split: str) -> int:
    return len(self.tasks(split))

  def __call__(self, **overrides) -> SweSuite:
    """The suite with other fields (the split files)."""
    return dataclasses.replace(self, **overrides)


SWE = CODING_SUITES.register("swe")(SweSuite())
