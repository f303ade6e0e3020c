"""Chat templates rendered by c2jax.data.chat_template equal transformers' apply_chat_template(tokenize=False) on
the vendored real templates (DeepSeek-V3.1, Kimi-K2-Thinking) over many conversations, and the loaders take a
tokenizer_config.json's chat_template in both of its forms."""

import json
import os
import tempfile

import jinja2
from absl.testing import absltest
from absl.testing import parameterized

from c2jax.data.chat_template import TEMPLATES_DIR, ChatTemplate
from tests.data import chat_tokenizers

DEEPSEEK_SPECIAL = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
DEEPSEEK_CONTROL = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
                    "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                    "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")
KIMI_SPECIAL = {"bos_token": "[BOS]", "eos_token": "[EOS]"}
KIMI_CONTROL = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file (ünïcødé <b>&</b>).",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "A path."}},
                   "required": ["path"]}}}]


def call(name, arguments, call_id=None):
  out = {"type": "function", "function": {"name": name, "arguments": arguments}}
  if call_id is not None:
    out["id"] = call_id
  return out


SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USER = {"role": "user", "content": "Fix calc.py, please ✓."}
DEEPSEEK_CONVERSATIONS = {
    "system_user": [SYSTEM, USER],
    "user_only": [USER],
    "two_systems": [SYSTEM, {"role": "system", "content": "Second."}, USER],
    "tool_calls": [SYSTEM, USER, {"role": "assistant", "content": "", "tool_calls": [
        call("read_file", '{"path": "calc.py"}'), call("run", '{"command": "ls"}')]}],
    "tool_results": [SYSTEM, USER, {"role": "assistant", "content": "Looking.", "tool_calls": [
        call("read_file", '{"path": "calc.py"}')]}, {"role": "tool", "content": "def add(a, b): ..."},
                     {"role": "tool", "content": "second"}],
    "multi_turn": [SYSTEM, USER, {"role": "assistant", "content": "", "tool_calls": [call("finish", "{}")]},
                   {"role": "tool", "content": "finished."}, {"role": "assistant", "content": "Done."},
                   {"role": "user", "content": "And now?"}, {"role": "assistant", "content": "<think>hm</think>ok"}],
    "content_none_dropped": [USER, {"role": "assistant", "content": "x", "tool_calls": None}],
}
KIMI_CONVERSATIONS = {
    "system_user": [SYSTEM, USER],
    "default_system": [USER],
    "tool_calls_with_reasoning": [SYSTEM, USER, {"role": "assistant", "content": "", "reasoning_content": "plan",
                                                 "tool_calls": [
                                                     call("read_file", '{"path": "a"}', "functions.read_file:0"),
                                                     call("finish", {"x": "ü"}, "functions.finish:1")]}],
    "tool_results": [USER, {"role": "assistant", "content": "c", "tool_calls": [
        call("read_file", '{"path": "a"}', "functions.read_file:0")]},
                     {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "text\nmore"}],
    "reasoning_dropped_before_final_answer": [
        USER, {"role": "assistant", "content": "", "reasoning": "old", "tool_calls": [
            call("run", '{"command": "ls"}', "functions.run:0")]},
        {"role": "tool", "tool_call_id": "functions.run:0", "content": "a.py"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "final"},
        {"role": "user", "content": "More?"},
        {"role": "assistant", "content": "", "thinking": "kept", "tool_calls": [
            call("run", '{"command": "pwd"}', "functions.run:1")]}],
    "named_messages": [{"role": "user", "name": "alice", "content": "hi"}, {"role": "system", "content": "note"}],
    "content_parts": [{"role": "user", "content": [{"type": "text", "text": "look "}, {"type": "image"}]}],
}


class ChatTemplateTest(parameterized.TestCase):

  def check(self, name, special, control, conversations):
    template = ChatTemplate.vendored(name, special)
    tok = chat_tokenizers.tokenizer(control, template.source, special["bos_token"], special["eos_token"])
    for key, messages in conversations.items():
      for tools in (None, TOOLS):
        for generation in (False, True):
          for extra in ({}, {"thinking": True}):
            with self.subTest(conversation=key, tools=tools is not None, generation=generation, extra=extra):
              want = tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=generation, **extra)
              got = template.render(messages, tools=tools, add_generation_prompt=generation, **extra)
              self.assertEqual(got, want)

  def test_deepseek_v3_1_renders_as_transformers(self):
    self.check("deepseek_v3_1", DEEPSEEK_SPECIAL, DEEPSEEK_CONTROL, DEEPSEEK_CONVERSATIONS)

  def test_kimi_k2_thinking_renders_as_transformers(self):
    self.check("kimi_k2_thinking", KIMI_SPECIAL, KIMI_CONTROL, KIMI_CONVERSATIONS)

  def test_kimi_declares_tools_as_compact_json(self):
    text = ChatTemplate.vendored("kimi_k2_thinking").render([USER], tools=TOOLS)
    self.assertIn('<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"read_file",'
                  '"description":"Read a file (ünïcødé <b>&</b>)."', text)

  def test_deepseek_thinking_switch_and_known_text(self):
    template = ChatTemplate.vendored("deepseek_v3_1", DEEPSEEK_SPECIAL)
    self.assertEqual(template.render([SYSTEM, USER], add_generation_prompt=True),
                     "<｜begin▁of▁sentence｜>You are a careful coding agent.<｜User｜>Fix calc.py, please ✓."
                     "<｜Assistant｜></think>")
    self.assertTrue(template.render([USER], add_generation_prompt=True, thinking=True).endswith("<think>"))

  def test_special_tokens_are_variables_and_kwargs_win(self):
    template = ChatTemplate("{{ bos_token }}|{{ eos_token }}|{{ messages[0].content }}", {"bos_token": "<s>",
                                                                                         "eos_token": "</s>"})
    self.assertEqual(template.render([USER]), "<s>|</s>|Fix calc.py, please ✓.")
    self.assertEqual(template.render([USER], eos_token="E"), "<s>|E|Fix calc.py, please ✓.")

  def test_environment_matches_transformers(self):
    source = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content | tojson }}"
              "{{ m.content | tojson(ensure_ascii=True) }}"
              "{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=true) }}"
              "{% generation %}G{% endgeneration %}{% endfor %}"
              "{% set ns = namespace(x=1) %}{% set ns.x = 2 %}{{ ns.x }}{{ dict(a=1) | tojson }}"
              "{{ strftime_now('%Y') | length }}\n  {% if true %}\n  lstrip\n  {% endif %}\n")
    tok = chat_tokenizers.tokenizer(KIMI_CONTROL, source, "[BOS]", "[EOS]")
    messages = [{"role": "user", "content": "é<>&"}, USER]
    self.assertEqual(ChatTemplate(source).render(messages), tok.apply_chat_template(messages, tokenize=False))

  def test_raise_exception_and_sandbox(self):
    with self.assertRaisesRegex(jinja2.TemplateError, "roles must alternate"):
      ChatTemplate("{{ raise_exception('roles must alternate') }}").render([USER])
    with self.assertRaises(jinja2.exceptions.SecurityError):
      ChatTemplate("{% set ns = namespace() %}{% set ns._x = 1 %}").render([USER])
    with self.assertRaises(jinja2.exceptions.SecurityError):
      ChatTemplate("{{ messages.append(1) }}").render([USER])

  def test_tokenizer_config_string_and_list_forms(self):
    source = ChatTemplate.vendored("deepseek_v3_1").source
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "tokenizer_config.json")
      with open(path, "w", encoding="utf-8") as f:
        json.dump({"chat_template": source, "bos_token": {"__type": "AddedToken", "content": "<B>"},
                   "eos_token": "<E>", "unk_token": None}, f)
      template = ChatTemplate.from_tokenizer_config(path)
      self.assertEqual(template.source, source)
      self.assertEqual(dict(template.special_tokens), {"bos_token": "<B>", "eos_token": "<E>"})
    named = {"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}
    self.assertEqual(ChatTemplate.from_tokenizer_config(named).source, "D")
    self.assertEqual(ChatTemplate.from_tokenizer_config(named, tools=True).source, "T")
    self.assertEqual(ChatTemplate.from_tokenizer_config(named, template_name="tool_use").source, "T")
    with self.assertRaisesRegex(ValueError, "no default"):
      ChatTemplate.from_tokenizer_config({"chat_template": [{"name": "rag", "template": "R"}]})
    with self.assertRaisesRegex(ValueError, "named 'x'"):
      ChatTemplate.from_tokenizer_config(named, template_name="x")
    with self.assertRaisesRegex(ValueError, "chat_template.jinja"):
      ChatTemplate.from_tokenizer_config({})

  def test_files_and_errors(self):
    for path in TEMPLATES_DIR.glob("*.jinja"):
      self.assertEqual(ChatTemplate.from_file(path).source, path.read_bytes().decode("utf-8"))
    with self.assertRaisesRegex(ValueError, "deepseek_v3_1, kimi_k2_thinking"):
      ChatTemplate.vendored("nope")
    with self.assertRaises(jinja2.TemplateSyntaxError):
      ChatTemplate("{% if %}")
    with self.assertRaisesRegex(ValueError, "empty conversation"):
      ChatTemplate("x").render([])


if __name__ == "__main__":
  absltest.main()
