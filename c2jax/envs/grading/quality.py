"""Code quality of a submission (CursorBench's complementary evaluations, report section 5): the findings of a
well-kept linter, ruff, that the submission's change introduced, counted on the diff (after minus before).

  terms = quality_terms(task, files, CodeQuality.RUFF)
  terms["quality_findings"], terms["complexity_findings"], terms["quality_error"]

Ruff never runs on the host over model-written files: the scorer lays out, in a fresh sandbox, `before/<path>` (the
starting repository's version) and `after/<path>` (the submission's) for every Python file the submission changed or
added, binds the pinned ruff binary read-only into it (`Sandbox(tools=...)`) and runs `ruff check` there under the
grading limits. Ruff only reads the files (it imports and executes nothing); its JSON report is read by the host.

A finding is one (path, rule) occurrence; the introduced findings of a path are, per rule, max(0, after - before),
so moving code about or fixing one finding while adding another of another rule is counted fairly, and a file the
submission left alone costs nothing. The submission's configuration files and suppression comments are ignored.
Rules (`RULES`): pyflakes (F: unused imports and names, undefined names),
pycodestyle errors and warnings (E, W: at `LINE_LENGTH` columns), bugbear (B: likely bugs), flake8-simplify (SIM)
and mccabe complexity (C901: a function over `MAX_COMPLEXITY` branches), the last also counted apart as
`complexity_findings`. A syntax error counts as one finding. The terms:

  quality_findings     introduced findings over every rule (complexity included)
  complexity_findings  introduced C901 findings
  quality_error        1.0 when the linter could not be run to a report (a timeout, a report cut by the output cap,
                       an exit other than 0); the counts are 0 then. A file over `grading.LINT_MAX_CHARS` is not
                       linted and counts as one finding.
"""

from __future__ import annotations

import collections
import enum
import functools
import json
import os
import shutil
import sys
from typing import AbstractSet, Callable, Mapping

from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.sandbox.sandbox import Sandbox, SandboxLimits, SandboxPathError


class CodeQuality(enum.Enum):
  """Whether grading scores the code quality of the diff, and with what."""

  OFF = "off"
  RUFF = "ruff"


RULES = ("F", "E", "W", "B", "SIM", "C901")
COMPLEXITY_RULE = "C901"
MAX_COMPLEXITY = 10  # mccabe's own suggestion
LINE_LENGTH = 120
MAX_CHARS = 200_000  # grading.LINT_MAX_CHARS: larger files are a finding each, not a workload
QUALITY_LIMITS = SandboxLimits(wall_s=30.0, cpu_s=30, memory_mb=1024, output_bytes=4 << 20)
_BEFORE, _AFTER = "before", "after"
_SYNTAX = "syntax"  # ruff reports a syntax error without a rule code


@functools.cache
def ruff_path() -> str:
  """The ruff executable: on PATH, or beside this Python (a virtual environment's bin/)."""
  found = shutil.which("ruff") or shutil.which("ruff", path=os.path.dirname(sys.executable))
  if found is None:
    raise FileNotFoundError("Code quality scoring runs ruff, which is not installed: `pip install ruff==0.17.6` "
                            "(setup.py's test extra).")
  return found


def ruff_command() -> str:
  """The command run in the sandbox over before/ and after/ (a JSON report on stdout, exit 0 whatever it finds)."""
  # --isolated: no configuration file of the submission's; --ignore-noqa: its suppression comments silence nothing;
  # exclude = []: ruff's default excludes (build/, .git/, venv/ ...) would leave files of those names unscored.
  return (f"ruff check --no-cache --isolated --ignore-noqa --exit-zero --output-format json "
          f"--line-length {LINE_LENGTH} --select {','.join(RULES)} --config 'exclude = []' "
          f"--config 'lint.mccabe.max-complexity = {MAX_COMPLEXITY}' {_BEFORE} {_AFTER}")


def changed_python(task: CodingTask, files: Mapping[str, str], owned: AbstractSet[str]) -> list[str]:
  """The Python paths the submission changed or added (not the grader's `owned` paths), sorted."""
  return sorted(p for p, c in files.items() if p.endswith(".py") and p not in owned and task.files.get(p) != c)


def count_findings(report: list, paths: list[str]) -> dict[str, collections.Counter]:
  """{"before": Counter, "after": Counter} of (path, rule) from ruff's JSON `report`; entries outside the two trees
  are ignored (ruff names files by their absolute path inside the sandbox: /work/<tree>/<path>)."""
  out = {_BEFORE: collections.Counter(), _AFTER: collections.Counter()}
  wanted = set(paths)
  for entry in report:
    name = entry.get("filename", "") if isinstance(entry, dict) else ""
    tree, _, path = name.removeprefix("/work/").partition("/")
    if tree in out and path in wanted:
      out[tree][(path, entry.get("code") or _SYNTAX)] += 1
  return out


def introduced(counts: Mapping[str, collections.Counter]) -> collections.Counter:
  """Per rule, the findings after minus before of each path, clipped at 0 and summed over paths."""
  out = collections.Counter()
  for (path, rule), n in counts[_AFTER].items():
    extra = n - counts[_BEFORE][(path, rule)]
    if extra > 0:
      out[rule] += extra
  return out


def quality_terms(task: CodingTask, files: Mapping[str, str], quality: CodeQuality, *,
                  owned: AbstractSet[str] = frozenset(),
                  sandbox_factory: Callable = Sandbox, limits: SandboxLimits = QUALITY_LIMITS) -> dict[str, float]:
  """The module docstring's terms for the submission `files` (empty when `quality` is OFF). `sandbox_factory` is
  called as (files, limits, tools={"ruff": path})."""
  if quality is CodeQuality.OFF:
    return {}
  paths = changed_python(task, files, owned)
  oversize = [p for p in paths if len(files[p]) > MAX_CHARS]
  paths = [p for p in paths if p not in oversize]
  terms = {"quality_findings": float(len(oversize)), "complexity_findings": 0.0, "quality_error": 0.0}
  if not paths:
    return terms
  layout = {f"{_AFTER}/{p}": files[p] for p in paths}
  layout.update({f"{_BEFORE}/{p}": task.files[p] for p in paths if p in task.files and len(task.files[p]) <= MAX_CHARS})
  try:
    with sandbox_factory(layout, limits, tools={"ruff": ruff_path()}) as sandbox:
      result = sandbox.run(ruff_command())
  except SandboxPathError:
    return terms | {"quality_error": 1.0}
  try:
    report = json.loads(result.stdout) if result.exit_code == 0 and not result.timed_out else None
  except ValueError:  # a report cut by the output cap
    report = None
  if not isinstance(report, list):
    return terms | {"quality_error": 1.0}
  found = introduced(count_findings(report, paths))
  terms["quality_findings"] += float(sum(found.values()))
  terms["complexity_findings"] = float(found[COMPLEXITY_RULE])
  return terms
