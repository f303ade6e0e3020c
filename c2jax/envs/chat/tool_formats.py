"""Tool-call formats: how a model's turn writes tool calls, parsed into the environment's calls and rendered back
(report section 4: the agent calls tools; a served model calls them in the syntax it was trained on).

  fmt = TOOL_FORMATS.get("kimi_k2")
  parsed = fmt.parse(turn_text)            # protocol.ParseResult: calls, one error per malformed call, incomplete
  text = fmt.render(calls, first_index=3)  # the turn text of an assistant message with these tool calls
  turn = fmt.turn(turn_text)               # the turn's parts (reasoning, content, raw calls) for HF messages
  schemas = tool_schemas()                 # JSON-schema function definitions of the tools, for `tools=`

  brief        the environment's own format (`protocol.py`): <tool name=...><arg name=...> blocks; unchanged.
  deepseek_v3  DeepSeek-V3's native calls as its V3.1 chat template writes them (chat_templates/deepseek_v3_1.jinja):
                 CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"arg": "value"}<｜tool▁call▁end｜>
                 ...<｜tool▁calls▁end｜>
               then the end-of-turn token <｜end▁of▁sentence｜>.
  kimi_k2      Kimi-K2's native calls (chat_templates/kimi_k2_thinking.jinja):
                 <think>REASONING</think>CONTENT<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
                 <|tool_call_argument_begin|>{"arg": "value"}<|tool_call_end|>...<|tool_calls_section_end|>
               (one line), then <|im_end|>. IDX counts the episode's calls from 0; a result names its call by this id.

Native arguments are one JSON object whose values are strings, the tools' arguments as `protocol.TOOL_ARGS` names
them, checked as `protocol.parse` checks its own (`protocol.check_call`: unknown tool, missing / unknown / duplicate
argument, empty or multi-line values where those are refused); JSON values are taken exactly, nothing is stripped.

`parse` is total (never raises, for any string) and linear in the text: every search moves the cursor forward.
Text outside the tool-calls section is prose (the turn's content) and never an error; inside the section only
whitespace may stand between calls. Each malformed call (bad JSON, a value that is not a string, a call with no
argument separator, stray text or markers) gives one error sentence and is not run. A text that ends inside a call
or the section (or inside a marker's text) sets `incomplete`, with one error: what the report's auxiliary reward
for incomplete tool calls counts. `render` writes the text the model's template writes for an assistant message
with those tool calls (compared with the real templates in tests/envs/chat/tool_formats_test.py), and
`parse(render(calls)).calls == calls`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable, Mapping, Protocol, Sequence

from c2jax.envs.tools import protocol
from c2jax.envs.tools.protocol import TOOL_ARGS, ParseResult, ToolCall, ToolName
from c2jax.registry import Registry

# One line each, for the models' tool declarations.
TOOL_DESCRIPTIONS: Mapping[ToolName, str] = {
    ToolName.READ_FILE: "Read a file of the repository.",
    ToolName.WRITE_FILE: "Create or overwrite a file of the repository with the given content.",
    ToolName.EDIT: "Replace the one occurrence of a search text in a file with a replacement text.",
    ToolName.RUN: "Run a shell command in the repository's root and show its exit code and output.",
    ToolName.GREP: "List the lines matching a Python regular expression in a file or folder.",
    ToolName.SEARCH_CODE: "Find the repository's functions, classes and lines that match a description.",
    ToolName.WEB_SEARCH: "Look up documentation.",
    ToolName.FINISH: "End the episode; the repository is graded as it stands.",
}
ARG_DESCRIPTIONS: Mapping[str, str] = {
    "path": "A path relative to the repository's root.",
    "content": "The whole new content of the file.",
    "search": "The exact text to replace; it must occur exactly once.",
    "replace": "The text that replaces it.",
    "command": "A shell command.",
    "pattern": "A Python regular expression.",
    "query": "What to look for, in words.",
}


def tool_schemas() -> list[dict]:
  """The tools as JSON-schema function definitions ({"type": "function", "function": {...}}), in `ToolName`
  order: what a chat template's `tools=` takes. Every argument is a string; optional ones are not required."""
  out = []
  for name in ToolName:
    required, optional = TOOL_ARGS[name]
    out.append({"type": "function", "function": {
        "name": name.value, "description": TOOL_DESCRIPTIONS[name],
        "parameters": {"type": "object",
                       "properties": {a: {"type": "string", "description": ARG_DESCRIPTIONS[a]}
                                      for a in required + optional},
                       "required": list(required)}}})
  return out


@dataclasses.dataclass(frozen=True)
class RawCall:
  """One call of a turn as its text writes it.

  Attributes:
    id: the call's id as written (Kimi: "functions.NAME:IDX"); "" where the format writes none (DeepSeek).
    name: the tool name as written.
    arguments: the argument text as written (JSON).
    call: the well-formed call, or None when this one is malformed.
  """

  id: str
  name: str
  arguments: str
  call: ToolCall | None


@dataclasses.dataclass(frozen=True)
class AssistantTurn:
  """A model turn taken apart: what an HF assistant message needs to be rendered back into the same text.

  Attributes:
    reasoning: the reasoning (Kimi: between <think> and </think>), "" where there is none.
    content: the prose before the tool calls.
    calls: the calls written, well-formed or not, in order.
    exact: rendering (reasoning, content, calls) gives back the turn's text exactly (no stray text, no trailing
      text after the calls, no malformed call, the spacing the template writes); only then does a fresh render of
      the conversation hold this turn as the model wrote it.
  """

  reasoning: str
  content: str
  calls: tuple[RawCall, ...]
  exact: bool


class ToolFormat(Protocol):
  """A tool-call syntax: parse a model turn, render calls back."""

  name: str
  native: bool  # the model's own syntax (tools declared by its chat template) rather than the environment's

  def parse(self, text: str) -> ParseResult:
    """The turn's calls; total and linear (see the module docstring)."""

  def render(self, calls: Sequence[ToolCall], *, content: str = "", reasoning: str = "",
             first_index: int = 0) -> str:
    """The turn text of an assistant message with these calls (ids from `first_index` where the format has ids)."""

  def turn(self, text: str) -> AssistantTurn:
    """The turn's parts, for an HF assistant message."""


TOOL_FORMATS: Registry[ToolFormat] = Registry("tool-call format")


@dataclasses.dataclass(frozen=True)
class BriefFormat:
  """The environment's own format (`protocol.py`), unchanged; calls are written one per line."""

  name: str = "brief"
  native: bool = False

  def parse(self, text: str) -> ParseResult:
    return protocol.parse(text)

  def render(self, calls: Sequence[ToolCall], *, content: str = "", reasoning: str = "",
             first_index: int = 0) -> str:
    del first_index
    if reasoning:
      raise ValueError("The brief tool format has no reasoning part; put it in the content.")
    return "\n".join(([content] if content else []) + [protocol.render(c) for c in calls])

  def turn(self, text: str) -> AssistantTurn:
    # The whole text is the message's content: there is no template to reproduce it but the raw text itself.
    return AssistantTurn(reasoning="", content=text, calls=(), exact=True)


def _decode_arguments(name: str, text: str) -> tuple[ToolCall | None, str]:
  """(the call, "") from a tool name and its JSON arguments, else (None, one sentence)."""
  duplicates: list[str] = []

  def pairs(items: list) -> dict:
    out = {}
    for key, value in items:
      if key in out:
        duplicates.append(key)
      out[key] = value
    return out

  try:
    args = json.loads(text, object_pairs_hook=pairs)
  except (ValueError, RecursionError) as e:
    return None, f"{name}: the arguments are not valid JSON ({str(e)[:80]})."
  if not isinstance(args, dict):
    return None, f"{name}: the arguments must be one JSON object, got {type(args).__name__}."
  if not duplicates:
    for key, value in args.items():
      if not isinstance(value, str):
        return None, f"{name}: argument {key!r} must be a string, got {type(value).__name__}."
  tool, error = protocol.check_call(name, args, tuple(duplicates))
  return (ToolCall(tool, args) if tool else None), error


def _arguments_text(call: ToolCall) -> str:
  """The canonical JSON of a call's arguments, in `TOOL_ARGS` order."""
  name, error = protocol.check_call(call.name.value, call.args)
  if name is None:
    raise ValueError(f"Cannot render this tool call: {error}")
  required, optional = TOOL_ARGS[name]
  return json.dumps({a: call.args[a] for a in required + optional if a in call.args}, ensure_ascii=False)


def _proper_prefix_at_end(text: str, markers: Sequence[str]) -> bool:
  """Whether `text` ends with a proper prefix of one of `markers` (a marker cut off), two characters at least: a
  lone "<" ending a prose is prose."""
  return any(text.endswith(m[:k]) for m in markers for k in range(2, len(m)))


@dataclasses.dataclass(frozen=True)
class SectionFormat:
  """A native format: prose, then one section of calls, each `CALL_BEGIN head SEP arguments CALL_END`.

  Attributes:
    name, native: the registry entry.
    section_begin, section_end, call_begin, separator, call_end: the markers (special tokens of the model).
    head_name: the call's head (the text between call_begin and separator) -> (tool name, "") or ("", error).
    head_text: (tool name, call index) -> the head to write.
    think: the (open, close) reasoning tags every turn starts with, or None.
    has_ids: a call's head is its id (which names the tool) rather than the tool's name.
  """

  name: str
  section_begin: str
  section_end: str
  call_begin: str
  separator: str
  call_end: str
  head_name: Callable[[str], tuple[str, str]]
  head_text: Callable[[str, int], str]
  think: tuple[str, str] | None = None
  has_ids: bool = False
  native: bool = True

  @property
  def markers(self) -> tuple[str, ...]:
    return (self.section_begin, self.section_end, self.call_begin, self.separator, self.call_end)

  def _marker_re(self) -> re.Pattern:
    return re.compile("|".join(re.escape(m) for m in self.markers))

  def parse(self, text: str) -> ParseResult:
    if not isinstance(text, str):
      return ParseResult(errors=(f"model output must be text, got {type(text).__name__}.",))
    turn, errors, incomplete = self._scan(text)
    calls = tuple(c.call for c in turn.calls if c.call is not None)
    return ParseResult(calls, tuple(errors), incomplete)

  def turn(self, text: str) -> AssistantTurn:
    if not isinstance(text, str):
      return AssistantTurn("", "", (), exact=False)
    return self._scan(text)[0]

  def render(self, calls: Sequence[ToolCall], *, content: str = "", reasoning: str = "",
             first_index: int = 0) -> str:
    raw = [RawCall(self.head_text(c.name.value, first_index + i) if self.has_ids else "", c.name.value,
                   _arguments_text(c), c) for i, c in enumerate(calls)]
    return self._write(reasoning, content, raw)

  def _write(self, reasoning: str, content: str, calls: Sequence[RawCall]) -> str:
    """The template's text of an assistant message with these parts."""
    if self._marker_re().search(content) or (self.think and any(t in content for t in self.think)):
      raise ValueError(f"{self.name}: the content must not hold the format's markers or reasoning tags.")
    head = ""
    if self.think:
      if any(t in reasoning for t in self.think):
        raise ValueError(f"{self.name}: the reasoning must not hold {self.think[0]} or {self.think[1]}.")
      head = f"{self.think[0]}{reasoning}{self.think[1]}"
    elif reasoning:
      raise ValueError(f"{self.name}: this format has no reasoning part (its template drops it).")
    if not calls:
      return head + content
    body = "".join(f"{self.call_begin}{c.id if self.has_ids else c.name}{self.separator}{c.arguments}{self.call_end}"
                   for c in calls)
    return f"{head}{content}{self.section_begin}{body}{self.section_end}"

  def _scan(self, text: str) -> tuple[AssistantTurn, list[str], bool]:
    """(the turn's parts, errors, incomplete); one pass, every search moving forward."""
    errors: list[str] = []
    calls: list[RawCall] = []
    reasoning, start = "", 0
    if self.think and text.startswith(self.think[0]):
      close = text.find(self.think[1], len(self.think[0]))
      if close < 0:  # cut off while reasoning: not inside a call
        return AssistantTurn(text[len(self.think[0]):], "", (), exact=False), errors, False
      reasoning, start = text[len(self.think[0]):close], close + len(self.think[1])
    markers = self._marker_re()
    exact = self.think is None or text.startswith(self.think[0])
    content_end = None
    pos = start
    while True:
      m = markers.search(text, pos)
      if m is None:
        if _proper_prefix_at_end(text[max(pos, len(text) - 64):], (self.section_begin,)):
          errors.append(f"incomplete tool call: the text ends inside {self.section_begin}.")
          return self._turn(reasoning, text, start, content_end, calls, False), errors, True
        if content_end is not None and text[pos:]:
          exact = False  # text after the calls: prose the template cannot write back
        break
      if m.group() != self.section_begin:
        errors.append(f"{m.group()} outside a tool-calls section (open one with {self.section_begin}).")
        exact = False
        pos = m.end()
        continue
      if content_end is None:
        content_end = m.start()
      elif text[pos:m.start()]:
        exact = False
      if calls or errors:
        exact = False  # a second section: the template writes one
      pos, ended, section_exact = self._section(text, m.end(), markers, calls, errors)
      exact = exact and section_exact
      if ended:
        return self._turn(reasoning, text, start, content_end, calls, False), errors, True
    exact = exact and not errors and all(c.call is not None for c in calls)
    return self._turn(reasoning, text, start, content_end, calls, exact), errors, False

  def _turn(self, reasoning: str, text: str, start: int, content_end: int | None, calls: list[RawCall],
            exact: bool) -> AssistantTurn:
    content = text[start:content_end] if content_end is not None else text[start:]
    turn = AssistantTurn(reasoning, content, tuple(calls), exact)
    if exact:  # the last word: the template's text of these parts is the turn's text
      try:
        exact = self._write(reasoning, content, calls) == text
      except ValueError:
        exact = False
      turn = dataclasses.replace(turn, exact=exact)
    return turn

  def _section(self, text: str, pos: int, markers: re.Pattern, calls: list[RawCall],
               errors: list[str]) -> tuple[int, bool, bool]:
    """Parses calls from `pos` (just after the section's opening) to its end: (next position, the text ended in
    the section, the section is written as the template writes it)."""
    exact = True
    while True:
      m = markers.search(text, pos)
      if m is None:
        errors.append(f"incomplete tool call: the text ends inside the tool-calls section ({self.section_end} "
                      "missing).")
        return len(text), True, False
      gap = text[pos:m.start()]
      if gap:
        exact = False
        if gap.strip():
          errors.append(f"unexpected text {gap.strip()[:24]!r} inside the tool-calls section; only calls may "
                        "stand there.")
      if m.group() == self.section_end:
        return m.end(), False, exact
      if m.group() != self.call_begin:
        errors.append(f"{m.group()} where a call should begin ({self.call_begin}).")
        exact = False
        pos = m.end()
        continue
      sep = markers.search(text, m.end())
      if sep is None:
        errors.append("incomplete tool call: the text ends inside a call.")
        return len(text), True, False
      if sep.group() != self.separator:
        errors.append(f"malformed tool call: {sep.group()} before the call's {self.separator}.")
        exact = False
        pos = sep.start() if sep.group() in (self.call_begin, self.section_end) else sep.end()
        continue
      head = text[m.end():sep.start()]
      end = markers.search(text, sep.end())
      if end is None:
        errors.append(f"incomplete tool call {head.strip()[:40]!r}: the text ends inside its arguments.")
        return len(text), True, False
      if end.group() != self.call_end:
        errors.append(f"malformed tool call {head.strip()[:40]!r}: its arguments are not closed with "
                      f"{self.call_end} before {end.group()}.")
        exact = False
        pos = end.start() if end.group() in (self.call_begin, self.section_end) else end.end()
        continue
      arguments = text[sep.end():end.start()]
      name, error = self.head_name(head)
      call = None
      if not error:
        call, error = _decode_arguments(name, arguments)
      if error:
        errors.append(error)
      calls.append(RawCall(head if self.has_ids else "", name or head, arguments, call))
      pos = end.end()


def _deepseek_head(head: str) -> tuple[str, str]:
  name = head.strip()
  return (name, "") if name else ("", "a tool call without a tool name.")


_KIMI_ID = re.compile(r"functions\.([A-Za-z_][A-Za-z0-9_]{0,63}):([0-9]{1,9})")


def _kimi_head(head: str) -> tuple[str, str]:
  m = _KIMI_ID.fullmatch(head.strip()) if len(head) <= 128 else None
  if m is None:
    return "", f"tool call id {head.strip()[:40]!r} is not functions.NAME:INDEX."
  return m.group(1), ""


TOOL_FORMATS.register("brief")(BriefFormat())
TOOL_FORMATS.register("deepseek_v3")(SectionFormat(
    name="deepseek_v3", section_begin="<｜tool▁calls▁begin｜>", section_end="<｜tool▁calls▁end｜>",
    call_begin="<｜tool▁call▁begin｜>", separator="<｜tool▁sep｜>", call_end="<｜tool▁call▁end｜>",
    head_name=_deepseek_head, head_text=lambda name, index: name))
TOOL_FORMATS.register("kimi_k2")(SectionFormat(
    name="kimi_k2", section_begin="<|tool_calls_section_begin|>", section_end="<|tool_calls_section_end|>",
    call_begin="<|tool_call_begin|>", separator="<|tool_call_argument_begin|>", call_end="<|tool_call_end|>",
    head_name=_kimi_head, head_text=lambda name, index: f"functions.{name}:{index}", think=("<think>", "</think>"),
    has_ids=True))
