"""The RL update step on the tiny model: Dr. GRPO's gradient, micro-batch invariance, routing replay, self-summary
chains by hand, metrics, and the same update on an 8-device mesh."""

import dataclasses
import functools

from absl.testing import absltest, parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2jax.model.losses import token_log_probs
from c2jax.model.transformer import forward
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.rl.config import Overlong, RLConfig, RoutingReplay, ZeroVarianceGroups
from c2jax.rl.kl import KlPlacement
from c2jax.rl.policy_loss import SequenceUnit
from c2jax.rl.rewards import LengthPenaltyConfig, RewardConfig
from c2jax.rl.sharded import make_rl_trainer
from c2jax.rl.update import init_state, optimizer, policy_log_probs, prepare, rl_gradients
from tests import tiny

B, T, PROMPT = 8, 16, 4
MODEL = tiny.MODEL


def _copy(tree):
  """A copy to hand to a donating step (the cached params must survive it)."""
  return jax.tree.map(jnp.copy, tree)


def _cfg(**kw) -> RLConfig:
  return RLConfig(model=MODEL, **kw)


def _params(seed: int = 0):
  return tiny.params(MODEL, seed)


def _forward_fn():
  return tiny.jit(forward, cfg=MODEL, with_mtp=False)


def _batch(seed: int = 0, off_policy: float = 0.0, params=None) -> dict:
  """Rollouts of random tokens with the model's own log-probs and routing: groups of 4, ragged response lengths,
  one padding row; `off_policy` perturbs the behaviour log-probs (an actor with other numerics/older weights)."""
  rng = np.random.default_rng(seed)
  params = _params() if params is None else params
  tokens = rng.integers(0, MODEL.vocab_size, (B, T)).astype(np.int32)
  lengths = rng.integers(3, T - PROMPT + 1, B)
  lengths[1] = T - PROMPT  # at least one full-length (truncated) row
  loss_mask = (np.arange(T)[None] >= PROMPT) & (np.arange(T)[None] < PROMPT + lengths[:, None])
  loss_mask = loss_mask.astype(np.float32)
  out = _forward_fn()(params, tokens)
  logp = np.zeros((B, T), np.float32)
  logp[:, 1:] = token_log_probs(out.logits[:, :-1], tokens[:, 1:])
  behaviour = (logp + off_policy * rng.normal(size=(B, T))).astype(np.float32) * loss_mask
  group_id = (np.arange(B) // 4).astype(np.int32)
  group_id[-1] = -1  # a padding row
  outcome = np.array([1, 0, 0, 1, 0, 1, 1, 0], np.float32)
  return {"tokens": tokens, "loss_mask": loss_mask, "behaviour_logprobs": behaviour,
          "policy_version": rng.integers(0, 3, (B, T)).astype(np.int32), "group_id": group_id,
          "chain_id": np.arange(B, dtype=np.int32), "reward_terms": {"outcome": outcome},
          "truncated": (lengths == T - PROMPT).astype(np.float32), "expert_ids": np.asarray(out.expert_ids)}


def _grads_fn(cfg: RLConfig):
  # One compile per config (each costs ~15 s on 2 CPU cores): tests share configs.
  return tiny.jit(rl_gradients, cfg=cfg)


def _grads(cfg: RLConfig, batch, params=None, ref=None, version=3):
  params = _params() if params is None else params
  if cfg.uses_reference and ref is None:
    ref = _params(1)
  return _grads_fn(cfg)(params, ref, jnp.int32(version), batch)


@functools.cache
def _weighted_logp_grad_fn():
  """grad of -sum_{i,t} W_it log pi(y_it) through the model with routing replay: the REINFORCE form of every
  on-policy objective here (W = token weight x advantage)."""
  cfg = _cfg()

  def surrogate(p, batch, w):
    return -jnp.sum(w * policy_log_probs(p, batch, cfg).logp)

  return jax.jit(jax.grad(surrogate))


def _policy_view_fn(cfg: RLConfig):
  """The jitted `policy_log_probs` of `cfg`: one compile per config, shared by the tests that read its fields."""
  return tiny.jit(policy_log_probs, cfg=cfg)


def _on_policy(batch):
  """The batch with behaviour log-probs equal to the trainer's (ratio 1: no clipping, no filtering)."""
  lp = _policy_view_fn(_cfg())(_params(), batch).logp
  return {**batch, "behaviour_logprobs": np.asarray(lp) * batch["loss_mask"]}


def _assert_tree_close(test, got, want, rtol, atol_floor=1e-9):
  test.assertEqual(jax.tree.structure(got), jax.tree.structure(want))
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    g, w = np.asarray(g), np.asarray(w)
    scale = max(float(np.max(np.abs(w))), atol_floor)
    np.testing.assert_allclose(g, w, rtol=0, atol=rtol * scale, err_msg=jax.tree_util.keystr(path))


class DrGrpoTest(absltest.TestCase):

  @pytest.mark.slow
  def test_on_policy_dr_grpo_is_reinforce_with_group_mean_baseline(self):
    # On-policy (behaviour = trainer log-probs) the clipped ratio is 1 and its gradient is grad log pi, so
    # Dr. GRPO's gradient is REINFORCE's: -(1 / (B T)) sum_i (r_i - mean_g r) sum_t grad log pi(y_it).
    cfg = _cfg(kl_coef=0.0)
    batch = _on_policy(_batch())
    grads, metrics = _grads(cfg, batch)
    r = batch["reward_terms"]["outcome"]
    g = batch["group_id"]
    valid = g >= 0
    baseline = np.array([r[(g == gi) & valid].mean() if gi >= 0 else 0.0 for gi in g])
    mask = batch["loss_mask"] * valid[:, None]
    mask[:, 0] = 0
    want = _weighted_logp_grad_fn()(_params(), batch, (r - baseline)[:, None] * mask / (B * T))
    _assert_tree_close(self, grads, want, rtol=1e-5)
    self.assertEqual(float(metrics["clip_fraction"]), 0.0)
    self.assertEqual(float(metrics["filtered_fraction"]), 0.0)
    # Without the baseline the gradient is another one: the comparison can tell them apart.
    no_baseline = _weighted_logp_grad_fn()(_params(), batch, r[:, None] * mask / (B * T))
    self.assertGreater(np.abs(no_baseline["lm_head"] - want["lm_head"]).max(), 0.1 * np.abs(want["lm_head"]).max())


# Shared by the micro-batch, metrics and mesh tests (one compile each): every masking option on.
MICRO_CFG = dict(aggregation="token_mean", kl_placement=KlPlacement.LOSS_STRAIGHT_THROUGH, kl_coef=0.1,
                 overlong=Overlong.MASK, zero_variance_groups=ZeroVarianceGroups.DROP)


class MicroBatchTest(absltest.TestCase):

  @pytest.mark.slow
  def test_gradient_does_not_depend_on_micro_batches(self):
    # token_mean normalizes by the whole batch's tokens: the aggregation a per-micro-batch normalization gets wrong.
    # With the KL in the loss (the reference forward is micro-batched too) and off-policy behaviour log-probs, so
    # that the clip and the plausibility filter act.
    batch = _batch(seed=1, off_policy=0.3)
    # n=1 is the unscanned path; n=2 the scan over micro-batches (every n > 1 runs that one compiled body), and
    # its micro-batches (rows j, j + n, ...) split every group, as any n > 1 does.
    results = {n: jax.device_get(_grads(_cfg(micro_batches=n, **MICRO_CFG), batch)) for n in (1, 2)}
    grads1, metrics1 = results[1]
    self.assertGreater(float(metrics1["filtered_fraction"]), 0.0)
    self.assertGreater(float(metrics1["clip_fraction"]), 0.0)
    grads, metrics = results[2]
    _assert_tree_close(self, grads, grads1, rtol=2e-5)
    for k in ("loss", "kl_ref_k1", "filtered_fraction", "clip_fraction", "entropy", "pass@1", "reward/mean"):
      np.testing.assert_allclose(metrics[k], metrics1[k], rtol=2e-5, atol=1e-7, err_msg=k)


class RoutingReplayTest(absltest.TestCase):

  @pytest.mark.slow
  def test_replay_reproduces_recorded_routing_after_the_router_moved(self):
    params = _params()
    batch = _batch()
    recorded = batch["expert_ids"]
    moe = params["moe_layers"]["moe"]
    noise = 0.5 * jax.random.normal(jax.random.key(5), moe["router"].shape)
    moved = {**params, "moe_layers": {**params["moe_layers"], "moe": {**moe, "router": moe["router"] + noise}}}
    replay = lambda p, b: _policy_view_fn(_cfg(routing_replay=RoutingReplay.REPLAY))(p, b).expert_ids
    fresh = lambda p, b: _policy_view_fn(_cfg(routing_replay=RoutingReplay.OFF))(p, b).expert_ids
    np.testing.assert_array_equal(replay(moved, batch), recorded)
    self.assertGreater(float(np.mean(np.asarray(fresh(moved, batch)) != recorded)), 0.05)
    np.testing.assert_array_equal(fresh(params, batch), recorded)  # unmoved weights route as recorded
    # The router still learns under replay: the gates are recomputed from it.
    grads, metrics = _grads(_cfg(kl_coef=0.0), batch, params=moved)
    self.assertGreater(float(jnp.abs(grads["moe_layers"]["moe"]["router"]).max()), 0.0)
    self.assertNotIn("routing_agreement", metrics)  # under replay the trainer routes as the actor did
    _, metrics_off = _grads(_cfg(kl_coef=0.0, routing_replay=RoutingReplay.OFF), _batch(), params=params)
    self.assertEqual(float(metrics_off["routing_agreement"]), 1.0)  # same weights: same routing

  def test_replay_without_ids_is_a_clear_error(self):
    batch = _batch()
    del batch["expert_ids"]
    with self.assertRaisesRegex(ValueError, "routing_replay=REPLAY needs the actor's expert_ids"):
      _grads(_cfg(kl_coef=0.0), batch)


def _chain_batch():
  """A hand-built batch with self-summary chains.

  group 0: chain 10 = rows 0 (generation) + 2 (generation on its own summary), reward 1;
           chain 11 = row 1, reward 0; chain 12 = row 3, reward 0.
  group 1: chain 20 = rows 4, 5, 6 (three segments), reward 1; chain 21 = row 7, reward 1 (a zero-variance group).
  """
  batch = _batch(seed=3)
  lengths = np.array([5, 7, 3, 9, 4, 2, 6, 8])
  batch["loss_mask"] = ((np.arange(T)[None] >= PROMPT) &
                        (np.arange(T)[None] < PROMPT + lengths[:, None])).astype(np.float32)
  batch["behaviour_logprobs"] = batch["behaviour_logprobs"] * batch["loss_mask"]
  batch["group_id"] = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32)
  batch["chain_id"] = np.array([10, 11, 10, 12, 20, 20, 20, 21], np.int32)
  batch["reward_terms"] = {"outcome": np.array([1, 0, 1, 0, 1, 1, 1, 1], np.float32),
                           "style": np.array([0.5, -1, 0.5, 0, 0, 0, 0, 0], np.float32)}
  batch["truncated"] = np.zeros(B, np.float32)
  return batch, lengths


class ChainTest(parameterized.TestCase):
  """Self-summary chains by hand: every segment carries its chain's reward and advantage, each chain counts once
  in its group, the length penalty sees the chain's total length, and the aggregation counts segments as
  configured. (The gradient of sum w A log pi itself is DrGrpoTest's.)"""

  @parameterized.named_parameters(
      ("sum_constant", "token_sum_constant", SequenceUnit.CHAIN, "dr_grpo"),
      ("seq_mean_chain", "seq_mean_token_mean", SequenceUnit.CHAIN, "dr_grpo"),
      ("seq_mean_row_rloo", "seq_mean_token_mean", SequenceUnit.ROW, "rloo"))
  def test_chain_shares_reward_and_advantage(self, aggregation, unit, advantage):
    batch, lengths = _chain_batch()
    penalty = LengthPenaltyConfig(weight=0.2, k=2.0, q=0.5, scale=10.0)
    reward_cfg = RewardConfig(weights=(("outcome", 1.0), ("style", 0.1)), length_penalty=penalty)
    cfg = _cfg(kl_coef=0.0, aggregation=aggregation, sequence_unit=unit, reward=reward_cfg, advantage=advantage)
    prep = jax.jit(functools.partial(prepare, cfg=cfg))(batch, None)
    # By hand: chain lengths sum the segments; C_{k,q}(x) = ((1 + kx)^(1-q) - 1) / (k (1-q)).
    chain_of = batch["chain_id"]
    chain_len = {c: lengths[chain_of == c].sum() for c in set(chain_of)}
    x = np.array([chain_len[c] / 10.0 for c in chain_of])
    c_kq = ((1 + 2.0 * x) ** 0.5 - 1) / (2.0 * 0.5)
    r = batch["reward_terms"]["outcome"] + 0.1 * batch["reward_terms"]["style"] - 0.2 * c_kq
    np.testing.assert_allclose(prep.reward.total, r, rtol=1e-5)
    chains = {c: (r[chain_of == c][0], batch["group_id"][chain_of == c][0]) for c in set(chain_of)}
    members = {g: [rc for rc, gc in chains.values() if gc == g] for g in (0, 1)}
    if advantage == "dr_grpo":
      adv = [r[i] - np.mean(members[batch["group_id"][i]]) for i in range(B)]
    else:  # leave-one-out over the other chains of the group
      adv = [r[i] - (np.sum(members[g]) - r[i]) / (len(members[g]) - 1) for i, g in enumerate(batch["group_id"])]
    np.testing.assert_allclose(prep.advantage, adv, rtol=1e-5, atol=1e-6)
    self.assertAlmostEqual(float(prep.advantage[0]), float(prep.advantage[2]), places=6)
    mask = batch["loss_mask"].copy()
    mask[:, 0] = 0
    if aggregation == "token_sum_constant":
      w = mask / (B * T)
    elif unit is SequenceUnit.CHAIN:
      w = mask / np.array([chain_len[c] for c in chain_of])[:, None] / 5  # five chains
    else:
      w = mask / lengths[:, None] / B
    np.testing.assert_allclose(prep.weight, w, rtol=1e-6)
    np.testing.assert_array_equal(prep.first, [1, 1, 0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(prep.chain_tokens, [chain_len[c] for c in chain_of])

  def test_kl_in_reward_shapes_the_chain_reward(self):
    batch, _ = _chain_batch()
    cfg = _cfg(kl_coef=0.5, kl_estimator="k1", kl_placement=KlPlacement.IN_REWARD)
    ref_logp = np.log(np.random.default_rng(0).uniform(0.1, 0.9, (B, T))).astype(np.float32)
    prep = jax.jit(functools.partial(prepare, cfg=cfg))(batch, ref_logp)
    mask = batch["loss_mask"].copy()
    mask[:, 0] = 0
    row_kl = np.sum(mask * (batch["behaviour_logprobs"] - ref_logp), axis=1)  # k1 = log mu - log pi_ref
    chain_kl = np.array([row_kl[batch["chain_id"] == c].sum() for c in batch["chain_id"]])
    np.testing.assert_allclose(prep.shaped_reward, batch["reward_terms"]["outcome"] - 0.5 * chain_kl, rtol=1e-5)

  def test_kl_in_reward_without_ref_logp_is_a_clear_error(self):
    batch, _ = _chain_batch()
    cfg = _cfg(kl_coef=0.5, kl_placement=KlPlacement.IN_REWARD)
    with self.assertRaisesRegex(ValueError, "kl_placement=IN_REWARD.*got no ref_logp"):
      prepare(batch, None, cfg)

  def test_zero_variance_is_judged_before_the_kl_shaping(self):
    batch, _ = _chain_batch()
    cfg = _cfg(zero_variance_groups=ZeroVarianceGroups.DROP)  # the default k1 KL in the reward is on
    ref_logp = np.log(np.random.default_rng(1).uniform(0.1, 0.9, (B, T))).astype(np.float32)
    prep = jax.device_get(jax.jit(functools.partial(prepare, cfg=cfg))(batch, ref_logp))
    self.assertGreater(np.ptp(prep.shaped_reward[4:]), 0)  # the KL makes group 1's rewards differ...
    np.testing.assert_array_equal(prep.zero_variance, [0, 0, 0, 0, 1, 1, 1, 1])  # ...but it has no task signal
    self.assertEqual(float(prep.mask[4:].sum()), 0)

  def test_truncation_is_a_chain_property(self):
    batch, _ = _chain_batch()
    batch["truncated"] = np.array([0, 0, 1, 0, 0, 0, 0, 0], np.float32)  # the last segment of chain 10
    prep = jax.device_get(jax.jit(functools.partial(prepare, cfg=_cfg(kl_coef=0.0, overlong=Overlong.MASK)))(
        batch, None))
    np.testing.assert_array_equal(prep.truncated, [1, 0, 1, 0, 0, 0, 0, 0])
    self.assertEqual(float(prep.mask[[0, 2]].sum()), 0)

  def test_overlong_and_zero_variance_masking(self):
    batch, _ = _chain_batch()
    batch["truncated"] = np.array([0, 1, 0, 0, 0, 0, 0, 0], np.float32)
    keep = jax.device_get(jax.jit(functools.partial(prepare, cfg=_cfg(kl_coef=0.0)))(batch, None))
    masked = jax.device_get(jax.jit(functools.partial(prepare, cfg=_cfg(
        kl_coef=0.0, overlong=Overlong.MASK, zero_variance_groups=ZeroVarianceGroups.DROP)))(batch, None))
    self.assertGreater(float(keep.mask[1].sum()), 0)  # the report's default: overlong rollouts stay in the loss
    self.assertEqual(float(masked.mask[1].sum()), 0)
    np.testing.assert_array_equal(masked.zero_variance, [0, 0, 0, 0, 1, 1, 1, 1])  # group 1: all outcomes 1
    self.assertEqual(float(masked.mask[4:].sum()), 0)
    np.testing.assert_array_equal(masked.mask[[0, 2, 3]], keep.mask[[0, 2, 3]])


class MetricsTest(absltest.TestCase):

  @pytest.mark.slow
  def test_metrics(self):
    batch = _batch(seed=4, off_policy=0.5)
    _, m = _grads(_cfg(micro_batches=1, **MICRO_CFG), batch, version=5)
    mask = batch["loss_mask"].copy()
    mask[:, 0] = 0
    mask[batch["group_id"] < 0] = 0
    lag = 5 - batch["policy_version"]
    np.testing.assert_allclose(m["staleness/mean"], (mask * lag).sum() / mask.sum(), rtol=1e-6)
    self.assertEqual(float(m["staleness/max"]), float(lag[mask > 0].max()))
    np.testing.assert_allclose(m["tokens"], mask.sum())
    self.assertGreater(float(m["filtered_fraction"]), 0.0)
    self.assertGreater(float(m["kl_ref_k3"]), 0.0)
    outcome = batch["reward_terms"]["outcome"][:7]
    np.testing.assert_allclose(m["reward/mean"], outcome.mean(), rtol=1e-6)
    np.testing.assert_allclose(m["pass@1"], np.mean([outcome[:4].mean(), outcome[4:].mean()]), rtol=1e-6)
    # Policy diagnostics over all action tokens, whatever the loss masks (overlong and zero-variance are on).
    view = jax.device_get(_policy_view_fn(_cfg())(_params(), batch))
    log_ratio = view.logp - batch["behaviour_logprobs"]
    mean = lambda x: float((mask * x).sum() / mask.sum())
    np.testing.assert_allclose(m["ratio_mean"], mean(np.exp(log_ratio)), rtol=1e-5)
    np.testing.assert_allclose(m["kl_behaviour_k3"], mean(np.exp(log_ratio) - 1 - log_ratio), rtol=1e-4)
    np.testing.assert_allclose(m["entropy"], mean(view.entropy), rtol=1e-5)
    self.assertLess(float(m["tokens_in_loss"]), float(m["tokens"]))  # the truncated row is out of the loss
    for key in ("pass@4", "best_of_4", "entropy", "kl_behaviour_k3", "length/mean", "truncated_fraction",
                "groups/zero_variance_fraction", "grad_norm", "reward/outcome", "length/correct"):
      self.assertIn(key, m)
      self.assertTrue(np.isfinite(float(m[key])), key)

  def test_non_finite_behaviour_log_probs_do_not_poison_the_update(self):
    # An actor row of -inf log-probs on a padding row, a token the actor reported at log-prob -100 and a NaN:
    # the filter drops the real ones, and nothing reaches the gradient through a zero weight.
    batch = _batch()
    b = batch["behaviour_logprobs"].copy()
    b[-1, PROMPT:] = -np.inf  # the padding row
    b[0, PROMPT] = -100.0
    b[2, PROMPT + 1] = np.nan
    batch["behaviour_logprobs"] = b
    batch["loss_mask"][-1, PROMPT:] = 1.0
    grads, m = _grads(_cfg(kl_coef=0.0), batch)
    chex.assert_tree_all_finite(grads)
    self.assertTrue(np.isfinite(float(m["loss"])))
    self.assertEqual(float(m["filtered_rows"]), 2.0)

  @pytest.mark.slow
  def test_chain_metrics_count_each_chain_once(self):
    batch, lengths = _chain_batch()
    # The default reward weighs the outcome alone: without the unweighted style term the batch has _batch's
    # structure, and the gradient program compiled for the other MICRO_CFG tests serves this one.
    del batch["reward_terms"]["style"]
    _, m = _grads(_cfg(micro_batches=1, **MICRO_CFG), batch)
    chains = {c: (batch["reward_terms"]["outcome"][batch["chain_id"] == c][0], lengths[batch["chain_id"] == c].sum())
              for c in set(batch["chain_id"])}
    np.testing.assert_allclose(m["reward/mean"], np.mean([r for r, _ in chains.values()]), rtol=1e-6)
    np.testing.assert_allclose(m["length/mean"], np.mean([n for _, n in chains.values()]), rtol=1e-6)
    np.testing.assert_allclose(m["length/correct"], np.mean([n for r, n in chains.values() if r == 1]), rtol=1e-6)
    self.assertEqual(float(m["groups/zero_variance_groups"]), 1.0)  # group 1: all pass


@pytest.mark.mesh
class MeshTest(absltest.TestCase):

  def test_update_on_8_devices_matches_one_device(self):
    # FSDP x EP x CP with two micro-batches, the KL in the loss and the filter active; the single-device reference
    # is the same config's gradient (shared with MicroBatchTest) through the same optimizer.
    cfg = _cfg(micro_batches=2, **MICRO_CFG)
    batch = _batch(seed=1, off_policy=0.3)
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, context=2))
    trainer = make_rl_trainer(cfg, mesh, batch_size=B, seq_len=T)
    state = trainer.init(jax.random.key(0), _copy(_params()))
    self.assertEqual(state.ref_params["lm_head"].sharding.spec, trainer.state_shardings.params["lm_head"].spec)
    gate = state.params["moe_layers"]["moe"]["experts"]["gate"]
    self.assertEqual(gate.addressable_shards[0].data.shape[1], MODEL.n_routed_experts // 2)  # experts split
    state = dataclasses.replace(state, ref_params=jax.device_put(_copy(_params(1)), trainer.state_shardings.ref_params))
    state, metrics = trainer.step(state, trainer.put_batch(batch))

    grads, ref_metrics = _grads(cfg, batch, version=0)
    ref_state = init_state(cfg, jax.random.key(0), params=_copy(_params()))

    @jax.jit  # one program: op by op, AdamW's update of every leaf costs more CPU than the update step's compile
    def apply(grads, opt_state, params):
      updates, _ = optimizer(cfg).update(grads, opt_state, params)
      return optax.apply_updates(params, updates)

    want = apply(grads, ref_state.opt_state, ref_state.params)
    for k in ("loss", "grad_norm", "kl_ref_k1", "entropy", "filtered_fraction", "clip_fraction", "pass@1",
              "staleness/mean", "ratio_mean", "tokens_in_loss"):
      np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-4, atol=1e-7, err_msg=k)
    self.assertGreater(float(metrics["filtered_fraction"]), 0.0)
    # AdamW's first step moves each weight by lr x g / (|g| + eps), ~lr x sign(g): compare at 1% of that move. Where
    # |g| is within 100 eps of zero (a sum that cancels), the step is ill-conditioned: the sharded sum's rounding,
    # ~1e-9 here, changes it by more than 1%; there it must only stay within the +-lr a first step can take.
    lr, eps = cfg.optim.learning_rate, cfg.optim.eps
    loose = total = 0
    for (path, got), w, g in zip(jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0],
                                 jax.tree.leaves(jax.device_get(want)), jax.tree.leaves(jax.device_get(grads))):
      g = np.abs(np.asarray(g))
      cancels = (g > 0) & (g <= 100 * eps)
      atol = np.where(cancels, lr, 0.01 * lr)
      loose, total = loose + int(np.sum(cancels)), total + int(np.sum(g > 0))
      np.testing.assert_array_less(np.abs(np.asarray(got) - np.asarray(w)), atol + 1e-12,
                                   err_msg=jax.tree_util.keystr(path))
    self.assertLess(loose / total, 0.01, (loose, total))  # the loose bound covers few weights
    self.assertEqual(int(state.step), 1)

  def test_batch_that_does_not_split_fails_early(self):
    with self.assertRaisesRegex(ValueError, "does not split into micro_batches=4"):
      make_rl_trainer(_cfg(micro_batches=4), make_mesh(MeshConfig(fsdp=2, expert=2, context=2)), batch_size=8)


if __name__ == "__main__":
  absltest.main()
