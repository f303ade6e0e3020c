"""Context-parallel MLA attention against the plain full-mask reference, on 8 fake CPU devices.

Inputs are permuted into `zigzag_order` and placed with the shard_map specs, as the layout does; outputs and
gradients are permuted back and compared with `mla.attend_reference` in natural order.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import pytest

from c2jax.model import mla
from c2jax.model import params as params_lib
from c2jax.model import rope as rope_lib
from c2jax.parallel import context_parallel as cp_lib
from c2jax.parallel.mesh import BATCH_AXES, CONTEXT, TENSOR, MeshConfig, make_mesh
from c2jax.model import presets

pytestmark = pytest.mark.mesh  # sharded against one device on 8 fake CPU devices (`make test-unit` leaves them out)

B, T = 4, 32
MESHES = {
    "context4": MeshConfig(context=4),
    "data2_context4": MeshConfig(data=2, context=4),
    "fsdp2_expert2_context2": MeshConfig(fsdp=2, expert=2, context=2),
    "context2_tensor2": MeshConfig(context=2, tensor=2),
    "data2_tensor2_no_context": MeshConfig(data=2, tensor=2),  # context 1: the plain case still works
}
# Every mesh runs the packed case (segment ids); the two cases without segment ids share one compile per mesh, so
# they run on two meshes that between them split every kind of axis, to keep the file's compile time down.
MESH_CASES = ([(name, "packed") for name in MESHES] +
              [(name, case) for name in ("data2_context4", "context2_tensor2") for case in ("causal", "rope_offset")])
HEADS = P(BATCH_AXES, CONTEXT, TENSOR, None)
LATENT = P(BATCH_AXES, CONTEXT, None)
TOKENS = P(BATCH_AXES, CONTEXT)
# float32 throughout; the merge of partial blocks reorders sums, so agreement is to rounding, not bitwise.
VALUE_TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = dict(atol=1e-5, rtol=1e-4)


@functools.cache
def _cfg_and_params():
  """The tiny config and one layer's attention params, drawn with numpy from the param table.

  numpy, because eager `jax.random` compiles once per shape (seconds each on 2 cores); std 0.2 rather than the
  init's 0.02 so that the softmax is far from uniform and the log-sum-exp merge is really exercised.
  """
  cfg = presets.tiny()
  rng = np.random.default_rng(0)

  def draw(spec: params_lib.ParamSpec) -> jax.Array:
    shape = spec.shape[1:]  # drop the stacked layer axis
    fill = {"ones": np.ones(shape), "zeros": np.zeros(shape)}.get(spec.init)
    return jnp.asarray(0.2 * rng.standard_normal(shape) if fill is None else fill, jnp.float32)

  specs = params_lib.param_specs(cfg)["dense_layers"]["attn"]
  return cfg, jax.tree.map(draw, specs, is_leaf=lambda s: isinstance(s, params_lib.ParamSpec))


@functools.cache
def _mesh(name: str) -> jax.sharding.Mesh:
  config = MESHES[name]
  return make_mesh(config, jax.devices()[:config.num_devices])


def _positions_and_segments(case: str):
  """positions [B, T], segment ids [B, T] or None, natural order."""
  if case == "packed":  # 2-4 documents per row, boundaries off the chunk grid, positions restarting in each
    rng = np.random.default_rng(0)
    seg = np.stack([np.searchsorted(np.sort(rng.choice(np.arange(1, T), 1 + r % 3, replace=False)), np.arange(T),
                                    side="right") for r in range(B)])
    starts = np.stack([np.maximum.accumulate(np.where(np.diff(s, prepend=-1) != 0, np.arange(T), 0)) for s in seg])
    return jnp.asarray(np.arange(T) - starts, jnp.int32), jnp.asarray(seg, jnp.int32)
  offset = 1000 if case == "rope_offset" else 0  # chunks carry global positions; rope sees them
  return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32) + offset, (B, T)), None


@functools.cache
def _inputs(case: str):
  """Natural-order (kv_b, latents (q_nope, q_rope, c_kv, k_rope), positions, segment ids, probe)."""
  cfg, p = _cfg_and_params()
  positions, segment_ids = _positions_and_segments(case)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((B, T, cfg.d_model)), jnp.float32)
  cos, sin = rope_lib.rope_angles(positions, cfg.rope, cfg.qk_rope_head_dim)
  lat = mla.project_latents(p, x, cos, sin, cfg)
  probe = jnp.asarray(rng.standard_normal((B, T, cfg.n_heads, cfg.v_head_dim)), jnp.float32)
  return p["kv_b"], (lat.q_nope, lat.q_rope, lat.c_kv, lat.k_rope), positions, segment_ids, probe


@jax.jit
def _reference(kv_b, lats, positions, segment_ids, probe):
  """(values, (d kv_b, d latents)) of sum(values * probe) by `attend_reference`, natural order."""
  cfg, _ = _cfg_and_params()
  mask = mla.attention_mask(positions, positions, segment_ids, segment_ids)

  def loss(kv_b, lats):
    values = mla.attend_reference({"kv_b": kv_b}, mla.Latents(*lats), mask, cfg)
    return jnp.sum(values * probe), values

  (_, values), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(kv_b, lats)
  return values, grads


@functools.cache
def _context_parallel(mesh_name: str):
  """Jitted (values, grads) of sum(values * probe) by context-parallel attention, zigzag order in and out."""
  cfg, _ = _cfg_and_params()
  attend = cp_lib.make_context_parallel(_mesh(mesh_name))

  def loss(kv_b, lats, positions, segment_ids, probe):
    values = attend({"kv_b": kv_b}, mla.Latents(*lats), positions, segment_ids, cfg)
    return jnp.sum(values * probe), values

  def run(kv_b, lats, positions, segment_ids, probe):
    (_, values), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(kv_b, lats, positions, segment_ids,
                                                                                 probe)
    return values, grads

  return jax.jit(run)


class ZigzagOrderTest(parameterized.TestCase):

  @parameterized.parameters(1, 2, 4, 8)
  def test_is_balanced_permutation(self, cp):
    t = 16 * cp
    ch = t // (2 * cp)
    order = cp_lib.zigzag_order(t, cp)
    np.testing.assert_array_equal(np.sort(order), np.arange(t))
    for c, shard in enumerate(order.reshape(cp, 2 * ch)):
      np.testing.assert_array_equal(shard[:ch], np.arange(c * ch, (c + 1) * ch))
      np.testing.assert_array_equal(shard[ch:], np.arange((2 * cp - 1 - c) * ch, (2 * cp - c) * ch))
      # The (query chunk, key chunk) pairs of the causal triangle that this shard owns: the same count everywhere,
      # and exactly the pairs the attention region computes.
      query_chunks = (c, 2 * cp - 1 - c)
      needed = {(q, k) for q in query_chunks for k in range(q + 1)}
      self.assertLen(needed, 2 * cp + 1)
      half, chunk = cp_lib._block_pairs(cp, jnp.int32(c))
      self.assertEqual({(query_chunks[h], int(k)) for h, k in zip(np.asarray(half), np.asarray(chunk))}, needed)

  def test_bad_length(self):
    with self.assertRaisesRegex(ValueError, r"sequence length 100 is not divisible by 2 x context = 8; pad the "
                                r"sequence to a multiple of 8"):
      cp_lib.zigzag_order(100, 4)


class AttentionBlockTest(absltest.TestCase):

  def test_lse_output_and_its_gradient(self):
    # The block kernel's (out, lse) and hand-written VJP, with cotangents on both outputs, against autodiff of
    # plain jnp; query rows 0-1 see no key at all (as in an off-diagonal context-parallel block).
    rng = np.random.default_rng(3)
    b, t, s, n, h, hv = 2, 6, 5, 2, 4, 3
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in
               ((b, t, n, h), (b, s, n, h), (b, s, n, hv)))
    q_pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    k_pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32) + 2, (b, s))
    q_seg = jnp.asarray(rng.integers(0, 2, (b, t)), jnp.int32).at[:, 2:].set(0)
    k_seg = jnp.zeros((b, s), jnp.int32)
    d_out = jnp.asarray(rng.standard_normal((b, t, n, hv)), jnp.float32)
    d_lse = jnp.asarray(rng.standard_normal((b, n, t)), jnp.float32)
    visible = mla.attention_mask(q_pos, k_pos, q_seg, k_seg)  # [b, 1, t, s]

    def plain(q, k, v):
      logits = jnp.where(visible, jnp.einsum("btnh,bsnh->bnts", q, k), -jnp.inf)
      lse = jax.nn.logsumexp(logits, axis=-1)
      probs = jnp.where(visible, jnp.exp(logits - lse[..., None]), 0.0)
      return jnp.einsum("bnts,bsnh->btnh", probs, v), lse

    @jax.jit
    def both(q, k, v):
      (out, lse), vjp = jax.vjp(lambda q, k, v: mla.attention_block(q, k, v, q_pos, k_pos, q_seg, k_seg), q, k, v)
      (want_out, want_lse), want_vjp = jax.vjp(plain, q, k, v)
      seen = jnp.any(visible[:, 0], axis=-1)  # [b, t]; plain's rows without a key are -inf / NaN
      d_lse_seen = jnp.where(seen[:, None], d_lse, 0.0)
      d_out_seen = jnp.where(seen[:, :, None, None], d_out, 0.0)
      return (out, lse, vjp((d_out_seen, d_lse_seen)), want_out, want_lse, want_vjp((d_out_seen, d_lse_seen)),
              seen)

    out, lse, grads, want_out, want_lse, want_grads, seen = both(q, k, v)
    self.assertFalse(np.all(seen) or not np.any(seen))  # both kinds of row are present
    seen_rows = np.asarray(seen)[:, None, :]
    chex.assert_trees_all_close(jnp.where(seen[:, :, None, None], out, 0.0),
                                jnp.where(seen[:, :, None, None], want_out, 0.0), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.where(seen_rows, lse, 0.0), np.where(seen_rows, want_lse, 0.0), atol=1e-5,
                               rtol=1e-5)
    self.assertTrue(np.all(np.asarray(lse)[~np.broadcast_to(seen_rows, lse.shape)] < -1e37))  # merge weight 0
    chex.assert_trees_all_close(grads, want_grads, atol=1e-5, rtol=1e-5)
    chex.assert_tree_all_finite(grads)


class ContextParallelAttentionTest(parameterized.TestCase):

  @parameterized.named_parameters((f"{mesh_name}_{case}", mesh_name, case) for mesh_name, case in MESH_CASES)
  def test_matches_reference_values_and_grads(self, mesh_name, case):
    mesh = _mesh(mesh_name)
    kv_b, lats, positions, segment_ids, probe = _inputs(case)
    want_values, (want_dkv_b, want_dlats) = _reference(kv_b, lats, positions, segment_ids, probe)

    order = cp_lib.zigzag_order(T, mesh.shape[CONTEXT])
    inverse = np.argsort(order)

    def place(a, spec):
      return None if a is None else jax.device_put(jnp.take(a, order, axis=1), NamedSharding(mesh, spec))

    got_values, (got_dkv_b, got_dlats) = _context_parallel(mesh_name)(
        jax.device_put(kv_b, NamedSharding(mesh, P(None, TENSOR, None))),
        tuple(place(a, s) for a, s in zip(lats, (HEADS, HEADS, LATENT, LATENT))),
        place(positions, TOKENS), place(segment_ids, TOKENS), place(probe, HEADS))

    self.assertTrue(got_values.sharding.is_equivalent_to(NamedSharding(mesh, HEADS), got_values.ndim))
    chex.assert_trees_all_close(jnp.take(got_values, inverse, axis=1), want_values, **VALUE_TOL)
    chex.assert_trees_all_close(got_dkv_b, want_dkv_b, **GRAD_TOL)
    chex.assert_trees_all_close(tuple(jnp.take(g, inverse, axis=1) for g in got_dlats), want_dlats, **GRAD_TOL)

  def test_inside_scan_over_layers(self):
    # How the decoder calls it: under jit, inside a scan over stacked layer params (here two kv_b's).
    mesh_name = "context2_tensor2"
    mesh = _mesh(mesh_name)
    cfg, _ = _cfg_and_params()
    kv_b, lats, positions, segment_ids, probe = _inputs("packed")
    kv_bs = jnp.stack([kv_b, 0.5 * kv_b[:, ::-1]])
    order = cp_lib.zigzag_order(T, mesh.shape[CONTEXT])
    attend = cp_lib.make_context_parallel(mesh)
    take = functools.partial(jnp.take, indices=order, axis=1)

    @jax.jit
    @jax.value_and_grad
    def loss(kv_bs):
      lat = mla.Latents(*map(take, lats))

      def step(acc, kv_b):
        return acc + attend({"kv_b": kv_b}, lat, take(positions), take(segment_ids), cfg), None

      values, _ = jax.lax.scan(step, jnp.zeros_like(take(probe)), kv_bs)
      return jnp.sum(values * take(probe))

    got, got_grad = loss(jax.device_put(kv_bs, NamedSharding(mesh, P(None, None, TENSOR, None))))
    want, want_grad = 0.0, []
    for layer in range(2):
      values, (dkv_b, _) = _reference(kv_bs[layer], lats, positions, segment_ids, probe)
      want += jnp.sum(values * probe)
      want_grad.append(dkv_b)
    chex.assert_trees_all_close(got, want, **VALUE_TOL)
    chex.assert_trees_all_close(got_grad, jnp.stack(want_grad), **GRAD_TOL)

  def test_bad_length(self):
    cfg, p = _cfg_and_params()
    lat = mla.Latents(q_nope=jnp.zeros((B, 36, cfg.n_heads, cfg.qk_nope_head_dim)),
                      q_rope=jnp.zeros((B, 36, cfg.n_heads, cfg.qk_rope_head_dim)),
                      c_kv=jnp.zeros((B, 36, cfg.kv_lora_rank)), k_rope=jnp.zeros((B, 36, cfg.qk_rope_head_dim)))
    attend = cp_lib.make_context_parallel(_mesh("context4"))
    with self.assertRaisesRegex(ValueError, "sequence length 36 is not divisible by 2 x context = 8"):
      attend(p, lat, jnp.zeros((B, 36), jnp.int32), None, cfg)

  def test_heads_not_divisible_by_tensor(self):
    cfg, p = _cfg_and_params()
    _, lats, positions, _, _ = _inputs("causal")
    attend = cp_lib.make_context_parallel(make_mesh(MeshConfig(tensor=8)))
    with self.assertRaisesRegex(ValueError, "4 attention heads are not divisible by tensor = 8"):
      attend(p, mla.Latents(*lats), positions, None, cfg)


if __name__ == "__main__":
  absltest.main()
