"""The actor loop in one process: in-flight weight swaps stamped per token, admission, resumed groups.

One sampler configuration (2 groups x 4 rows, 6 new tokens) is shared by every test, so it compiles once.
"""

import dataclasses
import shutil
import tempfile
import threading
import time
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.actors import sampler as sampler_lib
from c2jax.actors.actor import Actor, ActorConfig, WeightUpdates, _seed
from c2jax.envs.token_tasks.char_class import CharClassSuite
from c2jax.model.params import init_params
from c2jax.rollouts import admission
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.storage import Store
from c2jax.rollouts.weight_store import WeightStore
from tests import tiny

MODEL = tiny.BYTES
CFG = ActorConfig(group_size=4, groups_per_call=2, prompt_len=16, max_new_tokens=6, chunk_steps=2, max_lag=0,
                  poll_interval_s=0.01)


class ActorTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    init = jax.jit(init_params, static_argnums=0)
    cls.params = [jax.device_get(init(MODEL, jax.random.key(i))) for i in range(3)]

  def setUp(self):
    super().setUp()
    root = tempfile.mkdtemp()  # not create_tempdir: that needs absl flags, which pytest does not parse
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    self.buffer, self.weights = f"{root}/buffer", f"{root}/weights"
    self.store = WeightStore(self.weights)
    self.suite = CharClassSuite()

  def _actor(self, cfg=CFG, actor_id="a0"):
    return Actor(cfg, MODEL, self.suite, buffer_url=self.buffer, weights_url=self.weights, actor_id=actor_id)

  def _trainer_progress(self, version, consumed, groups_per_step=2):
    Store(self.buffer).write_json("trainer.json", {"version": version, "groups_consumed": consumed,
                                                   "groups_per_step": groups_per_step})

  def test_in_flight_swap_stamps_each_token_with_its_version(self):
    self.store.publish(0, self.params[0])
    self._trainer_progress(0, 0)
    actor = self._actor(dataclasses.replace(CFG, max_lag=1))
    update = actor.weights.update
    calls = []

    def update_publishing_mid_group(have_version, have_params):
      # The trainer publishes version 1 while the actor is between its first and second decode chunk.
      calls.append(have_version)
      if len(calls) == 4:
        self.store.publish(1, self.params[1])
      return update(have_version, have_params)

    actor.weights.update = update_publishing_mid_group
    self.assertEqual(actor.run(max_groups=2).groups, 2)
    self.assertEqual(actor.stats.in_flight_swaps, 1)
    groups = RolloutReader(self.buffer).poll()
    self.assertLen(groups, 2)
    versions = np.concatenate([g.data["policy_version"] for g in groups])
    mask = np.concatenate([g.data["loss_mask"] for g in groups]) > 0
    tokens = np.concatenate([g.data["tokens"] for g in groups])
    plen = np.concatenate([g.data["prompt_length"] for g in groups])
    # update() calls: wait_for_weights, step's refresh, then one before each decode chunk; version 1 appears at
    # the 4th, after the first chunk: the prefill token and the first chunk's 2 tokens are version 0, the rest 1.
    rows = np.arange(len(tokens))
    np.testing.assert_array_equal(versions[rows, plen], 0)
    np.testing.assert_array_equal(versions[rows, plen + 2], 0)
    np.testing.assert_array_equal(versions[rows, plen + 3], 1)
    np.testing.assert_array_equal(mask.sum(1), 6)
    self.assertEqual(groups[0].meta["start_version"], 0)
    self.assertEqual(groups[0].meta["end_version"], 1)

    # The same swap done by hand with the sampler gives the same tokens: the actor adds nothing but bookkeeping.
    key = jax.random.key(_seed(*(g.meta["sample_seed"] for g in groups)))
    prompts = np.zeros((8, 16), np.int32)
    for r in range(8):
      prompts[r, :plen[r]] = tokens[r, :plen[r]]
    kw = dict(cfg=MODEL, sampling=actor.sampling)
    state = sampler_lib.prefill(jax.device_put(self.params[0]), prompts, plen, key, version=0, **kw)
    state = sampler_lib.decode(jax.device_put(self.params[0]), state, steps=2, version=0, **kw)
    state = sampler_lib.decode(jax.device_put(self.params[1]), state, steps=6, version=1, **kw)
    out = jax.device_get(sampler_lib.finish(jax.device_put(self.params[1]), state, cfg=MODEL))
    np.testing.assert_array_equal(out.samples.tokens, tokens)
    np.testing.assert_array_equal(out.policy_version, versions)
    np.testing.assert_allclose(out.samples.logprobs, np.concatenate([g.data["behaviour_logprobs"] for g in groups]))

  @pytest.mark.slow
  def test_admission_holds_the_actor_until_the_trainer_catches_up(self):
    self.store.publish(0, self.params[0])
    self._trainer_progress(0, 0)
    actor = self._actor(dataclasses.replace(CFG, weight_updates=WeightUpdates.BETWEEN_CALLS))
    actor.refresh_weights()
    # max_lag 0, 2 groups per update: version 0 may start exactly the 2 groups that update 0 trains on.
    self.assertEqual(actor.step(), 2)
    self.assertEqual(actor.step(), 0)
    status = admission.read_status(self.buffer)
    self.assertEqual((status.committed, status.pending), (2, 0))
    # The trainer consumed them and published version 1: the actor loads it and goes on, sampling with it only.
    self.store.publish(1, self.params[1])
    self._trainer_progress(1, 2)
    self.assertEqual(actor.step(), 2)
    groups = RolloutReader(self.buffer).poll()
    self.assertEqual([int(g.data["policy_version"].max()) for g in groups], [0, 0, 1, 1])
    for g in groups[2:]:
      mask = g.data["loss_mask"] > 0
      self.assertTrue(np.all(g.data["policy_version"][mask] == 1))

  def test_a_refused_actor_asks_again_as_soon_as_the_trainer_moves(self):
    # Without this an actor slept in growing back-offs (up to 1 s) while the trainer finished steps of ~0.1 s,
    # and the trainer then waited on an empty buffer.
    self._trainer_progress(0, 0)
    actor = self._actor(dataclasses.replace(CFG, admission_recheck_s=60.0))
    self.assertEqual(admission.read_progress(self.buffer), (0, 0))
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (actor._wait_for_progress(lambda: False), done.set()))
    waiter.start()
    self.assertFalse(done.wait(0.3))  # nothing changed: still waiting
    self._trainer_progress(1, 2)
    self.assertTrue(done.wait(10))  # well before admission_recheck_s
    waiter.join()
    self.assertEqual(admission.read_progress(self.buffer), (1, 2))
    # Without progress it asks again after admission_recheck_s, and a stop ends the wait at once.
    t0 = time.perf_counter()
    self._actor(dataclasses.replace(CFG, admission_recheck_s=0.2), "a1")._wait_for_progress(lambda: False)
    self._actor(actor_id="a2")._wait_for_progress(lambda: True)
    self.assertLess(time.perf_counter() - t0, 10)

  def test_racing_admissions_never_exceed_the_budget(self):
    # max_lag 0, 2 groups per update: exactly 2 groups may start before the trainer moves. Two actors admitted by
    # the same status read (neither's tickets visible yet) both begin 2.
    self.store.publish(0, self.params[0])
    self._trainer_progress(0, 0)
    a, b = self._actor(actor_id="a"), self._actor(actor_id="b")
    for actor in (a, b):
      actor.refresh_weights()
    self.assertEqual((a._admit(0), b._admit(0)), (2, 2))
    stale = admission.read_status(self.buffer)
    # Calls: a admits (stale), a verifies (fresh), b admits (stale: it raced a), b verifies (fresh).
    with mock.patch.object(admission, "read_status", side_effect=[stale, mock.DEFAULT, stale, mock.DEFAULT],
                           wraps=admission.read_status):
      # The first to verify sees only its own tickets and keeps them; the second sees both and cancels its own.
      got_a, got_b = a._take_tickets(), b._take_tickets()
    self.assertEqual((len(got_a), len(got_b)), (2, 0))
    self.assertEqual((a._contended, b._contended), (False, True))
    self.assertEqual(b._next_task, 0)  # the cancelled draws are made again
    self.assertEqual(admission.read_status(self.buffer).pending, 2)
    # The worst interleaving: both begin before either verifies. Each sees the other's tickets: both back off.
    c, d = self._actor(actor_id="c"), self._actor(actor_id="d")
    for actor in (c, d):
      actor.refresh_weights()
    self._trainer_progress(1, 2)  # a budget of 2 more groups
    self.store.publish(1, self.params[1])
    for actor in (c, d):
      actor.refresh_weights()
      for _ in range(2):
        actor.writer.begin(actor._new_ticket())
    self.assertEqual((c._verify(2), d._verify(2)), (0, 0))

  def test_config_rejects_nonpositive_intervals(self):
    for name in ("poll_interval_s", "admission_recheck_s"):
      with self.assertRaisesRegex(ValueError, name):
        dataclasses.replace(CFG, **{name: 0.0})

  def test_restarted_actor_reruns_the_groups_it_had_begun(self):
    self.store.publish(0, self.params[0])
    self._trainer_progress(0, 0)
    first = self._actor()
    # A previous run began a group and was killed before committing it.
    ticket = first._new_ticket()
    ticket_id = first.writer.begin(ticket)
    first.writer.close()
    actor = self._actor()
    self.assertEqual(actor.run(max_groups=1).resumed_groups, 1)
    self.assertEqual(actor.writer.pending(), [])
    group, = RolloutReader(self.buffer).poll()[:1]
    self.assertEqual(group.meta["task_id"], self.suite.task(ticket["split"], ticket["task_index"]).task_id)
    self.assertEqual(group.meta["sample_seed"], ticket["sample_seed"])
    del ticket_id

  def test_rewards_come_from_the_suite(self):
    self.store.publish(0, self.params[2])
    self._trainer_progress(0, 0)
    actor = self._actor()
    actor.run(max_groups=2)
    for g in RolloutReader(self.buffer).poll():
      task = next(self.suite.task("train", i) for i in range(self.suite.size("train"))
                  if self.suite.task("train", i).task_id == g.meta["task_id"])
      for r in range(CFG.group_size):
        p = int(g.data["prompt_length"][r])
        expected = self.suite.reward(task, g.data["tokens"][r, p:p + int(g.data["length"][r])])["outcome"]
        self.assertAlmostEqual(float(g.data["reward_terms"]["outcome"][r]), expected, places=6)


if __name__ == "__main__":
  absltest.main()
