"""Explicit constraints a task's prompt states (instruction following, CursorBench's complementary evaluations, report
section 5): their format, kept in the task's metadata "constraints" as a JSON list; the grader checks them
(c2jax/envs/grading/constraints.py).

  constraints = task_constraints(task)
  task = dataclasses.replace(task, metadata={**task.metadata, METADATA_KEY: encode(constraints)})

A constraint is one JSON object with a "kind" (`Kind`):

  {"kind": "untouched", "paths": ["config.py"]}
      the files must stay exactly as the starting repository holds them (neither changed nor deleted);
  {"kind": "keep_api", "path": "shapes.py", "names": ["area", "Shape"]}
      each name stays a top-level function or class of the module, a function with the same parameters (names,
      kinds, defaults present or not, in order) as in the starting repository;
  {"kind": "style", "paths": ["report.py"], "style": "annotated"}
      a style the files must follow (`Style`): "annotated" (every function of the files annotates each parameter
      but self/cls, and its return), "no_print" (no call of print in the files), "docstrings" (every function and
      class of the files has a docstring).

The tests that judge correctness stay the hidden tests; a constraint is what tests cannot see (a file left alone, an
interface kept for callers outside the repository, a style).
"""

from __future__ import annotations

import dataclasses
import enum
import json

from c2jax.envs.tasks.coding_tasks import CodingTask, TaskFormatError, check_path

METADATA_KEY = "constraints"


class Kind(enum.Enum):
  """What a constraint requires."""

  UNTOUCHED = "untouched"
  KEEP_API = "keep_api"
  STYLE = "style"


class Style(enum.Enum):
  """A style the changed code must follow."""

  ANNOTATED = "annotated"
  NO_PRINT = "no_print"
  DOCSTRINGS = "docstrings"


@dataclasses.dataclass(frozen=True)
class Constraint:
  """One explicit instruction (the module docstring): `paths` for untouched and style, `path` and `names` for
  keep_api, `style` for style."""

  kind: Kind
  paths: tuple[str, ...] = ()
  names: tuple[str, ...] = ()
  style: Style | None = None

  def to_json(self) -> dict:
    out: dict = {"kind": self.kind.value}
    if self.kind is Kind.KEEP_API:
      out.update(path=self.paths[0], names=list(self.names))
    else:
      out["paths"] = list(self.paths)
    if self.style is not None:
      out["style"] = self.style.value
    return out


def _strings(value: object, what: str) -> tuple[str, ...]:
  if isinstance(value, str) or not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
    raise TaskFormatError(f"A constraint's {what} must be a non-empty list of strings, got {value!r:.200}.")
  return tuple(value)


def parse_constraint(value: object) -> Constraint:
  """A `Constraint` from its JSON object; a malformed one raises TaskFormatError naming the piece."""
  if not isinstance(value, dict) or value.get("kind") not in {k.value for k in Kind}:
    raise TaskFormatError(f"A constraint must be an object with a kind in {[k.value for k in Kind]}, got "
                          f"{value!r:.200}.")
  kind = Kind(value["kind"])
  if kind is Kind.KEEP_API:
    path = value.get("path")
    if not isinstance(path, str):
      raise TaskFormatError(f"A keep_api constraint needs a string path, got {path!r:.200}.")
    return Constraint(kind, paths=(check_path(path),), names=_strings(value.get("names"), "names"))
  paths = tuple(check_path(p) for p in _strings(value.get("paths"), "paths"))
  if kind is Kind.UNTOUCHED:
    return Constraint(kind, paths=paths)
  if value.get("style") not in {s.value for s in Style}:
    raise TaskFormatError(f"A style constraint's style must be one of {[s.value for s in Style]}, got "
                          f"{value.get('style')!r:.200}.")
  return Constraint(kind, paths=paths, style=Style(value["style"]))


def task_constraints(task: CodingTask) -> tuple[Constraint, ...]:
  """The task's constraints (metadata["constraints"], a JSON list); () when it states none."""
  text = task.metadata.get(METADATA_KEY)
  if text is None:
    return ()
  try:
    values = json.loads(text)
  except ValueError:
    raise TaskFormatError(f"Task {task.task_id}'s metadata {METADATA_KEY!r} must be a JSON list.") from None
  if not isinstance(values, list):
    raise TaskFormatError(f"Task {task.task_id}'s metadata {METADATA_KEY!r} must be a JSON list of constraints.")
  return tuple(parse_constraint(v) for v in values)


def encode(constraints: tuple[Constraint, ...]) -> str:
  """The metadata value of `constraints` (what `task_constraints` reads back)."""
  return json.dumps([c.to_json() for c in constraints])
