"""Model-level properties: causality, packing, routing replay, dispatch/remat equivalence, MTP wiring, counts."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import config as config_lib
from c2jax.model import losses
from c2jax.model import params as params_lib
from c2jax.model.config import ModelConfig, MoeDispatch, Remat
from c2jax.model.norms import rms_norm
from c2jax.model.transformer import forward
from c2jax.model import presets


# The tiny preset (1 dense + 2 MoE layers and an MTP module) with its MoE layers scanned one per iteration (the
# preset unrolls them): scan_unroll never changes the math (ModelConfig), so every property here holds at any
# unroll, and a rolled scan compiles one layer's body instead of two. Two MoE layers stay, so that a replayed id
# reaching the wrong layer still shows.
CFG = presets.tiny().replace(scan_unroll=1)


@functools.cache
def _params(seed=0):
  """Made once per module (the tests only read them)."""
  p = jax.jit(params_lib.init_params, static_argnums=0)(CFG, jax.random.key(seed))
  # Random router biases: zeros would leave near-ties that make the test insensitive to bias handling.
  p["moe_layers"]["moe"]["router_bias"] = 0.05 * jax.random.normal(jax.random.key(7),
                                                                   p["moe_layers"]["moe"]["router_bias"].shape)
  return p


def _setup(b=2, t=24, seed=0):
  toks = jax.random.randint(jax.random.key(seed + 1), (b, t), 0, CFG.vocab_size)
  return CFG, _params(seed), toks


@functools.cache
def _forward(cfg=CFG):
  """forward(p, tokens) with the MTP head, compiled once per config and shape for every test that runs it."""
  return jax.jit(functools.partial(forward, cfg=cfg))


@functools.cache
def _value_and_grad(cfg, with_mtp):
  """value_and_grad of the next-token loss (plus the MTP loss `with_mtp`) of `_setup()`'s tokens; one per config."""
  _, _, toks = _setup()

  def loss(p):
    out = forward(p, toks, cfg=cfg, with_mtp=with_mtp)
    ce = losses.next_token_loss(out.logits, toks).mean
    return ce + losses.mtp_loss(out.mtp_logits, toks).mean if with_mtp else ce

  return jax.jit(jax.value_and_grad(loss))


class TransformerTest(parameterized.TestCase):

  def test_shapes(self):
    cfg, p, toks = _setup()
    out = _forward()(p, toks)
    chex.assert_shape(out.logits, (2, 24, cfg.vocab_size))
    chex.assert_shape(out.expert_ids, (cfg.n_moe_layers, 2, 24, cfg.num_experts_per_tok))
    chex.assert_shape(out.expert_load, (cfg.n_moe_layers, cfg.n_routed_experts))
    chex.assert_shape(out.mtp_logits, (cfg.num_mtp_layers, 2, 24, cfg.vocab_size))
    chex.assert_tree_all_finite(out)

  def test_causal(self):
    cfg, p, toks = _setup()
    f = lambda p, t: _forward()(p, t).logits
    changed = toks.at[:, 15:].set((toks[:, 15:] + 1) % cfg.vocab_size)
    a, b = f(p, toks), f(p, changed)
    chex.assert_trees_all_close(a[:, :15], b[:, :15], atol=1e-6)
    self.assertGreater(float(jnp.abs(a[:, 15:] - b[:, 15:]).max()), 1e-4)

  @pytest.mark.slow
  def test_packed_segments_equal_separate_rows(self):
    cfg, p, toks = _setup(b=1, t=20)
    f = jax.jit(lambda p, t, pos, seg: forward(p, t, cfg=cfg, positions=pos, segment_ids=seg).logits)
    a, b = toks[:, :8], toks[:, 8:]
    packed = f(p, toks, jnp.concatenate([jnp.arange(8), jnp.arange(12)])[None],
               jnp.concatenate([jnp.zeros(8, jnp.int32), jnp.ones(12, jnp.int32)])[None])
    sep_a = f(p, a, jnp.arange(8)[None], None)
    sep_b = f(p, b, jnp.arange(12)[None], None)
    chex.assert_trees_all_close(packed[:, :8], sep_a, atol=2e-5)
    chex.assert_trees_all_close(packed[:, 8:], sep_b, atol=2e-5)

  @pytest.mark.slow
  def test_routing_replay(self):
    cfg, p, toks = _setup()
    f = jax.jit(lambda p, t, ids: forward(p, t, cfg=cfg, forced_expert_ids=ids))
    out = _forward()(p, toks)
    replay = f(p, toks, out.expert_ids)
    chex.assert_trees_all_close(replay.logits, out.logits, atol=1e-6)
    chex.assert_trees_all_equal(replay.expert_ids, out.expert_ids)
    # Replayed ids from a perturbed router are used as given, and differ from what the router would choose.
    shifted = (out.expert_ids + 1) % cfg.n_routed_experts
    other = f(p, toks, shifted)
    chex.assert_trees_all_equal(other.expert_ids, shifted)
    self.assertGreater(float(jnp.abs(other.logits - out.logits).max()), 1e-4)
    with self.assertRaisesRegex(ValueError, "forced_expert_ids"):
      forward(p, toks, cfg=cfg, forced_expert_ids=out.expert_ids[:, :1])

  @parameterized.parameters(MoeDispatch.SLOTS, MoeDispatch.TILES, MoeDispatch.RAGGED)
  @pytest.mark.slow
  def test_dispatch_equals_dense_with_grads(self, dispatch):
    cfg, p, _ = _setup()
    ref_l, ref_g = _value_and_grad(cfg.replace(moe_dispatch=MoeDispatch.DENSE), True)(p)  # compiled once
    l, g = _value_and_grad(cfg.replace(moe_dispatch=dispatch), True)(p)
    chex.assert_trees_all_close(l, ref_l, atol=1e-6)
    chex.assert_trees_all_close(g, ref_g, atol=1e-6, rtol=1e-4)

  @parameterized.parameters(Remat.FULL, Remat.DOTS_SAVEABLE)
  @pytest.mark.slow
  def test_remat_same_grads(self, remat):
    cfg, p, _ = _setup()
    _, g0 = _value_and_grad(cfg, False)(p)  # compiled once for both policies
    _, g1 = _value_and_grad(cfg.replace(remat=remat), False)(p)
    chex.assert_trees_all_close(g0, g1, atol=1e-6, rtol=1e-5)

  @pytest.mark.slow
  def test_mtp_module_by_hand(self):
    cfg, p, toks = _setup()
    out = _forward()(p, toks)
    from c2jax.model.transformer import block

    @jax.jit  # one program, not one per op
    def by_hand(p, hidden):
      m = jax.tree.map(lambda a: a[0], p["mtp"])
      nxt = jnp.pad(toks[:, 1:], ((0, 0), (0, 1)))
      x = jnp.concatenate([rms_norm(p["embed"][nxt], m["enorm"], cfg.rms_norm_eps),
                           rms_norm(hidden, m["hnorm"], cfg.rms_norm_eps)], -1) @ m["eh_proj"]
      pos = jnp.broadcast_to(jnp.arange(toks.shape[1]), toks.shape)
      h, _ = block(m["block"], x, pos, None, cfg)
      return rms_norm(h, m["final_norm"], cfg.rms_norm_eps) @ p["lm_head"]

    chex.assert_trees_all_close(out.mtp_logits[0], by_hand(p, out.hidden), atol=1e-5)

  @pytest.mark.slow
  def test_bf16_forward_close_to_f32(self):
    cfg, p, toks = _setup()
    a = _forward()(p, toks).logits  # the MTP head leaves the logits as they are
    b = jax.jit(lambda p: forward(p, toks, cfg=cfg.replace(dtype="bfloat16"), with_mtp=False).logits)(p)
    self.assertEqual(b.dtype, jnp.float32)
    self.assertLess(float(jnp.abs(a - b).max() / jnp.abs(a).max()), 0.05)


class LossTest(absltest.TestCase):

  def test_next_token_and_mtp_against_numpy(self):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 6, 5)).astype(np.float32)
    toks = rng.integers(0, 5, size=(2, 6))
    mask = np.ones((2, 6), np.float32)
    mask[1, 4:] = 0
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp[:, :-1], toks[:, 1:, None], -1)[..., 0]
    w = mask[:, 1:]
    # Jitted: one program per loss instead of one per op.
    got = jax.jit(losses.next_token_loss)(jnp.asarray(logits), jnp.asarray(toks), jnp.asarray(mask))
    np.testing.assert_allclose(float(got.sum), (nll * w).sum(), rtol=1e-5)
    self.assertEqual(float(got.weight), w.sum())
    mt = jax.jit(losses.mtp_loss)(jnp.asarray(logits)[None], jnp.asarray(toks), jnp.asarray(mask))
    nll2 = -np.take_along_axis(logp[:, :-2], toks[:, 2:, None], -1)[..., 0]
    np.testing.assert_allclose(float(mt.sum), (nll2 * mask[:, 2:]).sum(), rtol=1e-5)
    z = jax.jit(losses.z_loss)(jnp.asarray(logits))
    np.testing.assert_allclose(float(z.sum), (np.log(np.exp(logits).sum(-1)) ** 2).sum(), rtol=1e-5)


class ConfigTest(absltest.TestCase):

  def test_kimi_k25_counts(self):
    count = params_lib.count_params(presets.kimi_k25())
    self.assertAlmostEqual(count.total / 1.04e12, 1.0, delta=0.03)
    self.assertAlmostEqual(count.active / 32e9, 1.0, delta=0.03)

  def test_kimi_abstract_params_allocate_nothing(self):
    shapes = params_lib.abstract_params(presets.kimi_k25())
    self.assertEqual(shapes["moe_layers"]["moe"]["experts"]["gate"].shape, (60, 384, 7168, 2048))
    axes = params_lib.logical_axes(presets.kimi_k25())
    self.assertEqual(tuple(axes["moe_layers"]["moe"]["experts"]["down"]),
                     ("layers", "expert", "expert_mlp", "embed"))
    for shape, ax in zip(jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(
        x, jax.sharding.PartitionSpec))):
      self.assertLen(ax, len(shape.shape))

  def test_json_roundtrip_and_hf_roundtrip(self):
    cfg = presets.tiny()
    self.assertEqual(config_lib.config_from_json_dict(config_lib.config_to_json_dict(cfg)), cfg)
    # HF configs carry the architecture only; implementation choices come back as defaults.
    back = ModelConfig.from_hf_dict(cfg.to_hf_dict(), scan_unroll=cfg.scan_unroll)
    self.assertEqual(back, cfg)

  def test_bad_configs_explain_the_fix(self):
    with self.assertRaisesRegex(ValueError, "divisible by n_group"):
      ModelConfig(n_routed_experts=10, n_group=4, topk_group=1)
    with self.assertRaisesRegex(ValueError, "num_experts_per_tok"):
      ModelConfig(num_experts_per_tok=9, n_routed_experts=8)
    with self.assertRaisesRegex(ValueError, "unknown ModelConfig fields"):
      config_lib.config_from_json_dict({"d_modle": 3})
    with self.assertRaisesRegex(ValueError, "rope type"):
      ModelConfig.from_hf_dict({**presets.tiny().to_hf_dict(), "rope_parameters": {"rope_type": "linear",
                                                                                           "factor": 2.0}})


if __name__ == "__main__":
  absltest.main()
