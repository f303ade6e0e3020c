"""Instruction following (CursorBench's complementary evaluations, report section 5): the grader's check of the
constraints a task states (their format: c2jax/envs/tasks/constraints.py) on the submitted files.

  terms = constraint_terms(task, files)     # {"constraint_violations": n, "constraints_total": m}; {} without any

The checks read the submission's files with `c2jax.sandbox.host_ast` (parsing only; nothing of the submission is
imported or run on the host). A file that does not parse breaks every keep_api and style constraint on it; a file
the submission deleted breaks keep_api and untouched, and has no style to break. `grading.grade` adds
"instructions_followed": 1.0 when the task passed and no constraint was broken, the evaluation's score.
"""

from __future__ import annotations

import ast
from typing import Mapping

from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.tasks.constraints import Constraint, Kind, Style, task_constraints
from c2jax.sandbox import host_ast


def _parse(source: str | None, path: str) -> ast.Module | None:
  if source is None:
    return None
  try:
    return host_ast.parse(source, filename=path)
  except host_ast.Unparsable:
    return None


def _signature(node: ast.AST) -> tuple | None:
  """What callers depend on: a class is its name; a function its parameters' names and kinds, and which have
  defaults (the defaults' values may change)."""
  if isinstance(node, ast.ClassDef):
    return ("class",)
  if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
    return None
  a = node.args
  positional = a.posonlyargs + a.args
  defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
  return ("def",
          tuple((p.arg, "posonly" if i < len(a.posonlyargs) else "positional", d)
                for i, (p, d) in enumerate(zip(positional, defaults))),
          a.vararg.arg if a.vararg else None,
          tuple((p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)),
          a.kwarg.arg if a.kwarg else None)


def _top_level(tree: ast.Module) -> dict[str, tuple | None]:
  """name -> signature of the module's top-level functions and classes (the last definition wins, as in Python)."""
  return {n.name: _signature(n) for n in tree.body
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _functions(tree: ast.Module):
  return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _follows(tree: ast.Module, style: Style) -> bool:
  if style is Style.NO_PRINT:
    return not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
                   for n in ast.walk(tree))
  if style is Style.DOCSTRINGS:
    return all(ast.get_docstring(n) for n in ast.walk(tree)
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
  for f in _functions(tree):  # ANNOTATED
    a = f.args
    params = [p for p in a.posonlyargs + a.args if p.arg not in ("self", "cls")] + a.kwonlyargs
    params += [p for p in (a.vararg, a.kwarg) if p is not None]
    if f.returns is None or any(p.annotation is None for p in params):
      return False
  return True


def holds(constraint: Constraint, before: Mapping[str, str], after: Mapping[str, str]) -> bool:
  """Whether the submission `after` keeps `constraint`, the starting repository being `before`."""
  if constraint.kind is Kind.UNTOUCHED:
    return all(after.get(p) == before.get(p) for p in constraint.paths)
  if constraint.kind is Kind.KEEP_API:
    path = constraint.paths[0]
    old, new = _parse(before.get(path), path), _parse(after.get(path), path)
    if new is None:
      return False
    was, now = _top_level(old) if old is not None else {}, _top_level(new)
    return all(name in now and now[name] == was.get(name, now[name]) for name in constraint.names)
  for path in constraint.paths:  # STYLE: a file the submission deleted has no style to break
    if path in after:
      tree = _parse(after[path], path)
      if tree is None or not _follows(tree, constraint.style):
        return False
  return True


def constraint_terms(task: CodingTask, files: Mapping[str, str]) -> dict[str, float]:
  """{"constraint_violations", "constraints_total"} for a task that states constraints; {} otherwise."""
  constraints = task_constraints(task)
  if not constraints:
    return {}
  broken = sum(not holds(c, task.files, files) for c in constraints)
  return {"constraint_violations": float(broken), "constraints_total": float(len(constraints))}
