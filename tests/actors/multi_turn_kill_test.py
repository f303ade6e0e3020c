"""A multi-turn actor SIGKILLed mid-episode: its successor (same id) re-runs the groups it had begun, nothing is
committed twice, and the re-run trajectories equal an uninterrupted run of the same tickets."""

import os
import signal
import subprocess
import sys
import tempfile
import shutil
import time

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.actors.actor import Actor
from c2jax.model.params import init_params
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.storage import Store
from c2jax.rollouts.weight_store import WeightStore
from tests.actors.multi_turn_actor_test import CFG, MODEL, EchoSuite

pytestmark = pytest.mark.e2e  # a real actor process, SIGKILLed (`make test-unit` leaves it out)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The child runs the actor with tools slow enough (0.3 s per turn) to be killed between turns of its episodes.
_CHILD = """
import sys
from c2jax.actors.actor import Actor
from tests.actors.multi_turn_actor_test import CFG, MODEL, EchoSuite
Actor(CFG, MODEL, EchoSuite(step_s=0.3), buffer_url=sys.argv[1], weights_url=sys.argv[2], actor_id="a0").run()
"""


class KillTest(absltest.TestCase):

  def test_killed_mid_episode_the_successor_reruns_begun_groups_once(self):
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    buffer, weights = f"{root}/buffer", f"{root}/weights"
    WeightStore(weights).publish(0, jax.device_get(jax.jit(init_params, static_argnums=0)(MODEL, jax.random.key(0))))
    # The trainer admits exactly 2 groups (max_lag 0, 2 per step): the child begins both and is killed mid-way.
    Store(buffer).write_json("trainer.json", {"version": 0, "groups_consumed": 0, "groups_per_step": 2})
    env = dict(os.environ, PYTHONPATH=_ROOT)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, buffer, weights], env=env, cwd=_ROOT)
    self.addCleanup(child.kill)
    pending = f"{buffer}/shards/a0/pending"
    deadline = time.time() + 240
    while time.time() < deadline and not (os.path.isdir(pending) and len(os.listdir(pending)) >= 2):
      time.sleep(0.2)
    self.assertTrue(os.path.isdir(pending) and len(os.listdir(pending)) >= 2, "the actor never began its groups")
    time.sleep(1.0)  # inside the episodes: their tools take 0.3 s per turn
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    self.assertEqual(RolloutReader(buffer).poll(), [])  # nothing committed before the kill

    successor = Actor(CFG, MODEL, EchoSuite(), buffer_url=buffer, weights_url=weights, actor_id="a0")
    begun = sorted(t["sample_seed"] for _, t in successor.writer.pending())
    self.assertLen(begun, 2)
    stats = successor.run(max_groups=2)
    self.assertEqual(stats.resumed_groups, 2)
    groups = RolloutReader(buffer).poll()
    self.assertEqual(sorted(g.meta["sample_seed"] for g in groups), begun)  # each begun group once, no others
    # The re-run equals an uninterrupted run of the same tickets by a fresh actor elsewhere.
    other = Actor(CFG, MODEL, EchoSuite(), buffer_url=f"{root}/other", weights_url=weights, actor_id="b0")
    other.refresh_weights()
    for g in groups:
      index = int(g.meta["task_id"].rsplit("/", 1)[1])
      task = other.suite.task("train", index)
      again = other._episode_group(other.sample_episodes([task], [g.meta["sample_seed"]]))
      np.testing.assert_array_equal(again["tokens"], g.data["tokens"])
      np.testing.assert_array_equal(again["source"], g.data["source"])


if __name__ == "__main__":
  absltest.main()
