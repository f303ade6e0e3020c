"""The RL recipe as a run config: the report's defaults (a golden snapshot) and one override per ablation."""

from absl.testing import absltest, parameterized

from c2jax import typed_config
from c2jax.model import presets
from c2jax.rl.config import Overlong, RLConfig, RoutingReplay, ZeroVarianceGroups
from c2jax.rl.filters import FilterMode
from c2jax.rl.kl import KlPlacement
from c2jax.rl.policy_loss import SequenceUnit

# The report's recipe (section 4): Dr. GRPO, constant-normalized token sum, overlong kept, k1 KL, routing replay,
# plausibility filter. A change here is a change of the default recipe and must be deliberate.
GOLDEN = {
    "advantage": "dr_grpo", "advantage_eps": 1e-06, "aggregation": "token_sum_constant", "clip_eps_high": 0.28,
    "clip_eps_low": 0.2, "filter.max_ratio": 2.0, "filter.min_prob": 0.0, "filter.min_ratio": 0.5,
    "filter.mode": "token", "filter.sequence_max_fraction": 0.0, "kl_coef": 0.001, "kl_estimator": "k1",
    "kl_placement": "in_reward", "loss_constant": 0.0, "micro_batches": 1, "optim.b1": 0.9, "optim.b2": 0.95,
    "optim.decay": "cosine", "optim.eps": 1e-08, "optim.final_lr_fraction": 1.0, "optim.grad_clip": 1.0,
    "optim.learning_rate": 1e-05, "optim.lr_multipliers": {}, "optim.schedule_offset": 0, "optim.total_steps": 1,
    "optim.warmup_steps": 0,
    "optim.weight_decay": 0.0, "overlong": "keep", "pass_k": [1, 4],
    "policy_loss": "ppo_clip", "reward.length_penalty.k": 1.0, "reward.length_penalty.q": 0.5,
    "reward.length_penalty.scale": 1000.0, "reward.length_penalty.weight": 0.0, "reward.weights.outcome": 1.0,
    "routing_replay": "replay", "sampling_temperature": 1.0, "sequence_unit": "chain", "success_threshold": 1.0,
    "tis_cap": 2.0,
    "zero_variance_groups": "keep",
}


def _parse(d, model=None):
  return typed_config.from_plain(RLConfig(model=model or presets.tiny()), d, "rl")


class ConfigTest(parameterized.TestCase):

  def test_golden_defaults(self):
    got = typed_config.flatten(typed_config.to_plain(RLConfig(model=presets.tiny())))
    self.assertEqual(got, GOLDEN)

  def test_round_trip(self):
    cfg = RLConfig(model=presets.tiny())
    self.assertEqual(_parse(typed_config.to_plain(cfg), cfg.model), cfg)

  @parameterized.parameters(
      ("advantage", "grpo", lambda c: c.advantage == "grpo"),
      ("advantage", "rloo", lambda c: c.advantage == "rloo"),
      ("aggregation", "seq_mean_token_mean", lambda c: c.aggregation == "seq_mean_token_mean"),
      ("aggregation", "token_mean", lambda c: c.aggregation == "token_mean"),
      ("policy_loss", "tis", lambda c: c.policy_loss == "tis"),
      ("kl_estimator", "k3", lambda c: c.kl_estimator == "k3"),
      ("kl_placement", "LOSS_STRAIGHT_THROUGH", lambda c: c.kl_placement is KlPlacement.LOSS_STRAIGHT_THROUGH),
      ("kl_placement", "none", lambda c: c.kl_placement is KlPlacement.NONE and not c.uses_reference),
      ("overlong", "mask", lambda c: c.overlong is Overlong.MASK),
      ("routing_replay", "off", lambda c: c.routing_replay is RoutingReplay.OFF),
      ("zero_variance_groups", "drop", lambda c: c.zero_variance_groups is ZeroVarianceGroups.DROP),
      ("sequence_unit", "row", lambda c: c.sequence_unit is SequenceUnit.ROW),
      ("filter.mode", "none", lambda c: c.filter.mode is FilterMode.NONE),
      ("filter.mode", "sequence", lambda c: c.filter.mode is FilterMode.SEQUENCE),
      ("reward.weights.style", 0.1, lambda c: dict(c.reward.weights) == {"outcome": 1.0, "style": 0.1}),
      ("reward.length_penalty.weight", 0.5, lambda c: c.reward.length_penalty.weight == 0.5),
      ("optim.learning_rate", 3e-6, lambda c: c.optim.learning_rate == 3e-6),
      ("micro_batches", 4, lambda c: c.micro_batches == 4),
  )
  def test_override(self, path, value, check):
    d = typed_config.to_plain(RLConfig(model=presets.tiny()))
    *parents, leaf = path.split(".")
    node = d
    for p in parents:
      node = node[p]
    node[leaf] = value  # (for reward.weights.style: a new reward term)
    self.assertTrue(check(_parse(d)))

  def test_errors_name_the_field_and_choices(self):
    with self.assertRaisesRegex(ValueError, r"rl.kl_placement='reward' is not one of 'none', 'in_reward', 'loss'"):
      _parse({"kl_placement": "reward"})
    with self.assertRaisesRegex(ValueError, "rl.filter has no field 'max_rate'; its fields are max_ratio, "):
      _parse({"filter": {"max_rate": 3.0}})
    with self.assertRaisesRegex(ValueError, "rl: Unknown KL estimator 'k4'; known: k1, k2, k3"):
      _parse({"kl_estimator": "k4"})
    with self.assertRaisesRegex(ValueError, "unknown reward term 'styel'"):
      _parse({"reward": {"weights": {"styel": 1.0}}})
    with self.assertRaisesRegex(ValueError, "rl has no field 'kl_beta'; its fields are advantage, "):
      _parse({"kl_beta": 0.1})
    with self.assertRaisesRegex(ValueError, "rl.optim.learning_rate='fast' must be a number"):
      _parse({"optim": {"learning_rate": "fast"}})
    with self.assertRaisesRegex(ValueError, "rl has no field 'model'"):  # the architecture is the run's model section
      _parse({"model": {}})


if __name__ == "__main__":
  absltest.main()
