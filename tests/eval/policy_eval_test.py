"""Held-out evaluation through the agent loop (c2jax/eval/policy_eval.py): its figures and the agent's behaviour."""

import dataclasses
import math

from absl.testing import absltest

from c2jax.actors import behaviour
from c2jax.actors.agent_loop import RunStats
from c2jax.actors.ledger import EpisodeEnd
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.chat.chat_tokens import ChatTokens
from c2jax.envs.token_tasks.char_class import CharClassSuite
from c2jax.eval.policy_eval import evaluate_episodes
from tests.actors.behaviour_test import BLIND, GOOD, _episode


class _Runner:
  """Stands in for an AgentRunner: returns the given trajectories (no engine), with their outcomes."""

  tokenizer = ByteTokenizer()
  chat = ChatTokens.of("brief", tokenizer)

  def __init__(self, trajectories):
    self.trajectories = trajectories
    self.stats = RunStats()
    self.chunks = 0

  def run(self, episodes, weights, on_chunk=None):
    assert len(episodes) == len(self.trajectories)
    for _ in self.trajectories:  # one episode ends per loop iteration, as the progress bar reads it
      self.stats.episodes += 1
      on_chunk()
      self.chunks += 1
    return self.trajectories


class EvaluateEpisodesTest(absltest.TestCase):

  def test_reports_the_agents_behaviour(self):
    trajs = [dataclasses.replace(_episode(GOOD), reward_terms={"outcome": 1.0}),
             dataclasses.replace(_episode(BLIND, end=EpisodeEnd.TOKEN_BUDGET), reward_terms={"outcome": 0.0})]
    runner = _Runner(trajs)
    r = evaluate_episodes(None, runner=runner, suite=CharClassSuite(), tasks=1, samples=2)
    self.assertEqual(runner.chunks, 2)
    self.assertEqual(r["pass@1"], 0.5)
    self.assertTrue(set(behaviour.METRICS) <= set(r))
    self.assertEqual(r["behaviour/read_before_edit"], 0.5)
    self.assertEqual(r["behaviour/recovery_after_failing_tests"], 1.0)
    self.assertEqual(r["behaviour/cut_fraction"], r["cut/fraction"])
    self.assertFalse(math.isnan(r["behaviour/tokens_per_episode"]))


if __name__ == "__main__":
  absltest.main()
