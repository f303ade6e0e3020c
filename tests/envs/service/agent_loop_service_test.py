"""Episodes through the agent loop with their environments on environment servers (real processes): the same
scripted episodes give the same tokens, log-probs, ledgers and rewards as in-process; a server SIGKILLed in the middle
of an episode is survived (the episode runs again on the other server, counted, one trajectory per episode); and a
native chat format's turn results (tool results, continuation with control tokens) cross the wire intact.

The episodes are tiny_spec's spec_reader_no_test (read SPEC.md; write and finish: real sandboxes, two tool turns)
forced through the tiny model's engine (tests/envs/tasks/spec_suite_test.py); the run tool crosses the wire in
NativeFormatWireTest.
"""

import functools

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode
from c2jax.actors.ledger import EpisodeEnd
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.core.agent_env import agent_env
from c2jax.envs.service.client import EnvServerPool
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.envs.service.suites import suite_spec
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.envs.tools.protocol import ToolCall, ToolName
from c2jax.sandbox import sandbox as sandbox_lib
from tests import tiny
from tests.actors.agent_loop_test import ENGINE, MODEL, SAMPLING
from tests.data import chat_attacks
from tests.envs.service import servers as servers_lib
from tests.envs.service.servers import SECRET, ServerProcess

SUITE = CodingTaskSuite(coding_suite="tiny_spec", instructions="none", max_turns=8, tokenizer="byte")
AGENT = AgentConfig(max_turns=8, max_turn_tokens=256, max_episode_tokens=4000, chunk_steps=16, tool_workers=2)
TASKS = (0, 5)
CONFIG = EnvServiceConfig(call_timeout_s=30.0, env_timeout_s=120.0, open_wait_s=30.0, down_s=30.0)


def _episodes(make_env, on_turn=lambda i, turn: None) -> list[Episode]:
  """spec_reader_no_test on TASKS; `make_env(index)`; `on_turn(i, turn)` runs before episode i's scripted turn."""
  act = POLICIES.get("spec_reader_no_test")()
  episodes = []
  for i, index in enumerate(TASKS):
    task = SUITE.task("train", index)
    coding = SUITE.coding_task(task)

    def script(turn, obs, i=i, c=coding):
      on_turn(i, turn)
      return act.act(c, obs)

    episodes.append(Episode(prompt=task.prompt, make_env=functools.partial(make_env, index), key=i, script=script))
  return episodes


def _run(episodes) -> tuple[list, AgentRunner]:
  runner = AgentRunner(MODEL, ENGINE, SAMPLING, AGENT, SUITE.text_tokenizer())
  return runner.run(episodes, weights=lambda: (tiny.params(MODEL), 0)), runner


@functools.cache
def _in_process():
  trajectories, _ = _run(_episodes(lambda index: agent_env(SUITE, SUITE.task("train", index))))
  return trajectories


def _assert_same(test, got, want):
  """The same trajectories: tokens, ledger, routed experts, ends and reward terms exactly; log-probs to float error."""
  test.assertEqual(len(got), len(want))
  for a, b in zip(got, want):
    for name in ("tokens", "source", "turn", "versions", "expert_ids"):
      np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # The model's log-probs of the same tokens, up to the float error of another batch of slots beside them (an
    # episode's appends run with whichever others are ready then: tests/actors/agent_loop_test.py's tolerance).
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=2e-5)
    test.assertEqual((a.end, a.turns, a.drift, a.retokenized_turns, a.earlier),
                     (b.end, b.turns, b.drift, b.retokenized_turns, b.earlier))
    test.assertEqual(dict(a.reward_terms), dict(b.reward_terms))


@pytest.mark.e2e
@pytest.mark.slow
class AgentLoopServiceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    self.servers = servers_lib.start(2)
    self.pool = EnvServerPool([s.address for s in self.servers], SECRET, config=CONFIG)

  def tearDown(self):
    self.pool.close()
    for server in self.servers:
      server.kill()
    super().tearDown()

  def test_same_episodes_in_process_and_through_the_service(self):
    want = _in_process()
    self.assertEqual([(t.end, t.reward_terms["outcome"]) for t in want], [(EpisodeEnd.FINISHED, 1.0)] * len(TASKS))
    spec = suite_spec(SUITE)
    got, runner = _run(_episodes(functools.partial(self.pool.env, spec, "train")))
    _assert_same(self, got, want)
    self.assertEqual((runner.stats.env_reruns, runner.stats.env_errors, self.pool.stats.opens), (0, 0, len(TASKS)))
    self.assertEqual([s.load for s in self.pool.servers], [0, 0])  # every episode closed

  def test_a_server_killed_mid_episode_is_survived(self):
    want = _in_process()
    spec = suite_spec(SUITE)
    envs = []

    def make_env(index):
      envs.append(self.pool.env(spec, "train", index))
      return envs[-1]

    killed = []

    def on_turn(i, turn):
      # Before episode 0's second turn (its first tool call, the read, has run on its server): SIGKILL that server.
      if i == 0 and turn == 1 and not killed:
        victim = next(s for s in self.servers if s.address == envs[0].server.address)
        victim.kill()
        killed.append(victim.address)

    got, runner = _run(_episodes(make_env, on_turn))
    self.assertLen(killed, 1)
    _assert_same(self, got, want)  # the re-run is the same episode, whole; nothing of the lost attempt is kept
    self.assertEqual((runner.stats.env_reruns, runner.stats.env_errors, runner.stats.episodes), (1, 0, len(TASKS)))
    self.assertLen(envs, len(TASKS) + 1)  # one fresh environment for the re-run ...
    self.assertNotEqual(envs[-1].server.address, killed[0])  # ... on the other server
    self.assertEqual(self.pool.stats.marked_down, 1)


@pytest.mark.e2e
class NativeFormatWireTest(absltest.TestCase):
  """A native chat format's TurnResults (tool results, a continuation with control tokens) cross intact."""

  def setUp(self):
    super().setUp()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    self.server = ServerProcess()
    self.pool = EnvServerPool([self.server.address], SECRET, config=CONFIG)

  def tearDown(self):
    self.pool.close()
    self.server.kill()
    super().tearDown()

  def test_deepseek_v3_results_cross_intact(self):
    suite = CodingTaskSuite(coding_suite="tiny_functions", tokenizer=chat_attacks.model_dir("deepseek_v3"),
                            chat_format="deepseek_v3", instructions="none", max_turns=4)
    task = suite.task("train", 2)
    fmt = suite.chat_tokens().format
    turns = [fmt.tool_format.render((ToolCall(ToolName.RUN, {"command": "ls"}), ToolCall(ToolName.READ_FILE,
                                                                                {"path": "no/such"}))),
             "not a call at all",
             fmt.tool_format.render((ToolCall(ToolName.FINISH, {}),))]
    local, remote = agent_env(suite, task), self.pool.env(suite_spec(suite), "train", 2)
    local.reset()
    remote.reset()
    for text in turns:
      want = local.step(np.zeros(0, np.int32), text)
      got = remote.step(np.zeros(0, np.int32), text)
      self.assertEqual(got, want)
      self.assertIsNotNone(got.continuation)
    self.assertTrue(any(p.kind.value == "control" for p in got.continuation.notice_markup))
    self.assertTrue(want.done)
    self.assertEqual(remote.reward(), local.reward())
    local.close()
    remote.close()


if __name__ == "__main__":
  absltest.main()
