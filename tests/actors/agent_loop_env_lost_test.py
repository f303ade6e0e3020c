"""The agent loop when an episode's environment is lost with its host (`EnvLost`, e.g. a killed environment server):
the attempt is dropped whole and the episode runs again from its start in a fresh environment, so the trajectories
equal a run where nothing was lost and each episode returns exactly one; an environment lost every time ends as
ENV_ERROR after `MAX_ENV_RERUNS`; an ordinary exception is still the episode's own error, never re-run."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from c2jax.actors import agent_loop
from c2jax.actors.agent_loop import Episode
from c2jax.actors.ledger import EpisodeEnd
from c2jax.envs.core.agent_env import EnvLost
from tests import tiny
from tests.actors.agent_loop_test import MODEL, TOK, EchoEnv, _runner


class FlakyEnv(EchoEnv):
  """EchoEnv whose host is lost (`EnvLost`, or `error`) at `where` ("reset", "step" at its second turn, "reward")
  in its first `losses` instances of the episode (counted in `made`)."""

  def __init__(self, turns: int, made: list, losses: int, where: str, error=EnvLost):
    super().__init__(turns)
    made.append(self)
    self.fail = len(made) <= losses
    self.where, self.error = where, error

  def _maybe_fail(self, where: str):
    if self.fail and self.where == where:
      raise self.error(f"host lost at {where}")

  def reset(self):
    self._maybe_fail("reset")
    super().reset()

  def step(self, ids, text):
    if self.t == 1:
      self._maybe_fail("step")
    return super().step(ids, text)

  def reward(self):
    self._maybe_fail("reward")
    return super().reward()


def _run(losses: int = 0, where: str = "step", error=EnvLost):
  """Three scripted episodes (3 turns each); episode 1's environment is lost in its first `losses` instances."""
  made = {i: [] for i in range(3)}
  episodes = [Episode(prompt=TOK.encode(f"task {i} " * (i + 1), bos=True, eos=False), key=10 + i,
                      make_env=functools.partial(FlakyEnv, 3, made[i], losses if i == 1 else 0, where, error),
                      script=lambda turn, obs, i=i: f"e{i} t{turn} saw {len(obs)}")
              for i in range(3)]
  runner = _runner()
  before = (runner.stats.env_reruns, runner.stats.env_errors, runner.stats.episodes)
  trajectories = runner.run(episodes, weights=lambda: (tiny.params(MODEL), 0))
  after = (runner.stats.env_reruns, runner.stats.env_errors, runner.stats.episodes)
  return trajectories, tuple(b - a for a, b in zip(before, after)), made


@functools.cache
def _baseline():
  return _run()[0]


class EnvLostTest(parameterized.TestCase):

  @parameterized.parameters("reset", "step", "reward")
  def test_a_lost_environment_reruns_the_episode(self, where):
    trajectories, (reruns, errors, episodes), made = _run(losses=1, where=where)
    self.assertEqual((reruns, errors, episodes), (1, 0, 3))
    self.assertEqual([len(made[i]) for i in range(3)], [1, 2, 1])  # a fresh environment for the re-run
    self.assertTrue(all(env.closed for envs in made.values() for env in envs))
    for got, want in zip(trajectories, _baseline()):
      np.testing.assert_array_equal(got.tokens, want.tokens)
      np.testing.assert_array_equal(got.source, want.source)
      np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=2e-5)
      self.assertEqual((got.end, got.turns, dict(got.reward_terms)), (want.end, want.turns, dict(want.reward_terms)))
    self.assertEqual((trajectories[1].end, trajectories[1].reward_terms["outcome"]), (EpisodeEnd.FINISHED, 3.0))

  def test_lost_every_time_ends_as_env_error(self):
    trajectories, (reruns, errors, episodes), made = _run(losses=100)
    self.assertEqual((reruns, errors, episodes), (agent_loop.MAX_ENV_RERUNS, 1, 3))
    self.assertLen(made[1], agent_loop.MAX_ENV_RERUNS + 1)
    self.assertEqual((trajectories[1].end, dict(trajectories[1].reward_terms)),
                     (EpisodeEnd.ENV_ERROR, dict(agent_loop.ENV_ERROR_TERMS)))
    self.assertEqual([t.end for t in (trajectories[0], trajectories[2])], [EpisodeEnd.FINISHED] * 2)

  def test_an_ordinary_error_is_the_episodes_own(self):
    trajectories, (reruns, errors, _), made = _run(losses=1, error=RuntimeError)
    self.assertEqual((reruns, errors, len(made[1])), (0, 1, 1))
    self.assertEqual(trajectories[1].end, EpisodeEnd.ENV_ERROR)


if __name__ == "__main__":
  absltest.main()
