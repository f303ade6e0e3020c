"""The agent engine in a real model's own chat format (DeepSeek-V3's, Kimi-K2's): native tool calls forced through
the engine into real sandboxes, and the token stream the engine built, piece by piece, against a fresh render and
tokenization of the whole conversation by the model's template (zero drift at the engine's level).

The tokenizers are small byte-level BPEs carrying each template's control tokens as special tokens
(tests/data/chat_tokenizers.py), saved as an HF model directory and read back by c2jax's HFTokenizer, as a
converted model's own tokenizer is.
"""


from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, SummaryConfig
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import EpisodeEnd, Source
from c2jax.actors.sampling import SamplingConfig
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.core.agent_env import CodingAgentEnv
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, Step, chat_format
from c2jax.envs.chat.chat_tokens import ChatTokens
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.tools.protocol import ToolCall, ToolName
from tests import tiny
from tests.data import chat_attacks

FORMATS = ("deepseek_v3", "kimi_k2")
# The native prompts declare every tool (~1,800 tokens of these small BPEs): slots of 4096 positions.
ENGINE = EngineConfig(slots=2, context=4096, chunk_sizes=(16, 256, 1024), max_forced=512)


class RecordingEnv(CodingAgentEnv):
  """CodingAgentEnv that keeps each turn's text and result (the conversation, for the fresh render)."""

  def __init__(self, *args, log: list, **kwargs):
    super().__init__(*args, **kwargs)
    self.log = log

  def step(self, ids, text):
    result = super().step(ids, text)
    self.log.append((text, result))
    return result


def _calls(*calls: tuple[ToolName, dict]) -> tuple[ToolCall, ...]:
  return tuple(ToolCall(name, args) for name, args in calls)


class NativeChatEngineTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = tiny.params(tiny.MODEL)

  def _suite(self, name: str, **kwargs) -> CodingTaskSuite:
    return CodingTaskSuite(coding_suite="tiny_functions", tokenizer=chat_attacks.model_dir(name), chat_format=name,
                           instructions="none", max_turns=6, **kwargs)

  def _run(self, suite, task, script, summary=SummaryConfig(), max_turn_tokens=400):
    chat = suite.chat_tokens()
    log = []
    runner = AgentRunner(tiny.MODEL, ENGINE, SamplingConfig(max_new_tokens=1, temperature=1.0),
                         AgentConfig(max_turns=6, max_turn_tokens=max_turn_tokens, max_episode_tokens=2000,
                                     summary=summary),
                         suite.text_tokenizer(), chat_format=suite.chat_format)
    self.assertIn(chat.end_of_turn_id, runner.sampling.stop_tokens)  # the format's end of turn stops a turn
    episode = Episode(prompt=task.prompt, key=0, script=script, first_observation=task.text,
                      make_env=lambda: RecordingEnv(suite.coding_task(task), suite.env_config, log=log))
    (traj,) = runner.run([episode], weights=lambda: (self.params, 0))
    return traj, log, chat

  @parameterized.parameters(*FORMATS)
  @pytest.mark.slow
  def test_native_calls_solve_the_task_with_zero_drift(self, name):
    suite = self._suite(name)
    task = suite.task("heldout", 0)
    coding = suite.coding_task(task)
    fmt = chat_format(name)
    path, content = sorted(coding.solution.items())[0]
    writes = _calls(*((ToolName.WRITE_FILE, {"path": p, "content": c}) for p, c in sorted(coding.solution.items())))
    turns = [fmt.tool_format.render(_calls((ToolName.READ_FILE, {"path": path})), first_index=0),
             fmt.tool_format.render(writes, content="Fixing it.", first_index=1),
             fmt.tool_format.render(_calls((ToolName.FINISH, {})), first_index=1 + len(writes))]
    traj, log, chat = self._run(suite, task, lambda turn, obs: turns[turn] if turn < len(turns) else None)

    # The native calls were parsed and run: the reference solution, written through them, passes.
    self.assertEqual(traj.end, EpisodeEnd.FINISHED)
    self.assertEqual(traj.turns, 3)
    self.assertEqual(traj.reward_terms["outcome"], 1.0)
    self.assertEqual(traj.reward_terms["malformed_tool_calls"], 0.0)
    self.assertEqual([text for text, _ in log], turns)  # each turn decoded with its control tokens, as written
    self.assertEqual(traj.segments[0].drift, 0)
    self.assertEqual(traj.retokenized_turns, 0)
    # Zero drift: the tokens the engine appended piece by piece are the whole conversation's fresh render.
    steps = [Step(turn=text, results=r.results, notice=r.budget) for text, r in log[:-1]]
    steps.append(Step(turn=log[-1][0]))  # the episode ends after its last turn: nothing follows it
    messages = fmt.messages(SYSTEM_PROMPT, task.text, steps)
    np.testing.assert_array_equal(traj.segments[0].tokens, chat.encode_markup(fmt.held_markup(messages)))
    # No control string in the environment's text here: the whole text tokenized with its added tokens matched (as
    # transformers' apply_chat_template does) is the same stream.
    np.testing.assert_array_equal(traj.segments[0].tokens,
                                  chat.tokenizer.encode(fmt.held(messages), bos=False, eos=False))
    # Every MODEL position is a forced turn's token, its end-of-turn token included.
    seg = traj.segments[0]
    model = seg.tokens[seg.source == int(Source.MODEL)]
    np.testing.assert_array_equal(model, np.concatenate([chat.turn_ids(t) for t in turns]))

  @parameterized.parameters(*FORMATS)
  @pytest.mark.slow
  def test_a_summary_is_a_segment_break_re_rendered_by_the_template(self, name):
    suite = self._suite(name)
    task = suite.task("heldout", 1)
    coding = suite.coding_task(task)
    fmt = chat_format(name)
    path = sorted(coding.files)[0]
    summary_text = f"I read {path}; next I write the fix."
    turns = {0: fmt.tool_format.render(_calls((ToolName.READ_FILE, {"path": path})), first_index=0),
             1: summary_text,
             2: fmt.tool_format.render(_calls((ToolName.FINISH, {})), first_index=1)}
    # A summary once the first observation is in (the prompt is ~1,800 tokens).
    traj, log, chat = self._run(suite, task, lambda turn, obs: turns.get(turn),
                                summary=SummaryConfig(trigger_tokens=len(task.prompt) + 30, max_tokens=64))
    self.assertEqual(traj.end, EpisodeEnd.FINISHED)
    self.assertEqual(traj.compactions, 1)
    first, second = traj.segments
    self.assertEqual((first.drift, second.drift), (0, 0))
    # The first segment: the turn, its results and the summary request as a user turn the template renders in
    # place of the generation prompt, then the summary.
    text, result = log[0]
    request = fmt.summary_request(64)
    messages = fmt.messages(SYSTEM_PROMPT, task.text, [Step(turn=text, results=result.results, notice=result.budget,
                                                            request=request)])
    head = chat.encode_markup(fmt.held_markup(messages))
    np.testing.assert_array_equal(first.tokens[:len(head)], head)
    np.testing.assert_array_equal(first.tokens[len(head):], chat.turn_ids(summary_text))
    self.assertTrue(np.all(first.source[len(head) - 1:len(head)] == int(Source.SUMMARY_REQUEST)))
    # The second: the prompt re-rendered with the summary in the user message, then the last turn.
    prompt = chat.segment_prompt(task.text, summary_text)
    np.testing.assert_array_equal(second.tokens, np.concatenate([prompt, chat.turn_ids(turns[2])]))
    kept = int(np.sum(second.source == int(Source.PROMPT)))
    self.assertGreater(kept, 1000)  # the system prompt and the tools' declaration stay in the slot's cache
    np.testing.assert_array_equal(second.tokens[:kept], np.asarray(task.prompt)[:kept])

  @parameterized.parameters(*FORMATS)
  @pytest.mark.slow
  def test_a_cut_turn_is_closed_by_the_end_of_turn_token(self, name):
    # Sampled turns of the random model, cut at 6 tokens: the template ends every assistant message with the
    # end-of-turn token, so the engine writes it before the observation of a turn that was cut.
    suite = self._suite(name)
    traj, log, chat = self._run(suite, suite.task("heldout", 2), None, max_turn_tokens=6)
    seg = traj.segments[0]
    eot = chat.end_of_turn_id
    cut = 0
    for start, end, source, _ in seg.boundaries():
      if source is not Source.MODEL or seg.tokens[end - 1] == eot:
        continue
      cut += 1
      self.assertEqual(end - start, 6)
      if end < len(seg.tokens):  # the episode's last turn has nothing after it
        self.assertEqual((seg.tokens[end], seg.source[end]), (eot, int(Source.OBSERVATION)))
    self.assertGreater(cut, 1)
    self.assertEqual(seg.drift, 0)

  @parameterized.parameters(*FORMATS)
  def test_prompt_is_the_template_over_the_first_observation(self, name):
    suite = self._suite(name)
    task = suite.task("train", 2)
    fmt = chat_format(name)
    np.testing.assert_array_equal(task.prompt,
                                  suite.chat_tokens().encode_markup(fmt.prompt_markup(SYSTEM_PROMPT, task.text)))
    self.assertNotIn("<tool", task.text)  # the template declares the tools; the brief help is left out

  def test_refuses_a_tokenizer_without_the_control_tokens(self):
    with self.assertRaisesRegex(ValueError, r"^Chat format 'kimi_k2' needs a tokenizer holding its control tokens"):
      ChatTokens.of("kimi_k2", ByteTokenizer())
    with self.assertRaisesRegex(ValueError,
                                r"tokenizer.json lacks \[BOS\], \[EOS\], <\|im_end\|>, .*give the model.s own"):
      ChatTokens.of("kimi_k2", suite_tokenizer("deepseek_v3"))

  def test_brief_is_unchanged(self):
    chat = ChatTokens.of("brief", ByteTokenizer())
    np.testing.assert_array_equal(chat.prompt("ab"), ByteTokenizer().encode("ab", bos=True, eos=False))
    np.testing.assert_array_equal(chat.turn_ids("x"), ByteTokenizer().encode("x", bos=False, eos=True))
    self.assertEqual(chat.turn_text([120, ByteTokenizer.EOS]), "x")
    self.assertEqual(chat.end_of_turn_id, ByteTokenizer.EOS)


def suite_tokenizer(name: str):
  return CodingTaskSuite(tokenizer=chat_attacks.model_dir(name), chat_format=name).text_tokenizer()


if __name__ == "__main__":
  jax.config.parse_flags_with_absl()
  absltest.main()
