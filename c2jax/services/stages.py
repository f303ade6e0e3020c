"""Where a long job is: its stages by name and place, each progress bar labelled by its stage, how long each took,
and one-line notes (a long first compile, where the outputs are).

  plan = Stages(("SFT", "RL"))
  with plan.stage("SFT") as run:       # "stage 1/2: SFT"; at its end "stage 1/2: SFT done in 3 min 4 s"
    train(..., label=run.label)        # label "SFT 1/2": the stage's progress bar
    run.interrupted = stopped          # "stage 1/2: SFT stopped after 1 min 2 s" (so does an exception)
  plan.skip("RL", "restored")          # "stage 2/2: RL: restored"
  note_once(key, "compiling the RL update (first step; cached after)")   # once per key in this process

Lines go to stderr through `tqdm.write`, so they land above a running bar rather than through it, and stdout keeps
what a job prints as its result (the entry points' last line is JSON). A plan is plain data; a stage not in it (a
loop run on its own, without the job's plan) is its own plan of one (`Stages.of`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Hashable, Iterator

import tqdm


def note(line: str) -> None:
  """Prints `line` to stderr above any running progress bar."""
  tqdm.tqdm.write(line, file=sys.stderr)
  sys.stderr.flush()


_NOTED: set = set()  # note_once's keys in this process


def note_once(key: Hashable, line: str) -> None:
  """`note(line)` the first time this process sees `key` (e.g. a compile announced before a program's first call:
  a second run of the same program in the process finds it compiled)."""
  if key not in _NOTED:
    _NOTED.add(key)
    note(line)


def duration(seconds: float) -> str:
  """'42 s', '3 min 4 s', '1 h 2 min'."""
  s = int(round(seconds))
  if s < 60:
    return f"{s} s"
  if s < 3600:
    return f"{s // 60} min {s % 60} s"
  return f"{s // 3600} h {s % 3600 // 60} min"


@dataclasses.dataclass
class StageRun:
  """One stage while it runs: its bar label, and whether a stop request ended it early (set by the caller)."""

  label: str
  interrupted: bool = False


@dataclasses.dataclass(frozen=True)
class Stages:
  """The stages of a job in order (names as a user reads them: "SFT", "held-out evaluation before RL"), and the
  seconds each stage that ran in this process took (`seconds`, filled as stages end; a job's result reports them:
  tools/bench_main_job.py reads them)."""

  names: tuple[str, ...]
  seconds: dict[str, float] = dataclasses.field(default_factory=dict, compare=False)

  @classmethod
  def of(cls, plan: Stages | None, *names: str) -> Stages:
    """`plan` when it has every one of `names`, else a plan of `names` alone (a loop run outside its job)."""
    return plan if plan is not None and all(n in plan.names for n in names) else cls(tuple(names))

  def place(self, name: str) -> str:
    """'2/5' of `name`."""
    return f"{self.names.index(name) + 1}/{len(self.names)}"

  def label(self, name: str) -> str:
    """A progress bar's label: 'SFT 2/5'."""
    return f"{name} {self.place(name)}"

  @contextlib.contextmanager
  def stage(self, name: str, detail: str = "") -> Iterator[StageRun]:
    """Announces stage `name` (with `detail`), yields its `StageRun`, and says how long it took, or that it stopped
    (an exception, a Ctrl-C, passes through)."""
    note(f"stage {self.place(name)}: {name}" + (f" ({detail})" if detail else ""))
    t0 = time.perf_counter()
    run = StageRun(self.label(name))
    finished = False
    try:
      yield run
      finished = not run.interrupted
    finally:
      self.seconds[name] = time.perf_counter() - t0
      took = duration(self.seconds[name])
      note(f"stage {self.place(name)}: {name} " + (f"done in {took}" if finished else f"stopped after {took}"))

  def skip(self, name: str, why: str) -> None:
    """Announces that stage `name` has nothing to do (`why`: "restored from the checkpoint")."""
    note(f"stage {self.place(name)}: {name}: {why}")
