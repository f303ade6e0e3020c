"""The actor with multi-turn episodes: groups of whole trajectories with their ledger, in-flight weight swaps
across turns, and re-run of begun groups after a restart (the agent loop itself: agent_loop_test.py)."""

import dataclasses
import shutil
import tempfile
import time

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.actors.actor import Actor, ActorConfig, EpisodeKind
from c2jax.actors.ledger import Source
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.core.agent_env import TurnResult
from c2jax.envs.token_tasks.suite import TokenTask
from c2jax.model.params import init_params
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.storage import Store
from c2jax.rollouts.weight_store import WeightStore
from tests import tiny

MODEL = tiny.BYTES
TOK = ByteTokenizer()
CFG = ActorConfig(group_size=2, groups_per_call=2, prompt_len=32, max_new_tokens=6, chunk_steps=2, max_lag=0,
                  poll_interval_s=0.01, episodes=EpisodeKind.MULTI_TURN, context=192, max_turns=4,
                  max_episode_tokens=40, slots=2, chunk_sizes=(16, 64), tool_workers=2)


class _Echo:
  """Observations name the turn; the episode finishes after `turns` turns; outcome = turns / 4. With `marker`, a
  turn numbered `marker_turn` or later creates that file (a test waits for it)."""

  def __init__(self, turns, step_s=0.0, marker="", marker_turn=0):
    self.turns, self.t, self.step_s = turns, 0, step_s
    self.marker, self.marker_turn = marker, marker_turn

  def reset(self):
    pass

  def step(self, ids, text):
    self.t += 1
    if self.marker and self.t >= self.marker_turn:
      open(self.marker, "a").close()
    time.sleep(self.step_s)
    return TurnResult(observation=f"<saw {len(ids)}>", notice=f"[{self.t}]", done=self.t >= self.turns,
                      reason="finish")

  def reward(self):
    return {"outcome": self.t / 4}

  def close(self):
    pass


@dataclasses.dataclass(frozen=True)
class EchoSuite:
  """A multi-turn task suite without a sandbox: task i takes 1 + i % 3 turns."""

  step_s: float = 0.0  # each turn's tools take this long
  name: str = "echo"
  marker: str = ""  # see _Echo
  marker_turn: int = 0
  turns: int = 0  # turns of every episode (0: 1 + i % 3 for task i)

  def size(self, split):
    return 5

  def task(self, split, index):
    index = int(index) % 5
    return TokenTask(task_id=f"echo/{split}/{index}", prompt=tuple(TOK.encode(f"echo task {index}:", eos=False)))

  def agent_env(self, task):
    turns = self.turns or 1 + int(task.task_id.rsplit("/", 1)[1]) % 3
    return _Echo(turns, self.step_s, self.marker, self.marker_turn)

  def text_tokenizer(self):
    return TOK

  def reward(self, task, generated):
    raise AssertionError("multi-turn episodes are graded by their environment")


class MultiTurnActorTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    init = jax.jit(init_params, static_argnums=0)
    cls.params = [jax.device_get(init(MODEL, jax.random.key(i))) for i in range(2)]

  def setUp(self):
    super().setUp()
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    self.buffer, self.weights = f"{root}/buffer", f"{root}/weights"
    self.store = WeightStore(self.weights)
    self.store.publish(0, self.params[0])
    Store(self.buffer).write_json("trainer.json", {"version": 0, "groups_consumed": 0, "groups_per_step": 2})

  def _actor(self, cfg=CFG, actor_id="a0"):
    return Actor(cfg, MODEL, EchoSuite(), buffer_url=self.buffer, weights_url=self.weights, actor_id=actor_id)

  @pytest.mark.slow
  def test_groups_hold_whole_trajectories_with_their_ledger(self):
    actor = self._actor()
    self.assertEqual(actor.run(max_groups=2).groups, 2)
    groups = RolloutReader(self.buffer).poll()
    self.assertLen(groups, 2)
    for g in groups:
      d = g.data
      turns = 1 + int(g.meta["task_id"].rsplit("/", 1)[1]) % 3
      np.testing.assert_array_equal(d["loss_mask"], (d["source"] == Source.MODEL).astype(np.float32))
      np.testing.assert_allclose(d["reward_terms"]["outcome"], [min(turns, 4) / 4] * 2)
      for r in range(CFG.group_size):
        n = int(d["prompt_length"][r] + d["length"][r])
        self.assertEqual(int(d["turn"][r, :n].max()), turns - 1)
        self.assertEqual(int(np.sum(d["source"][r, :n] == Source.OBSERVATION) > 0), int(turns > 1))
        # The trainer's forward on the stored row reproduces the behaviour log-probs and the routing.
        lp, ids = tiny.trainer_logprobs(MODEL, self.params[0], d["tokens"][r, :n])
        m = d["loss_mask"][r, :n] > 0
        np.testing.assert_allclose(d["behaviour_logprobs"][r, :n][m], lp[m], rtol=0, atol=2e-5)
        np.testing.assert_array_equal(d["expert_ids"][:, r, :n], ids)
    self.assertEqual(actor.runner().stats.reprefill_fraction, 0.0)

  @pytest.mark.slow
  def test_in_flight_swap_across_turns_stamps_versions(self):
    actor = self._actor(dataclasses.replace(CFG, max_lag=1))
    update = actor.weights.update
    calls = []

    def update_publishing_mid_group(have_version, have_params):
      calls.append(have_version)
      if len(calls) == 6:
        self.store.publish(1, self.params[1])
      return update(have_version, have_params)

    actor.weights.update = update_publishing_mid_group
    actor.run(max_groups=2)
    self.assertEqual(actor.stats.in_flight_swaps, 1)
    groups = RolloutReader(self.buffer).poll()
    seen = set()
    for g in groups:
      for r in range(CFG.group_size):
        v = g.data["policy_version"][r][g.data["loss_mask"][r] > 0]
        self.assertTrue(np.all(np.diff(v) >= 0))
        seen |= set(v.tolist())
    self.assertEqual(seen, {0, 1})

  def test_restarted_actor_reruns_begun_groups_identically(self):
    first = self._actor()
    ticket = first._new_ticket()
    first.writer.begin(ticket)
    first.writer.close()  # killed before committing
    actor = self._actor()
    self.assertEqual(actor.run(max_groups=1).resumed_groups, 1)
    self.assertEqual(actor.writer.pending(), [])
    resumed, = RolloutReader(self.buffer).poll()[:1]
    self.assertEqual(resumed.meta["sample_seed"], ticket["sample_seed"])
    # The same ticket run by a fresh actor elsewhere gives the same trajectories: the keys come from the ticket.
    again = self._actor(actor_id="a1")
    task = again.suite.task(ticket["split"], ticket["task_index"])
    trajectories = again.sample_episodes([task], [ticket["sample_seed"]])
    np.testing.assert_array_equal(again._episode_group(trajectories)["tokens"], resumed.data["tokens"])

  def test_config_checks(self):
    with self.assertRaisesRegex(ValueError, "prompt_len=192 must be < context=192"):
      dataclasses.replace(CFG, prompt_len=192)
    self.assertEqual(CFG.seq_len, 192)
    self.assertEqual(CFG.engine_config().slots, 2)
    self.assertEqual(dataclasses.replace(CFG, slots=0).engine_config().slots, 4)


if __name__ == "__main__":
  absltest.main()
