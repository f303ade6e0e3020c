"""The held-out estimators of c2jax/actors/evaluate.py against brute force over every k-subset."""

import dataclasses
import itertools
import math

from absl.testing import absltest, parameterized
import numpy as np

from c2jax.actors import behaviour
from c2jax.actors.evaluate import best_of_k, evaluate_episodes, pass_at_k
from c2jax.actors.agent_loop import RunStats
from c2jax.actors.ledger import EpisodeEnd
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.chat.chat_tokens import ChatTokens
from c2jax.envs.token_tasks.char_class import CharClassSuite
from tests.actors.behaviour_test import BLIND, GOOD, _episode


def brute_best_of_k(outcomes, k):
  return float(np.mean([max(s) for s in itertools.combinations(outcomes, k)]))


class BestOfKTest(parameterized.TestCase):

  @parameterized.parameters(*[(n, k, seed) for n in (1, 3, 8, 10) for k in (1, 2, 3, 8) for seed in (0, 1) if k <= n])
  def test_is_the_mean_max_over_all_k_subsets(self, n, k, seed):
    rng = np.random.default_rng(seed)
    outcomes = rng.choice([0.0, 0.25, 0.5, 1.0], size=n)  # partial credit, ties included
    self.assertAlmostEqual(best_of_k(outcomes, k), brute_best_of_k(outcomes, k), places=12)

  def test_k_equal_n_is_the_maximum_and_k_one_the_mean(self):
    o = [0.3, 0.0, 0.9, 0.5]
    self.assertAlmostEqual(best_of_k(o, 4), 0.9)
    self.assertAlmostEqual(best_of_k(o, 1), np.mean(o))

  @parameterized.parameters((16, 0, 8), (16, 5, 8), (16, 16, 8), (8, 3, 1), (9, 8, 4))
  def test_on_pass_fail_outcomes_it_is_pass_at_k(self, n, c, k):
    outcomes = [1.0] * c + [0.0] * (n - c)
    self.assertAlmostEqual(best_of_k(outcomes, k), pass_at_k(n, c, k), places=12)

  @parameterized.parameters(0, 5)
  def test_bad_k_is_refused(self, k):
    with self.assertRaisesRegex(ValueError, "1 <= k <= samples"):
      best_of_k([0.0, 1.0, 0.5, 0.5], k)


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
