"""The quantized expert recipes (MXFP8, NVFP4 forward / MXFP8 backward) under expert parallelism equal the
single-device quantized model on 8 CPU devices.

Two MoE layers of the tiny preset (D=64, F=32, E=16, K=4, a shared expert) run through the model's own `moe_ffn`
in a layer scan, once without a layout (`moe.experts_quantized` over all expert-sorted rows) and once under a
data x expert `Layout` (each shard's local experts through the same `moe.quantized_grouped_dot`).

Replayed routing gives some (device, expert) pairs 64 rows (two dropless rounds); the router's own routing gives
uneven loads. In both the loss (through the outputs h) and every gradient agree up to float32 reassociation:
the weight gradient's 32-row scale blocks group other tokens on each layout, but an E8M0 scale is a power of two,
so a code depends on its block only in E4M3's subnormal range (see `c2jax.parallel.expert_parallel`). A recipe
dropped inside the shard (BF16 experts) and an NVFP4 scale over the wrong axis (per tensor, not per token) both
fail the comparison.
"""

import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import pytest

from c2jax.model import moe
from c2jax.model.config import Precision
from c2jax.model.sharding import Layout, use_layout
from c2jax.parallel import expert_parallel
from c2jax.parallel import mesh as meshlib
from c2jax.parallel.mesh import BATCH_AXES, CONTEXT, EXPERT, FSDP, TENSOR
from pallas_kernels.formats import NVFP4Scaling
from pallas_kernels.recipe import ops as recipe_ops
from tests import tiny

pytestmark = [
    pytest.mark.mesh,  # sharded against one device on 8 fake CPU devices (`make test-unit` leaves them out)
    pytest.mark.fusion_emitters,  # NVFP4's float4 containers: XLA:CPU's element-wise emitters cannot lower them
]

_CFG = tiny.MODEL
_D, _E, _K, _F = _CFG.d_model, _CFG.n_routed_experts, _CFG.num_experts_per_tok, _CFG.moe_intermediate_size
_FS = _CFG.shared_intermediate_size
_L, _B, _T = 2, 8, 64  # one sequence of 64 tokens (256 assignments) per device on every mesh below
# Every value and gradient is compared to its largest magnitude (its scale). float32 sums over D, F and the 512
# tokens run in another order (rows grouped per shard, partial dw psummed over data): ~1e-7 of the scale, so the
# bulk is held at _ATOL_FRACTION. The quantizers turn a few of those ulps into more: an input within an ulp of a
# rounding boundary flips to the next code (probability ~2^-20 per element, ~10^6 elements quantized per step),
# which moves the row or column it feeds by one E4M3 step of one element (measured 2.3e-4 of the scale, 0.1% of
# dx). So up to _MAX_FLIPPED of the elements may be off by up to _FLIP_FRACTION; a wrong recipe or scale moves
# nearly all of them.
_ATOL_FRACTION = 2e-5
_FLIP_FRACTION = 2e-3
_MAX_FLIPPED = 0.01

_QUANTIZE_NVFP4 = recipe_ops.quantize_nvfp4
_MESHES = {"data2_expert4": dict(data=2, expert=4), "expert8": dict(expert=8)}


def _normal(seed: int, *shape: int, scale: float = 1.0) -> jax.Array:
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _stack_params(seed: int) -> dict:
  """[L]-stacked MoE params, scaled so that routing is decisive and expert outputs are O(1)."""
  return {
      "router": _normal(seed, _L, _D, _E, scale=0.3),
      "router_bias": _normal(seed + 1, _L, _E, scale=0.1),
      "experts": {"gate": _normal(seed + 2, _L, _E, _D, _F, scale=0.2),
                  "up": _normal(seed + 3, _L, _E, _D, _F, scale=0.2),
                  "down": _normal(seed + 4, _L, _E, _F, _D, scale=0.2)},
      "shared": {"gate": _normal(seed + 5, _L, _D, _FS, scale=0.1), "up": _normal(seed + 6, _L, _D, _FS, scale=0.1),
                 "down": _normal(seed + 7, _L, _FS, _D, scale=0.1)},
  }


_PARAMS = _stack_params(0)
_X = _normal(10, _B, _T, _D)
_PROBE = _normal(11, _B, _T, _D)


def _aligned_ids(seed: int) -> jax.Array:
  """[L, B, T, K] replayed ids: per sequence (= per device), tokens 0-31 take experts {a, b, c, d} and 32-63
  {a, e, f, g}, so each device sends 32 or 64 rows (two dropless rounds) to each expert it uses."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((_L, _B, _T, _K), np.int32)
  for layer in range(_L):
    for b in range(_B):
      e = rng.permutation(_E)[:7]
      ids[layer, b, :_T // 2] = e[:4]
      ids[layer, b, _T // 2:] = [e[0], *e[4:]]
  return jnp.asarray(ids)


def _stack_loss(p, x, forced, cfg):
  """(sum(h * probe), h [B, T, D]) after two residual MoE layers (the model's `moe_ffn` in a scan, as in the
  transformer)."""

  def layer(h, inputs):
    p_layer, ids = inputs
    return h + moe.moe_ffn(p_layer, h, cfg, forced_ids=ids).y, None

  h, _ = jax.lax.scan(layer, x, (p, forced))
  return jnp.sum(h * _PROBE), h


@functools.cache
def _single_device(precision: Precision, replay: bool):
  cfg = _CFG.replace(precision=precision)
  loss = lambda p, x, f: _stack_loss(p, x, f if replay else None, cfg)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


@functools.cache
def _expert_parallel(axes: tuple[tuple[str, int], ...], precision: Precision, replay: bool):
  """(mesh, jitted value-and-grad of the stack under an EP layout of `axes`)."""
  mesh = meshlib.make_mesh(meshlib.MeshConfig(**dict(axes)))
  layout = Layout(mesh=mesh, rules=(("batch", BATCH_AXES), ("seq", (CONTEXT,))),
                  routed_experts=expert_parallel.make_expert_parallel(mesh))
  cfg = _CFG.replace(precision=precision)

  def loss(p, x, f):
    with use_layout(layout):
      return _stack_loss(p, x, f if replay else None, cfg)

  return mesh, jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _run_expert_parallel(axes: dict, precision: Precision, forced, compiled=None):
  """Value and grads of the stack under an EP layout of `axes` (`compiled`: a (mesh, fn) to use instead)."""
  mesh, fn = compiled or _expert_parallel(tuple(sorted(axes.items())), precision, forced is not None)
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  w = _PARAMS["experts"]
  p = dict(_PARAMS, experts={"gate": put(w["gate"], None, EXPERT, FSDP, TENSOR),
                             "up": put(w["up"], None, EXPERT, FSDP, TENSOR),
                             "down": put(w["down"], None, EXPERT, TENSOR, FSDP)})
  tokens = lambda a: put(a, *((None,) * (a.ndim - 3)), BATCH_AXES, CONTEXT, None)
  return fn(p, tokens(_X), None if forced is None else tokens(forced))


def _run_single_device(precision: Precision, forced):
  return _single_device(precision, forced is not None)(_PARAMS, _X, forced)


def _assert_close(got, want, name: str):
  """|got - want| <= _ATOL_FRACTION of want's scale but for <= _MAX_FLIPPED of the elements, <= _FLIP_FRACTION."""
  want = np.asarray(want, np.float64)
  err = np.abs(np.asarray(got, np.float64) - want) / max(float(np.max(np.abs(want))), 1e-30)
  off = float(np.mean(err > _ATOL_FRACTION))
  if err.max() > _FLIP_FRACTION or off > _MAX_FLIPPED:
    raise AssertionError(f"{name}: {off:.2%} of the elements are off by more than {_ATOL_FRACTION:g} of the scale "
                         f"(at most {_MAX_FLIPPED:.0%} may be), the largest by {err.max():.2e} (limit "
                         f"{_FLIP_FRACTION:g}).")


def _assert_match(got, want):
  """The outputs h and the grads (x, every param) of two runs match. (The loss, a sum of 32768 products that cancel
  to ~1e-3 of their absolute sum, is held through h.)"""
  ((_, h), (gp, gx)), ((_, h_ref), (gp_ref, gx_ref)) = got, want
  _assert_close(h, h_ref, "h")
  _assert_close(gx, gx_ref, "d/dx")
  for (path, g_ref), g in zip(jax.tree_util.tree_leaves_with_path(gp_ref), jax.tree.leaves(gp), strict=True):
    _assert_close(g, g_ref, f"d/d{jax.tree_util.keystr(path)}")


class ExpertParallelQuantizedTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("mxfp8_data2_expert4", Precision.MXFP8, "data2_expert4"),
      ("nvfp4_expert8", Precision.NVFP4_FWD_MXFP8_BWD, "expert8"),
  )
  def test_replayed_routing_matches_single_device(self, precision, mesh_name):
    forced = _aligned_ids(seed=1)
    _assert_match(_run_expert_parallel(_MESHES[mesh_name], precision, forced), _run_single_device(precision, forced))

  def test_router_routing_matches_single_device(self):
    precision = Precision.NVFP4_FWD_MXFP8_BWD
    _assert_match(_run_expert_parallel(_MESHES["data2_expert4"], precision, None), _run_single_device(precision, None))

  def test_comparison_catches_a_dropped_recipe_or_a_wrong_scale_axis(self):
    forced = _aligned_ids(seed=1)
    want = _run_single_device(Precision.NVFP4_FWD_MXFP8_BWD, forced)
    # The EP path computing its experts without the recipe (the refusal this replaced, silently dropped).
    with self.assertRaises(AssertionError):
      _assert_match(_run_expert_parallel(_MESHES["expert8"], Precision.BF16, forced), want)
    # NVFP4's second-level scale taken over the whole operand instead of per token (row) inside the shard: the
    # shard's rows are not all rows, so codes change.
    per_tensor = lambda x, scaling, **kw: _QUANTIZE_NVFP4(x, NVFP4Scaling.PER_TENSOR, **kw)
    with mock.patch.object(recipe_ops, "quantize_nvfp4", per_tensor):
      mesh, fn = _expert_parallel.__wrapped__((("expert", 8),), Precision.NVFP4_FWD_MXFP8_BWD, True)
      got = _run_expert_parallel(_MESHES["expert8"], Precision.NVFP4_FWD_MXFP8_BWD, forced, (mesh, fn))
    with self.assertRaises(AssertionError):
      _assert_match(got, want)

  @parameterized.named_parameters(
      ("nvfp4_tensor", Precision.NVFP4_FWD_MXFP8_BWD, dict(expert=4, tensor=2), "use a tensor axis of 1"),
      ("mxfp8_tensor", Precision.MXFP8, dict(expert=4, tensor=2), "leaves a multiple of 32 per device"),
  )
  def test_a_split_scale_block_is_refused(self, precision, axes, message):
    mesh = meshlib.make_mesh(meshlib.MeshConfig(**axes))
    fn = expert_parallel.make_expert_parallel(mesh)
    p = jax.eval_shape(lambda: jax.tree.map(lambda a: a[0], _PARAMS))
    x = jax.ShapeDtypeStruct((_B, _T, _D), jnp.float32)
    with self.assertRaisesRegex(ValueError, message):
      jax.eval_shape(lambda p, x: fn(p, x, _CFG.replace(precision=precision), None), p, x)


if __name__ == "__main__":
  absltest.main()
