"""OpenAI chat-completion requests as agent-loop episodes (c2jax/services/chat_completions.py), without a model: a
native conversation's pieces against the template's render of the whole conversation, replies parsed into
OpenAI's message shape, and the requests the endpoint refuses."""

import json

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, chat_format, deepseek_tools_prompt
from c2jax.envs.chat.chat_tokens import ChatTokens
from c2jax.envs.chat.tool_formats import tool_schemas
from c2jax.envs.tools import protocol
from c2jax.envs.tools.protocol import ToolCall, ToolName
from c2jax.services import chat_completions as cc
from c2jax.services import openai_server
from tests.data import chat_attacks

LIMITS = cc.Limits(model="m", temperature=1.0, top_p=1.0, max_tokens=64, max_forced=256, context=4096)
TOOLS = [t for t in tool_schemas() if t["function"]["name"] in ("read_file", "finish")]


def _chat(name: str) -> ChatTokens:
  return ChatTokens.of(name, make_tokenizer(chat_attacks.model_dir(name)))


def _conversation(name: str) -> list[dict]:
  """A user's task, a turn calling read_file, its result, a turn without calls, the user's answer."""
  fmt = chat_format(name)
  call_text = fmt.tool_format.render((ToolCall(ToolName.READ_FILE, {"path": "a.py"}),), first_index=0)
  call = fmt.assistant_message(call_text)
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Fix a.py."},
          {"role": "assistant", "content": call["content"], "tool_calls": call["tool_calls"]},
          {"role": "tool", "tool_call_id": call["tool_calls"][0].get("id", ""), "content": "x = 1\n"},
          {"role": "assistant", "content": "It looks fine."}, {"role": "user", "content": "Look again."}]


class RenderTest(parameterized.TestCase):

  @parameterized.parameters("deepseek_v3", "kimi_k2")
  def test_the_pieces_are_the_templates_render_of_the_whole_conversation(self, name):
    chat = _chat(name)
    messages = _conversation(name)
    request = cc.parse_request({"messages": messages, "tools": TOOLS}, LIMITS)
    conv = cc.render(request, chat)
    self.assertLen(conv.turns, 2)  # each earlier assistant message is a forced turn
    stream = [conv.prompt]
    for turn, cont in zip(conv.turns, conv.continuations):
      self.assertEqual(int(turn[-1]), chat.end_of_turn_id)
      stream += [turn, chat.encode_markup(cont)]
    # What the engine appends piece by piece is the template's render of the whole conversation (zero drift).
    fmt = chat.format
    msgs = messages
    if fmt.tools_in_system:
      msgs = [{"role": "system", "content": SYSTEM_PROMPT + "\n\n" + deepseek_tools_prompt(TOOLS)}] + msgs[1:]
    whole = chat.encode_markup(fmt.render_markup(msgs, True, TOOLS))
    np.testing.assert_array_equal(np.concatenate(stream), whole)
    self.assertEqual(conv.length(chat), len(whole))

  @parameterized.parameters("deepseek_v3", "kimi_k2")
  def test_a_known_turn_is_forced_as_drawn(self, name):
    chat = _chat(name)
    messages = _conversation(name)
    drawn = np.concatenate([chat.encode_model_text("It looks  fine."), [chat.end_of_turn_id]]).astype(np.int32)
    known = lambda m: drawn if m.get("content") == "It looks fine." else None
    conv = cc.render(cc.parse_request({"messages": messages, "tools": TOOLS}, LIMITS), chat, known)
    np.testing.assert_array_equal(conv.turns[1], drawn)

  def test_a_conversation_the_template_rewrites_is_one_prompt(self):
    # Kimi-K2's template drops the reasoning of turns before the last turn without calls: the first turn's reasoning
    # is rendered while it is the last, and dropped once a turn without calls follows it.
    chat = _chat("kimi_k2")
    messages = _conversation("kimi_k2")
    messages[2] = {**messages[2], "reasoning_content": "I should read it."}
    self.assertEqual(chat.format.boundary(messages[:3], messages[:5]).value, "segment_break")
    conv = cc.render(cc.parse_request({"messages": messages, "tools": TOOLS}, LIMITS), chat)
    self.assertEqual((conv.turns, conv.continuations), ((), ()))
    np.testing.assert_array_equal(conv.prompt,
                                  chat.encode_markup(chat.format.render_markup(messages, True, TOOLS)))

  @parameterized.parameters("deepseek_v3", "kimi_k2")
  def test_a_reply_with_calls_is_openai_tool_calls(self, name):
    chat = _chat(name)
    calls = (ToolCall(ToolName.READ_FILE, {"path": "a.py"}), ToolCall(ToolName.RUN, {"command": "pytest -q"}))
    text = chat.format.tool_format.render(calls, content="Let me look.", first_index=3)
    message = cc.assistant_message(chat, chat.turn_ids(text), tools_on=True)
    self.assertEqual(message["content"], "Let me look.")
    self.assertEqual([(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                      for c in message["tool_calls"]],
                     [("function", "read_file", {"path": "a.py"}), ("function", "run", {"command": "pytest -q"})])
    self.assertLen({c["id"] for c in message["tool_calls"]}, 2)
    # tool_choice "none": the text as the model wrote it, no calls.
    plain = cc.assistant_message(chat, chat.turn_ids(text), tools_on=False)
    self.assertNotIn("tool_calls", plain)
    self.assertEqual(plain["content"], text)

  def test_brief_replies_parse_the_environments_calls(self):
    chat = ChatTokens.of("brief", ByteTokenizer())
    text = "I read it.\n" + protocol.render(ToolCall(ToolName.READ_FILE, {"path": "a.py"}))
    message = cc.assistant_message(chat, chat.turn_ids(text), tools_on=True)
    self.assertEqual(message["content"], text)
    self.assertEqual(message["tool_calls"][0]["function"], {"name": "read_file", "arguments": '{"path": "a.py"}'})
    # Sent back, the message is written once: its content already holds its call.
    request = cc.parse_request({"messages": [{"role": "user", "content": "Fix a.py."}, message,
                                             {"role": "tool", "content": "x = 1"}]}, LIMITS)
    np.testing.assert_array_equal(cc.render(request, chat).turns[0], chat.turn_ids(text))


class RefusalTest(parameterized.TestCase):

  @parameterized.parameters(
      ([], "JSON object"),
      ({"messages": []}, "messages"),
      ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text"),
      ({"messages": [{"role": "system", "content": "s"}]}, "user message"),
      ({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                     {"role": "assistant", "content": "b"}, {"role": "user", "content": "u"}]}, "in a row"),
      ({"messages": [{"role": "user", "content": "u"}], "n": 2}, "n=2"),
      ({"messages": [{"role": "user", "content": "u"}], "seed": -1}, "seed"),
      ({"messages": [{"role": "user", "content": "u"}], "top_p": 0.5}, "top_p"),
      ({"messages": [{"role": "user", "content": "u"}], "max_completion_tokens": 0}, "max_tokens"),
      ({"messages": [{"role": "user", "content": "u"}], "tools": [{"type": "function"}]}, "tools"),
      ({"messages": [{"role": "user", "content": "u"},
                     {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
                     {"role": "tool", "content": "r"}]}, "tool_calls[0]"),
  )
  def test_refused_in_one_sentence(self, body, words):
    with self.assertRaises(cc.BadRequest) as e:
      cc.parse_request(body, LIMITS)
    self.assertIn(words, str(e.exception))
    self.assertTrue(str(e.exception).endswith("."))

  def test_brief_refuses_a_call_it_cannot_write(self):
    request = cc.parse_request({"messages": [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny"}]}, LIMITS)
    with self.assertRaisesRegex(cc.BadRequest, "get_weather"):
      cc.render(request, ChatTokens.of("brief", ByteTokenizer()))

  def test_defaults(self):
    request = cc.parse_request({"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}],
                                "temperature": 1, "tool_choice": "none"}, LIMITS)
    self.assertEqual((request.max_tokens, request.seed, request.stream, request.tools_on), (64, None, False, False))
    self.assertEqual(request.messages[0]["role"], "system")


class ServeConfigTest(parameterized.TestCase):

  @parameterized.parameters(
      (dict(checkpoint=""), "--checkpoint"),
      (dict(checkpoint="c", chat_format="chatml"), "--chat_format"),
      (dict(checkpoint="c", max_tokens=0), "--max_tokens"),
      (dict(checkpoint="c", max_tokens=4096, context=4096), "--max_tokens"),
      (dict(checkpoint="c", max_forced=0), "--max_forced"),
      (dict(checkpoint="c", top_p=0.0), "--top_p"),
  )
  def test_bad_flags_are_refused_in_one_sentence(self, kwargs, words):
    with self.assertRaises(ValueError) as e:
      openai_server.ServeConfig(**kwargs)
    self.assertIn(words, str(e.exception))


if __name__ == "__main__":
  absltest.main()
