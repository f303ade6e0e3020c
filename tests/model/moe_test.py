"""MoE routing, dispatch paths (equal to the dense reference, values and gradients), replay and balancing."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import moe
from c2jax.model.config import ModelConfig, MoeDispatch


def _cfg(**kw):
  base = dict(d_model=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=12, n_group=1,
              topk_group=1, n_layers=2, first_k_dense_replace=1)
  base.update(kw)
  return ModelConfig(**base)


def _experts(key, e, d, f):
  k1, k2, k3 = jax.random.split(key, 3)
  return {"gate": jax.random.normal(k1, (e, d, f)) * 0.3, "up": jax.random.normal(k2, (e, d, f)) * 0.3,
          "down": jax.random.normal(k3, (e, f, d)) * 0.3}


class RouteTest(parameterized.TestCase):

  def test_group_limited_topk_matches_numpy(self):
    cfg = _cfg(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3)
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=(64, 16)).astype(np.float32)
    bias = rng.normal(scale=0.1, size=(16,)).astype(np.float32)
    ids = np.asarray(moe.select_experts(jnp.asarray(scores), jnp.asarray(bias), cfg))
    for n in range(64):
      choice = scores[n] + bias
      grp = np.sort(choice.reshape(4, 4), axis=1)[:, -2:].sum(1)
      keep = np.argsort(-grp)[:2]
      masked = np.full(16, -np.inf)
      for g in keep:
        masked[g * 4:(g + 1) * 4] = choice[g * 4:(g + 1) * 4]
      self.assertEqual(set(ids[n]), set(np.argsort(-masked)[:3]))

  def test_bias_moves_choice_not_gates(self):
    cfg = _cfg(norm_topk_prob=False, routed_scaling_factor=2.0)
    x = jax.random.normal(jax.random.key(0), (32, 16))
    router = jax.random.normal(jax.random.key(1), (16, 8))
    bias = jnp.zeros(8).at[3].set(100.0)  # expert 3 always chosen
    r = moe.route(x, router, bias, cfg)
    self.assertTrue(bool(jnp.all(jnp.any(r.ids == 3, axis=1))))
    expected = 2.0 * jnp.take_along_axis(jax.nn.sigmoid(x @ router), r.ids, axis=1)
    chex.assert_trees_all_close(r.gates, expected, rtol=1e-6)

  def test_replay_uses_forced_ids_and_router_gets_gradient(self):
    cfg = _cfg()
    x = jax.random.normal(jax.random.key(0), (10, 16))
    router = jax.random.normal(jax.random.key(1), (16, 8))
    forced = jnp.tile(jnp.array([[5, 6]], jnp.int32), (10, 1))
    r = moe.route(x, router, jnp.zeros(8), cfg, forced_ids=forced)
    chex.assert_trees_all_equal(r.ids, forced)
    s = jax.nn.sigmoid(x @ router)[:, 5:7]
    chex.assert_trees_all_close(r.gates, s / s.sum(-1, keepdims=True), rtol=1e-6)
    g = jax.grad(lambda w: jnp.sum(moe.route(x, w, jnp.zeros(8), cfg, forced_ids=forced).gates[:, 0]))(router)
    self.assertGreater(float(jnp.abs(g[:, 5]).sum()), 0.0)
    chex.assert_trees_all_close(g[:, :5], jnp.zeros((16, 5)))

  def test_update_correction_bias(self):
    bias = jnp.zeros((2, 4))
    load = jnp.array([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    new = moe.update_correction_bias(bias, load, 0.01)
    chex.assert_trees_all_close(new, jnp.array([[-0.01, -0.01, 0.01, 0.01], [0.0, 0.0, 0.0, 0.0]]))


class DispatchTest(parameterized.TestCase):

  @parameterized.product(dispatch=[MoeDispatch.SLOTS, MoeDispatch.RAGGED], skew=[False, True],
                         capacity_factor=[0.25, 1.0, 1.25])
  def test_matches_dense_values_and_grads(self, dispatch, skew, capacity_factor):
    n, d, f, e, k = 48, 16, 12, 8, 2
    x = jax.random.normal(jax.random.key(0), (n, d))
    w = _experts(jax.random.key(1), e, d, f)
    if skew:  # every token on experts 0 and 1: max load = N, many overflow rounds for SLOTS
      ids = jnp.tile(jnp.array([[0, 1]], jnp.int32), (n, 1))
    else:
      ids = jax.random.permutation(jax.random.key(2), jnp.tile(jnp.arange(e, dtype=jnp.int32), n * k // e)).reshape(
          n, k)
      ids = jnp.where(ids[:, :1] == ids[:, 1:], jnp.stack([ids[:, 0], (ids[:, 0] + 1) % e], 1), ids)
    gates = jax.random.uniform(jax.random.key(3), (n, k))

    def run(fn, x, gates, w):
      return fn(x, ids, gates, w)

    fast = {MoeDispatch.SLOTS: functools.partial(moe.experts_slots, capacity_factor=capacity_factor),
            MoeDispatch.RAGGED: moe.experts_ragged}[dispatch]
    ref = jax.jit(functools.partial(run, moe.experts_dense))(x, gates, w)
    got = jax.jit(functools.partial(run, fast))(x, gates, w)
    chex.assert_trees_all_close(got, ref, atol=1e-5, rtol=1e-5)

    probe = jax.random.normal(jax.random.key(4), (n, d))

    def loss(fn, x, gates, w):
      return jnp.sum(run(fn, x, gates, w) * probe)

    g_ref = jax.jit(jax.grad(functools.partial(loss, moe.experts_dense), argnums=(0, 1, 2)))(x, gates, w)
    g_got = jax.jit(jax.grad(functools.partial(loss, fast), argnums=(0, 1, 2)))(x, gates, w)
    chex.assert_trees_all_close(g_got, g_ref, atol=1e-4, rtol=1e-4)

  @parameterized.named_parameters(
      # (name, routing): balanced; every token on experts 0 and 1 (12 tiles of 8 rows, 4 rounds of 3); experts
      # 1, 4 and 6 empty and the loads not multiples of the tile; one expert holding all but one assignment.
      ("balanced", "balanced"), ("skew", "skew"), ("empty_experts", "empty"), ("one_expert", "one"))
  def test_tiles_match_dense_values_and_grads(self, routing):
    n, d, f, e, k = 48, 16, 12, 8, 2
    x = jax.random.normal(jax.random.key(0), (n, d))
    w = _experts(jax.random.key(1), e, d, f)
    ids = {
        "balanced": jnp.stack([jnp.arange(n) % e, (jnp.arange(n) + 3) % e], 1),
        "skew": jnp.tile(jnp.array([[0, 1]]), (n, 1)),
        "empty": jnp.stack([jnp.array([0, 2, 3, 5, 7])[jnp.arange(n) % 5],
                            jnp.array([2, 3, 5, 7, 0])[(jnp.arange(n) * 3) % 5]], 1),
        "one": jnp.concatenate([jnp.tile(jnp.array([[5, 7]]), (1, 1)), jnp.tile(jnp.array([[7, 2]]), (n - 1, 1))]),
    }[routing].astype(jnp.int32)
    gates = jax.random.uniform(jax.random.key(3), (n, k))
    probe = jax.random.normal(jax.random.key(4), (n, d))

    def loss(fn, x, gates, w):
      return jnp.sum(fn(x, ids, gates, w) * probe)

    chex.assert_trees_all_close(jax.jit(moe.experts_tiles)(x, ids, gates, w),
                                jax.jit(moe.experts_dense)(x, ids, gates, w), atol=1e-5, rtol=1e-5)
    g_ref = jax.jit(jax.grad(functools.partial(loss, moe.experts_dense), argnums=(0, 1, 2)))(x, gates, w)
    g_got = jax.jit(jax.grad(functools.partial(loss, moe.experts_tiles), argnums=(0, 1, 2)))(x, gates, w)
    chex.assert_trees_all_close(g_got, g_ref, atol=1e-4, rtol=1e-4)

  def test_tiles_cover_every_row_once_within_its_expert(self):
    sizes = np.array([0, 13, 1, 0, 40, 8, 0, 2], np.int32)  # empty experts first, last and in between
    starts = np.cumsum(sizes) - sizes
    tiles = moe.Tiles(token=jnp.zeros((int(sizes.sum()),), jnp.int32), starts=jnp.asarray(starts, jnp.int32),
                      sizes=jnp.asarray(sizes), tile=8, per_round=3)
    padded_tiles = int(np.sum(-(-sizes // 8)))  # 0 + 2 + 1 + 0 + 5 + 1 + 0 + 1 = 10
    self.assertEqual(int(tiles.num_rounds()), -(-padded_tiles // 3))
    seen = []
    for r in range(int(tiles.num_rounds())):
      rows, valid, experts = (np.asarray(a) for a in tiles.round(jnp.int32(r)))
      chex.assert_shape((rows, valid, experts), ((3, 8), (3, 8), (3,)))
      for g in range(3):
        for row in rows[g][valid[g]]:
          self.assertTrue(starts[experts[g]] <= row < starts[experts[g]] + sizes[experts[g]])
          seen.append(int(row))
    self.assertEqual(sorted(seen), list(range(int(sizes.sum()))))

  def test_tile_sizes(self):
    self.assertEqual(moe.tile_rows(8192, 16), 128)  # a quarter of the balanced 512
    self.assertEqual(moe.tile_rows(16384, 64), 64)
    self.assertEqual((moe.tile_rows(96, 8), moe.tile_rows(10**7, 8)), (8, 128))
    # 3 x 512 x 256 float32 weights per tile: 4 tiles stay under 6 MiB; tiny experts: a quarter of the tiles.
    self.assertEqual(moe.tiles_per_round(16384, 64, (512, 256), jnp.float32), 4)
    self.assertEqual(moe.tiles_per_round(8192, 128, (64, 32), jnp.float32), 16)

  def test_slot_capacity(self):
    self.assertEqual(moe.slot_capacity(8192, 16, 1.25), 640)  # cf x balanced load
    self.assertEqual(moe.slot_capacity(8192, 128, 1.25), 96)  # balanced + 4 sigma: 64 + 32
    self.assertEqual(moe.slot_capacity(4, 8, 1.0), 4)

  def test_moe_ffn_load_and_shapes(self):
    cfg = _cfg(n_shared_experts=1)
    from c2jax.model.params import init_params
    p = jax.tree.map(lambda a: a[0], init_params(cfg, jax.random.key(0))["moe_layers"]["moe"])
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))
    mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
    out = jax.jit(lambda p, x, m: moe.moe_ffn(p, x, cfg, token_mask=m))(p, x, mask)
    chex.assert_shape(out.y, (2, 5, 16))
    chex.assert_shape(out.expert_ids, (2, 5, 2))
    self.assertAlmostEqual(float(out.load.sum()), 1.0, places=5)
    ids = np.asarray(out.expert_ids).reshape(-1, 2)[np.asarray(mask).reshape(-1) > 0]
    expected = np.bincount(ids.reshape(-1), minlength=8) / ids.size
    np.testing.assert_allclose(np.asarray(out.load), expected, atol=1e-6)


if __name__ == "__main__":
  absltest.main()
