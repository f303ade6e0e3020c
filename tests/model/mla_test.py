"""Block-causal MLA attention (with its hand-written VJP) against the plain full-mask reference."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import mla
from c2jax.model import params as params_lib
from c2jax.model import rope as rope_lib
from c2jax.model import presets


class AttendTest(parameterized.TestCase):

  @parameterized.parameters((40, False), (200, True), (300, True))  # one block; several; last block partial
  def test_matches_reference_values_and_grads(self, t, packed):
    cfg = presets.tiny()
    p = jax.tree.map(lambda a: a[0], params_lib.init_params(cfg, jax.random.key(0))["dense_layers"]["attn"])
    b = 2
    x = jax.random.normal(jax.random.key(1), (b, t, cfg.d_model))
    if packed:  # three documents per row, positions restarting in each
      bounds = np.sort(np.random.default_rng(t).choice(np.arange(1, t), 2, replace=False))
      seg = np.searchsorted(bounds, np.arange(t), side="right")
      pos = np.arange(t) - np.concatenate([[0], bounds])[seg]
      segment_ids = jnp.asarray(np.broadcast_to(seg, (b, t)), jnp.int32)
      positions = jnp.asarray(np.broadcast_to(pos, (b, t)), jnp.int32)
    else:
      segment_ids = None
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    probe = jax.random.normal(jax.random.key(2), (b, t, cfg.n_heads, cfg.v_head_dim))

    def run(p, x, fast):
      cos, sin = rope_lib.rope_angles(positions, cfg.rope, cfg.qk_rope_head_dim)
      lat = mla.project_latents(p, x, cos, sin, cfg)
      if fast:
        return mla.attend(p, lat, positions, segment_ids, cfg)
      return mla.attend_reference(p, lat, mla.attention_mask(positions, positions, segment_ids, segment_ids), cfg)

    def loss(p, x, fast):
      return jnp.sum(run(p, x, fast) * probe)

    ref = jax.jit(lambda p, x: run(p, x, False))(p, x)
    got = jax.jit(lambda p, x: run(p, x, True))(p, x)
    chex.assert_trees_all_close(got, ref, atol=1e-5, rtol=1e-5)
    g_ref = jax.jit(jax.grad(lambda p, x: loss(p, x, False), argnums=(0, 1)))(p, x)
    g_got = jax.jit(jax.grad(lambda p, x: loss(p, x, True), argnums=(0, 1)))(p, x)
    chex.assert_trees_all_close(g_got, g_ref, atol=1e-5, rtol=1e-4)

  def test_query_block_size(self):
    self.assertEqual(mla.query_block_size(40), 40)
    self.assertEqual(mla.query_block_size(256), 64)
    self.assertEqual(mla.query_block_size(1000), 128)


if __name__ == "__main__":
  absltest.main()
