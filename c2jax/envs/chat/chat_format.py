"""Chat formats: one tool-call format, and the model's chat template around it, as the environment and the agent
engine use them (report section 4: RL episodes are agent sessions; a served model reads them in its own format).

  fmt = chat_format("kimi_k2")                    # "brief" (the environment's raw text), "deepseek_v3", "kimi_k2"
  prompt = fmt.prompt(SYSTEM_PROMPT, first_observation)   # system + user, tools declared, generation prompt
  ... the model's turn text, then fmt.end_of_turn (the token that ended it) ...
  cont = fmt.continuation(turn_text, results, notice)      # what follows, up to the next generation prompt
  messages = fmt.messages(SYSTEM_PROMPT, first_observation, steps)  # the same conversation as HF messages

The token stream of an episode, as the engine builds it piece by piece (each piece tokenized on its own):

  prompt | turn_1 | end_of_turn | cont_1.observation | cont_1.notice | turn_2 | end_of_turn | ...

equals the tokens of `fmt.render(messages)`, the model's real chat template over the whole conversation (and
transformers' `apply_chat_template`): zero drift, proved in tests/envs/chat/chat_format_test.py. That holds at every
append-only boundary; where a boundary is not append-only (see "Segments" below) the engine must start a new
segment, re-prefilling from the longest common prefix of the old and new token streams. With the byte tokenizers
of the tiny models and a tokenizer whose control tokens are added special tokens every piece boundary falls on a
control token or a byte, so tokenizing pieces apart gives the same ids as tokenizing their concatenation.

The environment's text is never structure. The engine does not tokenize rendered text whole: it encodes markup
(`render_markup`, `Continuation.observation_markup`, `prompt_markup`; `c2jax.envs.chat.markup`), in which the
control tokens the template wrote are CONTROL pieces (one id each) and the content of every message from the
environment (the user message: task, repository listing, a summary; tool messages: files, command output; the
harness's notes and budget line) is TEXT, encoded with special-token matching off. In every format a control
string inside that text (its own, another format's, cut, full-width or not, split across results) reaches the
model as the ordinary tokens of its characters and decodes back to the same text: it cannot close a tool output,
open a user / system / assistant message or write a tool call. (transformers' `apply_chat_template` and vLLM
tokenize the rendered text whole with added tokens matched, so there such text becomes control tokens; the two
streams are equal wherever the environment's text spells no control string.) The opening system message (this
format's own prompt and tool layout, which for DeepSeek spells its call markers as its model card does) and the
model's own turns keep their control tokens.

Formats (`CHAT_FORMATS`):
  brief        no template: today's raw text framing, bit for bit. The prompt is the first observation (the engine
               adds BOS); a turn ends with the tokenizer's EOS (end_of_turn ""); the continuation is the tool
               results as <result tool=...> / <error> blocks, clipped as a whole, then "\\n" and the budget line.
               All of it is text: BOS and EOS are ids of their own, and no added token of the tokenizer (its
               specials, "<|endoftext|>", another format's tokens) is matched in the prompt, the observations,
               the framed summary or a forced turn.
  deepseek_v3  DeepSeek-V3.1's template (chat_templates/deepseek_v3_1.jinja) with thinking off, its native calls
               (`tool_formats`). Its template ignores `tools=`: the tools are described in the system prompt in the
               layout its model card gives. A turn ends with <｜end▁of▁sentence｜>. Each run call's result is a tool
               output (<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>), the harness's notes (malformed calls, calls not
               run) and the budget line a last one; the template writes no generation prompt after tool outputs
               (the model goes on right after them). A turn without a well-formed call is answered as the user
               (<｜User｜>notes<｜Assistant｜></think>).
  kimi_k2      Kimi-K2-Thinking's template (chat_templates/kimi_k2_thinking.jinja), tools declared by `tools=`.
               A turn is <think>reasoning</think>content<|tool_calls_section_begin|>...; it ends with <|im_end|>.
               Each run call's result is a tool message "## Return of functions.NAME:IDX\\n<result>" naming the
               call by the id the model wrote; the harness's notes and the budget line are a system message; then
               the generation prompt <|im_assistant|>assistant<|im_middle|>.

A failed call's result starts with "error: ". Results are clipped one by one (EnvConfig.max_observation_bytes);
native continuations are not clipped as a whole (that would cut control tokens).

Segments: what is append-only.
  * A turn and its continuation are append-only in every format: the templates render earlier messages the same
    whatever follows, for an agent episode (one user message, then assistant turns with tool calls and their
    results), as long as each turn is `exact` (`tool_formats.AssistantTurn`): written as the template writes it.
  * Kimi-K2's template drops reasoning: it renders `<think></think>` (reasoning dropped) for every assistant
    message up to and including the LAST assistant message WITHOUT tool calls, and keeps `<think>reasoning</think>`
    after it. So while every turn calls tools, all reasoning stays (append-only); a turn without a tool call
    whose reasoning, or an earlier turn's, is not empty rewrites history: a segment break. (The template's own
    comment: "reasoning_content in suffix should be reserved".)
  * DeepSeek-V3.1's template drops a reasoning before </think> in an assistant message without tool calls after
    a user message, and writes `<｜Assistant｜></think>` before tool calls even in thinking mode; with thinking off
    (as here) turns carry no reasoning and nothing is dropped.
  * A self-summary is always a segment break (`segment_prompt`): the new segment is the prompt with the summary
    in the user message (`self_summary.resume`), re-rendered; it shares the prompt's tokens up to the end of the
    first observation, after which it differs (the old prompt ended with the generation prompt).
  * A new user turn (e.g. the summary request, `continuation(..., request=...)`) is append-only when it comes in
    place of the generation prompt, as `continuation` writes it; appended after a rendered generation prompt it is
    not. `boundary(before, after)` tells the two apart by rendering (tests use it to show both cases).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from typing import Any, Mapping, Sequence

from c2jax.data.chat_template import ChatTemplate
from c2jax.envs.chat import markup, self_summary
from c2jax.envs.chat.markup import Markup, Piece
from c2jax.envs.chat.tool_formats import TOOL_FORMATS, AssistantTurn, ToolFormat, tool_schemas
from c2jax.registry import Registry

SYSTEM_PROMPT = ("You are a coding agent. You work in a repository through the tools you are given; call finish "
                 "when the task is done.")


class Boundary(enum.Enum):
  """How a conversation grows at one step: APPEND keeps every earlier token; SEGMENT_BREAK rewrites some."""

  APPEND = "append"
  SEGMENT_BREAK = "segment_break"


@dataclasses.dataclass(frozen=True)
class ToolResult:
  """One item of a step's observation, in the order the environment produced it.

  Attributes:
    text: the result (clipped), or the harness's note.
    call: the index in `ParseResult.calls` of the call this answers; None for a note of the harness (a malformed
      call, calls not run, a limit reached).
    ok: the call succeeded (a failed one is an error the model reads).
    tool: the tool's name (the brief format writes it).
  """

  text: str
  call: int | None = None
  ok: bool = True
  tool: str = ""


@dataclasses.dataclass(frozen=True)
class Continuation:
  """What is appended after a model turn's end-of-turn token, up to and including the next generation prompt, as
  markup (`markup.Piece`s: the template's control tokens apart from the environment's text, which stays text).

  Attributes:
    observation_markup: the tool results (the ledger's OBSERVATION tokens).
    notice_markup: the harness's message with the budget line, and the generation prompt (NOTICE tokens).
  """

  observation_markup: Markup
  notice_markup: Markup = ()

  @classmethod
  def plain(cls, observation: str, notice: str = "") -> Continuation:
    """Environment text alone, no control token (the brief format; a step after the episode's end)."""
    return cls(markup.plain(observation), markup.plain(notice))

  @property
  def observation(self) -> str:
    return markup.text_of(self.observation_markup)

  @property
  def notice(self) -> str:
    return markup.text_of(self.notice_markup)

  @property
  def text(self) -> str:
    return self.observation + self.notice


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of an episode: the model's turn text, the environment's results and budget line, and an optional
  request appended as a user turn (the summary request)."""

  turn: str
  results: tuple[ToolResult, ...] = ()
  notice: str = ""
  request: str = ""


def clip(text: str, limit: int) -> str:
  """`text` cut to about `limit` UTF-8 bytes, keeping its head and tail around a note of what was cut."""
  data = text.encode("utf-8", errors="replace")
  if len(data) <= limit:
    return text
  head, tail = data[:limit * 3 // 4], data[len(data) - limit // 4:]
  cut = len(data) - len(head) - len(tail)
  return (f"{head.decode('utf-8', errors='ignore')}\n[... {cut} bytes cut ...]\n"
          f"{tail.decode('utf-8', errors='ignore')}")


def deepseek_tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
  """The tool section of a DeepSeek-V3.1 system prompt, in the layout of its model card (its chat template does
  not render `tools`)."""
  parts = ["## Tools", "You have access to the following tools:"]
  for tool in tools:
    fn = tool["function"]
    parts.append(f"### {fn['name']}\nDescription: {fn['description']}\n\n"
                 f"Parameters: {json.dumps(fn['parameters'], ensure_ascii=False)}")
  parts.append("IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
               "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n"
               "Where:\n"
               "- `tool_call_name` must be an exact match to one of the available tools\n"
               "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
               "- For multiple tool calls, chain them directly without separators or spaces")
  return "\n\n".join(parts)


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """A tool-call format with (optionally) a chat template and the control tokens it writes.

  Attributes:
    name: the registry name.
    tool_format: parses and renders the model's calls.
    template: the model's chat template; None for "brief" (raw text framing).
    end_of_turn: the control token that ends a model turn ("" for brief: the tokenizer's EOS id, no text).
    control_tokens: every control token the template and the format write; a tokenizer must carry them as added
      special tokens (single ids) for the pieces of an episode to tokenize as the whole does.
    template_kwargs: extra template variables (DeepSeek: thinking=False).
    tools_in_system: the tools are described in the system prompt (DeepSeek-V3.1) instead of `tools=` (Kimi).
    harness_role: the role of the harness's message after a turn with calls ("tool" or "system").
    harness_role_no_calls: its role after a turn without a well-formed call ("user" or "system").
  """

  name: str
  tool_format: ToolFormat
  template: ChatTemplate | None = None
  end_of_turn: str = ""
  control_tokens: tuple[str, ...] = ()
  template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tools_in_system: bool = False
  harness_role: str = "system"
  harness_role_no_calls: str = "system"

  @property
  def native(self) -> bool:
    return self.template is not None

  # -- the pieces the engine appends ------------------------------------------------------------------------------

  def prompt(self, system: str, user: str) -> str:
    """The start of an episode: the system and user messages, the tools declared, the generation prompt. For
    brief: `user` (after `system` and a blank line when one is given); the engine adds BOS."""
    if not self.native:
      return f"{system}\n\n{user}" if system else user
    return self.render(self._head(system, user), add_generation_prompt=True)

  def prompt_markup(self, system: str, user: str) -> Markup:
    """`prompt` as markup: `user` (the task statement, the repository listing) is text, whatever it holds."""
    if not self.native:
      return markup.plain(self.prompt(system, user))  # brief has no control token: all of it is text
    return self.render_markup(self._head(system, user), add_generation_prompt=True)

  def continuation(self, turn_text: str, results: Sequence[ToolResult], notice: str, *,
                   max_bytes: int | None = None, request: str = "") -> Continuation:
    """What follows a model turn (after its end-of-turn token), up to and including the next generation prompt.

    Args:
      turn_text: the model's turn, as sampled (without the end-of-turn token).
      results: the environment's results and notes, in order.
      notice: the budget line.
      max_bytes: brief only: the whole observation is clipped to this.
      request: a user turn to append (the summary request), in place of the generation prompt.
    """
    if not self.native:
      parts = []
      for r in results:
        if r.call is None:
          parts.append(f"<error>{r.text}</error>")
        else:
          tag = "result" if r.ok else "error"
          parts.append(f'<{tag} tool="{r.tool}">\n{r.text}\n</{tag}>')
      body = "\n".join(parts)
      if max_bytes is not None:
        body = clip(body, max_bytes)
      return Continuation.plain(body, ("\n" + notice if notice else "") + request)
    turn = self.tool_format.turn(turn_text)
    tool_messages, rest = self._result_messages(turn, results, notice, request)
    context = self._context(bool(self.assistant_message(turn_text, turn).get("tool_calls")))
    base = self.render(context, add_generation_prompt=False)
    observation = self.render(context + tool_messages, add_generation_prompt=False) if tool_messages else base
    whole = self.render_markup(context + tool_messages + rest, add_generation_prompt=True)
    if not (observation.startswith(base) and markup.text_of(whole).startswith(observation)):
      raise AssertionError(f"{self.name}: the template does not render tool results append-only.")
    return Continuation(markup.cut(whole, len(base), len(observation)), markup.cut(whole, len(observation)))

  def segment_prompt(self, system: str, user: str, summary: str) -> str:
    """The start of a new segment after a self-summary (a segment break): the prompt whose user message is the
    first observation followed by the framed summary (`self_summary.resume`)."""
    return markup.text_of(self.segment_prompt_markup(system, user, summary))

  def segment_prompt_markup(self, system: str, user: str, summary: str) -> Markup:
    """`segment_prompt` as markup: the summary (the model's text, decoded with its control tokens) is text in the
    user message, like the first observation."""
    if not self.native:
      return markup.merge(self.prompt_markup(system, user) + markup.plain(self_summary.resume(summary)))
    return self.prompt_markup(system, user + self_summary.resume(summary).rstrip("\n"))

  def summary_request(self, max_tokens: int) -> str:
    """The summary request: raw text after the observation for brief, the `request` user turn of `continuation`
    for native formats."""
    text = self_summary.request(max_tokens)
    return text if not self.native else text.strip("\n")

  # -- the whole conversation -------------------------------------------------------------------------------------

  def messages(self, system: str, user: str, steps: Sequence[Step]) -> list[dict]:
    """The episode as HF chat messages: system (with the tools, for DeepSeek), user, then per step the assistant
    turn (its reasoning, content and tool calls as the model wrote them; a turn that is not `exact` is kept as
    plain content, which its template cannot reproduce) and the result messages `continuation` renders."""
    if not self.native:
      raise ValueError("The brief format has no chat template; its episode is the raw text of its pieces.")
    out = self._head(system, user)
    for step in steps:
      turn = self.tool_format.turn(step.turn)
      out.append(self.assistant_message(step.turn, turn))
      tool_messages, rest = self._result_messages(turn, step.results, step.notice, step.request)
      out += tool_messages + rest
    return out

  def assistant_message(self, turn_text: str, turn: AssistantTurn | None = None) -> dict:
    """The HF assistant message of one turn."""
    turn = turn or self.tool_format.turn(turn_text)
    think = getattr(self.tool_format, "think", None)
    if not turn.exact:  # kept as written: the reasoning apart where the turn opens with it, the rest as content
      if think and turn_text.startswith(think[0]) and think[1] in turn_text:
        reasoning, _, rest = turn_text[len(think[0]):].partition(think[1])
        return {"role": "assistant", "content": rest, "reasoning_content": reasoning}
      return {"role": "assistant", "content": turn_text}
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if think:
      message["reasoning_content"] = turn.reasoning
    if turn.calls:
      message["tool_calls"] = [
          {**({"id": c.id} if c.id else {}), "type": "function",
           "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls]
    return message

  def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
             tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The conversation through the template, with this format's tools (or `tools`: JSON-schema function
    definitions, a served request's own) and template variables. A format that describes its tools in the system
    prompt (`tools_in_system`) takes none here: they are in `messages`."""
    if not self.native:
      raise ValueError("The brief format has no chat template to render messages with.")
    tools = None if self.tools_in_system else tool_schemas() if tools is None else list(tools)
    return self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                **self.template_kwargs)

  def render_markup(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> Markup:
    """`render` as markup: the template's text split at the control tokens IT wrote; the content of every message
    from the environment (user, tool, and system messages after the first: the harness's notes) is TEXT, so a
    control string inside it stays text. The opening system message (the format's own prompt and tool layout) and
    assistant messages (the model's own text, its control tokens included) are split at their control tokens.

    How: the environment's contents are replaced by placeholders (a private-use character the conversation does
    not hold, around an index), the template renders that, its text is split at control tokens, and each
    placeholder is put back as TEXT; the result must spell `render(messages)` exactly (else AssertionError: the
    template changed a content, and its markup could not be told)."""
    whole = self.render(messages, add_generation_prompt, tools)
    mark = next(chr(c) for c in range(0x100000, 0x10FFFE) if chr(c) not in whole)
    texts: list[str] = []
    masked = []
    for i, message in enumerate(messages):
      content = message.get("content")
      if _from_environment(i, message) and isinstance(content, str):
        masked.append({**message, "content": f"{mark}{len(texts)}{mark}"})
        texts.append(content)
      else:
        masked.append(message)
    pieces: list[Piece] = []
    for k, part in enumerate(self.render(masked, add_generation_prompt, tools).split(mark)):
      pieces += [Piece(texts[int(part)])] if k % 2 else markup.split_controls(part, self.control_tokens)
    out = markup.merge(pieces)
    if markup.text_of(out) != whole:
      raise AssertionError(f"{self.name}: the template changes a message's content; its control tokens cannot be "
                           "told apart from the environment's text.")
    return out

  def held(self, messages: Sequence[Mapping[str, Any]]) -> str:
    """The text the engine holds after `messages`: after an assistant turn, the turn and its end-of-turn token;
    after anything else, the generation prompt too."""
    return self.render(messages, add_generation_prompt=messages[-1].get("role") != "assistant")

  def held_markup(self, messages: Sequence[Mapping[str, Any]]) -> Markup:
    """`held` as markup (`render_markup`)."""
    return self.render_markup(messages, add_generation_prompt=messages[-1].get("role") != "assistant")

  def boundary(self, before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> Boundary:
    """APPEND when the engine's text after `after` extends its text after `before`, else SEGMENT_BREAK."""
    return Boundary.APPEND if self.held(after).startswith(self.held(before)) else Boundary.SEGMENT_BREAK

  # -- helpers ----------------------------------------------------------------------------------------------------

  def _head(self, system: str, user: str) -> list[dict]:
    if self.tools_in_system:
      system = "\n\n".join(p for p in (system, deepseek_tools_prompt(tool_schemas())) if p)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]

  def _context(self, with_calls: bool) -> list[dict]:
    """A minimal conversation ending in an assistant turn of the same kind, after which results render as they
    do in the episode (the templates' state at that point depends only on the kind of the last turn)."""
    assistant: dict[str, Any] = {"role": "assistant", "content": ""}
    if with_calls:
      assistant["tool_calls"] = [{"id": "functions.finish:0", "type": "function",
                                  "function": {"name": "finish", "arguments": "{}"}}]
    return [{"role": "user", "content": "."}, assistant]

  def _result_messages(self, turn: AssistantTurn, results: Sequence[ToolResult], notice: str,
                       request: str) -> tuple[list[dict], list[dict]]:
    """(the tool messages of the run calls, then the harness's message and the request)."""
    ids = [c.id for c in turn.calls if c.call is not None]
    tool_messages = []
    for r in results:
      if r.call is None:
        continue
      message = {"role": "tool", "content": r.text if r.ok else f"error: {r.text}"}
      if r.call < len(ids) and ids[r.call]:
        message["tool_call_id"] = ids[r.call]
      tool_messages.append(message)
    notes = [r.text for r in results if r.call is None] + ([notice] if notice else [])
    rest = []
    if notes:
      role = self.harness_role if tool_messages else self.harness_role_no_calls
      rest.append({"role": role, "content": "\n".join(notes)})
    if request:
      rest.append({"role": "user", "content": request})
    return tool_messages, rest


def _from_environment(index: int, message: Mapping[str, Any]) -> bool:
  """Whether a message's content is the environment's text (user, tool, a system message after the first)."""
  role = message.get("role")
  return role in ("user", "tool") or (role == "system" and index > 0)


CHAT_FORMATS: Registry = Registry("chat format")

DEEPSEEK_CONTROL_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                           "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                           "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁output▁begin｜>",
                           "<｜tool▁output▁end｜>")
KIMI_CONTROL_TOKENS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                       "<|im_middle|>", "<think>", "</think>", "<|tool_calls_section_begin|>",
                       "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                       "<|tool_call_end|>")


@CHAT_FORMATS.register("brief")
@functools.cache
def brief() -> ChatFormat:
  return ChatFormat(name="brief", tool_format=TOOL_FORMATS.get("brief"))


@CHAT_FORMATS.register("deepseek_v3")
@functools.cache
def deepseek_v3() -> ChatFormat:
  template = ChatTemplate.vendored("deepseek_v3_1", {"bos_token": "<｜begin▁of▁sentence｜>",
                                                      "eos_token": "<｜end▁of▁sentence｜>"})
  return ChatFormat(name="deepseek_v3", tool_format=TOOL_FORMATS.get("deepseek_v3"), template=template,
                    end_of_turn="<｜end▁of▁sentence｜>", control_tokens=DEEPSEEK_CONTROL_TOKENS,
                    template_kwargs={"thinking": False}, tools_in_system=True, harness_role="tool",
                    harness_role_no_calls="user")


@CHAT_FORMATS.register("kimi_k2")
@functools.cache
def kimi_k2() -> ChatFormat:
  template = ChatTemplate.vendored("kimi_k2_thinking", {"bos_token": "[BOS]", "eos_token": "[EOS]"})
  return ChatFormat(name="kimi_k2", tool_format=TOOL_FORMATS.get("kimi_k2"), template=template,
                    end_of_turn="<|im_end|>", control_tokens=KIMI_CONTROL_TOKENS)


def chat_format(name: str) -> ChatFormat:
  """The chat format registered as `name` (built once)."""
  return CHAT_FORMATS.get(name)()
