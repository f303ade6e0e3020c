"""The long-horizon suite through the real harness: the agent loop's engine with self-summaries, the coding
environment in a sandbox, the hidden tests (report section 4). Scripted policies forced through the engine prove
it: the summarizing reader passes across segments; the same reading without summaries (the truncation baseline)
cannot, because its context overflows; and a reader whose summaries carry nothing fails with them too. The
policies see only what the engine shows them (the current segment's observations), so a pass is the harness's.
"""

import functools

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, SummaryConfig
from c2jax.actors.ledger import EpisodeEnd, Source
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.teachers.scripted_policies import POLICIES
from tests import tiny
from tests.actors.agent_loop_test import ENGINE, MODEL, SAMPLING

SUITE = CodingTaskSuite(coding_suite="tiny_long_horizon", instructions="none", max_turns=16, tokenizer="byte")
SUMMARIES = SummaryConfig(trigger_tokens=900, max_tokens=120, max_segments=6)
TASKS = 2


def _agent(summary: SummaryConfig = SummaryConfig()) -> AgentConfig:
  return AgentConfig(max_turns=16, max_turn_tokens=256, max_episode_tokens=8000, chunk_steps=16, tool_workers=2,
                     summary=summary)


@functools.cache
def _run(policy: str, summary: SummaryConfig):
  runner = AgentRunner(MODEL, ENGINE, SAMPLING, _agent(summary), SUITE.text_tokenizer())
  act = POLICIES.get(policy)()
  episodes = []
  for i in range(TASKS):
    task = SUITE.task("train", i)
    coding = SUITE.coding_task(task)
    episodes.append(Episode(prompt=task.prompt, make_env=functools.partial(SUITE.agent_env, task), key=i,
                            script=lambda turn, obs, c=coding: act.act(c, obs)))
  return runner.run(episodes, weights=lambda: (tiny.params(MODEL), 0))


class LongHorizonHarnessTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)

  @pytest.mark.slow
  def test_a_summarizing_agent_passes_across_segments(self):
    for traj in _run("summarizing_reader", SUMMARIES):
      self.assertEqual(traj.end, EpisodeEnd.FINISHED)
      self.assertEqual(traj.reward_terms["outcome"], 1.0)
      self.assertGreaterEqual(traj.compactions, 1)  # the episode did not fit one window
      for seg in traj.segments:
        self.assertLessEqual(len(seg.tokens), ENGINE.context)
        self.assertEqual(seg.drift, 0)
      self.assertTrue(np.any(traj.segments[-1].source == Source.RESUME))

  @pytest.mark.slow
  def test_without_summaries_the_window_overflows(self):
    for traj in _run("summarizing_reader", SummaryConfig()):
      self.assertEqual((traj.end, traj.compactions), (EpisodeEnd.CONTEXT, 0))
      self.assertEqual(traj.reward_terms["outcome"], 0.0)

  @pytest.mark.slow
  def test_summaries_that_carry_nothing_do_not_pass(self):
    for traj in _run("reader", SUMMARIES):
      self.assertGreaterEqual(traj.compactions, 1)
      self.assertEqual(traj.reward_terms["outcome"], 0.0)
      self.assertTrue(traj.cut)


if __name__ == "__main__":
  absltest.main()
