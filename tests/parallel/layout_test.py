"""Mesh construction, parameter sharding rules and early mesh errors (no model compile)."""

import dataclasses

from absl.testing import absltest, parameterized
import jax
import numpy as np

from c2jax.model.params import param_specs
from c2jax.model.sharding import Layout
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import AXES, MeshConfig, MeshRefusal, make_mesh, mesh_of
from c2jax.pretrain.step import StepConfig
from c2jax.pretrain.sharded import state_shardings
from c2jax.model import presets

P = jax.sharding.PartitionSpec


def _shape(**sizes):
  return {a: sizes.get(a, 1) for a in AXES}


class MeshConfigTest(parameterized.TestCase):

  def test_parse_and_str(self):
    m = MeshConfig.parse("fsdp:64,expert:64,context:4")
    self.assertEqual((m.fsdp, m.expert, m.context, m.data, m.tensor), (64, 64, 4, 1, 1))
    self.assertEqual(m.num_devices, 64 * 64 * 4)
    self.assertEqual(str(m), "fsdp:64,expert:64,context:4")

  @parameterized.parameters("fsdp=2", "pipeline:2", "fsdp:x", "fsdp:0")
  def test_parse_rejects(self, text):
    with self.assertRaises(ValueError):
      MeshConfig.parse(text)

  def test_make_mesh_needs_every_device(self):
    with self.assertRaisesRegex(MeshRefusal, "needs 6 devices but 8"):
      make_mesh(MeshConfig(fsdp=2, expert=3))
    mesh = make_mesh(MeshConfig(fsdp=2, expert=4))
    self.assertEqual(dict(mesh.shape), _shape(fsdp=2, expert=4))


class ParamSpecTest(parameterized.TestCase):

  def test_experts_over_expert_axis_and_fsdp(self):
    spec = layout_lib.param_spec((384, 7168, 2048), ("expert", "embed", "expert_mlp"),
                                 _shape(fsdp=64, expert=64, tensor=2))
    self.assertEqual(spec, P("expert", "fsdp", "tensor"))

  def test_dense_weights_shard_over_the_whole_data_parallel_group(self):
    # 7168 is not divisible by 64 x 64, so `expert` moves to the next largest dimension it divides.
    spec = layout_lib.param_spec((7168, 18432), ("embed", "mlp"), _shape(fsdp=64, expert=64))
    self.assertEqual(spec, P("fsdp", "expert"))

  def test_layer_and_vocab_dims_take_no_leftover_axis(self):
    # A stacked bias [L, E]: `context` may not split the layers (the scan would gather the stack).
    spec = layout_lib.param_spec((60, 384), ("layers", "expert_router"), _shape(fsdp=64, expert=64, context=4))
    self.assertEqual(spec, P(None, None))
    spec = layout_lib.param_spec((7168, 163840), ("embed", "vocab"), _shape(fsdp=64, expert=64, context=4))
    self.assertEqual(spec, P(("fsdp", "context"), None))

  def test_indivisible_dims_stay_replicated(self):
    spec = layout_lib.param_spec((6, 10), ("embed", "vocab"), _shape(fsdp=4, tensor=4))
    self.assertEqual(spec, P(None, None))

  def test_every_kimi_param_divides(self):
    cfg = presets.kimi_k25()
    shape = _shape(fsdp=64, expert=64, context=4)
    for spec in jax.tree.leaves(param_specs(cfg), is_leaf=lambda x: hasattr(x, "init")):
      mesh_spec = layout_lib.param_spec(spec.shape, spec.axes, shape)
      for dim, axes in zip(spec.shape, mesh_spec):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        self.assertEqual(dim % int(np.prod([shape[a] for a in axes])), 0)

  def test_optimizer_state_mirrors_params(self):
    cfg = presets.tiny()
    mesh = make_mesh(MeshConfig(fsdp=2, expert=4))
    shardings = state_shardings(cfg, StepConfig(), mesh)
    gate = shardings.params["moe_layers"]["moe"]["experts"]["gate"]
    self.assertEqual(gate.spec, P(None, "expert", "fsdp", None))
    mirrored = [s for p, s in jax.tree_util.tree_flatten_with_path(shardings.opt_state)[0]
                if "'moe_layers']['moe']['experts']['gate']" in jax.tree_util.keystr(p)]
    self.assertLen(mirrored, 2)  # AdamW mu and nu
    for s in mirrored:
      self.assertEqual(s.spec, gate.spec)


class CheckMeshTest(parameterized.TestCase):

  def test_mesh_of_a_run_config(self):
    self.assertIsNone(mesh_of(""))
    self.assertEqual(dict(mesh_of("fsdp:2,expert:2").shape), _shape(fsdp=2, expert=2))
    with self.assertRaisesRegex(MeshRefusal, "mesh='fsdp:4,context:4' needs 16 devices but only 8 exist; shrink"):
      mesh_of("fsdp:4,context:4")

  def test_experts_must_divide(self):
    cfg = dataclasses.replace(presets.kimi_k25())
    with self.assertRaisesRegex(MeshRefusal, "384 experts cannot be split over an expert axis of 7"):
      layout_lib.check_mesh(cfg, _shape(expert=7))

  def test_sequence_must_divide_twice_context(self):
    with self.assertRaisesRegex(MeshRefusal, "Sequence length 100 is not divisible by 2 x context = 8"):
      layout_lib.check_mesh(presets.tiny(), _shape(context=4), batch_size=8, seq_len=100)

  def test_batch_must_divide(self):
    with self.assertRaisesRegex(MeshRefusal, "Batch size 6 is not divisible by data x fsdp x expert = 4"):
      layout_lib.check_mesh(presets.tiny(), _shape(fsdp=2, expert=2), batch_size=6, seq_len=64)

  def test_mesh_needs_the_five_axes(self):
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 4), ("fsdp", "expert"))
    with self.assertRaisesRegex(ValueError, "lacks \\['data', 'context', 'tensor'\\]; build it with"):
      layout_lib.make_layout(presets.tiny(), mesh)

  def test_sequence_order_needs_its_attention(self):
    mesh = make_mesh(MeshConfig(context=8))
    with self.assertRaisesRegex(ValueError, "needs an attention that accepts it"):
      Layout(mesh=mesh, rules=layout_lib.ACTIVATION_RULES, sequence_order=lambda t: np.arange(t))

  def test_heads_must_divide(self):
    with self.assertRaisesRegex(MeshRefusal, "4 attention heads cannot be split over a tensor axis of 8"):
      layout_lib.check_mesh(presets.tiny(), _shape(tensor=8))


if __name__ == "__main__":
  absltest.main()
