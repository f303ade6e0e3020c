"""The NNX module over the pure model: same init, same outputs, same gradients, exact round trips and checkpoints.

Every comparison with the pure path is exact (bitwise, dtypes included): the module owns no math, so anything
short of equality would mean two sources of truth.
"""

import functools
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from c2jax.model import nnx_model
from c2jax.model.checkpoint import save_checkpoint
from c2jax.model.params import abstract_params, init_params, logical_axes
from c2jax.model.sharding import with_layout
from c2jax.model.transformer import forward
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import MeshConfig, make_mesh
from tests import tiny

CFG = tiny.MODEL_MTP  # 1 dense + 1 MoE layer and one MTP module: every param group of the layout.
KEY = 0
B, T = 4, 8  # B splits over the sharded tests' fsdp x expert = 4


@functools.cache
def _params():
  return init_params(CFG, jax.random.key(KEY))


@functools.cache
def _tokens():
  return jax.random.randint(jax.random.key(1), (B, T), 0, CFG.vocab_size, jnp.int32)


def _packed():
  """positions / segment ids of two documents per row (3 + 5 tokens)."""
  segment_ids = jnp.asarray([[0, 0, 0, 1, 1, 1, 1, 1]] * B, jnp.int32)
  positions = jnp.asarray([[0, 1, 2, 0, 1, 2, 3, 4]] * B, jnp.int32)
  return positions, segment_ids


# One compiled program per path, shared by the tests (None arguments are empty pytrees, so each combination of
# given arguments compiles once).
_pure_forward = jax.jit(functools.partial(forward, cfg=CFG))


@nnx.jit
def _module_forward(module, tokens, positions=None, segment_ids=None, forced_expert_ids=None):
  return module(tokens, positions=positions, segment_ids=segment_ids, forced_expert_ids=forced_expert_ids)


def _loss(out):
  # Touches the logits, the MTP logits and (through both) every param but the router bias.
  return jnp.mean(jax.nn.log_softmax(out.logits)[..., 0]) + 0.1 * jnp.mean(jnp.square(out.mtp_logits))


def _leaf_names(tree):
  return ["/".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


class ParamsTest(parameterized.TestCase):

  def test_init_equals_init_params(self):
    module = nnx_model.MoeTransformer(CFG, jax.random.key(KEY))
    chex.assert_trees_all_equal(nnx_model.to_params(module), _params(), strict=True)
    chex.assert_trees_all_equal_dtypes(nnx_model.to_params(module), _params())

  def test_params_are_nnx_params_with_logical_axes(self):
    module = nnx_model.from_params(CFG, _params())
    state = nnx.state(module)
    variables = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    self.assertLen(variables, len(jax.tree.leaves(_params())))
    self.assertTrue(all(isinstance(v, nnx.Param) for v in variables))
    # Same nested names as the pure pytree, attribute access included.
    self.assertEqual(_leaf_names(nnx.to_pure_dict(state)), _leaf_names(_params()))
    self.assertIsInstance(module.moe_layers["moe"]["router_bias"], nnx_model.RouterBias)
    self.assertIsInstance(module.moe_layers["moe"]["router"], nnx.Param)
    self.assertNotIsInstance(module.moe_layers["moe"]["router"], nnx_model.RouterBias)
    self.assertEqual(module.embed.get_metadata("out_sharding"), ("vocab", "embed"))
    specs = nnx.to_pure_dict(nnx.get_partition_spec(state))
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
    self.assertEqual(jax.tree.leaves(specs, is_leaf=is_spec), jax.tree.leaves(logical_axes(CFG), is_leaf=is_spec))

  def test_trainable_filter_leaves_out_router_bias(self):
    module = nnx_model.from_params(CFG, _params())
    names = _leaf_names(nnx.to_pure_dict(nnx.state(module, nnx_model.TRAINABLE)))
    self.assertNotIn("moe_layers/moe/router_bias", names)
    self.assertNotIn("mtp/block/moe/router_bias", names)
    self.assertLen(names, len(jax.tree.leaves(_params())) - 2)

  def test_split_merge_round_trip_is_exact(self):
    params = _params()
    module = nnx_model.from_params(CFG, params)
    graphdef, state = nnx.split(module)
    again = nnx.merge(graphdef, state)
    chex.assert_trees_all_equal(nnx_model.to_params(again), params, strict=True)
    chex.assert_trees_all_equal_dtypes(nnx_model.to_params(again), params)
    # No copy either way: the module holds the very arrays it was given.
    for a, b in zip(jax.tree.leaves(nnx_model.to_params(again)), jax.tree.leaves(params)):
      self.assertIs(a, b)

  def test_abstract_creation(self):
    module = nnx.eval_shape(lambda: nnx_model.MoeTransformer(CFG, jax.random.key(KEY)))
    want = abstract_params(CFG)
    for got in (nnx_model.to_params(module), nnx_model.to_params(nnx_model.abstract_module(CFG))):
      self.assertEqual(jax.tree.structure(got), jax.tree.structure(want))
      for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        self.assertIsInstance(g, jax.ShapeDtypeStruct)
        self.assertEqual((g.shape, g.dtype), (w.shape, w.dtype))

  @parameterized.named_parameters(
      ("shape", lambda p: p["moe_layers"]["attn"].update(q_b=p["moe_layers"]["attn"]["q_b"][..., :-1]),
       r"params do not match the config: moe_layers/attn/q_b is float32\[1, 32, 4, 23\] where the config needs "
       r"float32\[1, 32, 4, 24\]"),
      ("dtype", lambda p: p.update(lm_head=p["lm_head"].astype(jnp.bfloat16)),
       r"lm_head is bfloat16\[64, 512\] where the config needs float32\[64, 512\]"),
      ("missing", lambda p: p["mtp"].pop("enorm"), r"mtp/enorm is missing"),
      ("unexpected", lambda p: p.update(bias=jnp.zeros(3)), r"bias is not a param of this config"),
  )
  def test_from_params_names_the_first_mismatching_leaf(self, edit, message):
    params = jax.tree.map(lambda x: x, _params())  # a fresh nest of dicts, the arrays shared
    edit(params)
    with self.assertRaisesRegex(ValueError, message):
      nnx_model.from_params(CFG, params)

  def test_from_params_refuses_another_config(self):
    with self.assertRaisesRegex(ValueError, r"^params do not match the config: .*; pass the config the params "
                                r"were built for\.$"):
      nnx_model.from_params(CFG.replace(vocab_size=256), _params())


class ForwardTest(parameterized.TestCase):

  @pytest.mark.slow
  def test_call_equals_forward(self):
    module = nnx_model.from_params(CFG, _params())
    got = _module_forward(module, _tokens())
    want = _pure_forward(_params(), _tokens())
    chex.assert_trees_all_equal(got, want, strict=True)
    self.assertEqual(got.logits.shape, (B, T, CFG.vocab_size))
    self.assertEqual(got.mtp_logits.shape, (1, B, T, CFG.vocab_size))

  def test_packed_sequences_and_routing_replay_equal_forward(self):
    # One program for both (each costs a compile of both paths): packed documents, and replayed routing.
    positions, segment_ids = _packed()
    ref = _pure_forward(_params(), _tokens())
    # Ids the router would not choose: every expert id shifted by one.
    forced = (ref.expert_ids + 1) % CFG.n_routed_experts
    module = nnx_model.from_params(CFG, _params())
    got = _module_forward(module, _tokens(), positions, segment_ids, forced)
    want = _pure_forward(_params(), _tokens(), positions=positions, segment_ids=segment_ids,
                         forced_expert_ids=forced)
    np.testing.assert_array_equal(got.expert_ids, forced)
    chex.assert_trees_all_equal(got, want, strict=True)
    self.assertFalse(np.array_equal(got.logits, ref.logits))  # the arguments did reach the model

  @pytest.mark.slow
  def test_nnx_grad_equals_pure_grad(self):
    module = nnx_model.from_params(CFG, _params())
    got = nnx.jit(nnx.grad(lambda m, t: _loss(m(t))))(module, _tokens())
    want = jax.jit(jax.grad(lambda p, t: _loss(forward(p, t, cfg=CFG))))(_params(), _tokens())
    chex.assert_trees_all_equal(nnx.to_pure_dict(got), want, strict=True)
    self.assertGreater(float(jnp.abs(want["moe_layers"]["moe"]["experts"]["up"]).sum()), 0.0)

  def test_jit_sees_param_updates(self):
    # nnx.jit reads the module's current values on every call, as a training loop that updates them needs.
    module = nnx_model.from_params(CFG, _params())
    before = _module_forward(module, _tokens()).logits
    module.lm_head.set_value(module.lm_head.get_value() * 2.0)
    after = _module_forward(module, _tokens()).logits
    np.testing.assert_allclose(after, 2.0 * before, rtol=1e-6)


@pytest.mark.mesh
class ShardedTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # A mesh with every kind of parameter split: ZeRO over fsdp, experts over expert, heads and hidden over tensor.
    cls.mesh = make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2))
    cls.shardings = layout_lib.param_shardings(CFG, cls.mesh)
    cls.module = nnx_model.sharded_module(CFG, jax.random.key(KEY), cls.shardings)

  def test_sharded_creation_matches_pure_mesh_path(self):
    pure = jax.jit(init_params, static_argnums=0, out_shardings=self.shardings)(CFG, jax.random.key(KEY))
    got = nnx_model.to_params(self.module)
    for g, p, s in zip(jax.tree.leaves(got), jax.tree.leaves(pure), jax.tree.leaves(self.shardings)):
      self.assertEqual(g.sharding, p.sharding)
      self.assertEqual(g.sharding, s)
    chex.assert_trees_all_equal(jax.device_get(got), jax.device_get(_params()), strict=True)
    # Somewhere the mesh really splits something (the test would be vacuous on replicated params).
    self.assertTrue(any(len(g.addressable_shards[0].data.shape) and g.addressable_shards[0].data.shape != g.shape
                        for g in jax.tree.leaves(got)))

  def test_sharded_module_runs_under_the_layout(self):
    layout = layout_lib.make_layout(CFG, self.mesh)
    tokens = jax.device_put(_tokens(), layout_lib.batch_sharding(self.mesh))
    logits = nnx.jit(with_layout(lambda m, t: m(t, with_mtp=False).logits, layout))(self.module, tokens)
    want = _pure_forward(_params(), _tokens()).logits
    # Expert-parallel collectives sum in another order: close, not bitwise (as in tests/pretrain/sharded_test.py).
    np.testing.assert_allclose(logits, want, rtol=0, atol=2e-5)


class CheckpointTest(parameterized.TestCase):

  def _tempdir(self) -> str:
    # tempfile, not absltest's create_tempdir: that needs absl flags, which pytest does not parse.
    path = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path

  def test_c2jax_checkpoint_loads_into_the_module(self):
    directory = self._tempdir()
    save_checkpoint(directory, _params(), CFG)
    module = nnx_model.from_checkpoint(directory)
    self.assertEqual(module.cfg, CFG)
    chex.assert_trees_all_equal(nnx_model.to_params(module), _params(), strict=True)
    chex.assert_trees_all_equal_dtypes(nnx_model.to_params(module), _params())

  def test_nnx_state_checkpoint_loads_into_pure_params(self):
    path = os.path.join(self._tempdir(), "state")
    module = nnx_model.from_params(CFG, _params())
    with ocp.StandardCheckpointer() as ckptr:  # what a Flax NNX user writes
      ckptr.save(path, nnx.state(module))
      ckptr.wait_until_finished()
    params = nnx_model.load_nnx_state(path, CFG)
    chex.assert_trees_all_equal(params, _params(), strict=True)
    chex.assert_trees_all_equal_dtypes(params, _params())
    got = _pure_forward(params, _tokens())
    chex.assert_trees_all_equal(got, _module_forward(module, _tokens()), strict=True)
    with self.assertRaisesRegex(ValueError, r"does not hold the NNX state of this config: .*embed is stored as "
                                r"\[512, 64\], the config needs \[256, 64\]"):
      nnx_model.load_nnx_state(path, CFG.replace(vocab_size=256))

  def test_nnx_state_checkpoint_restores_sharded(self):
    path = os.path.join(self._tempdir(), "state")
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(path, nnx.state(nnx_model.from_params(CFG, _params())))
      ckptr.wait_until_finished()
    shardings = layout_lib.param_shardings(CFG, make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2)))
    params = nnx_model.load_nnx_state(path, CFG, shardings=shardings)
    for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
      self.assertEqual(p.sharding, s)
    chex.assert_trees_all_equal(jax.device_get(params), jax.device_get(_params()), strict=True)


if __name__ == "__main__":
  absltest.main()
