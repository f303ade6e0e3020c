"""Zero token drift: an agent episode appended piece by piece (prompt, turns, end-of-turn tokens, continuations;
each piece tokenized apart, as the engine does) equals the real chat template's rendering of the whole
conversation, by transformers' apply_chat_template and by c2jax's renderer, then tokenized, at every append-only
boundary; the boundaries that are not append-only (a summary, Kimi's dropped reasoning, a user turn after a
rendered generation prompt) are detected, and there the naive stream differs. The brief format keeps today's text,
and CodingEnv speaks every format."""

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.chat import self_summary
from c2jax.envs.chat.chat_format import (CHAT_FORMATS, SYSTEM_PROMPT, Boundary, Step, ToolResult, chat_format,
                                    deepseek_tools_prompt)
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.tools.protocol import ToolCall, ToolName
from c2jax.envs.chat.tool_formats import tool_schemas
from tests.data import chat_tokenizers
from tests.envs.core.env_test import FIXED, TASK

NATIVE = ("deepseek_v3", "kimi_k2")
USER = "[8 turns, about 8192 tokens]\nRepository files:\ncalc.py\n\nadd() subtracts; make it add."


def call(name, **args):
  return ToolCall(ToolName(name), args)


# (calls, content, reasoning, results): an agent's episode. Results: (text, call index or None, ok).
EPISODE = [
    ([call("read_file", path="calc.py")], "", "The bug is in calc.py; read it.",
     [("def add(a, b):\n  return a - b\n", 0, True)]),
    ([call("edit", path="calc.py", search="a - b", replace="a + b"), call("run", command="python3 -m unittest -q")],
     "Fixing the sign, then testing.", "",
     [("edited calc.py at line 2 (-1 +1 lines).", 0, True), ("exit code 1\n--- stderr ---\nFAILED", 1, False),
      ('malformed tool call, not run: grep: missing argument \'pattern\'.', None, True)]),
    ([call("write_file", path="calc.py", content=FIXED), call("finish")], "", "Rewrite it whole.",
     [("wrote calc.py (6 lines).", 0, True), ("finished.", 1, True)]),
]


def tokenizer(fmt):
  special = fmt.template.special_tokens
  return chat_tokenizers.tokenizer(fmt.control_tokens, fmt.template.source, special["bos_token"],
                                   special["eos_token"])


class ChatFormatTest(parameterized.TestCase):

  def hf_ids(self, fmt, messages):
    """transformers' rendering of `messages` as the engine holds them, tokenized."""
    tok = tokenizer(fmt)
    return tok.apply_chat_template(messages, tools=None if fmt.tools_in_system else tool_schemas(), tokenize=True,
                                   return_dict=False, add_generation_prompt=messages[-1]["role"] != "assistant",
                                   **fmt.template_kwargs)

  def play(self, name, episode, system=SYSTEM_PROMPT):
    """Runs `episode` piece by piece; checks drift 0 at every boundary; returns (steps, stream text, ids)."""
    fmt = chat_format(name)
    tok = tokenizer(fmt)
    text = fmt.prompt(system, USER)
    ids = chat_tokenizers.encode(tok, text)
    self.assertEqual(ids, self.hf_ids(fmt, fmt.messages(system, USER, [])))
    steps, index = [], 0
    for calls, content, reasoning, results in episode:
      turn = fmt.tool_format.render(calls, content=content,
                                    reasoning=reasoning if name == "kimi_k2" else "", first_index=index)
      index += len(calls)
      for piece in (turn, fmt.end_of_turn):
        text += piece
        ids += chat_tokenizers.encode(tok, piece)
      results = tuple(ToolResult(t, call=c, ok=ok, tool=calls[c].name.value if c is not None else "")
                      for t, c, ok in results)
      notice = f"[turn {len(steps) + 1} of 8; about {40 * (len(steps) + 1)} of 8192 tokens used]"
      messages = fmt.messages(system, USER, steps) + [fmt.assistant_message(turn)]
      self.assertEqual(fmt.held(messages), text)  # after the turn and its end-of-turn token
      self.assertEqual(ids, self.hf_ids(fmt, messages))
      cont = fmt.continuation(turn, results, notice)
      for piece in (cont.observation, cont.notice):
        text += piece
        ids += chat_tokenizers.encode(tok, piece)
      steps.append(Step(turn, results, notice))
      messages = fmt.messages(system, USER, steps)
      self.assertEqual(fmt.held(messages), text)  # after the continuation, up to the generation prompt
      self.assertEqual(ids, self.hf_ids(fmt, messages))
      self.assertEqual(ids, chat_tokenizers.encode(tok, text))
    return steps, text, ids

  @parameterized.parameters(*NATIVE)
  def test_an_agent_episode_has_zero_drift(self, name):
    _, text, _ = self.play(name, EPISODE)
    fmt = chat_format(name)
    self.assertIn("malformed tool call, not run", text)
    self.assertIn("error: exit code 1", text)
    if name == "kimi_k2":
      self.assertIn("<|im_system|>tool<|im_middle|>## Return of functions.run:2\nerror: exit code 1", text)
      self.assertIn("<think>The bug is in calc.py; read it.</think>", text)  # reasoning kept: every turn calls
      self.assertTrue(text.endswith("<|im_assistant|>assistant<|im_middle|>"))
    else:
      self.assertIn(deepseek_tools_prompt(tool_schemas()), text)
      self.assertTrue(text.endswith("tokens used]<｜tool▁output▁end｜>"))  # the model goes on after tool outputs
    self.assertEqual(fmt.boundary(fmt.messages(SYSTEM_PROMPT, USER, []), fmt.messages(SYSTEM_PROMPT, USER, [])),
                     Boundary.APPEND)

  @parameterized.parameters(*NATIVE)
  def test_turns_without_a_call_are_answered_by_the_harness(self, name):
    """A prose-only turn and a turn whose only call is malformed: the harness's message answers both (as the
    user for DeepSeek, a system message for Kimi); without reasoning it stays append-only."""
    fmt = chat_format(name)
    prose = [([], "I am not sure what to do.", "", [("no tool call found; call a tool, or finish.", None, True)])]
    steps, text, _ = self.play(name, EPISODE[:1] + prose + EPISODE[1:2]) if name == "deepseek_v3" else \
        self.play(name, [(c, t, "", r) for c, t, _, r in EPISODE[:1]] + prose + [
            (c, t, "", r) for c, t, _, r in EPISODE[1:2]])
    harness = "<｜User｜>no tool call found" if name == "deepseek_v3" else "<|im_system|>system<|im_middle|>no tool"
    self.assertIn(harness, text)
    malformed = fmt.tool_format.render([call("read_file", path="a.py")]).replace('"path"', '"paht"')
    cont = fmt.continuation(malformed, [ToolResult("malformed tool call, not run: ...")], "[turn 9]")
    self.assertEqual(cont.observation, "")
    self.assertIn("malformed tool call", cont.notice)

  def test_kimi_drops_reasoning_before_a_turn_without_calls(self):
    """Kimi's template renders <think></think> for every assistant message up to the last one without tool calls:
    such a turn after turns with reasoning rewrites them, a segment break the naive stream cannot follow."""
    fmt = chat_format("kimi_k2")
    steps, text, ids = self.play("kimi_k2", EPISODE[:1])
    before = fmt.messages(SYSTEM_PROMPT, USER, steps)
    final = fmt.tool_format.render([], content="Done: add() adds now.", reasoning="All good.")
    after = before + [fmt.assistant_message(final)]
    self.assertEqual(fmt.boundary(before, after), Boundary.SEGMENT_BREAK)
    naive = text + final + fmt.end_of_turn
    self.assertNotEqual(fmt.held(after), naive)
    self.assertNotEqual(chat_tokenizers.encode(tokenizer(fmt), naive), self.hf_ids(fmt, after))
    self.assertIn("<think></think><|tool_calls_section_begin|>", fmt.held(after))  # the earlier reasoning, gone
    # Without any reasoning the same step is append-only.
    plain = [(c, t, "", r) for c, t, _, r in EPISODE[:1]]
    steps, text, _ = self.play("kimi_k2", plain)
    before = fmt.messages(SYSTEM_PROMPT, USER, steps)
    final = fmt.tool_format.render([], content="Done.")
    self.assertEqual(fmt.boundary(before, before + [fmt.assistant_message(final)]), Boundary.APPEND)
    self.assertEqual(fmt.held(before + [fmt.assistant_message(final)]), text + final + fmt.end_of_turn)

  @parameterized.parameters(*NATIVE)
  def test_summary_is_a_segment_break_and_its_request_a_user_turn(self, name):
    fmt = chat_format(name)
    tok = tokenizer(fmt)
    steps, text, ids = self.play(name, EPISODE[:2])
    last = steps[-1]
    # The request in place of the generation prompt (as continuation writes it): append-only.
    request = fmt.summary_request(64)
    with_request = steps[:-1] + [Step(last.turn, last.results, last.notice, request=request)]
    cont = fmt.continuation(last.turn, last.results, last.notice, request=request)
    messages = fmt.messages(SYSTEM_PROMPT, USER, with_request)
    self.assertEqual(fmt.boundary(fmt.messages(SYSTEM_PROMPT, USER, steps[:-1]), messages), Boundary.APPEND)
    before_cont = text[:len(text) - len(fmt.continuation(last.turn, last.results, last.notice).text)]
    self.assertEqual(fmt.held(messages), before_cont + cont.text)
    self.assertIn(self_summary.REQUEST_MARK, cont.notice)
    # Appended after the generation prompt already written, the request is not what the template writes.
    naive_request = text + request
    self.assertNotEqual(fmt.held(messages), naive_request)
    # The summary, then the new segment: a rewrite, not an append.
    summary = "calc.py: the sign of add() was wrong; fixed; tests not run yet."
    new_segment = fmt.segment_prompt(SYSTEM_PROMPT, USER, summary)
    naive = fmt.prompt(SYSTEM_PROMPT, USER) + self_summary.resume(summary)
    self.assertNotEqual(new_segment, naive)
    self.assertFalse(new_segment.startswith(fmt.prompt(SYSTEM_PROMPT, USER)))
    new_ids, old_ids = chat_tokenizers.encode(tok, new_segment), chat_tokenizers.encode(tok, fmt.prompt(
        SYSTEM_PROMPT, USER))
    shared = next(i for i, (a, b) in enumerate(zip(new_ids, old_ids)) if a != b)
    self.assertGreater(shared, len(chat_tokenizers.encode(tok, SYSTEM_PROMPT)))  # the system prompt's cache stays
    self.assertEqual(fmt.boundary(fmt.messages(SYSTEM_PROMPT, USER, []),
                                  fmt.messages(SYSTEM_PROMPT, USER + self_summary.resume(summary).rstrip("\n"), [])),
                     Boundary.SEGMENT_BREAK)
    self.assertIn(summary, new_segment)

  def test_brief_is_todays_raw_text(self):
    fmt = chat_format("brief")
    self.assertEqual(CHAT_FORMATS.names(), ["brief", "deepseek_v3", "kimi_k2"])
    self.assertFalse(fmt.native)
    self.assertEqual((fmt.end_of_turn, fmt.prompt("", USER)), ("", USER))
    results = [ToolResult("a.py", call=0, tool="read_file"), ToolResult("no such file", call=1, ok=False, tool="edit"),
               ToolResult("malformed tool call, not run: x.")]
    cont = fmt.continuation("ignored", results, "[turn 1 of 8]")
    self.assertEqual(cont.text, '<result tool="read_file">\na.py\n</result>\n<error tool="edit">\nno such file\n'
                     "</error>\n<error>malformed tool call, not run: x.</error>\n[turn 1 of 8]")
    self.assertEqual(cont.notice, "\n[turn 1 of 8]")
    self.assertEqual(fmt.continuation("", [ToolResult("x" * 100, call=0, tool="run")], "n", max_bytes=40).observation,
                     '<result tool="run">\nxxxxxxxxxx\n[... 90 bytes cut ...]\n\n</result>')  # clipped as a whole
    self.assertEqual(fmt.segment_prompt("", USER, "s"), USER + self_summary.resume("s"))
    self.assertEqual(fmt.summary_request(9), self_summary.request(9))
    with self.assertRaisesRegex(ValueError, "no chat template"):
      fmt.messages("", USER, [])
    with self.assertRaisesRegex(ValueError, "Unknown chat format 'chatml'"):
      chat_format("chatml")


class ChatFormatEnvTest(parameterized.TestCase):
  """CodingEnv over the real sandbox, speaking a native format end to end."""

  def setUp(self):
    super().setUp()
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))

  @parameterized.parameters(*NATIVE)
  def test_env_episode_in_a_native_format(self, name):
    fmt = chat_format(name)
    env = CodingEnv(EnvConfig(chat_format=name, max_turns=4))
    self.addCleanup(env.close)
    first = env.reset(TASK)
    self.assertNotIn("<tool", first)  # the template declares the tools
    self.assertIn("add() subtracts; make it add.", first)
    tok = tokenizer(fmt)
    text = fmt.prompt(SYSTEM_PROMPT, first)
    ids = chat_tokenizers.encode(tok, text)
    turns = [fmt.tool_format.render([call("read_file", path="calc.py"), call("grep", pattern="(")]),
             fmt.tool_format.render([call("write_file", path="calc.py", content=FIXED),
                                     call("run", command="python3 -m unittest -q")], first_index=2)
             .replace("</think>", "</think>Fixing.", 1) if name == "kimi_k2" else
             "Fixing." + fmt.tool_format.render([call("write_file", path="calc.py", content=FIXED),
                                                 call("run", command="python3 -m unittest -q")]),
             fmt.tool_format.render([call("finish")], first_index=4)]
    steps = []
    for turn in turns:
      result = env.step(turn)
      self.assertEqual(result.observation, result.continuation.text)
      steps.append(Step(turn, result.results, result.notice))
      for piece in (turn, fmt.end_of_turn, result.continuation.observation, result.continuation.notice):
        text += piece
        ids += chat_tokenizers.encode(tok, piece)
      messages = fmt.messages(SYSTEM_PROMPT, first, steps)
      self.assertEqual(fmt.held(messages), text)
      self.assertEqual(ids, tokenizer(fmt).apply_chat_template(
          messages, tools=None if fmt.tools_in_system else tool_schemas(), tokenize=True, return_dict=False,
          add_generation_prompt=True, **fmt.template_kwargs))
    self.assertTrue(result.done)
    self.assertIn("bad regex", text)  # grep's error reached the model
    self.assertIn("error: ", text)
    self.assertEqual(env.reward()["passed"], 1.0)
    self.assertEqual(env.reward()["malformed_tool_calls"], 0.0)

  def test_env_counts_malformed_and_incomplete_native_calls(self):
    env = CodingEnv(EnvConfig(chat_format="deepseek_v3", max_turns=3))
    self.addCleanup(env.close)
    env.reset(TASK)
    fmt = chat_format("deepseek_v3")
    good = fmt.tool_format.render([call("read_file", path="calc.py")])
    result = env.step(good.replace('"path"', '"paht"') + good[:good.index("calc.py")])  # the second one cut off
    self.assertEqual(result.info["step_malformed_tool_calls"], 2)
    self.assertEqual(result.info["step_incomplete_tool_calls"], 1)
    self.assertIn("<｜User｜>malformed tool call, not run: read_file: unknown argument 'paht'", result.observation)
    self.assertTrue(result.observation.endswith("<｜Assistant｜></think>"))


if __name__ == "__main__":
  absltest.main()
