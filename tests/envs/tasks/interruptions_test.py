"""A user message that interrupts the agent: its format in task metadata, the scripted drivers' cut, and CodingEnv
delivering it after the interrupted turn in each chat format (a finish there overruled, a spent budget not)."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.chat import chat_format as chat_format_lib
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.tasks import interruptions
from c2jax.envs.tasks.coding_tasks import CodingTask, TaskFormatError
from c2jax.envs.tasks.interruptions import Interruption
from c2jax.envs.tools.protocol import ToolCall, ToolName
from c2jax.sandbox import sandbox as sandbox_lib

_MESSAGE = "Change of plan: write b.py instead."


def _task(interruption: Interruption | None) -> CodingTask:
  metadata = {} if interruption is None else {interruptions.METADATA_KEY: interruptions.encode(interruption)}
  return CodingTask(task_id="t", prompt="Write a.py.", files={"x.py": "x = 1\n"},
                    hidden_tests={"hidden_tests/test_t.py": ""}, metadata=metadata)


class FormatTest(parameterized.TestCase):

  def test_round_trip(self):
    for interruption in (Interruption(1, _MESSAGE), Interruption(2, _MESSAGE, cut_tokens=40)):
      self.assertEqual(interruptions.task_interruption(_task(interruption)), interruption)
    self.assertIsNone(interruptions.task_interruption(_task(None)))

  @parameterized.parameters(
      ('{"turn": 0, "message": "m"}', "turn"),
      ('{"turn": 1, "message": " "}', "message"),
      ('{"turn": 1, "message": "m", "cut_tokens": 0}', "cut_tokens"),
      ('{"turn": 1, "message": "m", "when": 3}', "JSON object"),
      ("[1]", "JSON object"),
  )
  def test_malformed_is_refused(self, text, names):
    task = dataclasses.replace(_task(None), metadata={interruptions.METADATA_KEY: text})
    with self.assertRaisesRegex(TaskFormatError, names):
      interruptions.task_interruption(task)

  def test_cut_turn_cuts_only_the_interrupted_turn_mid_way(self):
    text = "é" * 30  # two bytes each: a cut inside a character drops it
    mid = _task(Interruption(2, _MESSAGE, cut_tokens=7))
    self.assertEqual(interruptions.cut_turn(mid, 2, text), "ééé")
    self.assertEqual(interruptions.cut_turn(mid, 1, text), text)
    self.assertEqual(interruptions.cut_turn(_task(Interruption(2, _MESSAGE)), 2, text), text)

  def test_turn_tokens_cut_the_interrupted_turn_for_the_agent_loop(self):
    self.assertEqual(interruptions.turn_tokens(_task(Interruption(3, _MESSAGE, cut_tokens=40)), 256), (256, 256, 40))
    self.assertEqual(interruptions.turn_tokens(_task(Interruption(1, _MESSAGE, cut_tokens=400)), 256), (256,))
    self.assertEqual(interruptions.turn_tokens(_task(Interruption(1, _MESSAGE)), 256), ())
    self.assertEqual(interruptions.turn_tokens(_task(None), 256), ())


class DeliveryTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)

  @parameterized.parameters("brief", "deepseek_v3", "kimi_k2")
  def test_after_the_interrupted_turn_a_finish_overruled(self, chat_format):
    turn = chat_format_lib.chat_format(chat_format).tool_format.render(
        [ToolCall(ToolName.WRITE_FILE, {"path": "a.py", "content": "a = 1\n"}), ToolCall(ToolName.FINISH, {})])
    with CodingEnv(EnvConfig(chat_format=chat_format)) as env:
      env.reset(_task(Interruption(1, _MESSAGE)))
      first = env.step(turn)
      self.assertFalse(first.done)
      self.assertIn(_MESSAGE, first.continuation.notice)  # after the tool results, where a user turn goes
      self.assertNotIn(_MESSAGE, first.continuation.observation)
      if chat_format == "brief":
        self.assertTrue(first.observation.endswith(interruptions.framed(_MESSAGE)))
      second = env.step(turn)
      self.assertTrue(second.done)
      self.assertNotIn(_MESSAGE, second.observation)
      self.assertEqual(env.reward()["interruption_delivered"], 1.0)

  def test_a_spent_budget_ends_the_episode_undelivered(self):
    with CodingEnv(EnvConfig(max_turns=1)) as env:
      env.reset(_task(Interruption(1, _MESSAGE)))
      result = env.step("thinking")
      self.assertTrue(result.done)
      self.assertNotIn(_MESSAGE, result.observation)
      self.assertEqual(env.reward()["interruption_delivered"], 0.0)


if __name__ == "__main__":
  absltest.main()
