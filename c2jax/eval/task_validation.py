"""Checks a user's coding tasks before training on them: solvable, not already solved, judged by the host.

  verdicts = validate(load_tasks("my_tasks.jsonl"), workers=2)
  [v.line() for v in verdicts if not v.valid], summary(verdicts)

A task is valid when

  its reference solution passes   graded in a sandbox by the scripted "reference" policy (an episode of the
                                  harness, `harness.run_episode`): a task nobody can solve only teaches noise
  its starting repository fails   the "empty" policy (changes nothing) must not pass: a task that is already solved
                                  rewards doing nothing
  its hidden tests hold no plain  an AST scan of every hidden .py file: a plain `assert` is decided in the judge's
  `assert`                        process by the submission's objects (a returned object whose `__eq__` says True
                                  passes `assert f() == 3`); c2jax/envs/tasks/assert_import.py rewrites such files
                                  into host-decided assertions, or write `self.assertEqual` and the like

Each failed check is a `Finding` (its `Problem` and a detail naming the file and line where there is one).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import enum
from typing import Sequence

from c2jax.envs.core.env import EnvConfig
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.eval import harness
from c2jax.sandbox import host_ast
from c2jax.sandbox.sandbox import SandboxPool

ASSERT_FIX = ("rewrite it with c2jax/envs/tasks/assert_import.py or as self.assertEqual and the like, since a plain "
              "assert is decided in the judge's process, where a submission's objects can fake it")


class Problem(enum.Enum):
  """Why a task is not valid."""

  NO_REFERENCE = "no_reference"  # no solution to prove the task solvable
  REFERENCE_FAILS = "reference_fails"
  START_PASSES = "start_passes"
  PLAIN_ASSERT = "plain_assert"
  UNPARSABLE_TEST = "unparsable_test"  # a hidden .py file the scan (and so the judge) cannot parse


@dataclasses.dataclass(frozen=True)
class Finding:
  problem: Problem
  detail: str


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One task's findings; valid when there are none."""

  task_id: str
  findings: tuple[Finding, ...]

  @property
  def valid(self) -> bool:
    return not self.findings

  def line(self) -> str:
    """One line: the task and each finding (what failed, why)."""
    return f"{self.task_id}: " + "; ".join(f"{f.problem.value}: {f.detail}" for f in self.findings)


def plain_asserts(task: CodingTask) -> list[Finding]:
  """A finding for each hidden .py file that does not parse, then one listing every `assert` statement in the task's
  hidden .py files as path:line, in path and line order (none without asserts)."""
  findings, places = [], []
  for path, source in sorted(task.hidden_tests.items()):
    if not path.endswith(".py"):
      continue
    try:
      tree = host_ast.parse(source, filename=path)  # the host's one parser, under its lock (task files are input too)
    except host_ast.Unparsable as e:
      cause = e.__context__  # the parser's own error (host_ast raises from None: kept as the context)
      where = f" line {cause.lineno}" if isinstance(cause, SyntaxError) and cause.lineno else ""
      reason = cause.msg if isinstance(cause, SyntaxError) else str(e)
      findings.append(Finding(Problem.UNPARSABLE_TEST, f"hidden test {path}{where} does not parse ({reason})"))
      continue
    places += [f"{path}:{n}" for n in sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert))]
  if places:
    findings.append(Finding(Problem.PLAIN_ASSERT, f"plain assert at {', '.join(places)}; {ASSERT_FIX}"))
  return findings


def _grading_finding(problem: Problem, episode: harness.Episode) -> Finding:
  fraction = episode.terms.get("pass_fraction", 0.0)
  if problem is Problem.REFERENCE_FAILS:
    why = f"the reference solution does not pass the hidden tests (pass fraction {fraction:.2f})"
  else:
    why = "the starting repository already passes the hidden tests, so doing nothing is rewarded"
  return Finding(problem, why + (f" [{episode.error}]" if episode.error else ""))


def validate(tasks: Sequence[CodingTask], *, workers: int = 2, config: EnvConfig = EnvConfig(),
             progress: bool = True) -> list[Verdict]:
  """The verdict of every task, in task order: two sandboxed gradings each (reference, empty), `workers` at a
  time, and the plain-assert scan.

  Raises:
    SandboxUnavailable: bubblewrap cannot run here.
  """
  jobs = [(task, problem) for task in tasks for problem in (Problem.REFERENCE_FAILS, Problem.START_PASSES)
          if not (problem is Problem.REFERENCE_FAILS and task.solution is None)]
  policy = {Problem.REFERENCE_FAILS: "reference", Problem.START_PASSES: "empty"}
  with SandboxPool(workers) as pool:
    futures = [pool.submit(harness.run_episode, task, POLICIES.get(policy[problem])(), 0, config)
               for task, problem in jobs]
    if progress:
      import tqdm
      futures = tqdm.tqdm(futures, desc="grading", unit="grading")
    episodes = [f.result() for f in futures]
  found: dict[str, list[Finding]] = collections.defaultdict(list)
  for (task, problem), episode in zip(jobs, episodes):
    # The reference must pass; the starting repository must not.
    if episode.passed != (problem is Problem.REFERENCE_FAILS):
      found[task.task_id].append(_grading_finding(problem, episode))
  verdicts = []
  for task in tasks:
    findings = list(found[task.task_id])
    if task.solution is None:
      findings.insert(0, Finding(Problem.NO_REFERENCE, "the task has no reference solution, so nothing shows it "
                                                       "solvable; add solution/ (or the record's \"solution\")"))
    verdicts.append(Verdict(task.task_id, tuple(findings + plain_asserts(task))))
  return verdicts


def summary(verdicts: Sequence[Verdict]) -> dict:
  """The JSON summary: counts, the invalid task ids, and how many tasks have each problem."""
  problems = collections.Counter(p.value for v in verdicts for p in {f.problem for f in v.findings})
  return {"tasks": len(verdicts), "valid": sum(v.valid for v in verdicts),
          "invalid": [v.task_id for v in verdicts if not v.valid], "problems": dict(sorted(problems.items()))}
