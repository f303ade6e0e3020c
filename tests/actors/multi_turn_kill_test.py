"""A multi-turn actor SIGKILLed mid-episode, and one SIGKILLed mid-chain (after a self-summary, in a later segment):
its successor (same id) re-runs the groups it had begun, nothing is committed twice, and the re-run trajectories
equal an uninterrupted run of the same tickets."""

import dataclasses
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
from c2jax.actors.agent_loop import SummaryConfig
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

# Chains: episodes of 3 turns summarize after their second (trigger 40 positions; many stop tokens, so that an
# untrained model's turns and summaries end early); the tool of a third turn marks the file the test waits for.
CHAIN_CFG = dataclasses.replace(CFG, stop_tokens=tuple(range(0, 259, 3)), context=320, max_turns=4,
                                summary=SummaryConfig(trigger_tokens=40, max_tokens=24, max_segments=3))
_CHAIN_CHILD = """
import sys
from c2jax.actors.actor import Actor
from tests.actors.multi_turn_actor_test import MODEL, EchoSuite
from tests.actors.multi_turn_kill_test import CHAIN_CFG
suite = EchoSuite(step_s=0.3, marker=sys.argv[3], marker_turn=3, turns=3)
Actor(CHAIN_CFG, MODEL, suite, buffer_url=sys.argv[1], weights_url=sys.argv[2], actor_id="a0").run()
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

  def test_killed_mid_chain_the_successor_reruns_whole_chains_once(self):
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    buffer, weights, marker = f"{root}/buffer", f"{root}/weights", f"{root}/third_turn"
    WeightStore(weights).publish(0, jax.device_get(jax.jit(init_params, static_argnums=0)(MODEL, jax.random.key(0))))
    Store(buffer).write_json("trainer.json", {"version": 0, "groups_consumed": 0, "groups_per_step": 2})
    env = dict(os.environ, PYTHONPATH=_ROOT)
    child = subprocess.Popen([sys.executable, "-c", _CHAIN_CHILD, buffer, weights, marker], env=env, cwd=_ROOT)
    self.addCleanup(child.kill)
    deadline = time.time() + 300
    while time.time() < deadline and not os.path.exists(marker) and child.poll() is None:
      time.sleep(0.05)
    # A third turn's tool ran: its episode summarized after its second turn and is in its second segment.
    self.assertTrue(os.path.exists(marker), "no episode reached a later segment")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    self.assertEqual(RolloutReader(buffer).poll(), [])  # each group commits whole: nothing of a chain yet

    suite = EchoSuite(turns=3)
    successor = Actor(CHAIN_CFG, MODEL, suite, buffer_url=buffer, weights_url=weights, actor_id="a0")
    begun = sorted(t["sample_seed"] for _, t in successor.writer.pending())
    self.assertLen(begun, 2)
    stats = successor.run(max_groups=2)
    self.assertEqual(stats.resumed_groups, 2)
    groups = RolloutReader(buffer).poll()
    self.assertEqual(sorted(g.meta["sample_seed"] for g in groups), begun)  # each begun group once, no others
    other = Actor(CHAIN_CFG, MODEL, suite, buffer_url=f"{root}/other", weights_url=weights, actor_id="b0")
    other.refresh_weights()
    chained = 0
    for g in groups:
      chains = g.data["chain_id"]
      np.testing.assert_array_equal(np.unique(chains), np.arange(CHAIN_CFG.group_size))
      chained += int(len(chains) > CHAIN_CFG.group_size)
      for c in np.unique(chains):  # segments in order, the episode's reward on each
        np.testing.assert_array_equal(g.data["segment"][chains == c], np.arange(np.sum(chains == c)))
        self.assertLen(set(g.data["reward_terms"]["outcome"][chains == c]), 1)
      task = other.suite.task("train", int(g.meta["task_id"].rsplit("/", 1)[1]))
      again = other._episode_group(other.sample_episodes([task], [g.meta["sample_seed"]]))
      for f in ("tokens", "source", "chain_id", "segment"):
        np.testing.assert_array_equal(again[f], g.data[f])
    self.assertGreaterEqual(chained, 1)


if __name__ == "__main__":
  absltest.main()
