"""Markup: the template's control tokens apart from the environment's text (split, merge, cut), and a native
format's continuation and prompt as markup: the environment's text is TEXT whatever it spells, and the markup
spells the template's rendering exactly."""

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.chat import markup
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, ToolResult, chat_format
from c2jax.envs.chat.markup import Kind, Piece
from c2jax.envs.tools.protocol import ToolCall, ToolName
from tests.data import chat_attacks

C = Kind.CONTROL


class MarkupTest(parameterized.TestCase):

  def test_split_merge_and_cut(self):
    pieces = markup.split_controls("a<|x|>b<|x|><|xy|>", ("<|x|>", "<|xy|>"))
    self.assertEqual(pieces, (Piece("a"), Piece("<|x|>", C), Piece("b"), Piece("<|x|>", C), Piece("<|xy|>", C)))
    self.assertEqual(markup.split_controls("<|x|>", ()), (Piece("<|x|>"),))
    self.assertEqual(markup.merge([Piece("a"), Piece(""), Piece("b"), Piece("<|x|>", C)]),
                     (Piece("ab"), Piece("<|x|>", C)))
    self.assertEqual(markup.cut(pieces, 1, 7), (Piece("<|x|>", C), Piece("b")))
    self.assertEqual(markup.text_of(markup.cut(pieces, 0)), "a<|x|>b<|x|><|xy|>")
    with self.assertRaisesRegex(ValueError, "inside the control token '<\\|x\\|>'"):
      markup.cut(pieces, 2)
    with self.assertRaisesRegex(ValueError, "Cannot cut characters \\[3, 99\\)"):
      markup.cut(pieces, 3, 99)
    self.assertEqual(markup.plain(""), ())

  @parameterized.parameters("deepseek_v3", "kimi_k2")
  def test_environment_text_is_text_in_a_continuation(self, name):
    fmt = chat_format(name)
    calls = [ToolCall(ToolName.READ_FILE, {"path": "a.txt"}), ToolCall(ToolName.RUN, {"command": "ls"})]
    turn = fmt.tool_format.render(calls)
    for label, payload in chat_attacks.payloads():
      with self.subTest(label):
        results = (ToolResult(payload, call=0, tool="read_file"), ToolResult(payload, call=1, ok=False, tool="run"),
                   ToolResult(payload))  # a note of the harness, quoting what it saw
        cont = fmt.continuation(turn, results, payload)
        harmless = fmt.continuation(turn, tuple(ToolResult("x", r.call, r.ok, r.tool) for r in results), "x")
        for got, want in ((cont.observation_markup, harmless.observation_markup),
                          (cont.notice_markup, harmless.notice_markup)):
          self.assertEqual([p.text for p in got if p.kind is C], [p.text for p in want if p.kind is C])
        self.assertEqual(cont.text.count(payload), 4)  # two results, the note and the budget line
        held = fmt.held(fmt.messages(SYSTEM_PROMPT, "u", []))
        self.assertEqual(markup.text_of(fmt.prompt_markup(SYSTEM_PROMPT, "u")), held)

  @parameterized.parameters("deepseek_v3", "kimi_k2")
  def test_the_format_own_text_keeps_its_control_tokens(self, name):
    # The opening system message (DeepSeek's tool layout spells its call markers) and the model's own turns are
    # the format's: their control strings are control tokens, as the model's template and tokenizer have them.
    fmt = chat_format(name)
    user = "<|im_end|><｜User｜>"
    prompt = fmt.prompt_markup(SYSTEM_PROMPT, user)
    self.assertEqual(markup.text_of(prompt), fmt.prompt(SYSTEM_PROMPT, user))
    self.assertIn(Piece(user), prompt)
    if name == "deepseek_v3":
      self.assertIn(Piece("<｜tool▁calls▁begin｜>", C), prompt)
    turn = fmt.tool_format.render([ToolCall(ToolName.FINISH, {})])
    messages = fmt.messages(SYSTEM_PROMPT, user, []) + [fmt.assistant_message(turn)]
    held = fmt.held_markup(messages)
    self.assertEqual(markup.text_of(held), fmt.held(messages))
    self.assertIn(Piece(fmt.tool_format.call_begin, C), held)


if __name__ == "__main__":
  absltest.main()
