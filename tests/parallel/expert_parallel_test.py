"""Expert parallelism equals the single-device reference (`moe.route` + `moe.experts_dense`) on 8 CPU devices.

Values and gradients (x, router, every expert weight) over several mesh shapes, routing replay, skewed routing
(several dropless rounds, on every device or on one device only, so that its expert group must agree on the
round count), capacity-factor drops against an independent numpy count, the model's own `moe_ffn` under a
`Layout` inside a scan over layers, and clear errors for shapes that do not split.
"""

import functools
import re

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import pytest

from c2jax.model import moe
from c2jax.model.config import ModelConfig, MoeDispatch
from c2jax.model.sharding import Layout, use_layout
from c2jax.parallel import mesh as meshlib
from c2jax.parallel.expert_parallel import make_expert_parallel
from c2jax.parallel.mesh import BATCH_AXES, CONTEXT, EXPERT, FSDP, TENSOR

pytestmark = pytest.mark.mesh  # sharded against one device on 8 fake CPU devices (`make test-unit` leaves them out)

# K=2 of E=16 (rather than 4) so that a fully skewed batch needs 4 dropless rounds, not 2.
_B, _T, _D, _E, _K, _F = 8, 32, 16, 16, 2, 8
_CFG = ModelConfig(d_model=_D, n_routed_experts=_E, num_experts_per_tok=_K, moe_intermediate_size=_F, n_group=4,
                   topk_group=2, n_layers=2, first_k_dense_replace=1, n_shared_experts=0)
_VALUE_TOL = dict(atol=1e-5, rtol=1e-5)  # float32 sums in a different order than the reference.
_GRAD_TOL = dict(atol=1e-4, rtol=1e-4)  # router/expert grads sum over all 256 tokens.

_MESHES = {
    "expert8": dict(expert=8),
    "fsdp2_expert4": dict(fsdp=2, expert=4),
    "fsdp2_expert2_context2": dict(fsdp=2, expert=2, context=2),
    "data2_context4": dict(data=2, context=4),
    "expert4_tensor2": dict(expert=4, tensor=2),
}


def _normal(seed: int, *shape: int, scale: float = 1.0) -> jax.Array:
  # numpy, not jax.random: eager jax.random compiles a program per shape, seconds each on a busy 2-core box.
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _moe_params(seed: int, layers: int | None = None) -> dict:
  """Random MoE params (scaled so that routing is decisive and expert outputs are O(1)); optional [L] stack."""
  lead = () if layers is None else (layers,)
  return {
      "router": _normal(seed, *lead, _D, _E),
      "router_bias": _normal(seed + 1, *lead, _E, scale=0.1),
      "experts": {"gate": _normal(seed + 2, *lead, _E, _D, _F, scale=0.3),
                  "up": _normal(seed + 3, *lead, _E, _D, _F, scale=0.3),
                  "down": _normal(seed + 4, *lead, _E, _F, _D, scale=0.3)},
  }


_P = _moe_params(0)
_X = _normal(10, _B, _T, _D)
_PROBE = _normal(11, _B, _T, _D)


def _balanced_ids(seed: int) -> jax.Array:
  """[B, T, K] replayed ids with two distinct experts per token, spread evenly over the experts."""
  first = np.random.default_rng(seed).integers(0, _E // 2, (_B, _T, 1), dtype=np.int32)
  return jnp.asarray(np.concatenate([first, first + _E // 2], axis=-1))


def _mesh(**axes) -> jax.sharding.Mesh:
  return meshlib.make_mesh(meshlib.MeshConfig(**axes))


def _place(mesh, p, x, forced=None):
  """Params in their training layout (experts over expert, F over tensor, D over fsdp) and tokens split."""
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  lead = (None,) * (p["router"].ndim - 2)
  w = p["experts"]
  p = {"router": put(p["router"], *lead, None, None), "router_bias": put(p["router_bias"], *lead, None),
       "experts": {"gate": put(w["gate"], *lead, EXPERT, FSDP, TENSOR), "up": put(w["up"], *lead, EXPERT, FSDP, TENSOR),
                   "down": put(w["down"], *lead, EXPERT, TENSOR, FSDP)}}
  x = put(x, BATCH_AXES, CONTEXT, None)
  return p, x, None if forced is None else put(forced, BATCH_AXES, CONTEXT, None)


@jax.jit
def _reference(p, x, forced, keep):
  """Single-device reference: (loss, (y, ids)) and grads w.r.t. (p, x); keep [B, T, K] zeroes dropped gates."""

  def loss(p, x):
    flat = x.reshape(-1, _D)
    r = moe.route(flat, p["router"], p["router_bias"], _CFG, None if forced is None else forced.reshape(-1, _K))
    gates = r.gates if keep is None else r.gates * keep.reshape(-1, _K)
    y = moe.experts_dense(flat, r.ids, gates, p["experts"]).reshape(x.shape)
    return jnp.sum(y * _PROBE), (y, r.ids.reshape(_B, _T, _K))

  return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(p, x)


@functools.cache
def _jitted_expert_parallel(axes: tuple[tuple[str, int], ...], capacity_factor: float | None):
  """(mesh, jitted value-and-grad of the EP path), one per mesh and mode, so that tests can share a compile."""
  mesh = _mesh(**dict(axes))
  fn = make_expert_parallel(mesh, capacity_factor=capacity_factor)

  def loss(p, x, forced):
    out = fn(p, x, _CFG, forced)
    return jnp.sum(out.y * _PROBE), out

  return mesh, jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _expert_parallel(axes: dict, p, x, forced=None, capacity_factor=None):
  """The EP path under jit on inputs placed over the mesh `axes`: (RoutedOutput, grads w.r.t. (p, x))."""
  mesh, run = _jitted_expert_parallel(tuple(sorted(axes.items())), capacity_factor)
  (_, out), grads = run(*_place(mesh, p, x, forced))
  return out, grads


def _assert_grads_close(got, want):
  chex.assert_trees_all_close(got[1], want[1], **_GRAD_TOL)  # x
  chex.assert_trees_all_close(got[0]["router"], want[0]["router"], **_GRAD_TOL)
  chex.assert_trees_all_close(got[0]["experts"], want[0]["experts"], **_GRAD_TOL)


class ExpertParallelTest(parameterized.TestCase):

  @parameterized.named_parameters(*_MESHES.items())
  def test_matches_reference_values_and_grads(self, axes):
    out, grads = _expert_parallel(axes, _P, _X)
    (_, (y_ref, ids_ref)), grads_ref = _reference(_P, _X, None, None)
    chex.assert_trees_all_equal(out.ids, ids_ref)
    chex.assert_trees_all_close(out.y, y_ref, **_VALUE_TOL)
    self.assertEqual(float(out.dropped), 0.0)
    # The router is replicated into the shard_map: its gradient must be the sum over all devices' tokens.
    _assert_grads_close(grads, grads_ref)

  def test_routing_replay(self):
    forced = _balanced_ids(seed=3)
    out, grads = _expert_parallel(dict(fsdp=2, expert=2, context=2), _P, _X, forced)
    (_, (y_ref, _)), grads_ref = _reference(_P, _X, forced, None)
    chex.assert_trees_all_equal(out.ids, forced)
    chex.assert_trees_all_close(out.y, y_ref, **_VALUE_TOL)
    _assert_grads_close(grads, grads_ref)  # gates recomputed from the router: it still gets gradient.
    self.assertGreater(float(jnp.abs(grads[0]["router"]).sum()), 0.0)

  @parameterized.named_parameters(("every_device", _B), ("one_device", 2))
  def test_skewed_routing_is_dropless(self, skewed_sequences):
    """Tokens forced onto the same K experts need several rounds; on one device only, its group must agree."""
    axes = dict(expert=4, tensor=2)  # sequences 0-1 live on expert shard 0
    n = _B * _T // 4  # tokens per device
    self.assertGreaterEqual(-(-n // moe.slot_capacity(n * _K, _E, _CFG.moe_capacity_factor)), 4)  # rounds
    forced = np.array(_balanced_ids(seed=5))
    forced[:skewed_sequences] = [3, 12]  # experts on expert shards 0 and 3
    out, grads = _expert_parallel(axes, _P, _X, jnp.asarray(forced))
    (_, (y_ref, _)), grads_ref = _reference(_P, _X, jnp.asarray(forced), None)
    self.assertEqual(float(out.dropped), 0.0)
    chex.assert_trees_all_close(out.y, y_ref, **_VALUE_TOL)
    _assert_grads_close(grads, grads_ref)

  def test_capacity_factor_drops_and_counts(self):
    axes = dict(fsdp=2, expert=2, context=2)
    cf = 1.0
    # Replayed ids concentrated on a few experts, so that some (device, expert) pairs overflow one round.
    rng = np.random.default_rng(0)
    prob = 0.5 ** np.arange(_E)
    forced = np.stack([rng.choice(_E, _K, replace=False, p=prob / prob.sum()) for _ in range(_B * _T)])
    forced = forced.reshape(_B, _T, _K).astype(np.int32)

    # Independent count: each device holds a [B_l, T_l] block and keeps, per expert, its first C assignments in
    # (b, t, k) order.
    batch_shards, ctx = 4, 2
    bl, tl = _B // batch_shards, _T // ctx
    capacity = moe.slot_capacity(bl * tl * _K, _E, cf)
    keep = np.ones_like(forced, np.float32)
    for i in range(batch_shards):
      for j in range(ctx):
        ids = forced[i * bl:(i + 1) * bl, j * tl:(j + 1) * tl].reshape(-1)
        place_in_queue = np.array([np.sum(ids[:a] == e) for a, e in enumerate(ids)])
        keep[i * bl:(i + 1) * bl, j * tl:(j + 1) * tl] = (place_in_queue < capacity).reshape(bl, tl, _K)
    expected_dropped = float((keep == 0).sum())
    self.assertGreater(expected_dropped, 0)

    out, grads = _expert_parallel(axes, _P, _X, jnp.asarray(forced), capacity_factor=cf)
    (_, (y_ref, _)), grads_ref = _reference(_P, _X, jnp.asarray(forced), jnp.asarray(keep))
    self.assertEqual(float(out.dropped), expected_dropped)
    chex.assert_trees_all_close(out.y, y_ref, **_VALUE_TOL)
    _assert_grads_close(grads, grads_ref)

  def test_moe_ffn_under_layout_in_a_layer_scan(self):
    """The model's own entry point: `moe_ffn` dispatches to the layout's EP function inside lax.scan."""
    mesh = _mesh(fsdp=2, expert=2, tensor=2)
    layers = 2
    stacked = _moe_params(20, layers)
    layout = Layout(mesh=mesh, rules=(("batch", BATCH_AXES), ("seq", (CONTEXT,))),
                    routed_experts=make_expert_parallel(mesh))

    def stack_loss(p, x, layout):
      # The reference runs the local dense dispatch (cheapest to compile); EP ignores cfg.moe_dispatch.
      cfg = _CFG.replace(moe_dispatch=MoeDispatch.DENSE)

      def layer(h, p_layer):
        out = moe.moe_ffn(p_layer, h, cfg)
        return h + out.y, out.expert_ids

      with use_layout(layout):
        h, ids = jax.lax.scan(layer, x, p)
      return jnp.sum(h * _PROBE), ids

    grad = lambda layout: jax.jit(jax.value_and_grad(lambda p, x: stack_loss(p, x, layout), argnums=(0, 1),
                                                     has_aux=True))
    (loss_ref, ids_ref), g_ref = grad(None)(stacked, _X)
    p, x, _ = _place(mesh, stacked, _X)
    (loss, ids), g = grad(layout)(p, x)
    chex.assert_trees_all_equal(ids, ids_ref)
    chex.assert_trees_all_close(loss, loss_ref, atol=1e-3, rtol=1e-5)
    _assert_grads_close(g, g_ref)

  @parameterized.named_parameters(
      ("experts", dict(expert=8), dict(n_routed_experts=12, n_group=1, topk_group=1), (8, 32),
       "12 experts cannot be split over an expert axis of 8; choose an expert axis size that divides 12."),
      ("expert_hidden", dict(tensor=8), dict(moe_intermediate_size=12), (8, 32),
       "moe_intermediate_size=12 cannot be split over a tensor axis of 8"),
      ("batch", dict(fsdp=2, expert=4), {}, (4, 32), "make the batch a multiple of 8"),
      ("sequence", dict(expert=2, context=4), {}, (8, 30), "make the sequence length a multiple of 4"),
  )
  def test_shapes_that_do_not_split_raise(self, axes, cfg_overrides, batch_seq, message):
    cfg = _CFG.replace(**cfg_overrides)
    fn = make_expert_parallel(_mesh(**axes))
    p = jax.eval_shape(lambda: _P)
    x = jax.ShapeDtypeStruct((*batch_seq, _D), jnp.float32)
    with self.assertRaisesRegex(ValueError, re.escape(message)):
      jax.eval_shape(lambda p, x: fn(p, x, cfg, None), p, x)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "must be positive"):
      make_expert_parallel(_mesh(expert=8), capacity_factor=0.0)
    with self.assertRaisesRegex(ValueError, "build it with c2jax.parallel.mesh.make_mesh"):
      make_expert_parallel(jax.sharding.Mesh(np.array(jax.devices()), (EXPERT,)))


if __name__ == "__main__":
  absltest.main()
