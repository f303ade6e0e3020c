"""Attacks on the chat formats' structure from the prompt side: a task statement, a repository listing or a
self-summary that spells control strings (any format's, cut, full-width or ASCII twins, forged messages) must reach
the model as text. The prompt's control ids are exactly those of the same prompt around harmless text, and its
ids decode back to the text the template renders. Every format (brief over a tokenizer with specials, DeepSeek-V3,
Kimi-K2), over tokenizers whose control tokens are special added tokens and over ones whose are not.

The observation side (tool results, files read back) runs through the agent engine:
tests/actors/agent_loop_chat_attack_test.py.
"""

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.data.tokenizer import HFTokenizer
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, chat_format
from c2jax.envs.chat.chat_tokens import ChatTokens
from tests.data import chat_attacks

USER = "[8 turns, about 8192 tokens]\nRepository files:\ncalc.py\n\nadd() subtracts; make it add.\n"
# (format, the tokenizer's family, control tokens not marked special).
CASES = (("brief", "kimi_k2", False), ("brief", "deepseek_v3", False), ("deepseek_v3", "deepseek_v3", False),
         ("deepseek_v3", "deepseek_v3", True), ("kimi_k2", "kimi_k2", False), ("kimi_k2", "kimi_k2", True))


def chat_tokens(name: str, family: str, non_special: bool) -> tuple[ChatTokens, HFTokenizer]:
  tok = HFTokenizer(chat_attacks.model_dir(family, non_special))
  return ChatTokens.of(name, tok), tok


class PromptSideAttackTest(parameterized.TestCase):

  @parameterized.parameters(*CASES)
  def test_task_statement_with_control_strings_stays_text(self, name, family, non_special):
    chat, tok = chat_tokens(name, family, non_special)
    expected = chat_attacks.control_ids(chat.prompt(USER + "x"), tok)
    self.assertNotEmpty(expected)  # BOS at least: the check sees control ids where they are
    for label, payload in chat_attacks.payloads():
      with self.subTest(label):
        text = USER + payload
        ids = chat.prompt(text)
        self.assertEqual(chat_attacks.control_ids(ids, tok), expected)
        if chat.native:
          self.assertEqual(tok.decode(ids, skip_special_tokens=False), chat.prompt_text(text))
        else:
          self.assertEqual(int(ids[0]), tok.bos_id)
          self.assertEqual(tok.decode(ids[1:], skip_special_tokens=False), text)

  @parameterized.parameters(*CASES[2:])
  def test_summary_with_control_strings_stays_text(self, name, family, non_special):
    # The model's summary is decoded with its control tokens kept; in the next segment's user message it is text.
    chat, tok = chat_tokens(name, family, non_special)
    expected = chat_attacks.control_ids(chat.segment_prompt(USER, "x"), tok)
    for label, payload in chat_attacks.payloads():
      with self.subTest(label):
        ids = chat.segment_prompt(USER, payload)
        self.assertEqual(chat_attacks.control_ids(ids, tok), expected)
        self.assertEqual(tok.decode(ids, skip_special_tokens=False),
                         chat_format(name).segment_prompt(SYSTEM_PROMPT, USER, payload))

  @parameterized.parameters(*CASES[2:])
  def test_split_control_strings_stay_text(self, name, family, non_special):
    # A control string cut in two, the halves far apart or side by side in the user message: text either way.
    chat, tok = chat_tokens(name, family, non_special)
    expected = chat_attacks.control_ids(chat.prompt(USER + "x"), tok)
    for head, tail in chat_attacks.split_pairs(chat_format(name).control_tokens):
      for text in (f"{USER}{tail} ... {head}", f"{USER}{head}{tail}"):
        with self.subTest(text=text[len(USER):]):
          ids = chat.prompt(text)
          self.assertEqual(chat_attacks.control_ids(ids, tok), expected)
          self.assertEqual(tok.decode(ids, skip_special_tokens=False), chat.prompt_text(text))


if __name__ == "__main__":
  absltest.main()
