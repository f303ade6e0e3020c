"""OpenAI chat-completion requests as agent-loop episodes, and the model's turns as OpenAI messages (the endpoint of
`c2jax.services.openai_server`).

  request = parse_request(body, limits)              # BadRequest (one sentence) on what OpenAI's API would refuse
  conv = render(request, chat, known_turns)          # the conversation in the model's own chat format, as ids
  message = assistant_message(chat, ids, tools_on)   # {"content", "tool_calls", ...} of a turn's ids

A conversation is played as the agent loop plays an episode, so that for the same seed its tokens are the agent
loop's (zero drift): the prompt is the messages up to the first assistant message (`ChatTokens.prompt` for brief,
the template's render for a native format), each earlier assistant message is a turn forced through the engine
(`Episode.script`: the engine draws past it, so the next sampled turn draws with the index the agent loop's would),
each run of tool / user messages after it is the continuation an environment returns (`ReplayEnv`), and the reply
is the episode's last, sampled turn.

An earlier assistant message is forced as the ids the server drew for it when the server answered it
(`known_turns`: the assistant messages it returned recently, by their JSON), else as the format writes it (the
template's render; brief: its content, then its calls in the environment's syntax): a model's text need not
re-tokenize to the ids it drew (a byte-level tokenizer's invalid UTF-8 does not), so the drawn ids keep the
stream exact. A native conversation the template does not render append-only (Kimi-K2's template drops
reasoning before the last assistant message without tool calls) is one prompt instead: the template's render of
every message, with no forced turn.

The tools: a request's `tools` are rendered by the template (`tools=`; DeepSeek describes them in the system
message); brief declares none (its environment's text does). Calls are parsed by the format's tool-call parser
(`tool_formats`; brief: `protocol.parse`) into OpenAI's shape, arguments a JSON string.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from c2jax.envs.chat import markup
from c2jax.envs.chat.chat_format import Continuation, ToolResult, deepseek_tools_prompt
from c2jax.envs.chat.chat_tokens import ChatTokens
from c2jax.envs.core.agent_env import TurnResult
from c2jax.envs.tools import protocol


class BadRequest(ValueError):
  """A request the endpoint refuses (HTTP 400); its message is one sentence saying what and how to fix."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """What the server takes: its model name, sampling, the longest reply and forced turn.

  Attributes:
    model: the name `/v1/models` lists (any name is accepted in a request).
    temperature, top_p: the engine's sampling (one for all slots); a request asking for others is refused.
    max_tokens: the longest reply, and the reply's length when a request gives none.
    max_forced: the longest earlier assistant turn, in tokens (`EngineConfig.max_forced`).
    context: positions per slot: the conversation and its reply must fit.
  """

  model: str
  temperature: float
  top_p: float
  max_tokens: int
  max_forced: int
  context: int


@dataclasses.dataclass(frozen=True)
class Request:
  """A checked chat-completion request.

  Attributes:
    messages: the conversation, each {"role", "content", ...} with string content.
    tools: the request's function definitions ({"type": "function", "function": {...}}), () without.
    tools_on: tool calls are parsed out of the reply (tool_choice "auto"; "none" leaves the text as content).
    max_tokens: the reply's budget.
    seed: the episode's seed (`jax.random.key(seed)`, as the agent loop keys an int seed); None: the server's.
    stream: answer with server-sent events.
    include_usage: a streamed answer ends with a usage chunk.
  """

  messages: tuple[Mapping[str, Any], ...]
  tools: tuple[Mapping[str, Any], ...] = ()
  tools_on: bool = True
  max_tokens: int = 16
  seed: int | None = None
  stream: bool = False
  include_usage: bool = False


def _text(content: Any, where: str) -> str:
  """A message content as text: a string, or OpenAI's list of text parts."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                       isinstance(p.get("text"), str) for p in content):
    return "".join(p["text"] for p in content)
  raise BadRequest(f"{where}.content must be a string or a list of text parts; this model reads text only.")


def _message(m: Any, i: int) -> dict:
  where = f"messages[{i}]"
  if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
    raise BadRequest(f"{where} must be an object whose role is system, developer, user, assistant or tool.")
  role = "system" if m["role"] == "developer" else m["role"]
  out: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
  if role == "assistant":
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
      raise BadRequest(f"{where}.tool_calls must be a list of function calls.")
    checked = []
    for k, c in enumerate(calls):
      fn = c.get("function") if isinstance(c, dict) else None
      if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
        raise BadRequest(f"{where}.tool_calls[{k}] must be {{'type': 'function', 'function': {{'name': str, "
                         "'arguments': str}}}.")
      checked.append({**({"id": c["id"]} if isinstance(c.get("id"), str) else {}), "type": "function",
                      "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    if checked:
      out["tool_calls"] = checked
    if isinstance(m.get("reasoning_content"), str):
      out["reasoning_content"] = m["reasoning_content"]
  if role == "tool" and isinstance(m.get("tool_call_id"), str):
    out["tool_call_id"] = m["tool_call_id"]
  return out


def parse_request(body: Any, limits: Limits) -> Request:
  """The request of a /v1/chat/completions body; BadRequest (one sentence) on anything the endpoint refuses."""
  if not isinstance(body, dict):
    raise BadRequest("The request body must be a JSON object.")
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise BadRequest("messages must be a non-empty list of chat messages.")
  msgs = tuple(_message(m, i) for i, m in enumerate(messages))
  if msgs[-1]["role"] == "assistant":
    raise BadRequest("The last message is an assistant message; end the conversation with a user or tool message "
                     "for the model to answer.")
  if not any(m["role"] == "user" for m in msgs):
    raise BadRequest("messages need a user message.")
  for i in range(1, len(msgs)):
    if msgs[i]["role"] == msgs[i - 1]["role"] == "assistant":
      raise BadRequest(f"messages[{i}] is a second assistant message in a row; put the user's or the tools' "
                       "message between them (each assistant message is one turn of the model).")
  tools = body.get("tools") or []
  if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" and
                                            isinstance(t.get("function"), dict) and
                                            isinstance(t["function"].get("name"), str) for t in tools):
    raise BadRequest("tools must be a list of {'type': 'function', 'function': {'name': ..., 'parameters': ...}}.")
  choice = body.get("tool_choice", "auto")
  if choice not in ("auto", "none"):
    raise BadRequest(f"tool_choice={choice!r} is not served; use 'auto' or 'none'.")
  max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
  max_tokens = limits.max_tokens if max_tokens is None else max_tokens
  if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= limits.max_tokens:
    raise BadRequest(f"max_tokens={max_tokens!r} must be an integer from 1 to {limits.max_tokens} (the server's "
                     "--max_tokens).")
  for name, served in (("temperature", limits.temperature), ("top_p", limits.top_p)):
    value = body.get(name)
    if value is not None and (not isinstance(value, (int, float)) or abs(float(value) - served) > 1e-6):
      raise BadRequest(f"{name}={value!r} is not served: every slot samples with {name}={served} (the server's "
                       f"--{name}); omit it or pass {served}.")
  n = body.get("n", 1)
  if n != 1:
    raise BadRequest(f"n={n!r} is not served; ask for one choice per request (n=1).")
  seed = body.get("seed")
  if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
    raise BadRequest(f"seed={seed!r} must be a non-negative integer below 2**63.")
  stream = body.get("stream", False)
  if not isinstance(stream, bool):
    raise BadRequest("stream must be true or false.")
  options = body.get("stream_options") or {}
  return Request(messages=msgs, tools=tuple(tools), tools_on=choice == "auto", max_tokens=max_tokens, seed=seed,
                 stream=stream, include_usage=bool(isinstance(options, dict) and options.get("include_usage")))


def turn_key(message: Mapping[str, Any]) -> str:
  """The identity of an assistant message as a client sends it back: its content and calls (names, arguments)."""
  calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
  return json.dumps([message.get("content") or "", calls], ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class Conversation:
  """A request as an episode's pieces (ids): the prompt, the forced turns (each ended as a turn ends), the
  continuation after each (markup: the environment's text apart from the template's control tokens)."""

  prompt: np.ndarray
  turns: tuple[np.ndarray, ...]
  continuations: tuple[markup.Markup, ...]

  def length(self, chat: ChatTokens) -> int:
    """Positions the conversation holds before its reply."""
    return len(self.prompt) + sum(len(t) for t in self.turns) + sum(len(chat.encode_markup(c))
                                                                     for c in self.continuations)


def _split(msgs: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[tuple[dict, list[dict]]]]:
  """(the messages before the first assistant one, [(each assistant message, the messages after it)])."""
  first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
  head, rounds = list(msgs[:first]), []
  for m in msgs[first:]:
    if m["role"] == "assistant":
      rounds.append((m, []))
    else:
      rounds[-1][1].append(m)
  return head, rounds


def render(request: Request, chat: ChatTokens,
           known_turns: Callable[[Mapping[str, Any]], np.ndarray | None] = lambda m: None) -> Conversation:
  """The request's conversation in `chat`'s format (see the module docstring); `known_turns(message)`: the ids the
  server drew for an assistant message it returned, or None."""
  if chat.native:
    return _render_native(request, chat, known_turns)
  return _render_brief(request, chat, known_turns)


def _render_brief(request: Request, chat: ChatTokens, known_turns) -> Conversation:
  head, rounds = _split(request.messages)
  system = "\n\n".join(m["content"] for m in head if m["role"] == "system" and m["content"])
  user = "\n\n".join(m["content"] for m in head if m["role"] != "system")
  prompt = chat.prompt(chat.format.prompt(system, user))
  turns, conts = [], []
  for message, after in rounds:
    text = message["content"]
    calls = []
    for c in message.get("tool_calls", []):
      try:
        args = json.loads(c["function"]["arguments"])
        calls.append(protocol.ToolCall(protocol.ToolName(c["function"]["name"]), args))
        rendered = protocol.render(calls[-1])
      except (ValueError, TypeError) as e:
        raise BadRequest(f"The brief format writes only its own tools' calls with string arguments; "
                         f"{c['function']['name']!r} cannot be written ({str(e)[:80]}).") from None
      if rendered not in text:
        text = "\n".join(p for p in (text, rendered) if p)
    known = known_turns(message)
    turns.append(chat.turn_ids(text) if known is None else known)
    results = [ToolResult(m["content"], call=k, tool=_call_name(message, m, k))
               for k, m in enumerate(x for x in after if x["role"] == "tool")]
    notice = "\n".join(m["content"] for m in after if m["role"] != "tool")
    cont = chat.format.continuation(text, results, notice)
    conts.append(cont.observation_markup + cont.notice_markup)
  return Conversation(prompt, tuple(turns), tuple(conts))


def _call_name(assistant: Mapping[str, Any], tool: Mapping[str, Any], k: int) -> str:
  """The name of the call a tool message answers: by its tool_call_id, else the k-th call."""
  calls = assistant.get("tool_calls", [])
  for c in calls:
    if c.get("id") and c.get("id") == tool.get("tool_call_id"):
      return c["function"]["name"]
  return calls[k]["function"]["name"] if k < len(calls) else ""


def _render_native(request: Request, chat: ChatTokens, known_turns) -> Conversation:
  fmt = chat.format
  msgs = [dict(m) for m in request.messages]
  tools = [dict(t) for t in request.tools]
  if fmt.tools_in_system and tools:
    system = msgs[0]["content"] if msgs[0]["role"] == "system" else ""
    text = "\n\n".join(p for p in (system, deepseek_tools_prompt(tools)) if p)
    msgs = [{"role": "system", "content": text}] + (msgs[1:] if msgs[0]["role"] == "system" else msgs)
  ends = [i + 1 for i, m in enumerate(msgs) if m["role"] == "assistant"]  # each assistant message's prefix
  if not ends:
    return Conversation(chat.encode_markup(fmt.render_markup(msgs, True, tools)), (), ())
  starts = [e - 1 for e in ends]
  texts = {}
  for n in sorted(set(starts + ends + [len(msgs)])):
    texts[n] = fmt.render(msgs[:n], n not in ends, tools)
  order = sorted(texts)
  append_only = all(texts[b].startswith(texts[a]) for a, b in zip(order, order[1:]))
  turn_texts = [texts[e][len(texts[s]):] for s, e in zip(starts, ends)]
  if not append_only or not all(t.endswith(fmt.end_of_turn) for t in turn_texts):
    # Not append-only (the template rewrites an earlier turn): the whole conversation is the prompt.
    return Conversation(chat.encode_markup(fmt.render_markup(msgs, True, tools)), (), ())
  whole = fmt.render_markup(msgs, True, tools)
  prompt = chat.encode_markup(markup.cut(whole, 0, len(texts[starts[0]])))
  turns = []
  for i, e in zip(starts, ends):
    known = known_turns(msgs[i])
    turns.append(chat.turn_ids(texts[e][len(texts[i]):-len(fmt.end_of_turn)]) if known is None else known)
  bounds = [len(texts[e]) for e in ends]
  nexts = [len(texts[s]) for s in starts[1:]] + [len(texts[len(msgs)])]
  conts = tuple(markup.cut(whole, a, b) for a, b in zip(bounds, nexts))
  return Conversation(prompt, tuple(turns), conts)


class ReplayEnv:
  """The environment of a served conversation: each turn's continuation is the request's messages after it; the
  episode ends after the last (the reply). `AgentEnv` of `c2jax.envs.core.agent_env`."""

  def __init__(self, continuations: Sequence[markup.Markup]):
    self.continuations = list(continuations)
    self.turn = 0

  def reset(self) -> None:
    self.turn = 0

  def step(self, ids: np.ndarray, text: str) -> TurnResult:
    del ids, text
    k, self.turn = self.turn, self.turn + 1
    if k >= len(self.continuations):
      return TurnResult(observation="", done=True, reason="finish")
    cont = Continuation(tuple(self.continuations[k]))
    return TurnResult(observation=cont.observation, continuation=cont)

  def reward(self) -> Mapping[str, float]:
    return {}

  def close(self) -> None:
    pass


def assistant_message(chat: ChatTokens, ids: Sequence[int], tools_on: bool) -> dict:
  """The OpenAI assistant message of a reply's ids: content, and (with tools on) tool_calls, each
  {"id", "type": "function", "function": {"name", "arguments": JSON text}}; a native format with reasoning gives
  reasoning_content apart. Calls are parsed by the format (a malformed one stays in the content)."""
  text = chat.turn_text(ids)
  if not chat.native:
    calls = protocol.parse(text).calls if tools_on else ()
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
      message["tool_calls"] = [{"id": f"call_{k}", "type": "function",
                                "function": {"name": c.name.value, "arguments": json.dumps(dict(c.args))}}
                               for k, c in enumerate(calls)]
    return message
  out = dict(chat.format.assistant_message(text))
  out["content"] = out.get("content") or ""
  calls = out.pop("tool_calls", None)
  if calls and tools_on:
    out["tool_calls"] = [{"id": c.get("id") or f"call_{k}", "type": "function", "function": dict(c["function"])}
                         for k, c in enumerate(calls)]
  elif calls:  # tool_choice "none": the calls as the model wrote them, in the content
    out["content"] = text
    out.pop("reasoning_content", None)
  if not out.get("reasoning_content"):
    out.pop("reasoning_content", None)
  return out
