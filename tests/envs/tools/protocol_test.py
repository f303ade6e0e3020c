"""The tool-call format: render/parse round trips, and a parser that is total (never raises, stays linear) and
tells malformed calls from cut-off ones, over hand-made, random and adversarial texts."""

import random
import time

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tools import protocol
from c2jax.envs.tools.protocol import ParseResult, ToolCall, ToolName, parse, render

# Values that stress the format: its own tags, the heredoc terminator, quotes, newlines at either end, unicode.
NASTY = ["", "x", "\n", "\n\n", " lead and trail ", "a\nb", "\nstarts", "ends\n", "</arg>", "</tool>",
         '<tool name="run">', "<arg", "</EOF>", "</EOF></EOF1>", 'say "hi" > out', "tab\tand\r\nCRLF",
         "ünïcødé ✓ 🐍", "<tools> and <article>", "<", ">", "a </arg> b <tool name=\"x\"> c </EOF>"]
ONE_LINE = [v for v in NASTY if "\n" not in v and v.strip()]

CALLS = [
    ToolCall(ToolName.READ_FILE, {"path": "pkg/util.py"}),
    ToolCall(ToolName.WRITE_FILE, {"path": "a.py", "content": ""}),
    ToolCall(ToolName.WRITE_FILE, {"path": "dir/new file.py", "content": "def f(x):\n    return x\n"}),
    ToolCall(ToolName.EDIT, {"path": "m.py", "search": "    return a - b\n", "replace": "    return a + b\n"}),
    ToolCall(ToolName.EDIT, {"path": "m.py", "search": "x", "replace": ""}),
    ToolCall(ToolName.RUN, {"command": "python3 -m unittest -q 2>&1 | tail -3"}),
    ToolCall(ToolName.RUN, {"command": "cat <<EOF > f.txt\n</arg></tool>\nEOF\n"}),
    ToolCall(ToolName.GREP, {"pattern": r"def \w+\(", "path": "pkg"}),
    ToolCall(ToolName.GREP, {"pattern": " leading space"}),
    ToolCall(ToolName.SEARCH_CODE, {"query": "parse a date string"}),
    ToolCall(ToolName.WEB_SEARCH, {"query": " json.dumps <indent> "}),
    ToolCall(ToolName.FINISH, {}),
]

# Fragments for a grammar fuzzer: pieces of well-formed calls, near misses and noise.
FRAGMENTS = ['<tool name="edit">', '<tool name="read_file">', '<tool name="finish"/>', '<tool name="run">',
             '<tool name="nope">', "<tool", "<tool ", '<tool name=', '"', "</tool>", "</tool", '<arg name="path">',
             '<arg name="command">', '<arg name="search" end="EOF">', '<arg name="content">', "</arg>", "</EOF>",
             '<arg name="', "<arg", "<", ">", "/>", "\n", " ", "a.py", "ls", "x", "<tools>", "</", "end=", "EOF"]


def random_call(rng: random.Random) -> ToolCall:
  name = rng.choice(list(ToolName))
  required, optional = protocol.TOOL_ARGS[name]
  args = {}
  for a in required + tuple(o for o in optional if rng.random() < 0.5):
    if a == "path":
      args[a] = rng.choice(["a.py", "pkg/b c.py", "x<y>.txt", "ünï.py"])
    elif a in ("pattern", "query", "command", "search"):
      args[a] = rng.choice(ONE_LINE + [v for v in NASTY if v.strip()] if a in ("command", "search") else ONE_LINE)
    else:
      args[a] = rng.choice(NASTY)
  return ToolCall(name, args)


def fuzz_text(rng: random.Random) -> str:
  kind = rng.randrange(4)
  if kind == 0:  # random bytes, decoded leniently
    return bytes(rng.randrange(256) for _ in range(rng.randrange(200))).decode("utf-8", errors="replace")
  if kind == 1:  # random code points, including surrogates and controls
    return "".join(chr(rng.randrange(0x110000) if rng.random() < 0.3 else rng.randrange(128))
                   for _ in range(rng.randrange(200)))
  pieces = [rng.choice(FRAGMENTS) for _ in range(rng.randrange(40))]
  if kind == 3:  # valid calls with fragments spliced in
    pieces = [render(random_call(rng)) if rng.random() < 0.3 else p for p in pieces]
  return "".join(pieces)


def check_well_typed(test: absltest.TestCase, result: ParseResult) -> None:
  test.assertIsInstance(result, ParseResult)
  test.assertIsInstance(result.incomplete, bool)
  for error in result.errors:
    test.assertIsInstance(error, str)
  for call in result.calls:
    # Every call the parser returns is one render accepts, and it survives the round trip.
    test.assertEqual(parse(render(call)).calls, (call,))
  if result.incomplete:
    test.assertTrue(result.errors, "an incomplete call is also reported in errors")


class RoundTripTest(parameterized.TestCase):

  @parameterized.parameters(*range(len(CALLS)))
  def test_render_then_parse_gives_the_call(self, i):
    result = parse(render(CALLS[i]))
    self.assertEqual(result, ParseResult(calls=(CALLS[i],)))

  def test_random_calls_with_nasty_values_round_trip(self):
    rng = random.Random(0)
    calls = [random_call(rng) for _ in range(300)]
    for call in calls:
      self.assertEqual(parse(render(call)), ParseResult(calls=(call,)), render(call))
    text = "Plan: fix it.\n" + "\nthen\n".join(render(c) for c in calls) + "\nDone."
    self.assertEqual(parse(text), ParseResult(calls=tuple(calls)))

  def test_args_compare_equal_to_plain_dicts_and_are_read_only(self):
    call = parse('<tool name="run"><arg name="command">ls</arg></tool>').calls[0]
    self.assertEqual(call.args, {"command": "ls"})
    with self.assertRaises(TypeError):
      call.args["command"] = "rm -rf /"  # pytype: disable=unsupported-operands

  def test_hand_written_forms(self):
    text = ('<tool  name = "edit" >\n<arg name="path">\n  m.py  \n</arg>\n'
            '<arg name="search">\nold\n</arg><arg name="replace" end="X1">new </arg> kept</X1>\n</tool>\n'
            '<tool name="finish" />')
    self.assertEqual(parse(text).calls, (
        ToolCall(ToolName.EDIT, {"path": "m.py", "search": "old\n", "replace": "new </arg> kept"}),
        ToolCall(ToolName.FINISH, {})))

  def test_a_query_is_one_line_without_its_newlines(self):
    text = '<tool name="search_code"><arg name="query">\nparse a date string\n</arg></tool>'
    self.assertEqual(parse(text).calls, (ToolCall(ToolName.SEARCH_CODE, {"query": "parse a date string"}),))

  def test_prose_is_ignored(self):
    self.assertEqual(parse("I will use <tools> and an <article>; a < b > c. toolbox</tools>"), ParseResult())

  @parameterized.parameters(
      ToolCall(ToolName.READ_FILE, {}),
      ToolCall(ToolName.READ_FILE, {"path": "a.py", "extra": "1"}),
      ToolCall(ToolName.READ_FILE, {"path": " a.py"}),
      ToolCall(ToolName.READ_FILE, {"path": "a\nb"}),
      ToolCall(ToolName.GREP, {"pattern": ""}),
      ToolCall(ToolName.EDIT, {"path": "a.py", "search": "", "replace": "x"}),
      ToolCall(ToolName.SEARCH_CODE, {"query": " "}),
      ToolCall(ToolName.WEB_SEARCH, {"query": "a\nb"}),
      ToolCall(ToolName.WEB_SEARCH, {}),
  )
  def test_render_refuses_calls_the_parser_cannot_produce(self, call):
    with self.assertRaises(ValueError):
      render(call)


class MalformedTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("unknown_tool", '<tool name="delete"><arg name="path">a</arg></tool>', 0, 1),
      ("missing_arg", '<tool name="edit"><arg name="path">a</arg><arg name="search">x</arg></tool>', 0, 1),
      ("duplicate_arg", '<tool name="read_file"><arg name="path">a</arg><arg name="path">b</arg></tool>', 0, 1),
      ("unknown_arg", '<tool name="finish"><arg name="why">done</arg></tool>', 0, 1),
      ("empty_command", '<tool name="run"><arg name="command">  </arg></tool>', 0, 1),
      ("two_line_path", '<tool name="read_file"><arg name="path">a\nb</arg></tool>', 0, 1),
      ("empty_query", '<tool name="search_code"><arg name="query">\n</arg></tool>', 0, 1),
      ("two_line_query", '<tool name="web_search"><arg name="query">json\ndumps</arg></tool>', 0, 1),
      ("stray_text", '<tool name="run">run this <arg name="command">ls</arg></tool>', 0, 1),
      ("bad_tool_tag", "<tool name='run'><arg name=\"command\">ls</arg></tool>", 0, 1),
      ("bad_arg_tag", '<tool name="run"><arg command>ls</arg></tool>', 0, 1),
      ("stray_close", 'done</tool>', 0, 1),
      ("stray_arg", '<arg name="path">a.py</arg> then <tool name="finish"/>', 1, 1),
      # A forgotten </arg> is caught at the next tag instead of swallowing the next call.
      ("mismatched_close", '<tool name="read_file"><arg name="path">a.py</tool>'
       '<tool name="run"><arg name="command">ls</arg></tool>', 1, 1),
      ("arg_runs_into_arg", '<tool name="edit"><arg name="path">a<arg name="search">x</arg></tool>', 0, 1),
      # A block left open before the next <tool> is one error; the next call still counts.
      ("nested", '<tool name="run"><tool name="read_file"><arg name="path">a</arg></tool></tool>', 1, 2),
      ("unclosed_before_next", '<tool name="run"><arg name="command">ls</arg>\n<tool name="finish"/>', 1, 1),
  )
  def test_malformed(self, text, num_calls, num_errors):
    result = parse(text)
    self.assertLen(result.calls, num_calls, result)
    self.assertLen(result.errors, num_errors, result)
    self.assertFalse(result.incomplete, result)
    check_well_typed(self, result)

  def test_non_text_is_an_error_not_an_exception(self):
    for value in (None, b"<tool", 3):
      self.assertLen(parse(value).errors, 1)  # pytype: disable=wrong-arg-types


class CutOffTest(parameterized.TestCase):

  @parameterized.parameters(*range(len(CALLS)))
  def test_every_cut_of_a_call_is_incomplete(self, i):
    before = render(CALLS[0]) + "\nnow:\n"
    call_text = render(CALLS[i])
    for cut in range(1, len(call_text)):
      result = parse(before + call_text[:cut])
      self.assertTrue(result.incomplete, repr(call_text[:cut]))
      self.assertEqual(result.calls, (CALLS[0],), repr(call_text[:cut]))
      self.assertLen(result.errors, 1)

  def test_cut_random_calls(self):
    rng = random.Random(1)
    for _ in range(100):
      text = render(random_call(rng))
      cut = rng.randrange(1, len(text))
      result = parse(text[:cut])
      self.assertTrue(result.incomplete and not result.calls, repr(text[:cut]))

  def test_text_between_calls_is_not_incomplete(self):
    self.assertFalse(parse(render(CALLS[0]) + "\n\nand then").incomplete)


class TotalityTest(absltest.TestCase):

  def test_fuzz_never_raises(self):
    rng = random.Random(2)
    for _ in range(3000):
      text = fuzz_text(rng)
      try:
        result = parse(text)
      except Exception as e:  # noqa: BLE001
        self.fail(f"parse raised {e!r} on {text!r}")
      check_well_typed(self, result)

  def test_huge_adversarial_inputs_parse_in_linear_time(self):
    n = 40_000
    makers = {
        "open_tags": lambda k: "<tool " * k,
        "open_blocks": lambda k: '<tool name="x">' * k,
        "long_whitespace": lambda k: "<tool" + " " * (6 * k) + "name",
        "arg_openings": lambda k: '<tool name="run">' + '<arg name="a">' * k,
        "many_args": lambda k: '<tool name="run">' + '<arg name="a">y</arg>' * k,
        "long_value": lambda k: '<tool name="run"><arg name="command">' + "x" * (20 * k),
        "long_heredoc": lambda k: '<tool name="run"><arg name="command" end="E">' + "</arg>" * k,
        "lt": lambda k: "<" * (6 * k),
        "closes": lambda k: "</tool></arg>" * k,
        "calls": lambda k: '<tool name="finish"/>' * k,
        "stray_args": lambda k: '<arg name="p">' * k,
    }
    for name, make in makers.items():
      check_well_typed(self, parse(make(n // 8)))
      times = []
      for k in (n // 8, n):
        text = make(k)
        best = float("inf")
        for _ in range(2):  # the better of two
          # This thread's CPU time, not the wall clock: other processes on a busy machine do not count.
          start = time.thread_time()
          parse(text)
          best = min(best, time.thread_time() - start)
        times.append(best)
      # 8x the input: linear takes ~8x, quadratic ~64x. Sub-20 ms timings are too noisy for a ratio.
      self.assertLess(times[1], 2.0, name)
      if times[1] > 0.02:
        self.assertLess(times[1] / times[0], 30.0, f"{name}: {times}")

  def test_format_help_examples_parse(self):
    # The prose around the examples names tags, which counts as malformed; the examples are all well formed.
    calls = parse(protocol.format_help()).calls
    self.assertEqual({c.name for c in calls}, set(ToolName))

  def test_brief_help_names_every_tool_and_its_example_parses(self):
    brief = protocol.format_help(protocol.HelpDetail.BRIEF)
    for name, (required, optional) in protocol.TOOL_ARGS.items():
      self.assertIn(f"{name.value}({', '.join(required + optional)})", brief)
    parsed = parse(brief)
    self.assertEqual([c.name for c in parsed.calls], [ToolName.WRITE_FILE, ToolName.FINISH])
    self.assertEqual(parsed.errors, ())
    self.assertLess(len(brief), len(protocol.format_help()) // 2)
    self.assertEqual(protocol.format_help(protocol.HelpDetail.NONE), "")


if __name__ == "__main__":
  absltest.main()
