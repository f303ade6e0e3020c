"""Tool-call formats: round trips, text equal to the real templates' rendering of the assistant message, strict
and total parsing (malformed JSON, unknown tools, missing arguments, cut-off text at every prefix, random garbage
in linear time)."""

import json
import random
import time

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tools import protocol
from c2jax.envs.chat.chat_format import chat_format
from c2jax.envs.tools.protocol import ToolCall, ToolName
from c2jax.envs.chat.tool_formats import TOOL_FORMATS, tool_schemas
from tests.envs.tools.protocol_test import CALLS, fuzz_text

NATIVE = ("deepseek_v3", "kimi_k2")
# One call, written by hand as each format writes it (and its template renders it).
ONE_CALL = {
    "deepseek_v3": ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "a.py"}'
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "kimi_k2": ('<think></think><|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0'
                '<|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|><|tool_calls_section_end|>'),
}


def wrap(name, arguments, fmt="deepseek_v3", head=None):
  """One call with raw arguments in a native format."""
  if fmt == "deepseek_v3":
    return (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{head or name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"
            "<｜tool▁calls▁end｜>")
  return (f"<think></think><|tool_calls_section_begin|><|tool_call_begin|>{head or f'functions.{name}:0'}"
          f"<|tool_call_argument_begin|>{arguments}<|tool_call_end|><|tool_calls_section_end|>")


class ToolFormatsTest(parameterized.TestCase):

  def test_registry_and_schemas(self):
    self.assertEqual(TOOL_FORMATS.names(), ["brief", "deepseek_v3", "kimi_k2"])
    schemas = tool_schemas()
    self.assertEqual([s["function"]["name"] for s in schemas], [t.value for t in ToolName])
    for schema in schemas:
      fn = schema["function"]
      required, optional = protocol.TOOL_ARGS[ToolName(fn["name"])]
      self.assertEqual(fn["parameters"]["required"], list(required))
      self.assertEqual(list(fn["parameters"]["properties"]), list(required + optional))
      self.assertNotIn("\n", fn["description"])
      json.dumps(schema)  # plain JSON

  @parameterized.parameters("brief", *NATIVE)
  def test_round_trips(self, name):
    fmt = TOOL_FORMATS.get(name)
    for calls in [CALLS, CALLS[:1], [], CALLS[::-1]]:
      for content in ("", "I will look first.\n"):
        text = fmt.render(calls, content=content, first_index=5)
        parsed = fmt.parse(text)
        self.assertEqual(parsed.calls, tuple(calls))
        self.assertEqual(parsed.errors, ())
        self.assertFalse(parsed.incomplete)
        if name != "brief":
          turn = fmt.turn(text)
          self.assertTrue(turn.exact)
          self.assertEqual(turn.content, content)
    one = ToolCall(ToolName.READ_FILE, {"path": "a.py"})
    self.assertEqual(fmt.parse(ONE_CALL.get(name, protocol.render(one))).calls, (one,))

  def test_brief_is_the_protocol(self):
    fmt = TOOL_FORMATS.get("brief")
    text = fmt.render(CALLS)
    self.assertEqual(text, "\n".join(protocol.render(c) for c in CALLS))
    for t in [text, text[:50], "<tool name=", "garbage"]:
      self.assertEqual(fmt.parse(t), protocol.parse(t))

  @parameterized.parameters(*NATIVE)
  def test_render_equals_the_templates_assistant_message(self, name):
    """The text the model writes (its turn, then the end-of-turn token) is what its template writes for an
    assistant message with those tool calls, after the generation prompt."""
    cf = chat_format(name)
    head = [{"role": "user", "content": "Fix it."}]
    prompt = cf.render(head, add_generation_prompt=True)
    for calls, content, reasoning in [(CALLS, "", ""), (CALLS[2:4], "Let me edit.", ""),
                                      (CALLS[:1], "", "I should read first." if name == "kimi_k2" else "")]:
      text = cf.tool_format.render(calls, content=content, reasoning=reasoning)
      message = {"role": "assistant", "content": content, "tool_calls": [
          {"type": "function", "function": {"name": c.name.value, "arguments": json.dumps(
              {a: c.args[a] for a in sum(protocol.TOOL_ARGS[c.name], ()) if a in c.args}, ensure_ascii=False)},
           "id": f"functions.{c.name.value}:{i}"} for i, c in enumerate(calls)]}
      if reasoning:
        message["reasoning_content"] = reasoning
      whole = cf.render(head + [message])
      self.assertEqual(whole, prompt + text + cf.end_of_turn)

  @parameterized.parameters(*NATIVE)
  def test_malformed_calls_are_errors_not_calls(self, name):
    fmt = TOOL_FORMATS.get(name)
    cases = {
        "not valid JSON": wrap("read_file", '{"path": "a.py"', name),
        "one JSON object": wrap("read_file", '["a.py"]', name),
        "must be a string": wrap("read_file", '{"path": 3}', name),
        "unknown tool 'nope'": wrap("nope", "{}", name),
        "missing argument 'path'": wrap("read_file", "{}", name),
        "unknown argument 'x'": wrap("read_file", '{"path": "a", "x": "1"}', name),
        "given twice": wrap("read_file", '{"path": "a", "path": "b"}', name),
        "is empty": wrap("run", '{"command": " "}', name),
        "must be one line": wrap("grep", '{"pattern": "a\\nb"}', name),
    }
    for expected, text in cases.items():
      with self.subTest(expected):
        parsed = fmt.parse(text)
        self.assertEqual(parsed.calls, ())
        self.assertLen(parsed.errors, 1)
        self.assertIn(expected, parsed.errors[0])
        self.assertFalse(parsed.incomplete)
        self.assertFalse(fmt.turn(text).exact)
    good = fmt.render([CALLS[0]])
    # A bad call beside good ones: only it is refused.
    mixed = good.replace(fmt.section_end, "") + wrap("nope", "{}", name).split(fmt.section_begin)[1]
    parsed = fmt.parse(mixed)
    self.assertEqual(parsed.calls, (CALLS[0],))
    self.assertLen(parsed.errors, 1)

  def test_kimi_ids_and_deepseek_names(self):
    kimi = TOOL_FORMATS.get("kimi_k2")
    for head in ("read_file:0", "functions.read_file", "functions.read-file:0", "x" * 300):
      with self.subTest(head=head[:20]):
        self.assertIn("is not functions.NAME:INDEX", kimi.parse(wrap("read_file", '{"path": "a"}', "kimi_k2",
                                                                      head)).errors[0])
    turn = kimi.turn(kimi.render(CALLS[:3], first_index=7))
    self.assertEqual([c.id for c in turn.calls], ["functions.read_file:7", "functions.write_file:8",
                                                  "functions.write_file:9"])
    self.assertIn("without a tool name", TOOL_FORMATS.get("deepseek_v3").parse(wrap("", "{}", head=" ")).errors[0])

  @parameterized.parameters(*NATIVE)
  def test_stray_markers_and_text(self, name):
    fmt = TOOL_FORMATS.get(name)
    good = fmt.render([CALLS[0]])
    stray = [good.replace(fmt.call_begin, fmt.call_begin + "x" + fmt.call_end, 1),  # a call with no separator
             good.replace(fmt.section_begin, fmt.section_begin + "hello "),         # prose inside the section
             fmt.call_end + good,                                                    # a marker outside a section
             good.replace(fmt.call_end, fmt.separator + fmt.call_end)]              # two separators
    for text in stray:
      parsed = fmt.parse(text)
      self.assertNotEqual(parsed.errors, (), text)
      self.assertFalse(parsed.incomplete)
      self.assertFalse(fmt.turn(text).exact)
    # Prose after the section, and whitespace between calls, are not errors, but no longer the template's text.
    for text in (good + " bye", good.replace(fmt.call_begin, "\n" + fmt.call_begin)):
      parsed = fmt.parse(text)
      self.assertEqual((parsed.calls, parsed.errors), ((CALLS[0],), ()))
      self.assertFalse(fmt.turn(text).exact)

  @parameterized.parameters(*NATIVE)
  def test_every_prefix_of_a_valid_turn_is_incomplete_never_an_error_or_a_raise(self, name):
    fmt = TOOL_FORMATS.get(name)
    text = fmt.render(CALLS[2:5], content="Plan.")
    opening = text.index(fmt.section_begin)
    for i in range(len(text)):
      parsed = fmt.parse(text[:i])
      if i <= opening + 1:  # prose, or prose ending in a lone "<"
        self.assertEqual(parsed.calls, (), i)  # still prose (or reasoning): no call begun
        self.assertFalse(parsed.incomplete, i)
        self.assertEqual(parsed.errors, (), i)
      else:
        self.assertTrue(parsed.incomplete, (i, text[:i]))
        self.assertLen(parsed.errors, 1, i)
        self.assertEqual(parsed.calls, tuple(CALLS[2:5])[:len(parsed.calls)])
    self.assertFalse(fmt.parse(text).incomplete)

  @parameterized.parameters("brief", *NATIVE)
  def test_random_garbage_never_raises_and_stays_linear(self, name):
    fmt = TOOL_FORMATS.get(name)
    rng = random.Random(0)
    pieces = ([fmt.section_begin, fmt.section_end, fmt.call_begin, fmt.separator, fmt.call_end, "<think>",
               "</think>", '{"path": "a.py"}', "functions.run:0", "read_file", "{", '"', "\\"]
              if name != "brief" else ["<tool", "</tool>", "<arg", "</arg>"])
    for _ in range(300):
      text = fuzz_text(rng) if rng.random() < 0.5 else "".join(rng.choice(pieces) for _ in range(rng.randrange(30)))
      parsed = fmt.parse(text)
      fmt.turn(text)
      for c in parsed.calls:
        self.assertIsInstance(c, ToolCall)
    self.assertNotEqual(fmt.parse(None).errors, ())
    # Linear time: a long run of openings (each search moves forward) and deep JSON parse quickly.
    n = 20000
    bad = ["<tool " * n, '<tool name="run">' + "<arg " * n, "[" * n]
    if name != "brief":
      bad += [fmt.section_begin + fmt.call_begin * n, fmt.call_begin * n, wrap("read_file", "[" * n, name),
              fmt.section_begin + (fmt.call_begin + "read_file" + fmt.separator) * n]
    for text in bad:
      start = time.perf_counter()
      fmt.parse(text)
      self.assertLess(time.perf_counter() - start, 2.0)

  def test_render_refuses_what_parse_cannot_give(self):
    kimi = TOOL_FORMATS.get("kimi_k2")
    with self.assertRaisesRegex(ValueError, "missing argument"):
      kimi.render([ToolCall(ToolName.READ_FILE, {})])
    with self.assertRaisesRegex(ValueError, "markers"):
      kimi.render(CALLS[:1], content="<|tool_call_begin|>")
    with self.assertRaisesRegex(ValueError, "reasoning must not"):
      kimi.render(CALLS[:1], reasoning="a</think>b")
    with self.assertRaisesRegex(ValueError, "no reasoning"):
      TOOL_FORMATS.get("deepseek_v3").render(CALLS[:1], reasoning="r")


if __name__ == "__main__":
  absltest.main()
