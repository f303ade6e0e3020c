"""The whole model on 8 fake CPU devices equals the single-device model: logits, loss and gradients, on the
meshes of the report's parallelism (FSDP, EP, CP and their mixes); and the sharded trainer's steps.

Tolerances (float32): logits and loss to 2e-5, gradients to 1e-4 relative of each leaf's largest entry. Sharded
programs only reorder float sums (all-reduces, reduce-scatters), which moves results by a few ulps.
"""

import dataclasses
import functools

from absl.testing import absltest, parameterized
import jax
import numpy as np
import pytest

from c2jax.model import presets
from c2jax.model.params import init_params
from c2jax.model.sharding import with_layout
from c2jax.model.transformer import forward
from c2jax.optim import OptimizerConfig
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.pretrain.sharded import make_trainer
from c2jax.pretrain.step import StepConfig, init_state, loss_fn, train_step
from tests import tiny

pytestmark = pytest.mark.mesh  # sharded against one device on 8 fake CPU devices (`make test-unit` leaves them out)

# Each mesh costs one sharded value-and-grad compile (~15-20 s on 2 cores): four shapes cover every axis (pure
# expert parallelism, FSDP x EP x CP, data x CP, and tensor parallelism with EP x CP); tests/parallel/
# expert_parallel_test.py and context_parallel_test.py sweep more shapes of their own regions.
MESHES = {
    "expert8": MeshConfig(expert=8),
    "fsdp2_expert2_context2": MeshConfig(fsdp=2, expert=2, context=2),
    "data2_context4": MeshConfig(data=2, context=4),
    "expert2_context2_tensor2": MeshConfig(expert=2, context=2, tensor=2),
}
B, T = 8, 32


def _config():
  # The tiny model cut to one dense and one MoE layer (plus the MoE MTP block), scanned without unrolling:
  # every feature is still there and each mesh compiles in seconds.
  return tiny.MODEL_MTP


def _packed_batch(cfg, seed=0):
  """Two or three documents per row, per-document positions, a loss mask hiding one row's tail."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
  segment_ids = np.zeros((B, T), np.int32)
  positions = np.zeros((B, T), np.int32)
  for row in range(B):
    cuts = sorted(rng.choice(np.arange(4, T - 4), size=1 + row % 2, replace=False))
    bounds = [0, *cuts, T]
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
      segment_ids[row, a:b] = s + 1
      positions[row, a:b] = np.arange(b - a)
  loss_mask = np.ones((B, T), np.float32)
  loss_mask[0, T - 5:] = 0
  token_mask = (rng.random((B, T)) > 0.2).astype(np.float32)  # tokens left out of the expert-load statistics
  return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions, "loss_mask": loss_mask,
          "token_mask": token_mask}


def _outputs(params, batch, cfg, hp):
  (loss, (metrics, load)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, cfg, hp)
  out = forward(params, batch["tokens"], cfg=cfg, positions=batch["positions"], segment_ids=batch["segment_ids"],
                with_mtp=False)
  return {"loss": loss, "metrics": metrics, "load": load, "grads": grads, "logits": out.logits,
          "expert_ids": out.expert_ids}


def _assert_tree_close(test, got, want, rtol):
  test.assertEqual(jax.tree.structure(got), jax.tree.structure(want))
  flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
  flat_want = jax.tree.leaves(want)
  for (path, g), w in zip(flat_got, flat_want):
    g, w = np.asarray(g), np.asarray(w)
    scale = max(float(np.max(np.abs(w))), 1e-6)
    np.testing.assert_allclose(g, w, rtol=0, atol=rtol * scale, err_msg=jax.tree_util.keystr(path))


class ShardedModelTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cfg = _config()
    cls.hp = StepConfig(mtp_weight=0.3, z_loss_weight=1e-3)
    cls.params = jax.jit(init_params, static_argnums=0)(cls.cfg, jax.random.key(0))
    cls.batch = _packed_batch(cls.cfg)
    fn = jax.jit(functools.partial(_outputs, cfg=cls.cfg, hp=cls.hp))
    cls.want = jax.device_get(fn(cls.params, cls.batch))

  @parameterized.named_parameters(*MESHES.items())
  def test_logits_loss_and_grads_match_single_device(self, mesh_config):
    mesh = make_mesh(mesh_config)
    layout = layout_lib.make_layout(self.cfg, mesh)
    params = jax.device_put(self.params, layout_lib.param_shardings(self.cfg, mesh))
    batch = jax.device_put(self.batch, layout_lib.batch_sharding(mesh))
    fn = jax.jit(with_layout(functools.partial(_outputs, cfg=self.cfg, hp=self.hp), layout))
    got = jax.device_get(fn(params, batch))
    np.testing.assert_array_equal(got["expert_ids"], self.want["expert_ids"])
    np.testing.assert_allclose(got["logits"], self.want["logits"], rtol=0, atol=2e-5)
    np.testing.assert_allclose(got["loss"], self.want["loss"], rtol=2e-5)
    for key in ("ce", "mtp_ce", "z_loss"):
      np.testing.assert_allclose(got["metrics"][key], self.want["metrics"][key], rtol=2e-5, err_msg=key)
    self.assertEqual(float(got["metrics"]["moe_dropped"]), 0.0)  # dropless by default
    np.testing.assert_allclose(got["load"], self.want["load"], atol=1e-6)
    _assert_tree_close(self, got["grads"], self.want["grads"], rtol=1e-4)


  def test_routing_replay_under_expert_parallelism(self):
    # Replay the single-device routing through the expert-parallel model (report section 4): same experts,
    # same logits, and the MTP block's replayed routing too.
    # On a mesh with every kind of split, so that the replayed ids also go through the context-parallel sequence
    # order (permuted in, restored out) in the main stack and in the MTP block.
    mesh = make_mesh(MeshConfig(expert=2, context=2, tensor=2))
    layout = layout_lib.make_layout(self.cfg, mesh)
    params = jax.device_put(self.params, layout_lib.param_shardings(self.cfg, mesh))
    tokens = self.batch["tokens"]
    ref = jax.jit(functools.partial(forward, cfg=self.cfg))(self.params, tokens)
    # Replayed ids that differ from what the router would choose: shift every expert id by one.
    forced = (ref.expert_ids + 1) % self.cfg.n_routed_experts
    forced_mtp = (ref.mtp_expert_ids + 1) % self.cfg.n_routed_experts
    run = lambda p, t, f, fm: forward(p, t, cfg=self.cfg, forced_expert_ids=f, forced_mtp_expert_ids=fm)
    want = jax.jit(run)(self.params, tokens, forced, forced_mtp)
    got = jax.jit(with_layout(run, layout))(params, tokens, forced, forced_mtp)
    np.testing.assert_array_equal(got.expert_ids, forced)
    np.testing.assert_array_equal(got.mtp_expert_ids, forced_mtp)
    np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=2e-5)
    np.testing.assert_allclose(got.mtp_logits, want.mtp_logits, rtol=0, atol=2e-5)
    self.assertGreater(float(np.max(np.abs(want.logits - ref.logits))), 1e-4)  # the replay changed something


class ShardedTrainerTest(absltest.TestCase):

  def test_init_and_steps_match_single_device(self):
    cfg = dataclasses.replace(_config(), num_mtp_layers=0)
    hp = StepConfig(optim=OptimizerConfig(learning_rate=1e-2, warmup_steps=1, total_steps=10), mtp_weight=0.0)
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, context=2))
    trainer = make_trainer(cfg, hp, mesh, batch_size=B, seq_len=T)
    state = trainer.init(jax.random.key(0))
    ref_state = jax.jit(functools.partial(init_state, cfg, hp))(jax.random.key(0))  # one program, not one per op
    # Built straight into its shards: experts split over `expert` and their D over `fsdp` x `context`.
    gate = state.params["moe_layers"]["moe"]["experts"]["gate"]
    self.assertEqual(gate.sharding.spec, trainer.state_shardings.params["moe_layers"]["moe"]["experts"]["gate"].spec)
    self.assertEqual(gate.addressable_shards[0].data.shape[1:3], (cfg.n_routed_experts // 2, cfg.d_model // 4))
    _assert_tree_close(self, state.params, ref_state.params, rtol=1e-6)  # same random draws, fused differently
    ref_step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp))
    batch = _packed_batch(cfg, seed=1)
    for _ in range(2):
      state, metrics = trainer.step(state, trainer.put_batch(batch))
      ref_state, ref_metrics = ref_step(ref_state, batch)
      np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=2e-5)
      np.testing.assert_allclose(metrics["grad_norm"], ref_metrics["grad_norm"], rtol=1e-4)
    # AdamW's g / sqrt(v) turns ulp-level differences of near-zero gradients into visible ones, so the updated
    # params are compared at 1% of the two steps' largest possible move (2 x lr).
    self.assertEqual(jax.tree.structure(state.params), jax.tree.structure(ref_state.params))
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(state.params)[0], jax.tree.leaves(ref_state.params)):
      np.testing.assert_allclose(g, w, rtol=0, atol=0.01 * 2 * hp.optim.learning_rate,
                                 err_msg=jax.tree_util.keystr(path))

  def test_bad_mesh_fails_early(self):
    cfg = presets.tiny()
    with self.assertRaisesRegex(ValueError, "Sequence length 36 is not divisible by 2 x context = 8"):
      make_trainer(cfg, StepConfig(), make_mesh(MeshConfig(data=2, context=4)), batch_size=B, seq_len=36)


if __name__ == "__main__":
  absltest.main()
