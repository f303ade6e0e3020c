"""The pretraining run config: the default phases, errors that name the field, and the optimizer's lr_multipliers."""

from absl.testing import absltest
import jax

from c2jax.pretrain.step import MtpTarget, init_state
from c2jax.services import pretrain_run_config
from configs import pretrain_tiny


def _phases(c):
  return pretrain_run_config.parse(c).phases_resolved()


class ConfigTest(absltest.TestCase):

  def test_default_phases(self):
    phases = _phases(pretrain_tiny.get_config())
    self.assertEqual([p.name for p in phases], ["bulk", "long_context", "sft"])
    self.assertEqual([p.start for p in phases], [0, 60, 75])
    self.assertEqual([p.hp.mtp_weight > 0 for p in phases], [False, True, True])
    self.assertEqual({p.hp.mtp_target for p in phases[1:]}, {MtpTarget.SELF_DISTILL})
    self.assertEqual(phases[0].model.rope.type.value, "default")
    self.assertEqual((phases[1].model.rope.type.value, phases[1].model.rope.factor), ("yarn", 4.0))
    self.assertEqual(phases[2].model.rope, phases[1].model.rope)  # rope overrides carry into later phases
    self.assertEqual(phases[2].sources[0]["kind"], "sft")
    # One AdamW state through the phases: each phase's schedule starts at its first global step.
    self.assertEqual([p.hp.optim.schedule_offset for p in phases], [0, 60, 75])
    self.assertEqual({(p.hp.optim.weight_decay, p.hp.z_loss_weight, p.hp.bias_update_rate) for p in phases},
                     {(0.1, 1e-4, 1e-3)})

  def test_errors_name_the_field(self):
    cases = [({"phase_order": "bulk,nope"}, "`phases` has only"),
             ({"phase_order": ""}, "phase_order is empty"),
             ({"phase_order": "bulk,bulk"}, "twice")]
    for override, pattern in cases:
      c = pretrain_tiny.get_config()
      c.update(override)
      with self.assertRaisesRegex(ValueError, pattern):
        _phases(c)
    c = pretrain_tiny.get_config()
    c.phases.bulk.decay = "exponential"
    with self.assertRaisesRegex(ValueError, r"phases.bulk.decay='exponential' is not one of 'cosine', 'linear'"):
      _phases(c)
    c = pretrain_tiny.get_config()
    c.phases.bulk.rope = {"factr": 2.0}
    with self.assertRaisesRegex(ValueError, "phases.bulk.rope has no field 'factr'; its fields are"):
      _phases(c)
    c = pretrain_tiny.get_config()
    c.phases.sft.seq_len = 100_000
    with self.assertRaisesRegex(ValueError, "max_position_embeddings"):
      _phases(c)
    c = pretrain_tiny.get_config()
    c.phases.bulk.sources = {}
    with self.assertRaisesRegex(ValueError, "phases.bulk.sources is empty"):
      _phases(c)
    c = pretrain_tiny.get_config()
    c.phases.bulk.mtp_weight = 0.5
    c.model_overrides.num_mtp_layers = 0
    with self.assertRaisesRegex(ValueError, "phases.bulk.mtp_weight=0.5 but the model has no MTP layers"):
      _phases(c)
    with self.assertRaisesRegex(ValueError, "optim has no field 'z_loss_weight'; its fields are"):
      pretrain_run_config.parse({"optim": {"z_loss_weight": 0.1}})  # a step setting, under `step`

  def test_lr_multipliers_reach_every_phase_and_must_match_a_parameter(self):
    c = pretrain_tiny.get_config()
    c.optim.lr_multipliers = {"(dense|moe)_layers/attn/(q_a|kv_a)": 0.3}
    phases = _phases(c)
    self.assertEqual({p.hp.optim.lr_multipliers for p in phases}, {(("(dense|moe)_layers/attn/(q_a|kv_a)", 0.3),)})
    key = jax.random.key(0)
    jax.eval_shape(lambda: init_state(phases[0].model, phases[0].hp, key))  # the tiny model has both maps
    c.optim.lr_multipliers = {"layers/attn/q_a": 0.3}  # no such path: the layers are dense_layers / moe_layers
    phases = _phases(c)
    with self.assertRaisesRegex(ValueError, r"patterns \['layers/attn/q_a'\] match no trained parameter"):
      jax.eval_shape(lambda: init_state(phases[0].model, phases[0].hp, key))

  def test_unknown_model_name(self):
    c = pretrain_tiny.get_config()
    c.model = "nope"
    with self.assertRaisesRegex(ValueError, "Unknown model preset 'nope'; known: kimi_k25, small, tiny"):
      _phases(c)


if __name__ == "__main__":
  absltest.main()
