"""The LM train step: losses fall, the balancing bias follows its rule, every metric is there, and packed rows (the
pretraining and SFT batches) train as the same documents one per row."""

import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.data.packing import finish_batch
from c2jax.model import presets
from c2jax.optim import OptimizerConfig
from c2jax.pretrain.step import MtpTarget, StepConfig, init_state, loss_fn, train_step
from tests import tiny


class StepTest(absltest.TestCase):

  @pytest.mark.slow
  def test_steps_lower_loss_and_bias_follows_balancing_rule(self):
    cfg = presets.tiny()
    hp = StepConfig(optim=OptimizerConfig(learning_rate=3e-3, warmup_steps=1, total_steps=20), bias_update_rate=1e-2,
                    z_loss_weight=1e-4, mtp_target=MtpTarget.SELF_DISTILL)
    state = init_state(cfg, hp, jax.random.key(0))
    bias0 = state.params["moe_layers"]["moe"]["router_bias"]
    step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp))
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, cfg.vocab_size)
    segments = jnp.concatenate([jnp.ones((4, 20), jnp.int32), 2 * jnp.ones((4, 12), jnp.int32)], axis=1)
    positions = jnp.concatenate([jnp.arange(20), jnp.arange(12)])[None].repeat(4, 0)
    batch = {"tokens": tokens, "segment_ids": segments, "positions": positions}
    losses = []
    for _ in range(6):
      prev = state
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    self.assertLess(losses[-1], losses[0] - 0.1)
    chex.assert_tree_all_finite(state.params)
    self.assertEqual(int(state.step), 6)
    # The bias moves by exactly +-rate (or 0) per step: AdamW and weight decay never touch it.
    delta = np.abs(np.asarray(state.params["moe_layers"]["moe"]["router_bias"] -
                              prev.params["moe_layers"]["moe"]["router_bias"]))
    self.assertTrue(np.all(np.isclose(delta, 0.0) | np.isclose(delta, 1e-2)), delta)
    self.assertGreater(float(jnp.abs(state.params["moe_layers"]["moe"]["router_bias"] - bias0).max()), 0)
    for key in ("ce", "mtp_ce", "mtp_kl", "z_loss", "grad_norm", "expert_load_max"):
      self.assertIn(key, metrics)
    # 2 documents of 20 and 12 tokens: 19 + 11 next-token targets per row (document starts are not targets).
    self.assertEqual(float(metrics["tokens"]), 4 * 30)


def _rows(docs, layout, t):
  """`finish_batch`'s batch of `docs` ((tokens, weights) pairs) placed in rows as `layout` lists them (doc indices)."""
  rows = {"tokens": [], "tokens_segment_ids": [], "tokens_positions": [], "weights": []}
  for members in layout:
    row = {k: np.zeros(t, np.float32 if k == "weights" else np.int32) for k in rows}
    at = 0
    for s, i in enumerate(members):
      tokens, weights = docs[i]
      n = len(tokens)
      row["tokens"][at:at + n], row["weights"][at:at + n] = tokens, weights
      row["tokens_segment_ids"][at:at + n], row["tokens_positions"][at:at + n] = s + 1, np.arange(n)
      at += n
    for k in rows:
      rows[k].append(row[k])
  return finish_batch({k: np.stack(v) for k, v in rows.items()}, len(layout), pad_id=0)


class PackedRowsTest(absltest.TestCase):

  @pytest.mark.slow
  def test_packed_rows_give_the_padded_loss_and_gradients(self):
    # Chat documents (prompt weight 0, answer 1) as the SFT trains them: four in four padded rows, or packed two
    # and two; the loss is a mean over the answer tokens, next-token and MTP, so the layout must not change it.
    cfg = tiny.MODEL_MTP
    rng = np.random.default_rng(0)
    docs = []
    for n, prompt in ((9, 3), (7, 2), (6, 4), (10, 5)):
      docs.append((rng.integers(1, cfg.vocab_size, n), (np.arange(n) >= prompt).astype(np.float32)))
    padded = _rows(docs, [[0], [1], [2], [3]], 16)
    packed = _rows(docs, [[0, 1], [2, 3]], 16)
    self.assertEqual(float(padded["loss_mask"].sum()), float(packed["loss_mask"].sum()))
    # The SFT's MTP target (c2jax/services/warm_start.py), and a z-loss.
    hp = StepConfig(mtp_target=MtpTarget.SELF_DISTILL, z_loss_weight=1e-3)
    fn = tiny.jit(jax.value_and_grad(loss_fn, has_aux=True), cfg=cfg, hp=hp)
    (_, (m_a, _)), g_a = fn(tiny.params(cfg), padded)
    (_, (m_b, _)), g_b = fn(tiny.params(cfg), packed)
    self.assertEqual(sorted(m_a), sorted(m_b))
    for k in m_a:
      np.testing.assert_allclose(m_b[k], m_a[k], rtol=2e-5, atol=1e-7, err_msg=k)
    self.assertGreater(float(m_a["mtp_kl"]), 0.0)
    for (path, b), a in zip(jax.tree_util.tree_flatten_with_path(g_b)[0], jax.tree.leaves(g_a)):
      scale = max(float(np.max(np.abs(a))), 1e-9)
      np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * scale, err_msg=jax.tree_util.keystr(path))


if __name__ == "__main__":
  absltest.main()
