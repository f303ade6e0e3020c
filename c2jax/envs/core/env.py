"""The coding environment: a multi-turn episode in which a model edits a task repository through tools in a
sandbox, and the hidden tests decide the reward (report section 4: environments that mimic real coding sessions).

  env = CodingEnv(EnvConfig(max_turns=8))
  observation = env.reset(task)                  # the tool format (protocol.py), budget, file listing, then the task
  while True:
    result = env.step(model_text)                # runs the turn's tool calls in order
    if result.done:                              # finish, or the turn / token budget is spent
      break
    observation = result.observation
  terms = env.reward()                           # grading.grade terms + "malformed_tool_calls", ...
  env.close()

Every mistake of the model (a malformed or cut-off call, a missing file, an edit whose search text is not unique, a
failing command, a bad regex) becomes text in the next observation, never an exception; only misuse by the caller
(step before reset) raises. Malformed and incomplete calls are counted, in `info` and in `reward()`, for the
report's auxiliary reward on incomplete tool calls.

Budgets: `max_turns` steps, and `max_tokens` over all model text of the episode (bytes / 4 unless a counter is
given). The turn that crosses a budget still runs its calls (the text exists; the sampler already cut it, and a
call it cut is reported as incomplete); then the episode ends.

Host resources: the tools' wall-clock time over the whole episode is bounded by `max_tool_s` (each command's
timeout is cut to what is left; when none is left the turn's remaining calls do not run and the episode ends,
"time_budget"), and the workdir (a directory in the host's temp dir) by `max_workdir_bytes` and
`max_workdir_entries`, measured after every call that can write: past either the episode ends ("workdir_limit")
and scores 0 without grading, since grading would read the whole repository into host memory.

A task with an interruption (`c2jax.envs.tasks.interruptions`: a user message while the agent works) gets the
message after the interrupted turn's tool results, as a user turn of the chat format; a finish in that turn is
overruled and the episode goes on (a spent budget still ends it, the message undelivered).

Tools run against a `Sandbox` holding a fresh copy of the task's starting files (hidden tests are never in it):
read_file, write_file and edit work on the workdir from the host side (the sandbox confines paths to it); run is a
shell command in the container (its output shown without the test runners' durations, `without_timings`); grep is
a Python regex over the workdir's text files, evaluated inside the container too, so a pathological pattern meets
the sandbox's timeout instead of stalling the host (its interpreter runs isolated, `python3 -I`, so that a
repository's own json.py or re.py cannot stand in for the standard library).
search_code ranks the workdir's functions, classes and windows of lines against a description (`code_search`: its
index is built from `Sandbox.files`, which follows no symlink, and rebuilt when a file changed, in a child process
that is killed past the call's time, `bounded_search.TIMEOUT_S` cut to the episode's time left, or its memory cap:
then the call is a tool error); web_search asks the configured backend (`web_search.WEB_SEARCH_BACKENDS`, by
default an offline index of the Python standard library's documentation; no backend here reaches the network) with
a query of at most `code_search.MAX_QUERY_CHARS`. Both list at most `max_search_results` results.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import shlex
import time
from typing import Callable, Sequence

from c2jax.envs.chat import chat_format as chat_format_lib
from c2jax.envs.tools import bounded_search
from c2jax.envs.tools import code_search
from c2jax.envs.grading import grading
from c2jax.envs.grading import quality
from c2jax.envs.tools import protocol
from c2jax.envs.tools import web_search
from c2jax.envs.tasks import interruptions
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.chat.chat_format import ToolResult, clip
from c2jax.envs.tools.protocol import ToolCall, ToolName
from c2jax.sandbox.sandbox import Sandbox, SandboxLimits, SandboxUnavailable


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """Budgets and limits of one episode.

  Attributes:
    max_turns: steps before the episode ends.
    max_tokens: budget over all model text of the episode, in tokens of the env's counter (bytes / 4 by default).
    max_observation_bytes: each tool result, and each whole observation, is clipped to this (head and tail kept).
    max_calls_per_turn: calls of one turn beyond this are not run (reported in the observation).
    max_grep_matches: grep lists at most this many matching lines.
    max_search_results: search_code and web_search list at most this many results (each a header and a bounded
      snippet: ~1 KB for code, ~0.5 KB for documentation).
    web_search_backend: the name of web_search's backend in `web_search.WEB_SEARCH_BACKENDS`.
    max_tool_s: wall-clock seconds all tool calls of the episode may take together (without it an episode could
      hold a worker for max_turns x max_calls_per_turn x limits.wall_s).
    max_workdir_bytes: bytes of regular files the workdir may hold after a call.
    max_workdir_entries: files, directories and links the workdir may hold after a call.
    limits: the sandbox limits of every tool call.
    grading_limits: the judge's sandbox limits; grading's defaults when None.
    instructions: how much of the tool format the first observation spells out (`protocol.HelpDetail`); native
      chat formats leave it out (their templates declare the tools).
    chat_format: the name of the tool-call and chat format in `chat_format.CHAT_FORMATS`: "brief" (the raw
      `protocol.py` format, by default), "deepseek_v3" or "kimi_k2" (the models' own templates and tool calls).
    code_quality: whether grading scores the code quality of the episode's diff (`quality.CodeQuality`: "ruff"
      adds quality_findings and complexity_findings, at one more sandbox per grading).
  """

  max_turns: int = 8
  max_tokens: int = 8192
  max_observation_bytes: int = 8192
  max_calls_per_turn: int = 32
  max_grep_matches: int = 100
  max_search_results: int = 5
  web_search_backend: str = "stdlib_docs"
  max_tool_s: float = 300.0
  max_workdir_bytes: int = 32 << 20
  max_workdir_entries: int = 10000
  limits: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)
  grading_limits: SandboxLimits | None = None
  instructions: protocol.HelpDetail = protocol.HelpDetail.FULL
  chat_format: str = "brief"
  code_quality: quality.CodeQuality = quality.CodeQuality.OFF


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What one step returns: the next observation, whether the episode ended, and counters (see CodingEnv.step).

  `notice` is the budget line ("[turn 2 of 8; about 130 of 8192 tokens used]"). With the brief format the
  observation is its tool results, a newline, then the notice (the agent loop's ledger marks the two apart); with
  a native chat format it is the continuation the model's template writes after the turn (tool messages, the
  harness's message holding the notice, the next generation prompt). `continuation` holds the same text in the
  two pieces the engine appends (`chat_format.Continuation`); `observation == continuation.text`. `results` are
  the step's results and notes in order (`ChatFormat.messages` builds the conversation from them).
  """

  observation: str
  done: bool
  info: dict
  notice: str = ""
  continuation: chat_format_lib.Continuation | None = None
  results: tuple[ToolResult, ...] = ()


def byte_tokens(text: str) -> int:
  """The default token count: UTF-8 bytes / 4, rounded up."""
  return (len(text.encode("utf-8", errors="replace")) + 3) // 4


def _workdir_path(path: str) -> str:
  """A model's path as a workdir-relative one: './x' and '/work/x' (the path inside the sandbox) mean 'x'."""
  if path == "/work" or path.startswith("/work/"):
    path = path[len("/work/"):]
  while path.startswith("./"):
    path = path[2:]
  if path.startswith("/") or ".." in path.split("/"):
    raise ValueError(f"{path!r} is outside the repository; give a path relative to its root.")
  return posixpath.normpath(path) if path else "."


# Exit statuses of the grep script: a user error (message on stdout), and no match. Python's own crash exits 1, so
# neither may be 1: a crash must read as a failure, not as "no matches".
_GREP_USAGE_ERROR = 2
_GREP_NO_MATCH = 3

# Runs inside the sandbox (python3 -I there): argument JSON on stdin, "path:line:text" lines on stdout. Only regular
# files are read: a FIFO in the repository would block the read until the call's timeout.
_GREP_SCRIPT = r"""
import json, os, re, sys
a = json.load(sys.stdin)
try:
  rx = re.compile(a["pattern"])
except re.error as e:
  print(f"bad regex {a['pattern']!r}: {e}"); sys.exit(%(usage)d)
root = a["path"]
if os.path.islink(root) or not os.path.exists(root):
  print(f"{root!r} does not exist in the repository."); sys.exit(%(usage)d)
if not os.path.isdir(root):
  paths = [root]
else:
  paths = []
  for d, dirs, names in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not os.path.islink(os.path.join(d, x)))
    paths += [os.path.normpath(os.path.join(d, x)) for x in sorted(names)
              if not os.path.islink(os.path.join(d, x))]
shown = total = 0
for p in paths:
  if not os.path.isfile(p):
    continue
  try:
    text = open(p, "rb").read().decode()
  except (OSError, UnicodeDecodeError):
    continue
  for i, line in enumerate(text.splitlines(), 1):
    if rx.search(line):
      total += 1
      if shown < a["max"]:
        shown += 1
        print(f"{p}:{i}:{line[:200]}")
if total > shown:
  print(f"[... {total - shown} more matching lines]")
sys.exit(0 if total else %(no_match)d)
""" % {"usage": _GREP_USAGE_ERROR, "no_match": _GREP_NO_MATCH}  # noqa: UP031  (the script holds braces)


# The test runners' own run times ("Ran 3 tests in 0.004s", pytest's "2 passed in 0.03s"): the one part of a test
# run's output that differs between two plays of the same episode.
_UNITTEST_TIME = re.compile(r"(Ran \d+ tests? in )\d+\.\d+s")
_PYTEST_TIME = re.compile(r"(\b(?:passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?|no tests ran) in )"
                          r"\d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?")


def without_timings(output: str) -> str:
  """`output` with unittest's and pytest's run times written as 0.000s and 0.00s (their zero in their own format).

  The run tool shows every command's output this way, so that the same actions give the same observations: a
  recorded teacher trace, the SFT trained on it, a suite BPE trained on its text and a replayed episode are then the
  same on every machine and every run (a time that differs changes the tokens, and with them the SFT and the policy
  RL starts from: docs/experiments/main_job.md, sections 11 and 12). Any other duration is kept.
  """
  return _PYTEST_TIME.sub(r"\g<1>0.00s", _UNITTEST_TIME.sub(r"\g<1>0.000s", output))


# Tools that can grow the workdir; the others leave it as it is.
_WRITING_TOOLS = frozenset({ToolName.WRITE_FILE, ToolName.EDIT, ToolName.RUN})


MAX_LISTED_FILES = 200  # the first observation lists at most this many repository files


def first_observation(task: CodingTask, config: EnvConfig, files: Sequence[str]) -> str:
  """The episode's first observation: the tool format, the budget, the repository listing, then the task.

  The task statement comes last, right before the model's answer: as a system prompt precedes a user's request,
  and because a small model copies names and constants from the statement far more easily at a short distance
  (the tiny models' failure with the statement first was answers that ignored it). `config.instructions` NONE
  leaves the tool format out (models SFT'd on it), and so does a native chat format (`config.chat_format`), whose
  template declares the tools; its prompt is `ChatFormat.prompt(system, first_observation)`.

  `CodingEnv.reset` returns it with `files` = the sandbox's listing of the fresh copy (the sorted paths of
  `task.files`); SFT demonstrations (`c2jax.envs.teachers.demonstrations`) build the same text without a sandbox.
  """
  listing = "\n".join(files[:MAX_LISTED_FILES])
  if len(files) > MAX_LISTED_FILES:
    listing += f"\n[... {len(files) - MAX_LISTED_FILES} more files]"
  native = chat_format_lib.chat_format(config.chat_format).native
  parts = ["" if native else protocol.format_help(config.instructions),
           f"You have {config.max_turns} turns and about {config.max_tokens} tokens; call finish when done.",
           f"Repository files:\n{listing or '(none)'}",
           task.prompt.strip()]
  return "\n\n".join(p for p in parts if p)


class CodingEnv:
  """One coding episode at a time (reset -> step ... -> reward), over a sandbox per episode.

  Args:
    config: budgets and limits.
    sandbox_factory: builds a sandbox from (files, limits); the real bubblewrap `Sandbox` by default.
    token_counter: text -> tokens for the token budget; `byte_tokens` by default (pass the tokenizer's length).
  """

  def __init__(self, config: EnvConfig = EnvConfig(), sandbox_factory: Callable = Sandbox,
               token_counter: Callable[[str], int] | None = None):
    self.config = config
    self._sandbox_factory = sandbox_factory
    self._count_tokens = token_counter or byte_tokens
    self._sandbox = None
    self._task: CodingTask | None = None
    self._reward: dict[str, float] | None = None
    if config.max_search_results < 1:
      raise ValueError(f"EnvConfig.max_search_results must be at least 1, got {config.max_search_results}.")
    self._web_search_factory = web_search.WEB_SEARCH_BACKENDS.get(config.web_search_backend)  # unknown: refused now
    self._format = chat_format_lib.chat_format(config.chat_format)  # unknown: refused now
    self._web_search: web_search.SearchBackend | None = None
    # Kept across episodes: its index is rebuilt only when the repository differs, so a next episode on the same
    # starting files reuses it.
    self._code_search = bounded_search.BoundedSearch()

  # -- episode ----------------------------------------------------------------------------------------------------

  def reset(self, task: CodingTask) -> str:
    """Starts an episode on a fresh copy of `task.files`; returns the first observation.

    Raises:
      SandboxUnavailable: bubblewrap is missing (the environment cannot run code safely, so it does not start).
    """
    self.close()
    cfg = self.config
    # The workdir's own filesystem (where the host allows one) stops a call's writes just past the episode's caps,
    # which the check after the call then sees crossed: no call can fill the host before it is measured.
    limits = dataclasses.replace(
        cfg.limits, workdir_mb=min(cfg.limits.workdir_mb, -(-cfg.max_workdir_bytes // (1 << 20)) + 1),
        workdir_entries=min(cfg.limits.workdir_entries, cfg.max_workdir_entries + 16))
    self._sandbox = self._sandbox_factory(dict(task.files), limits)
    self._task = task
    self._reward = None
    self._done = False
    self._done_reason = ""
    self._turn = 0
    self._tokens = 0
    self._tool_s = 0.0
    self._totals = {"tool_calls": 0, "malformed_tool_calls": 0, "incomplete_tool_calls": 0, "tool_errors": 0,
                    "interruptions": 0}
    return first_observation(task, self.config, self._sandbox.list_files())

  def step(self, model_text: str) -> StepResult:  # noqa: C901
    """Runs the tool calls of one model turn, in order.

    Returns:
      The observation (each call's result or error, parse errors, a budget line), done (finish called or a budget
      spent), and info: "turn", "tokens", "tool_seconds", "done_reason" ("finish", "turn_budget", "token_budget",
      "time_budget", "workdir_limit" or ""), this step's "step_tool_calls" / "step_malformed_tool_calls" /
      "step_incomplete_tool_calls" / "step_tool_errors", and the episode totals under the same names without "step_".
    """
    if self._task is None:
      raise RuntimeError("Call reset(task) before step().")
    if self._done:
      return StepResult("The episode is over; nothing was run.", True, self._info({}))
    if not isinstance(model_text, str):
      model_text = "" if model_text is None else str(model_text)
    self._turn += 1
    self._tokens += int(self._count_tokens(model_text))
    parsed = self._format.tool_format.parse(model_text)
    step = {"tool_calls": 0, "malformed_tool_calls": len(parsed.errors),
            "incomplete_tool_calls": int(parsed.incomplete), "tool_errors": 0}
    results: list[ToolResult] = []  # in order; a note of the harness has no call
    limit = self.config.max_calls_per_turn
    for i, call in enumerate(parsed.calls):
      if i >= limit:
        results.append(ToolResult(f"only the first {limit} tool calls of a turn are run; "
                                  f"{len(parsed.calls) - limit} more were skipped."))
        break
      if self._done:
        when = "finish" if self._done_reason == "finish" else f"the episode ended ({self._done_reason})"
        results.append(ToolResult(f"{len(parsed.calls) - i} tool call(s) after {when} were not run."))
        break
      if self._time_left() <= 0:
        self._done, self._done_reason = True, "time_budget"
        results.append(ToolResult(f"the episode's {self.config.max_tool_s:g} s of tool time are spent; "
                                  f"{len(parsed.calls) - i} tool call(s) were not run."))
        break
      step["tool_calls"] += 1
      t0 = time.monotonic()
      try:
        ok, text = self._execute(call)
      finally:
        self._tool_s += time.monotonic() - t0
      if not ok:
        step["tool_errors"] += 1
      results.append(ToolResult(clip(text, self.config.max_observation_bytes), call=i, ok=ok, tool=call.name.value))
      if call.name in _WRITING_TOOLS and self._workdir_over_limit():
        self._done, self._done_reason = True, "workdir_limit"
        results.append(ToolResult(f"the repository exceeds {self.config.max_workdir_bytes} bytes or "
                                  f"{self.config.max_workdir_entries} files and directories; the episode is over "
                                  "and scores 0."))
    for error in parsed.errors:
      results.append(ToolResult(f"malformed tool call, not run: {error}"))
    if not results:
      results.append(ToolResult("no tool call found; call a tool, or finish." if self._format.native else
                                "no tool call found; write a <tool> block, or finish."))
    for key, value in step.items():
      self._totals[key] += value
    interruption = interruptions.task_interruption(self._task)
    interrupted = interruption is not None and interruption.turn == self._turn
    if interrupted and self._done_reason == "finish":
      # The user spoke while the agent worked: a finish in the interrupted turn is overruled, the episode goes on.
      self._done, self._done_reason = False, ""
    if not self._done:
      if self._turn >= self.config.max_turns:
        self._done, self._done_reason = True, "turn_budget"
      elif self._tokens >= self.config.max_tokens:
        self._done, self._done_reason = True, "token_budget"
      elif self._time_left() <= 0:
        self._done, self._done_reason = True, "time_budget"
    footer = (f"[turn {self._turn} of {self.config.max_turns}; about {self._tokens} of {self.config.max_tokens} "
              f"tokens used{'; episode over: ' + self._done_reason if self._done else ''}]")
    request = ""
    if interrupted and not self._done:
      self._totals["interruptions"] += 1
      request = interruption.message if self._format.native else interruptions.framed(interruption.message)
    continuation = self._format.continuation(model_text, results, footer, max_bytes=self.config.max_observation_bytes,
                                             request=request)
    return StepResult(continuation.text, self._done, self._info(step), notice=footer, continuation=continuation,
                      results=tuple(results))

  def reward(self) -> dict[str, float]:
    """The reward terms of the episode: `grading.grade` on the workdir's files (hidden tests added in a fresh
    sandbox) plus "malformed_tool_calls", "incomplete_tool_calls", "turns" and, for a task with an interruption
    (`c2jax.envs.tasks.interruptions`), "interruption_delivered" (1.0 once its user message reached the agent).
    Meant for after done (then cached); before that it grades the repository as it stands. A workdir past its
    caps is not graded: "passed", "pass_fraction" and "credited_fraction" are 0 and "workdir_limit" is 1."""
    if self._task is None:
      raise RuntimeError("Call reset(task) before reward().")
    if self._reward is not None:
      return dict(self._reward)
    if self._sandbox is None:
      raise RuntimeError("The episode's sandbox is closed; call reward() before close().")
    if self._done_reason == "workdir_limit" or self._workdir_over_limit():
      terms = {"passed": 0.0, "pass_fraction": 0.0, "credited_fraction": 0.0, "tests_total": 0.0, "tests_passed": 0.0,
               "workdir_limit": 1.0}
    else:
      terms = {k: float(v) for k, v in grading.grade(self._task, self._sandbox.files(),
                                                      sandbox_factory=self._sandbox_factory,
                                                      limits=self.config.grading_limits,
                                                      code_quality=self.config.code_quality).items()}
    terms["malformed_tool_calls"] = float(self._totals["malformed_tool_calls"])
    terms["incomplete_tool_calls"] = float(self._totals["incomplete_tool_calls"])
    if interruptions.task_interruption(self._task) is not None:
      terms["interruption_delivered"] = float(self._totals["interruptions"])
    terms["turns"] = float(self._turn)
    if self._done:
      self._reward = terms
    return dict(terms)

  def close(self) -> None:
    """Deletes the episode's sandbox and gives back its search worker. Idempotent; safe before reset."""
    self._code_search.close()
    if self._sandbox is not None:
      self._sandbox.close()
      self._sandbox = None

  def __enter__(self) -> CodingEnv:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  @property
  def done(self) -> bool:
    return self._task is not None and self._done

  def _info(self, step: dict) -> dict:
    info = {"turn": self._turn, "tokens": self._tokens, "tool_seconds": round(self._tool_s, 3),
            "done_reason": self._done_reason}
    info.update({f"step_{k}": step.get(k, 0) for k in self._totals})
    info.update(self._totals)
    return info

  def _time_left(self) -> float:
    return self.config.max_tool_s - self._tool_s

  def _workdir_over_limit(self) -> bool:
    """Whether the workdir holds more than the caps allow (counting stops just past a cap, so this stays cheap)."""
    cfg = self.config
    try:
      size, entries = self._sandbox.usage(max_bytes=cfg.max_workdir_bytes, max_entries=cfg.max_workdir_entries)
    except OSError:
      return True  # a workdir the host cannot even measure is not one it will read
    return size > cfg.max_workdir_bytes or entries > cfg.max_workdir_entries

  def _run(self, command: str, stdin: str | None = None):
    """A sandboxed command whose timeout is cut to the episode's remaining tool time."""
    timeout = min(self.config.limits.wall_s, max(self._time_left(), 0.0))
    return self._sandbox.run(command, timeout_s=timeout, stdin=stdin)

  # -- tools ------------------------------------------------------------------------------------------------------

  def _execute(self, call: ToolCall) -> tuple[bool, str]:
    """(ok, text) of one call; the model's mistakes come back as (False, one sentence)."""
    try:
      return getattr(self, f"_tool_{call.name.value}")(**call.args)
    except SandboxUnavailable:
      raise  # the host lost bubblewrap: not the model's doing, and not safe to go on
    except OSError as e:  # the message names the host path; the model gets the relative one
      return False, f"{call.args.get('path', '')}: {e.strerror or type(e).__name__}."
    except ValueError as e:  # bad paths (SandboxPathError too): the sentence speaks for itself
      return False, str(e)
    except Exception as e:  # noqa: BLE001  (anything else is the model's error to read)
      return False, f"{type(e).__name__}: {e}"

  def _tool_read_file(self, path: str) -> tuple[bool, str]:
    return True, self._sandbox.read_file(_workdir_path(path))

  def _tool_write_file(self, path: str, content: str) -> tuple[bool, str]:
    path = _workdir_path(path)
    self._sandbox.write_file(path, content)
    return True, f"wrote {path} ({len(content.splitlines())} lines)."

  def _tool_edit(self, path: str, search: str, replace: str) -> tuple[bool, str]:
    path = _workdir_path(path)
    text = self._sandbox.read_file(path)
    first = text.find(search)
    if first < 0:
      return False, f"the search text is not in {path}; read the file and copy the lines exactly."
    if text.find(search, first + 1) >= 0:
      return False, (f"the search text occurs {max(2, text.count(search))} times in {path}; "
                     "add surrounding lines so that it is unique.")
    self._sandbox.write_file(path, text[:first] + replace + text[first + len(search):])
    line = text.count("\n", 0, first) + 1
    return True, f"edited {path} at line {line} (-{len(search.splitlines())} +{len(replace.splitlines())} lines)."

  def _tool_run(self, command: str) -> tuple[bool, str]:
    result = self._run(command)
    status = (f"timed out after {result.wall_s:.1f} s" if result.timed_out else f"exit code {result.exit_code}")
    parts = [status + (" (output truncated)" if result.truncated else "")]
    if result.stdout:
      parts.append(f"--- stdout ---\n{without_timings(result.stdout.rstrip())}")
    if result.stderr:
      parts.append(f"--- stderr ---\n{without_timings(result.stderr.rstrip())}")
    # A failing command is a result the model reads, not a tool error.
    return True, "\n".join(parts)

  def _tool_grep(self, pattern: str, path: str = ".") -> tuple[bool, str]:
    args = {"pattern": pattern, "path": _workdir_path(path), "max": self.config.max_grep_matches}
    result = self._run(f"python3 -I -c {shlex.quote(_GREP_SCRIPT)}", stdin=json.dumps(args))
    if result.timed_out:
      return False, f"grep timed out after {result.wall_s:.1f} s; simplify the pattern."
    if result.exit_code == _GREP_NO_MATCH:
      return True, "no matches."
    if result.exit_code == _GREP_USAGE_ERROR and result.stdout.strip():
      return False, result.stdout.strip()
    if result.exit_code != 0:
      return False, f"grep failed (exit code {result.exit_code}): {result.stderr.strip()[-500:] or 'no message'}"
    return True, result.stdout.rstrip()

  def _tool_search_code(self, query: str) -> tuple[bool, str]:
    files = self._sandbox.files(max_file_bytes=code_search.MAX_FILE_BYTES)
    timeout = min(bounded_search.TIMEOUT_S, max(self._time_left(), 0.0))
    try:
      hits = self._code_search.search(files, query, self.config.max_search_results, timeout_s=timeout)
    except bounded_search.SearchBudgetExceeded as e:
      return False, str(e)
    return True, code_search.render(hits)

  def _tool_web_search(self, query: str) -> tuple[bool, str]:
    if not query.strip():  # the backend's contract is a non-empty query
      return False, "the query is empty; say what to look up, e.g. 'serialize an object to a JSON string'."
    if len(query) > code_search.MAX_QUERY_CHARS:  # a backend's work grows with the query: it is bounded here
      return False, (f"the query has {len(query)} characters; say what to look up in at most "
                     f"{code_search.MAX_QUERY_CHARS}.")
    if self._web_search is None:
      self._web_search = self._web_search_factory()
    k = self.config.max_search_results
    return True, web_search.render(list(self._web_search.search(query, k))[:k])

  def _tool_finish(self) -> tuple[bool, str]:
    self._done, self._done_reason = True, "finish"
    return True, "finished."
