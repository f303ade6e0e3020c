"""The actor loop in one process: in-flight weight swaps stamped per token, admission, resumed groups.

One sampler configuration (2 groups x 4 rows, 6 new tokens) is shared by every test, so it compiles once.
"""

import dataclasses
import shutil
import tempfile

from absl.testing import absltest
import jax
import numpy as np

from c2jax.actors import sampler as sampler_lib
from c2jax.actors.actor import Actor, ActorConfig, WeightUpdates, _seed
from c2jax.envs.char_class import CharClassSuite
from c2jax.model.params import init_params
from c2jax.rollouts import admission
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.storage import Store
from c2jax.rollouts.weight_store import WeightStore
from configs.model import tiny

MODEL = dataclasses.replace(tiny.get_model_config(), vocab_size=259, n_layers=2, num_mtp_layers=0, scan_unroll=1)
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
