"""The policy interface of a coding episode, and scripted policies that prove a suite, its grader and the harness
honest (report section 5: an evaluation is only as good as its checks).

  policy = POLICIES.get("reference")()         # applies each task's reference solution: must score 100%
  text = policy.act(task, observations)         # the model text of the next turn (tool calls, see protocol.py)

  reference      writes the reference solution's files (and deletes what it deletes), then finishes; its turn is also
                 the SFT demonstrations' response (`c2jax.envs.teachers.demonstrations`);
  empty          finishes at once: must score 0% (every hidden test fails on a starting repository);
  delete_tests   deletes the repository's own test files and finishes: must not pass (the hidden tests judge).
  sloppy         reference with lint findings and a too-complex function appended to its Python files: passes, but
                 scores low on code quality (`EnvConfig.code_quality`);
  shortcut       writes the task's shortcut (the instructions and intent suites'): passes while breaking a stated
                 constraint, or solves the prompt's literal reading the hidden tests reject; must score low there;
  follows_interruptions   the interruptions suite: writes the prompt's solution and finishes, then, told otherwise
                 by the user's message, writes the changed request's: must score 100%;
  ignores_interruptions   the same first turn, then finishes whatever the user said: must score 0%;
  explorer       the reference solution over several turns, as an agent works: looks around (1-3 turns), writes the
                 solution, checks it (1-2 turns), finishes: 5-8 tool calls in 4-7 turns, fixed per task (the agent
                 loop's benchmark and tests force it through the engine).
  reader         tiny_long_horizon: reads one note per turn, then writes the solution from the steps its observations
                 show; its summaries say nothing, so it passes only when the episode fits one context;
  summarizing_reader   the same reading, but its summaries list the steps found and the next note: it passes across
                 summaries;
  never_read     tiny_long_horizon: writes f(x) = x unread and finishes: must fail (on tiny_spec it writes the same
                 guess: f(xs) = xs);
  spec_reader    tiny_spec, the teacher as an agent works: reads SPEC.md, writes solution.py from the sentence its
                 observation shows and runs the visible tests (one turn), then finishes: 3 turns, must score 100%;
  spec_reader_no_test   the same reading and writing, but finishes in the writing turn without running a test (a
                 flawed teacher: as correct, but tests_before_finish 0);
  spec_unverified   tiny_spec, a careless teacher: spec_reader_no_test, but half of its writes are one part wrong
                 and it finishes unverified all the same (those episodes fail; its failures are demonstrations too);
  spec_unclosed  the same, but its careless writes are incomplete calls (nothing written), then it finishes;
  spec_fixer     tiny_spec, the teacher whose traces show recovery: spec_reader, but in a share of its episodes the
                 first write is one part wrong, the visible tests fail, and it writes the right one and tests again
                 (4 turns); must score 100%;
  spec_guess     tiny_spec: writes `spec.blind_guess()` (the composition that passes most train hidden tests) without
                 reading and finishes: the chance level of a policy that never reads.

A model is evaluated through the agent loop instead (`c2jax.eval.harness.evaluate_model`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import shlex
from typing import Callable, ClassVar, Protocol, Sequence

from c2jax.envs.chat import self_summary
from c2jax.envs.tasks import interruptions, shortcuts
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.tools.protocol import ToolCall, ToolName, render
from c2jax.envs.tasks.suites import compositions, long_horizon
from c2jax.envs.tasks.suites import spec as spec_suite
from c2jax.envs.tasks.suites.procedural import FunctionSpec
from c2jax.registry import Registry


class Policy(Protocol):
  """Produces the model text of one turn from the task and the observations so far (oldest first)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    ...


POLICIES: Registry = Registry("scripted policy")


def play(policy: Policy, task: CodingTask, config: EnvConfig, graded: bool = True) -> tuple[list[str], dict | None]:
  """One episode of `policy` on `task` in CodingEnv (the real sandbox and grading): every observation, the first
  included, and the reward terms, or None when the episode had not ended after `config.max_turns` steps.
  `graded=False` skips the grading (a judge's sandbox per episode) for a caller that wants only the observations:
  the terms are then None too."""
  with CodingEnv(config) as env:
    observations = [env.reset(task)]
    for turn in range(1, config.max_turns + 1):
      result = env.step(interruptions.cut_turn(task, turn, policy.act(task, observations)))
      observations.append(result.observation)
      if result.done:
        return observations, env.reward() if graded else None
  return observations, None


def _calls(*calls: ToolCall) -> str:
  return "\n".join(render(c) for c in calls)


@POLICIES.register("reference")
@dataclasses.dataclass(frozen=True)
class ReferencePolicy:
  """Writes the task's reference solution in its first turn (scripted; needs `task.solution`)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if task.solution is None:
      raise ValueError(f"Task {task.task_id} has no reference solution for the reference policy to apply.")
    calls = [ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content})
             for path, content in sorted(task.solution.items())]
    calls += [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(path)}"}) for path in task.solution_deletes]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


@POLICIES.register("empty")
@dataclasses.dataclass(frozen=True)
class EmptyPolicy:
  """Changes nothing."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    return _calls(ToolCall(ToolName.FINISH, {}))


# What `sloppy` appends to each Python file of the reference solution: an import below the code (unused, and not at
# the top), a function of 11 branches that prints (mccabe complexity over 10), a bare except, a comparison to None
# by ==: findings a well-kept linter reports, in code the hidden tests never call.
SLOPPY_CODE = """

import os


def _describe(x):
    if x == None:
        return 'none'
    try:
        n = int(x)
    except:
        n = 0
    if n == 1: return 'one'
    if n == 2: return 'two'
    if n == 3: return 'three'
    if n == 4: return 'four'
    if n == 5: return 'five'
    if n == 6: return 'six'
    if n == 7: return 'seven'
    if n == 8: return 'eight'
    if n == 9: return 'nine'
    print( 'many' )
    return 'many'
"""


@POLICIES.register("sloppy")
@dataclasses.dataclass(frozen=True)
class SloppyPolicy:
  """The reference solution with `SLOPPY_CODE` appended to each of its Python files, then finishes: as correct as
  reference, but low on code quality (the scorer of `c2jax.envs.grading.quality` counts what it adds)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if task.solution is None:
      raise ValueError(f"Task {task.task_id} has no reference solution for the sloppy policy to apply.")
    calls = [ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content + SLOPPY_CODE if path.endswith(".py")
                                            else content})
             for path, content in sorted(task.solution.items())]
    calls += [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(path)}"}) for path in task.solution_deletes]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


@POLICIES.register("shortcut")
@dataclasses.dataclass(frozen=True)
class ShortcutPolicy:
  """Writes the task's shortcut (`c2jax.envs.tasks.shortcuts`: a plausible submission its evaluation must score
  low), then finishes."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    calls = [ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content})
             for path, content in sorted(shortcuts.shortcut(task).items())]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


class Listening(enum.Enum):
  """What a scripted agent does with a user message that arrives while it works."""

  FOLLOWS = "follows"
  IGNORES = "ignores"


@dataclasses.dataclass(frozen=True)
class InterruptiblePolicy:
  """The interruptions suite's agent: its first turn writes the prompt's solution (the task's shortcut) and
  finishes; a later turn (the environment overrules a finish when the user interrupts) writes the reference
  solution once the task's interruption message shows in its last observation (FOLLOWS), or finishes as it is
  (IGNORES). The message's presence, not the task, tells it: a pass proves the message reached the agent."""

  listening: Listening = Listening.FOLLOWS

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    interruption = interruptions.task_interruption(task)
    if interruption is None:
      raise ValueError(f"Task {task.task_id} has no interruption; this policy plays the interruptions suite.")
    if len(observations) <= 1:
      files = shortcuts.shortcut(task)
    elif self.listening is Listening.FOLLOWS and interruption.message in observations[-1]:
      files = dict(task.solution or {})
    else:
      files = {}
    calls = [ToolCall(ToolName.WRITE_FILE, {"path": p, "content": c}) for p, c in sorted(files.items())]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


@POLICIES.register("follows_interruptions")
@dataclasses.dataclass(frozen=True)
class FollowsInterruptionsPolicy(InterruptiblePolicy):
  """InterruptiblePolicy that follows the user's message."""

  listening: Listening = Listening.FOLLOWS


@POLICIES.register("ignores_interruptions")
@dataclasses.dataclass(frozen=True)
class IgnoresInterruptionsPolicy(InterruptiblePolicy):
  """InterruptiblePolicy that ignores the user's message."""

  listening: Listening = Listening.IGNORES


@POLICIES.register("delete_tests")
@dataclasses.dataclass(frozen=True)
class DeleteTestsPolicy:
  """Deletes every file of the repository that looks like a test, then finishes (a reward hack that must fail)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    tests = sorted(p for p in task.files if "test" in p.rsplit("/", 1)[-1].lower())
    calls = [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(p)}"}) for p in tests]
    return _calls(*calls, ToolCall(ToolName.FINISH, {}))


@POLICIES.register("explorer")
@dataclasses.dataclass(frozen=True)
class ExplorerPolicy:
  """The reference solution over several turns, as an agent works (scripted; needs `task.solution`): 1-3 turns
  looking around (read a file, grep for definitions, read another), a turn writing the solution, 1-2 turns checking
  (a listing and a syntax check, then printing what it wrote), then finish: 4-7 turns and 5-8 tool calls, the
  counts fixed per task by a hash of its id (episodes of different lengths, as real agents' are)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if task.solution is None:
      raise ValueError(f"Task {task.task_id} has no reference solution for the explorer policy to apply.")
    n = int.from_bytes(hashlib.blake2b(task.task_id.encode(), digest_size=4).digest(), "little")
    reads, checks = 1 + n % 3, 1 + (n // 3) % 2
    files = sorted(task.files) or ["."]
    written = sorted(task.solution)
    looks = [ToolCall(ToolName.READ_FILE, {"path": files[0]}),
             ToolCall(ToolName.GREP, {"pattern": r"def |class ", "path": "."}),
             ToolCall(ToolName.READ_FILE, {"path": files[-1]})]
    py = " ".join(shlex.quote(p) for p in written if p.endswith(".py"))
    verify = [[ToolCall(ToolName.RUN, {"command": "ls -R"}),
               ToolCall(ToolName.RUN, {"command": f"python3 -m py_compile {py} && echo compiled" if py else
                                       "echo nothing to compile"})],
              [ToolCall(ToolName.RUN, {"command": f"cat -- {shlex.quote(written[0])}" if written else "ls"})]]
    turn = len(observations) - 1
    if turn < reads:
      return _calls(looks[turn])
    if turn == reads:
      calls = [ToolCall(ToolName.WRITE_FILE, {"path": path, "content": content})
               for path, content in sorted(task.solution.items())]
      calls += [ToolCall(ToolName.RUN, {"command": f"rm -f -- {shlex.quote(p)}"}) for p in task.solution_deletes]
      return _calls(*calls)
    if turn <= reads + checks:
      return _calls(*verify[turn - reads - 1])
    return _calls(ToolCall(ToolName.FINISH, {}))


# ---------------------------------------------------------------------------------------------------- long horizon
# Policies of the tiny_long_horizon suite (c2jax/envs/tasks/suites/long_horizon.py). They parse steps ONLY from the
# observations they are given, never from `task`: their scores are the proof that the agent loop's context (and its
# summaries) carried the steps, and that nothing else did.

_NOTE_PATH = re.compile(r"notes/step_(\d+)\.txt")
_SUMMARY_STEPS = re.compile(r"steps so far: (.*?)(?:; next: |$)", re.M)
_SUMMARY_ITEM = re.compile(r"^\s*(\d+): (.+?)\s*$")


def _num_notes(observations: Sequence[str]) -> int:
  """K, the last note the first observation (the listing and the prompt) names."""
  indices = [int(i) for i in _NOTE_PATH.findall(observations[0])] if observations else []
  if not indices:
    raise ValueError("The first observation names no notes/step_<i>.txt file; this policy plays tiny_long_horizon.")
  return max(indices)


def _resumed_summaries(observation: str) -> list[str]:
  """The summaries framed by self_summary.resume in one observation (to its end where the end mark is cut)."""
  out = []
  for part in observation.split(self_summary.RESUME_MARK)[1:]:
    out.append(part.split(self_summary.RESUME_END, 1)[0])
  return out


def _visible_steps(observations: Sequence[str]) -> dict[int, long_horizon.Step]:
  """Step index -> step, from the note lines in the observations and the step lists of resumed summaries."""
  steps = {}
  for observation in observations:
    for summary in _resumed_summaries(observation):
      for listing in _SUMMARY_STEPS.findall(summary):
        for item in listing.split(";"):
          m = _SUMMARY_ITEM.match(item)
          step = m and long_horizon.parse_step(m.group(2))
          if step is not None:
            steps[int(m.group(1))] = step
    steps.update(long_horizon.find_steps(observation))
  return steps


def _next_note(observations: Sequence[str], steps: dict[int, long_horizon.Step]) -> int | None:
  """The first note whose step is not known yet, or None when all K are."""
  return next((i for i in range(1, _num_notes(observations) + 1) if i not in steps), None)


def _read_or_write(observations: Sequence[str]) -> str:
  """One note read per turn, in order; once every step is known, solution.py from them and finish."""
  steps = _visible_steps(observations)
  index = _next_note(observations, steps)
  if index is not None:
    return _calls(ToolCall(ToolName.READ_FILE, {"path": long_horizon.note_path(index)}))
  source = long_horizon.solution_source([steps[i] for i in sorted(steps)])
  return _calls(ToolCall(ToolName.WRITE_FILE, {"path": long_horizon.STUB_PATH, "content": source}),
                ToolCall(ToolName.FINISH, {}))


def long_horizon_summary(observations: Sequence[str]) -> str:
  """What summarizing_reader writes when asked to summarize: the steps it can see and what it does next,
  "steps so far: 1: add 3; 2: multiply by 2; next: read notes/step_3.txt"."""
  steps = _visible_steps(observations)
  listing = "; ".join(f"{i}: {steps[i].words}" for i in sorted(steps)) or "none"
  index = _next_note(observations, steps)
  todo = f"read {long_horizon.note_path(index)}" if index is not None else f"write {long_horizon.STUB_PATH}"
  return f"steps so far: {listing}; next: {todo}"


@POLICIES.register("reader")
@dataclasses.dataclass(frozen=True)
class ReaderPolicy:
  """tiny_long_horizon: reads one note per turn in order, then writes solution.py from the steps its observations
  show and finishes. Asked for a summary it writes none worth the name, so a resumed segment starts over: it passes
  only when the whole episode fits one context."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if observations and self_summary.is_request(observations[-1]):
      return "working on it"
    return _read_or_write(observations)


@POLICIES.register("summarizing_reader")
@dataclasses.dataclass(frozen=True)
class SummarizingReaderPolicy:
  """tiny_long_horizon: reader's reading, but asked for a summary it lists the steps found so far (its window's
  notes and any earlier summary) and the next note (`long_horizon_summary`); a resumed segment continues from it."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if observations and self_summary.is_request(observations[-1]):
      return long_horizon_summary(observations)
    return _read_or_write(observations)


@POLICIES.register("never_read")
@dataclasses.dataclass(frozen=True)
class NeverReadPolicy:
  """tiny_long_horizon: writes f(x) = x without reading a note and finishes (a guess: must fail)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    return _calls(ToolCall(ToolName.WRITE_FILE, {"path": long_horizon.STUB_PATH,
                                                 "content": long_horizon.solution_source([])}),
                  ToolCall(ToolName.FINISH, {}))


# ---------------------------------------------------------------------------------------------------- tiny_spec
# Policies of the tiny_spec suite (c2jax/envs/tasks/suites/spec.py). The readers take the composition ONLY from the
# observations (SPEC.md's sentence as read_file showed it, or a resumed summary's `spec.summary_line`), never from
# `task`: a pass proves that reading the repository carried what the prompt does not say.

_WROTE_SOLUTION = f'<result tool="write_file">\nwrote {spec_suite.STUB_PATH} '
_WRITTEN_NOTE = f"{spec_suite.STUB_PATH} is written."  # a summary's note that the solution was written


def _written(observations: Sequence[str]) -> bool:
  return any(_WROTE_SOLUTION in o or _WRITTEN_NOTE in o for o in observations)


def _spec_summary(observations: Sequence[str]) -> str:
  """A summary that keeps what was read and done: the composition as `spec.summary_line` ("f returns ..."), when
  seen, and whether solution.py was written (a resumed segment then finishes instead of writing again)."""
  found = spec_suite.find_spec("\n".join(observations))
  if found is None:
    return f"nothing read yet; next: read {spec_suite.SPEC_PATH}"
  return spec_suite.summary_line(found) + (f"\n{_WRITTEN_NOTE}" if _written(observations) else "")


def _spec_turn(observations: Sequence[str], run_tests: bool,
               write_turn: Callable[[FunctionSpec], str] | None = None) -> str:
  """Read SPEC.md until its sentence shows; then write solution.py from it (and run the visible tests, or finish in
  the same turn), or play `write_turn`(the composition read) instead; once written, finish."""
  if observations and self_summary.is_request(observations[-1]):
    return _spec_summary(observations[:-1])
  found = spec_suite.find_spec("\n".join(observations))
  if found is None:
    return _calls(ToolCall(ToolName.READ_FILE, {"path": spec_suite.SPEC_PATH}))
  if _written(observations):
    return _calls(ToolCall(ToolName.FINISH, {}))
  if write_turn is not None:
    return write_turn(found)
  write = ToolCall(ToolName.WRITE_FILE, {"path": spec_suite.STUB_PATH, "content": spec_suite.solution_source(found)})
  then = (ToolCall(ToolName.RUN, {"command": spec_suite.TEST_COMMAND}) if run_tests else
          ToolCall(ToolName.FINISH, {}))
  return _calls(write, then)


@POLICIES.register("spec_reader")
@dataclasses.dataclass(frozen=True)
class SpecReaderPolicy:
  """tiny_spec: reads SPEC.md (turn 1); writes solution.py from the sentence its observation shows and runs the
  visible tests, `spec.TEST_COMMAND` (turn 2); finishes (turn 3). Asked for a summary, it states the composition read
  (`spec.summary_line`) and whether it wrote solution.py: a resumed segment goes on from there."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    return _spec_turn(observations, run_tests=True)


@POLICIES.register("spec_reader_no_test")
@dataclasses.dataclass(frozen=True)
class SpecReaderNoTestPolicy:
  """tiny_spec: spec_reader without the test run: writes solution.py and finishes in the same turn (a teacher that
  never checks its work: as correct here, but tests_before_finish is 0)."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    return _spec_turn(observations, run_tests=False)


class Mistake(enum.Enum):
  """What a careless teacher's write gets wrong: the code (a composition one part away) or the call (cut off)."""

  WRONG_PART = "wrong_part"
  INCOMPLETE_CALL = "incomplete_call"


_MALFORMED = "<error>malformed tool call"  # CodingEnv's answer to a call it could not parse


@POLICIES.register("spec_unverified")
@dataclasses.dataclass(frozen=True)
class SpecUnverifiedPolicy:
  """tiny_spec, a careless teacher as real traces have them: spec_reader_no_test (reads, writes, finishes without
  running a test), but in a `wrong_first` share of its episodes (chosen by a hash of the task and `episode`) its write
  is one part wrong (`wrong_neighbour`), and it finishes all the same: those episodes fail the hidden tests. Its
  failures are part of what it demonstrates (`KEEPS_FAILURES`): an SFT on its traces learns the mistakes along with
  the habit of not checking, which RL, rewarded by the hidden tests, can unlearn by testing and recovering (report
  section 4: RL in environments like real coding sessions changes how the agent works).

  Attributes:
    wrong_first: the share of episodes whose write is wrong.
    episode: which of a task's demonstrations this is (`for_episode`).
    mistake: what the careless write gets wrong (`Mistake`).
  """

  KEEPS_FAILURES: ClassVar[bool] = True

  wrong_first: float = 1 / 2
  episode: int = 0
  mistake: Mistake = Mistake.WRONG_PART

  def for_episode(self, episode: int) -> SpecUnverifiedPolicy:
    return dataclasses.replace(self, episode=episode)

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if observations and observations[-1].startswith(_MALFORMED):  # its own cut-off write: it finishes as if written
      return _calls(ToolCall(ToolName.FINISH, {}))
    return _spec_turn(observations, run_tests=False, write_turn=lambda found: self._write(task, found))

  def _write(self, task: CodingTask, found: FunctionSpec) -> str:
    """The writing turn: careless in a `wrong_first` share of episodes, then finish (or the turn ends cut off)."""
    h = int(hashlib.sha256(f"{task.task_id}/{self.episode}/unverified".encode()).hexdigest(), 16)
    careless = h % 10_000 < self.wrong_first * 10_000
    if careless and self.mistake is Mistake.INCOMPLETE_CALL:
      # The write_file call cut off after its content, as demonstrations' incomplete_call: the turn ends there.
      call = render(ToolCall(ToolName.WRITE_FILE, {"path": spec_suite.STUB_PATH,
                                                   "content": spec_suite.solution_source(found)}))
      return re.sub(r"</[A-Za-z0-9]+>\n</tool>$", "", call).rstrip("\n")
    wrong = wrong_neighbour(found, task, f"unverified/{self.episode}") if careless else None
    return _calls(ToolCall(ToolName.WRITE_FILE, {"path": spec_suite.STUB_PATH,
                                                 "content": spec_suite.solution_source(wrong or found)}),
                  ToolCall(ToolName.FINISH, {}))


@POLICIES.register("spec_unclosed")
@dataclasses.dataclass(frozen=True)
class SpecUnclosedPolicy(SpecUnverifiedPolicy):
  """tiny_spec, spec_unverified whose careless writes are incomplete calls instead of wrong ones: the write_file
  call stops after its content (no closing tags), the environment answers that it is malformed, and the teacher
  finishes all the same (nothing written: the episode fails). A flaw of the call, not of the code."""

  mistake: Mistake = Mistake.INCOMPLETE_CALL


@POLICIES.register("spec_guess")
@dataclasses.dataclass(frozen=True)
class SpecGuessPolicy:
  """tiny_spec: writes the best blind guess (`spec.blind_guess` of the task's seed: the composition passing the most
  train hidden tests) without reading anything, and finishes: the chance level of a policy that never reads."""

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    guess = spec_suite.blind_guess(int(task.metadata.get("seed", 0)))
    return _calls(ToolCall(ToolName.WRITE_FILE, {"path": spec_suite.STUB_PATH,
                                                 "content": spec_suite.solution_source(guess)}),
                  ToolCall(ToolName.FINISH, {}))


_RUN_STATUS = re.compile(r'<result tool="run">\n(?:exit code (-?\d+)|timed out)')


def _last_test_failed(observations: Sequence[str]) -> bool:
  """Whether the last observation answers a test run that did not exit 0."""
  if not observations:
    return False
  m = _RUN_STATUS.search(observations[-1])
  return m is not None and m.group(1) != "0"


def wrong_neighbour(spec: FunctionSpec, task: CodingTask, salt: str) -> FunctionSpec | None:
  """A composition one part away from `spec` (the same reducer, another mapper or filter) that fails at least one of
  `task`'s visible examples: a plausible first mistake. Chosen by a hash of (task, salt); None if there is none."""
  parts = spec.key.split(".")
  inputs = ([v for v, _ in spec_suite.visible_cases(task)] if spec_suite.VISIBLE_TESTS_PATH in task.files else
            [[-3, 4, -7, 0, 5, 2]])  # a task without its visible tests (a unit test's): any informative input
  near = [s for s in compositions.all_specs()
          if len(s.key.split(".")) == len(parts) and s.key.split(".")[0] == parts[0]
          and sum(a != b for a, b in zip(s.key.split("."), parts)) == 1
          and any(s.fn(v) != spec.fn(v) for v in inputs)]
  if not near:
    return None
  return near[int(hashlib.sha256(f"{task.task_id}/{salt}".encode()).hexdigest(), 16) % len(near)]


@POLICIES.register("spec_fixer")
@dataclasses.dataclass(frozen=True)
class SpecFixerPolicy:
  """tiny_spec, the teacher whose traces show recovery: reads SPEC.md; in a `wrong_first` share of its episodes
  (chosen by a hash of the task and `episode`) first writes a composition one part away (`wrong_neighbour`) and runs
  the visible tests, whose failure it answers by writing the right one and running them again; once a run passes, it
  finishes (3 turns, or 4 with the recovery). Must score 100%. `is_mistake` marks the wrong write.

  Attributes:
    wrong_first: the share of episodes whose first write is wrong.
    episode: which of a task's demonstrations this is (`for_episode`): the same task may be shown both ways.
  """

  wrong_first: float = 1 / 3
  episode: int = 0

  def for_episode(self, episode: int) -> SpecFixerPolicy:
    return dataclasses.replace(self, episode=episode)

  def _starts_wrong(self, task: CodingTask) -> bool:
    h = int(hashlib.sha256(f"{task.task_id}/{self.episode}/wrong_first".encode()).hexdigest(), 16)
    return h % 10_000 < self.wrong_first * 10_000

  def _mistake(self, task: CodingTask, observations: Sequence[str]) -> FunctionSpec | None:
    """The wrong composition this turn writes, or None."""
    if observations and self_summary.is_request(observations[-1]):
      return None
    found = spec_suite.find_spec("\n".join(observations))
    if found is None or _written(observations) or not self._starts_wrong(task):
      return None
    return wrong_neighbour(found, task, str(self.episode))

  def is_mistake(self, task: CodingTask, observations: Sequence[str]) -> bool:
    """Whether this turn is the deliberate wrong write (a demonstration's SFT loss skips it: the traces teach the
    recovery, not the mistake; `c2jax.services.teacher_traces`)."""
    return self._mistake(task, observations) is not None

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    if observations and self_summary.is_request(observations[-1]):
      return _spec_summary(observations[:-1])
    found = spec_suite.find_spec("\n".join(observations))
    if found is None:
      return _calls(ToolCall(ToolName.READ_FILE, {"path": spec_suite.SPEC_PATH}))
    test = ToolCall(ToolName.RUN, {"command": spec_suite.TEST_COMMAND})
    if not _written(observations):
      content = spec_suite.solution_source(self._mistake(task, observations) or found)
      return _calls(ToolCall(ToolName.WRITE_FILE, {"path": spec_suite.STUB_PATH, "content": content}), test)
    if _last_test_failed(observations):
      return _calls(ToolCall(ToolName.WRITE_FILE, {"path": spec_suite.STUB_PATH,
                                                   "content": spec_suite.solution_source(found)}), test)
    return _calls(ToolCall(ToolName.FINISH, {}))
