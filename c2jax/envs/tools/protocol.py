"""The tool-call text format inside model output, and a strict, total parser for it (report section 4: the model
reads and writes files, runs shell commands and searches the repository through tools).

A call is an XML-ish block; every argument is a child whose value is the raw text up to its closing tag (no
escaping, no CDATA), so code goes in exactly as it should land in the file:

  <tool name="read_file"><arg name="path">pkg/util.py</arg></tool>

  <tool name="edit">
  <arg name="path">pkg/util.py</arg>
  <arg name="search">
      return a - b
  </arg>
  <arg name="replace">
      return a + b
  </arg>
  </tool>

  <tool name="run"><arg name="command">python3 -m unittest -q</arg></tool>
  <tool name="search_code"><arg name="query">parse a date string</arg></tool>
  <tool name="finish"/>

Tools and their arguments (`?` optional): read_file{path}, write_file{path, content}, edit{path, search,
replace}, run{command}, grep{pattern, path?}, search_code{query}, web_search{query}, finish{}.

Rules, all of them:
  * Text outside <tool> blocks is free prose and is ignored; a turn may hold several calls, run in order.
  * Opening tags are `<tool name="NAME">` (or `<tool name="NAME"/>` for a call without arguments) and
    `<arg name="NAME">`; double quotes only, whitespace allowed around `=` and before `>`.
  * Inside a block only whitespace may separate the <arg> children; the block ends at `</tool>`.
  * A value runs from its opening tag to the next `</arg>`. If it starts with a newline, that one newline is dropped
    (so the value may begin on its own line); everything else is kept as written, trailing newline included.
  * A plain value may not contain the format's own tags (`<tool`, `</tool>`, `<arg`, `</arg>`): that is how a
    forgotten `</arg>` is caught instead of swallowing the next call. A value that must contain them names its own
    terminator, heredoc-style: `<arg name="content" end="EOF">...</EOF>` runs raw to the first `</EOF>`
    (WORD = [A-Za-z_][A-Za-z0-9_]{0,31}).
  * `path`, `pattern` and `query` are one-line arguments: one trailing newline is also dropped, and `path` is
    stripped of surrounding whitespace. `path`, `pattern`, `query`, `command` and `search` must not be empty.

The parser is total: `parse` never raises, for any string, and runs in time linear in the text (every search
either moves the cursor forward or ends the scan). Each malformed call (unknown tool, missing / duplicate / unknown
argument, stray text or tags, a block not closed before the next <tool>) yields one error sentence and is not
executed; a text that ends inside a call (the sampler ran out of tokens) sets `incomplete` and adds one error,
which is what the report's auxiliary reward for incomplete tool calls counts. `render` writes the canonical text of
a call, and `parse(render(c)).calls == (c,)` for every call `render` accepts.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
from typing import Mapping


class ToolName(enum.Enum):
  READ_FILE = "read_file"
  WRITE_FILE = "write_file"
  EDIT = "edit"
  RUN = "run"
  GREP = "grep"
  SEARCH_CODE = "search_code"
  WEB_SEARCH = "web_search"
  FINISH = "finish"


# (required, optional) argument names of each tool, in canonical (render) order.
TOOL_ARGS: Mapping[ToolName, tuple[tuple[str, ...], tuple[str, ...]]] = types.MappingProxyType({
    ToolName.READ_FILE: (("path",), ()),
    ToolName.WRITE_FILE: (("path", "content"), ()),
    ToolName.EDIT: (("path", "search", "replace"), ()),
    ToolName.RUN: (("command",), ()),
    ToolName.GREP: (("pattern",), ("path",)),
    ToolName.SEARCH_CODE: (("query",), ()),
    ToolName.WEB_SEARCH: (("query",), ()),
    ToolName.FINISH: ((), ()),
})
_LINE_ARGS = frozenset({"path", "pattern", "query"})
_NONEMPTY_ARGS = frozenset({"path", "pattern", "query", "command", "search"})
_BY_VALUE = {t.value: t for t in ToolName}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One well-formed call: the tool and its arguments (a read-only mapping, name -> raw value)."""

  name: ToolName
  args: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    # Read-only, so a frozen call stays frozen; compares equal to a plain dict with the same items.
    object.__setattr__(self, "args", types.MappingProxyType(dict(self.args)))


@dataclasses.dataclass(frozen=True)
class ParseResult:
  """What one model text holds.

  Attributes:
    calls: the well-formed calls, in text order.
    errors: one sentence per malformed call, plus one for an incomplete call at the end.
    incomplete: the text ends inside a call (an unclosed block or a cut-off tag).
  """

  calls: tuple[ToolCall, ...] = ()
  errors: tuple[str, ...] = ()
  incomplete: bool = False


def _chain(*atoms: str) -> str:
  """The regex of every prefix of the concatenation of `atoms`: a0(?:a1(?:a2...)?)?."""
  out = ""
  for atom in reversed(atoms):
    out = f"{atom}(?:{out})?" if out else atom
  return out


def _chars(s: str) -> tuple[str, ...]:
  return tuple(re.escape(c) for c in s)


_NAME = r'[^"<>\n]{0,64}'  # bounded, so a failed tag match never scans far
_WORD = r"[A-Za-z_][A-Za-z0-9_]{0,31}"
# A tag of the format. The lookahead keeps words like <tools> or <article> prose.
_TAG = re.compile(r"<(?:tool|arg)(?=[\s/>])|</(?:tool|arg)>")
_TOOL_TAG = re.compile(r"<tool(?=[\s/>])|</tool>")
_TOOL_OPEN = re.compile(rf'<tool\s+name\s*=\s*"({_NAME})"\s*(/?)>')
_ARG_OPEN = re.compile(rf'<arg\s+name\s*=\s*"({_NAME})"(?:\s+end\s*=\s*"({_WORD})")?\s*>')
_WS = re.compile(r"\s*")
# Proper prefixes of a tag, for telling a cut-off text (incomplete) from a wrong one (malformed).
_TOOL_OPEN_PREFIX = _chain(*_chars("<tool"), r"\s+", *_chars("name"), r"\s*", "=", r"\s*", '"', _NAME, '"', r"\s*",
                           "/")
_ARG_END_PREFIX = _chain(r"\s+", *_chars("end"), r"\s*", "=", r"\s*", '"', r"[A-Za-z_][A-Za-z0-9_]{0,31}", '"',
                         r"\s*")
_ARG_OPEN_PREFIX = _chain(*_chars("<arg"), r"\s+", *_chars("name"), r"\s*", "=", r"\s*", '"', _NAME,
                          f'"(?:\\s*|{_ARG_END_PREFIX})')
_CUT_OUTSIDE = re.compile(f"(?:{_TOOL_OPEN_PREFIX})")
_CUT_INSIDE = re.compile(f"(?:{_ARG_OPEN_PREFIX}|{_chain(*_chars('</tool'))}|{_TOOL_OPEN_PREFIX})")
_MAX_TAG = 200  # longer than any opening tag, so a cut-off tag is always within this many final characters


def _is_cut(text: str, pos: int, pattern: re.Pattern) -> bool:
  """Whether text[pos:] is a proper prefix of a tag (the text was cut off inside it)."""
  return len(text) - pos <= _MAX_TAG and pattern.fullmatch(text, pos) is not None


def _clean(name: str, value: str) -> str:
  if value.startswith("\n"):
    value = value[1:]
  if name in _LINE_ARGS:
    if value.endswith("\n"):
      value = value[:-1]
    if name == "path":
      value = value.strip()
  return value


def check_call(tool: str, args: Mapping[str, str],
               duplicates: tuple[str, ...] = ()) -> tuple[ToolName | None, str]:
  """(the tool, "") for a well-formed call, else (None, one sentence saying what is wrong); every tool-call format
  (`c2jax.envs.chat.tool_formats`) checks its calls with it."""
  name = _BY_VALUE.get(tool)
  if name is None:
    return None, f"unknown tool {tool!r}; the tools are {', '.join(_BY_VALUE)}."
  required, optional = TOOL_ARGS[name]
  if duplicates:
    return None, f"{tool}: argument {duplicates[0]!r} is given twice."
  unknown = [a for a in args if a not in required and a not in optional]
  if unknown:
    allowed = ", ".join(required + optional) or "none"
    return None, f"{tool}: unknown argument {unknown[0]!r} (arguments: {allowed})."
  missing = [a for a in required if a not in args]
  if missing:
    return None, f"{tool}: missing argument {missing[0]!r}."
  for a, v in args.items():
    if a in _NONEMPTY_ARGS and not v.strip():
      return None, f"{tool}: argument {a!r} is empty."
    if a in _LINE_ARGS and "\n" in v:
      return None, f"{tool}: argument {a!r} must be one line."
  return name, ""


def parse(text: str) -> ParseResult:
  """All tool calls in `text`; never raises (a non-str is reported as an error), linear time."""
  if not isinstance(text, str):
    return ParseResult(errors=(f"model output must be text, got {type(text).__name__}.",))
  calls: list[ToolCall] = []
  errors: list[str] = []
  pos, n = 0, len(text)
  while True:
    m = _TAG.search(text, pos)
    if m is None:
      last = text.rfind("<", max(0, n - _MAX_TAG))
      if last >= 0 and _is_cut(text, last, _CUT_OUTSIDE):
        errors.append("incomplete tool call: the text ends inside a <tool> tag.")
        return ParseResult(tuple(calls), tuple(errors), True)
      return ParseResult(tuple(calls), tuple(errors), False)
    tag = m.group()
    if tag == "</tool>":
      errors.append("a </tool> without an open <tool> block.")
      pos = m.end()
      continue
    if tag != "<tool":  # <arg ...> or </arg> outside any block: one error, skipping a whole stray argument
      errors.append(f"{tag.rstrip('>')}> outside any <tool> block.")
      pos = m.end()
      if tag == "<arg":
        nxt = _TAG.search(text, pos)
        if nxt is not None and nxt.group() == "</arg>":
          pos = nxt.end()
      continue
    call, error, pos, cut = _parse_block(text, m.start())
    if call is not None:
      calls.append(call)
    if error:
      errors.append(error)
    if cut:
      return ParseResult(tuple(calls), tuple(errors), True)


def _skip(text: str, pos: int) -> tuple[int, bool]:
  """Resynchronises after a malformed block: past the next </tool>, or at the next <tool>; (pos, text ended)."""
  m = _TOOL_TAG.search(text, pos)
  if m is None:
    return len(text), True
  return (m.end() if m.group() == "</tool>" else m.start()), False


def _parse_block(text: str, start: int) -> tuple[ToolCall | None, str, int, bool]:  # noqa: C901
  """Parses the block opening at `start`; returns (call or None, error or "", next position, text ended in it)."""
  n = len(text)
  m = _TOOL_OPEN.match(text, start)
  if m is None:
    if _is_cut(text, start, _CUT_OUTSIDE):
      return None, "incomplete tool call: the text ends inside a <tool> tag.", n, True
    pos, ended = _skip(text, start + 1)
    return None, 'malformed <tool> tag; write <tool name="NAME">.', pos, ended
  tool = m.group(1)
  if m.group(2):  # <tool name="finish"/>
    name, error = check_call(tool, {})
    return (ToolCall(name, {}) if name else None), error, m.end(), False
  args: dict[str, str] = {}
  duplicates: list[str] = []
  pos = m.end()
  while True:
    pos = _WS.match(text, pos).end()
    if pos >= n:
      return None, f"incomplete tool call {tool!r}: the text ends before </tool>.", n, True
    if text.startswith("</tool>", pos):
      name, error = check_call(tool, args, tuple(duplicates))
      return (ToolCall(name, args) if name else None), error, pos + len("</tool>"), False
    a = _ARG_OPEN.match(text, pos)
    if a is None:
      if _is_cut(text, pos, _CUT_INSIDE):
        return None, f"incomplete tool call {tool!r}: the text ends inside a tag.", n, True
      if _TOOL_OPEN.match(text, pos):
        return None, f"tool call {tool!r} is not closed with </tool> before the next <tool>.", pos, False
      what = "malformed <arg> tag" if text.startswith("<arg", pos) else "unexpected text"
      error = f"tool call {tool!r}: {what} at {text[pos:pos + 24]!r}; only <arg> children may stand in a block."
      pos, ended = _skip(text, pos)
      return None, error, pos, ended
    arg, word = a.group(1), a.group(2)
    body = a.end()
    if word:
      close = text.find(f"</{word}>", body)
      if close < 0:
        return None, f"incomplete tool call {tool!r}: argument {arg!r} never reaches </{word}>.", n, True
      value, pos = text[body:close], close + len(word) + 3
    else:
      t = _TAG.search(text, body)
      if t is None:
        return None, f"incomplete tool call {tool!r}: argument {arg!r} never reaches </arg>.", n, True
      if t.group() != "</arg>":
        error = (f"tool call {tool!r}: argument {arg!r} is not closed with </arg> before {t.group()}"
                 f"{'' if t.group().endswith('>') else '...'} (a value holding tags needs end=\"WORD\").")
        if t.group() == "<tool":  # a forgotten </arg></tool>: the next call still counts
          return None, error, t.start(), False
        pos, ended = _skip(text, t.start())
        return None, error, pos, ended
      value, pos = text[body:t.start()], t.end()
    if arg in args:
      duplicates.append(arg)
    args[arg] = _clean(arg, value)


def _value_text(name: str, value: str) -> str:
  """One <arg> element whose parse gives back `value` exactly."""
  if _TAG.search(value) is None:
    return f'<arg name="{name}">{chr(10) if chr(10) in value else ""}{value}</arg>'
  word, k = "EOF", 0
  while f"</{word}>" in value:
    k += 1
    word = f"EOF{k}"
  return f'<arg name="{name}" end="{word}">{chr(10) if chr(10) in value else ""}{value}</{word}>'


def render(call: ToolCall) -> str:
  """The canonical text of `call`; raises ValueError for a call `parse` could never produce."""
  name, error = check_call(call.name.value, call.args)
  if name is None:
    raise ValueError(f"Cannot render this tool call: {error}")
  if "path" in call.args and call.args["path"] != call.args["path"].strip():
    raise ValueError(f"Cannot render this tool call: {name.value}: the path has surrounding whitespace.")
  if not call.args:
    return f'<tool name="{name.value}"/>'
  required, optional = TOOL_ARGS[name]
  body = "\n".join(_value_text(a, call.args[a]) for a in required + optional if a in call.args)
  return f'<tool name="{name.value}">\n{body}\n</tool>'


class HelpDetail(enum.Enum):
  """How much of the tool format the first observation spells out.

  FULL: one rendered example per tool and the value rules (~1.3 KB): for models meeting the format cold.
  BRIEF: the tools' names and arguments and one example in ~300 bytes: for models that learned the format in SFT
    (the tiny models, whose every prompt byte costs training and sampling compute).
  NONE: no description: for models that learned the format in SFT and are only ever prompted the same way (the
    CPU-sized coding RL runs, where the prompt is the listing, the budget and the task in ~200 bytes).
  """

  FULL = "full"
  BRIEF = "brief"
  NONE = "none"


def format_help(detail: HelpDetail = HelpDetail.FULL) -> str:
  """A description of the format for the first observation (see `HelpDetail`); empty for NONE."""
  if detail is HelpDetail.NONE:
    return ""
  if detail is HelpDetail.BRIEF:
    signature = ", ".join(f"{name.value}({', '.join(TOOL_ARGS[name][0] + TOOL_ARGS[name][1])})" for name in ToolName)
    return "\n".join([
        # Terse, so that naming every tool keeps the prompt this short (configs/pretrain_tiny.py's SFT rows of 768
        # byte tokens hold the longest tiny_functions demonstration with this help, with ~20 bytes to spare).
        f"Tools: {signature}; e.g.:",
        render(ToolCall(ToolName.WRITE_FILE, {"path": "a.py", "content": "x = 1\n"})),
        render(ToolCall(ToolName.FINISH, {})),
    ])
  examples = [
      ToolCall(ToolName.READ_FILE, {"path": "pkg/module.py"}),
      ToolCall(ToolName.EDIT, {"path": "pkg/module.py", "search": "    return a - b\n",
                               "replace": "    return a + b\n"}),
      ToolCall(ToolName.WRITE_FILE, {"path": "pkg/new.py", "content": "def f(x):\n    return x\n"}),
      ToolCall(ToolName.RUN, {"command": "python3 -m unittest -q"}),
      ToolCall(ToolName.GREP, {"pattern": r"def \w+", "path": "pkg"}),
      ToolCall(ToolName.SEARCH_CODE, {"query": "where the config file is parsed"}),
      ToolCall(ToolName.WEB_SEARCH, {"query": "python json dumps indent"}),
      ToolCall(ToolName.FINISH, {}),
  ]
  return "\n".join([
      "Use tools by writing blocks like these (several per turn are run in order; other text is ignored):",
      *(render(c) for c in examples),
      "A value is the raw text up to </arg> (one newline right after the opening tag is dropped). For a value that "
      'contains <tool> or <arg> tags, write <arg name="content" end="EOF">...</EOF>.',
      "edit replaces exactly one occurrence of search; grep takes a Python regex and an optional file or folder; "
      "search_code finds the repository's code that matches a description; web_search looks up documentation; "
      "run executes a shell command in the repository; finish ends the episode.",
  ])
