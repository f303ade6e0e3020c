"""What an agent does in its episodes, measured from the trajectories alone (report section 5: a run shows not only
how often the agent succeeds but how it works: does it look before it edits, test before it finishes, recover from a
failing test, keep to the tool format).

  b = episode_behaviour(traj, tokenizer, task=coding_task)   # EpisodeBehaviour: one episode's facts
  figures = summarize([b, ...])                               # {"behaviour/turns_per_episode": 4.2, ...}

Reading a trajectory. The chain's segments are walked oldest first with the ledger's runs (`Segment.boundaries`).
The model's turns are the MODEL runs (each with its ledger turn index); a turn's text is its ids decoded together,
exactly the text the environment ran. Every OBSERVATION run belongs to the last MODEL turn before it in the chain:
that is the observation answering it, also when the agent loop carried it into the next segment (where it stands
after the task's prompt and the RESUME copy of the summary and carries the summary's turn index). Source by source:
  * MODEL: the model's tool turns. Forced turns (`Episode.script`) are MODEL runs too, indistinguishable in the
    ledger: a scripted episode is measured as the script behaved.
  * SUMMARY: the model's summaries; actions (their tokens count in tokens_per_episode) but not tool turns: the
    harness runs no tool call of a summary, so none is parsed, and they are not in turns_per_episode.
  * OBSERVATION: the tool results (below); NOTICE (budget lines), SUMMARY_REQUEST, RESUME (the harness's copy of a
    summary) and PROMPT (the task, again at the head of every later segment) are not actions and are ignored.
The episode's last turn has no observation in the ledger (the agent loop ends an episode without appending it), so
its calls' outcomes are unknown; calls after a turn's first finish are dropped (the environment does not run them).

Calls and outcomes. A turn's calls are `protocol.parse` of its text: the well-formed calls (`ParseResult.calls`)
and one error per malformed call (`ParseResult.errors`, an incomplete call at the end included: what the environment
counts as malformed_tool_calls). The environment answers each call it runs with a block `<result tool="NAME">` or
`<error tool="NAME">` in call order (`CodingEnv.step`); blocks are matched to the turn's calls in order by tool name,
so a call's outcome is OK (a result block), ERROR (an error block) or UNKNOWN (no block: the turn was the last, the
call was not run, or the environment clipped the observation's middle). The matching is exact unless the
observation was clipped or a tool's output itself holds lines starting with such a tag.

  a look       a read_file, grep or search_code call whose outcome is not ERROR (a failed read showed nothing);
  an edit      a write_file or edit call (any outcome: an edit made blind is blind whether or not it applied;
               shell commands that change files are not edits);
  a test run   a run call whose command runs tests: it names unittest, pytest or py.test as a word, or runs a
               python file named test*.py / *_test.py (`is_test_command`); passing: its result says "exit code 0";
               failing: "exit code N" with N != 0, or "timed out"; otherwise (ERROR, UNKNOWN) neither;
  a finish     a well-formed finish call (in any MODEL turn, also one a budget cut: then the episode is cut and
               finished both).

"Before" means in an earlier turn: all calls of a turn are written before any of them runs, so the model can act
only on results of earlier turns.

The metrics of `summarize` (names stable; a rate whose denominator is 0 is NaN, with the denominator reported):
  behaviour/episodes                      N, the episodes summarized (a chain of segments is one episode).
  behaviour/turns_per_episode             mean MODEL turns per episode (summaries not counted; the agent loop's
                                          `Trajectory.turns` and evaluate's "turns/mean" count them).
  behaviour/tokens_per_episode            mean action tokens per episode: MODEL and SUMMARY positions over the chain
                                          (what the model sampled; prompts and observations not counted).
  behaviour/read_before_edit              among episodes with at least one edit ("behaviour/episodes_with_edit"),
                                          the fraction with a look before the turn of the first edit. When the task
                                          is given and declares metadata["relevant_files"] (comma-separated paths),
                                          only a read_file of one of those paths (any one) counts as the look; else
                                          any look does. `EpisodeBehaviour.relevant_files` says which was used.
  behaviour/edit_fraction                 the fraction of episodes with at least one edit (a write_file or edit
                                          call that parsed: a cut-off write is a malformed call, not an edit).
  behaviour/tests_before_finish           among episodes that called finish ("behaviour/episodes_finished"; a cut
                                          episode that never called it is not counted), the fraction with a test
                                          run (any outcome) before the finish's turn.
  behaviour/recovery_after_failing_tests  among episodes with a failing test run (their count:
                                          "behaviour/episodes_with_failing_tests"), the fraction with a passing test
                                          run after (in a later turn than) the first failing one.
  behaviour/malformed_call_rate           malformed calls over all calls written, pooled over the episodes' MODEL
                                          turns: sum(malformed) / sum(well-formed + malformed); the denominator is
                                          "behaviour/calls_per_episode" x N.
  behaviour/calls_per_episode             mean calls written (well-formed + malformed) per episode.
  behaviour/cut_fraction                  the fraction of episodes a budget ended (`Trajectory.cut`).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import posixpath
import re
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from c2jax.actors.ledger import EpisodeEnd, Source, Trajectory
from c2jax.envs.tools import protocol
from c2jax.envs.tools.protocol import ToolCall, ToolName

RELEVANT_FILES_KEY = "relevant_files"  # CodingTask.metadata key: comma-separated repository paths

_LOOKS = frozenset({ToolName.READ_FILE, ToolName.GREP, ToolName.SEARCH_CODE})
_EDITS = frozenset({ToolName.WRITE_FILE, ToolName.EDIT})
# A result block's opening line, as CodingEnv.step writes it (at the observation's start or after a newline).
_BLOCK = re.compile(r'(?:^|\n)<(result|error) tool="([a-z_]+)">\n')
_TEST_WORD = re.compile(r"(?<![\w.-])(?:unittest|pytest|py\.test)(?![\w-])")
_TEST_FILE = re.compile(r"(?<![\w.-])python[0-9.]*\s+(?:-\S+\s+)*[\w./-]*?(?:\btest\w*|_test)\.py(?![\w.])")
_STATUS = re.compile(r"exit code (-?\d+)|timed out")


class Tokenizer(Protocol):
  def decode(self, ids) -> str:
    ...


class Outcome(enum.Enum):
  """What the environment answered a call (module docstring)."""

  OK = "ok"
  ERROR = "error"
  UNKNOWN = "unknown"


class RunStatus(enum.Enum):
  """A run call's result: exit code 0, another exit code or a timeout, or unknown (no result block)."""

  PASSING = "passing"
  FAILING = "failing"
  UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Call:
  """One well-formed call of a model turn and what the environment answered.

  Attributes:
    turn: the ledger's turn index of the model turn that wrote it.
    call: the call.
    outcome: its block's kind, or UNKNOWN without one.
    result: the block's text after its opening line ("" when UNKNOWN).
  """

  turn: int
  call: ToolCall
  outcome: Outcome
  result: str = ""


@dataclasses.dataclass(frozen=True)
class Turn:
  """One model turn (a MODEL run) with the observation answering it.

  Attributes:
    index: the ledger's turn index.
    text: the turn's ids decoded together (what the environment parsed).
    observation: the OBSERVATION text that answered it ("" for the episode's last turn).
    tokens: its positions.
    calls: its well-formed calls up to the first finish (the environment runs none after it), with outcomes.
    written: its well-formed calls, those after a finish included.
    malformed: `protocol.parse` errors of its text (an incomplete call included).
    incomplete: the text ends inside a call.
  """

  index: int
  text: str
  observation: str
  tokens: int
  calls: tuple[Call, ...]
  written: int
  malformed: int
  incomplete: bool


@dataclasses.dataclass(frozen=True)
class EpisodeBehaviour:
  """One episode's facts (definitions in the module docstring).

  Attributes:
    turns: MODEL turns.
    summaries: SUMMARY turns (self-summaries written).
    segments: segments of the chain.
    tokens: action tokens (MODEL and SUMMARY) over the chain.
    calls: calls written in MODEL turns, well-formed and malformed.
    malformed_calls: the malformed ones (incomplete included).
    incomplete_turns: MODEL turns whose text ends inside a call.
    edits: edit calls (write_file, edit).
    looks: look calls (read_file, grep, search_code, not answered with an error).
    test_runs: test runs; passing_test_runs / failing_test_runs: those with a known status.
    relevant_files: the task's declared relevant files used for read_before_edit; empty: any look counted.
    read_before_edit: a (relevant) look before the first edit's turn; None without an edit.
    finished: a finish call was written.
    tests_before_finish: a test run before the finish's turn; None when the episode did not finish.
    recovered: a passing test run after the first failing one; None without a failing test run.
    end: why the episode ended.
  """

  turns: int
  summaries: int
  segments: int
  tokens: int
  calls: int
  malformed_calls: int
  incomplete_turns: int
  edits: int
  looks: int
  test_runs: int
  passing_test_runs: int
  failing_test_runs: int
  relevant_files: tuple[str, ...]
  read_before_edit: bool | None
  finished: bool
  tests_before_finish: bool | None
  recovered: bool | None
  end: EpisodeEnd = EpisodeEnd.FINISHED

  @property
  def cut(self) -> bool:
    return self.end is not EpisodeEnd.FINISHED


def is_test_command(command: str) -> bool:
  """Whether a run command runs tests: it names unittest, pytest or py.test as a word, or runs a python file named
  test*.py or *_test.py (e.g. "python3 -m unittest -q", "pytest tests", "python3 test_util.py")."""
  return bool(_TEST_WORD.search(command) or _TEST_FILE.search(command))


def run_status(call: Call) -> RunStatus:
  """The status of a run call from its result's first line ("exit code N" or "timed out after ...")."""
  if call.outcome is not Outcome.OK:
    return RunStatus.UNKNOWN
  m = _STATUS.match(call.result)
  if m is None:
    return RunStatus.UNKNOWN
  return RunStatus.PASSING if m.group(1) is not None and int(m.group(1)) == 0 else RunStatus.FAILING


def _norm_path(path: str) -> str:
  """A path as the environment resolves it, leniently (never raises): './x' and '/work/x' mean 'x'."""
  path = path.strip()
  if path == "/work" or path.startswith("/work/"):
    path = path[len("/work/"):]
  while path.startswith("./"):
    path = path[2:]
  return posixpath.normpath(path) if path else "."


def relevant_files(task: Any) -> tuple[str, ...]:
  """The paths a task declares in metadata["relevant_files"] (comma-separated), normalized; () when it declares
  none (or `task` is None or has no metadata)."""
  metadata = getattr(task, "metadata", None)
  if not isinstance(metadata, Mapping):
    return ()
  listed = str(metadata.get(RELEVANT_FILES_KEY, ""))
  return tuple(sorted({_norm_path(p) for p in listed.split(",") if p.strip()}))


def _match(turn: int, calls: Sequence[ToolCall], observation: str) -> tuple[Call, ...]:
  """The calls with their outcomes: the observation's blocks matched in order by tool name."""
  outcomes: list[tuple[Outcome, str]] = [(Outcome.UNKNOWN, "")] * len(calls)
  blocks = list(_BLOCK.finditer(observation))
  nxt = 0
  for k, block in enumerate(blocks):
    kind, name = block.group(1), block.group(2)
    j = next((j for j in range(nxt, len(calls)) if calls[j].name.value == name), None)
    if j is None:
      continue
    end = blocks[k + 1].start() if k + 1 < len(blocks) else len(observation)
    body = observation[block.end():end]
    close = body.rfind(f"\n</{kind}>")
    outcomes[j] = (Outcome.OK if kind == "result" else Outcome.ERROR, body[:close] if close >= 0 else body)
    nxt = j + 1
  return tuple(Call(turn, c, o, r) for c, (o, r) in zip(calls, outcomes))


def turns(trajectory: Trajectory, tokenizer: Tokenizer, chat=None) -> tuple[tuple[Turn, ...], int]:
  """The episode's MODEL turns over its chain, oldest first, each with its observation; and its summaries' count.

  `chat` (a `c2jax.envs.chat.chat_tokens.ChatTokens`) reads turns in a native chat format: decoded with their control
  tokens and parsed by its tool format. Its observations are the template's tool messages, which `_match` does not
  read: the calls' outcomes stay UNKNOWN there."""
  raw: list[list] = []  # [turn index, model ids, observation ids]
  summaries = 0
  for segment in trajectory.segments:
    for start, end, source, index in segment.boundaries():  # a turn is one run: its positions are contiguous
      ids = segment.tokens[start:end]
      if source is Source.MODEL:
        raw.append([index, ids, np.zeros(0, ids.dtype)])
      elif source is Source.OBSERVATION and raw:
        raw[-1][2] = np.concatenate([raw[-1][2], ids])
      elif source is Source.SUMMARY:
        summaries += 1
  out = []
  for index, model_ids, obs_ids in raw:
    native = chat is not None and chat.native
    text = chat.turn_text(model_ids) if native else tokenizer.decode(model_ids)
    observation = tokenizer.decode(obs_ids) if len(obs_ids) and not native else ""
    parsed = chat.format.tool_format.parse(text) if native else protocol.parse(text)
    calls = list(parsed.calls)
    finish = next((i for i, c in enumerate(calls) if c.name is ToolName.FINISH), None)
    if finish is not None:
      calls = calls[:finish + 1]
    out.append(Turn(index=int(index), text=text, observation=observation, tokens=len(model_ids),
                    calls=_match(int(index), calls, observation), written=len(parsed.calls),
                    malformed=len(parsed.errors),
                    incomplete=parsed.incomplete))
  return tuple(out), summaries


def episode_behaviour(trajectory: Trajectory, tokenizer: Tokenizer, task: Any = None, chat=None) -> EpisodeBehaviour:
  """The facts of one episode (a whole chain of segments), as the module docstring defines them.

  Args:
    trajectory: the episode, as the agent loop returns it.
    tokenizer: the one the episode ran with (`decode` of the ledger's ids).
    task: the episode's `CodingTask` (or anything with a `metadata` mapping), for its declared relevant files;
      None: any look counts for read_before_edit.
    chat: the episode's chat format over `tokenizer` (`turns`); None: brief.
  """
  model_turns, summaries = turns(trajectory, tokenizer, chat)
  relevant = relevant_files(task)
  calls = [c for t in model_turns for c in t.calls]  # in order: (turn, position in the turn)

  def is_look(c: Call) -> bool:
    if c.outcome is Outcome.ERROR:
      return False
    if relevant:
      return c.call.name is ToolName.READ_FILE and _norm_path(c.call.args["path"]) in relevant
    return c.call.name in _LOOKS

  edits = [c for c in calls if c.call.name in _EDITS]
  tests = [(c, run_status(c)) for c in calls
           if c.call.name is ToolName.RUN and is_test_command(c.call.args["command"])]
  finishes = [c for c in calls if c.call.name is ToolName.FINISH]
  read_before_edit = None
  if edits:
    read_before_edit = any(is_look(c) and c.turn < edits[0].turn for c in calls)
  tests_before_finish = None
  if finishes:
    tests_before_finish = any(c.turn < finishes[0].turn for c, _ in tests)
  failing = [c for c, s in tests if s is RunStatus.FAILING]
  recovered = None
  if failing:
    recovered = any(s is RunStatus.PASSING and c.turn > failing[0].turn for c, s in tests)
  return EpisodeBehaviour(
      turns=len(model_turns), summaries=summaries, segments=len(trajectory.segments),
      tokens=sum(s.model_tokens for s in trajectory.segments),
      calls=sum(t.written + t.malformed for t in model_turns),
      malformed_calls=sum(t.malformed for t in model_turns),
      incomplete_turns=sum(t.incomplete for t in model_turns),
      edits=len(edits), looks=sum(c.call.name in _LOOKS and c.outcome is not Outcome.ERROR for c in calls),
      test_runs=len(tests), passing_test_runs=sum(s is RunStatus.PASSING for _, s in tests),
      failing_test_runs=len(failing), relevant_files=relevant, read_before_edit=read_before_edit,
      finished=bool(finishes), tests_before_finish=tests_before_finish, recovered=recovered, end=trajectory.end)


METRICS = ("behaviour/episodes", "behaviour/turns_per_episode", "behaviour/tokens_per_episode",
           "behaviour/read_before_edit", "behaviour/episodes_with_edit", "behaviour/edit_fraction",
           "behaviour/tests_before_finish",
           "behaviour/episodes_finished", "behaviour/recovery_after_failing_tests",
           "behaviour/episodes_with_failing_tests", "behaviour/malformed_call_rate", "behaviour/calls_per_episode",
           "behaviour/cut_fraction")


def _rate(flags: Sequence[bool | None]) -> tuple[float, float]:
  """(the fraction of True among the applicable flags (not None), or NaN; how many were applicable)."""
  known = [f for f in flags if f is not None]
  return (float(np.mean(known)) if known else math.nan), float(len(known))


def summarize(behaviours: Sequence[EpisodeBehaviour]) -> dict[str, float]:
  """The metrics of `METRICS` over episodes (module docstring); every name is present, a rate with no applicable
  episode is NaN."""
  n = len(behaviours)
  mean = lambda xs: float(np.mean(xs)) if n else math.nan
  read, with_edit = _rate([b.read_before_edit for b in behaviours])
  tested, finished = _rate([b.tests_before_finish for b in behaviours])
  recovered, failing = _rate([b.recovered for b in behaviours])
  calls = sum(b.calls for b in behaviours)
  return {
      "behaviour/episodes": float(n),
      "behaviour/turns_per_episode": mean([b.turns for b in behaviours]),
      "behaviour/tokens_per_episode": mean([b.tokens for b in behaviours]),
      "behaviour/read_before_edit": read,
      "behaviour/episodes_with_edit": with_edit,
      "behaviour/edit_fraction": with_edit / n if n else math.nan,
      "behaviour/tests_before_finish": tested,
      "behaviour/episodes_finished": finished,
      "behaviour/recovery_after_failing_tests": recovered,
      "behaviour/episodes_with_failing_tests": failing,
      "behaviour/malformed_call_rate": sum(b.malformed_calls for b in behaviours) / calls if calls else math.nan,
      "behaviour/calls_per_episode": mean([b.calls for b in behaviours]),
      "behaviour/cut_fraction": mean([b.cut for b in behaviours]),
  }
