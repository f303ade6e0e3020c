"""The planner's analytic model (`plan`) against hand computations and lowered HLO, and the HLO accounting
(`hlo_stats`) on small modules (no compile)."""

import collections
import math

from absl.testing import absltest, parameterized
import jax
import jax.numpy as jnp

from c2jax.model.config import Remat
from c2jax.model.params import count_params
from c2jax.parallel import hlo_stats
from c2jax.parallel import plan
from c2jax.pretrain import sharded as train
from c2jax.parallel.mesh import AXES, MeshConfig, make_mesh
from c2jax.pretrain.step import StepConfig
from c2jax.model import presets


def _shape(**sizes):
  return {a: sizes.get(a, 1) for a in AXES}


class StateMemoryTest(absltest.TestCase):

  def test_kimi_param_bytes_on_fsdp64_expert64_by_hand(self):
    # On fsdp:64 x expert:64 the named rules put fsdp on every 7168 (embed; 7168 = 64 x 112) and expert on the 384
    # experts. A leftover expert axis (7168 / 64 = 112 does not divide by 64 again) goes to the largest other dim
    # it divides: 576, 1536, 192, 128, 18432, 2048 all divide by 64, so every attention, MLP, shared-expert and
    # routed-expert matrix splits 4096 ways (eh_proj [14336, 7168]: fsdp on 14336, expert on 7168). A leftover axis
    # never lands on a layers, mtp_layers, vocab or expert_router dim, so
    #   embed [V, D] and lm_head [D, V]: fsdp on D only, 64 ways (replicated over expert);
    #   router [L, D, 384] float32: fsdp on D only, 64 ways;
    #   router_bias [L, 384] float32: replicated (it has only a layers and an expert_router dim);
    #   the norm vectors [L, 7168 | 1536 | 512]: fsdp only, 64 ways (expert divides none of them after fsdp).
    d, v, lm = 7168, 163840, 60
    attn = 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168 + 7168 * 1536 + 1536 * 64 * 192
    attn_vectors = 512 + 1536 + 2 * d
    experts = 3 * 384 * d * 2048
    shared = 3 * d * 2048
    router = d * 384  # float32
    moe_bf16 = attn + experts + shared
    dense_bf16 = attn + 3 * d * 18432
    mtp_bf16 = moe_bf16 + 2 * d * d
    embeddings_bf16 = 2 * v * d  # embed + lm_head
    matrices_bf16 = embeddings_bf16 + dense_bf16 + lm * moe_bf16 + mtp_bf16
    vectors_bf16 = attn_vectors + lm * attn_vectors + d + attn_vectors + 3 * d
    routers_f32, biases_f32 = (lm + 1) * router, (lm + 1) * 384
    expected = (2 * (matrices_bf16 - embeddings_bf16) / 4096
                + (2 * embeddings_bf16 + 2 * vectors_bf16 + 4 * routers_f32) / 64
                + 4 * biases_f32)
    mem = plan.state_memory(presets.kimi_k25(), _shape(fsdp=64, expert=64))
    self.assertAlmostEqual(mem.params, expected, delta=1.0)
    # AdamW mu and nu in the param dtype, for every leaf but the router bias; gradients like the params.
    self.assertAlmostEqual(mem.optimizer, 2 * (expected - 4 * biases_f32), delta=1.0)
    self.assertEqual(mem.grads, mem.params)
    # The total elements agree with count_params (main model + MTP modules).
    c = count_params(presets.kimi_k25())
    self.assertEqual(matrices_bf16 + vectors_bf16 + routers_f32 + biases_f32, c.total + c.mtp)

  def test_data_axis_replicates(self):
    cfg = presets.tiny()
    a = plan.state_memory(cfg, _shape(fsdp=2, expert=2))
    b = plan.state_memory(cfg, _shape(data=2, fsdp=2, expert=2))
    self.assertEqual(a.params, b.params)

  def test_kimi_context_axis_shards_the_state_by_hand(self):
    # ZeRO-3 over context too: on fsdp:64 x expert:64 x context:4 the leftover context axis joins fsdp on a dim
    # that 256 divides (7168 = 256 x 28, 1536 = 256 x 6, 512 = 256 x 2, 14336, 18432), so every leaf splits 4 more
    # ways: the matrices 16384, embed / lm_head, the routers and the norm vectors 256. The router biases [60, 384]
    # and [1, 384] stay replicated: context may go neither on the layers nor on the experts' router dim.
    cfg = presets.kimi_k25()
    mem = plan.state_memory(cfg, _shape(fsdp=64, expert=64))
    cp = plan.state_memory(cfg, _shape(fsdp=64, expert=64, context=4))
    biases = 4 * (60 + 1) * 384  # float32, whole on every device under both meshes
    self.assertAlmostEqual(cp.params, (mem.params - biases) / 4 + biases, delta=1.0)
    self.assertAlmostEqual(cp.optimizer, mem.optimizer / 4, delta=1.0)  # no moments for the biases


class FlopsTest(absltest.TestCase):

  def test_kimi_nominal_is_6_n_active(self):
    f = plan.flops_per_token(presets.kimi_k25(), 32768)
    self.assertAlmostEqual(f.nominal / (6 * 32.86e9), 1.0, delta=1e-3)

  def test_tiny_model_flops_by_hand(self):
    cfg = presets.tiny()
    t = 256
    f = plan.flops_per_token(cfg, t, with_mtp=False)
    active = count_params(cfg).active
    self.assertEqual(f.dense, 6 * (active - cfg.vocab_size * cfg.d_model))
    # 3 (fwd + bwd) x 2 FLOPs x (T + 1) / 2 keys x N x (Hqk + Hv) per layer.
    self.assertAlmostEqual(f.attention, 3 * 2 * (t + 1) / 2 * 4 * (24 + 16) * 3)
    # The executed count covers at least the model's (recomputation, block coverage, padding).
    self.assertGreater(f.executed, f.model)

  def test_mtp_adds_a_block_and_a_head(self):
    cfg = presets.tiny()
    with_mtp = plan.flops_per_token(cfg, 64, with_mtp=True)
    without = plan.flops_per_token(cfg, 64, with_mtp=False)
    self.assertGreater(with_mtp.dense - without.dense, 6 * cfg.vocab_size * cfg.d_model)

  def test_keys_per_query(self):
    # 8 blocks of 512 rows over 4096: sum_i 512 * 512 (i + 1) / 4096 = 512 * 36 / 8.
    self.assertAlmostEqual(plan.keys_per_query(4096, 1), 512 * 36 / 8)
    # Context parallelism: 2cp + 1 ch x ch blocks for 2 ch queries, ch = T / 2cp.
    self.assertAlmostEqual(plan.keys_per_query(4096, 4), 9 * 512 / 2)


class ActivationTest(absltest.TestCase):

  def test_full_remat_keeps_layer_inputs_and_ids(self):
    cfg = presets.tiny().replace(remat=Remat.FULL)
    work = plan.Workload(global_batch=8, seq_len=64, with_mtp=True)
    act = plan.activation_memory(cfg, _shape(fsdp=2, expert=2, context=2), work)
    n = 2 * 32  # b = 8 / 4, t = 64 / 2
    layers = cfg.n_layers + cfg.num_mtp_layers
    moe_layers = cfg.n_moe_layers + cfg.num_mtp_layers
    self.assertEqual(act.tokens, n)
    self.assertEqual(act.saved, n * (layers * cfg.d_model * 4 + moe_layers * 4 * cfg.num_experts_per_tok))
    self.assertEqual(act.layer_factor_saved, 1.0)
    none = plan.activation_memory(cfg.replace(remat=Remat.NONE), _shape(fsdp=2, expert=2, context=2), work)
    self.assertGreater(none.saved, 10 * act.saved)

  def test_context_parallel_score_blocks(self):
    cfg = presets.kimi_k25().replace(remat=Remat.FULL)
    work = plan.Workload(global_batch=4096, seq_len=32768)
    act = plan.activation_memory(cfg, _shape(fsdp=64, expert=64, context=4), work)
    # 2cp + 1 = 9 blocks of 4096 x 4096 float32 scores for 64 heads, four live copies.
    self.assertEqual(act.attention_scores, 9 * 64 * 4096 * 4096 * 4 * 4)
    fused = plan.activation_memory(cfg, _shape(fsdp=64, expert=64, context=4),
                                   plan.Workload(global_batch=4096, seq_len=32768, fused_attention=True))
    self.assertEqual(fused.attention_scores, 0)

  def test_batch_must_divide(self):
    with self.assertRaisesRegex(ValueError, "not divisible by data x fsdp x expert"):
      plan.local_batch(_shape(fsdp=4), plan.Workload(global_batch=6, seq_len=64))


class CommunicationTest(absltest.TestCase):

  def test_expert_all_to_all_by_hand(self):
    cfg = presets.tiny()  # float32, 2 MoE layers + 1 MTP MoE block
    work = plan.Workload(global_batch=8, seq_len=64)
    comm = plan.communication(cfg, _shape(expert=4, fsdp=2), work).items
    n = 1 * 64
    slots = cfg.n_routed_experts * plan.expert_capacity(cfg, n)
    big = slots * cfg.d_model * 4 * 3 / 4
    self.assertAlmostEqual(comm[("all-to-all", "EP dispatch + combine (fwd)")], 3 * 2 * big)
    self.assertAlmostEqual(comm[("all-to-all", "EP x, cotangent, dx + gates (bwd)")],
                           3 * (3 * big + slots * 8 * 3 / 4))

  def test_no_expert_traffic_without_an_expert_axis(self):
    comm = plan.communication(presets.tiny(), _shape(fsdp=8), plan.Workload(8, 64)).by_kind()
    self.assertNotIn("all-to-all", comm)

  def test_context_gathers_latents(self):
    cfg = presets.kimi_k25().replace(remat=Remat.NONE)
    comm = plan.communication(cfg, _shape(fsdp=64, expert=64, context=4), plan.Workload(4096, 32768)).items
    per_layer = 3 * 8192 * ((512 + 64) * 2 + 4)  # (cp - 1) x local tokens x (latent + position)
    self.assertAlmostEqual(comm[("all-gather", "CP latents c_kv + k_rope + positions (fwd)")], 62 * per_layer)

  def test_fsdp_gathers_and_reduces_by_hand(self):
    cfg = presets.tiny()
    comm = plan.communication(cfg, _shape(fsdp=8), plan.Workload(8, 64)).items
    rows = plan.param_rows(cfg, _shape(fsdp=8))
    other = [r for r in rows if r.region is None]
    routers = [r for r in rows if r.region == plan.EXPERT_REGION and not r.expert]
    total = sum(r.bytes for r in other)
    self.assertEqual(total, sum(r.gathered_bytes for r in other))  # nothing stays split over fsdp where it is used
    self.assertAlmostEqual(comm[("all-gather", "FSDP gather of other weight leaves (fwd + bwd)")], 2 * total * 7 / 8)
    self.assertAlmostEqual(comm[("reduce-scatter", "gradients over the gather axes")], total * 7 / 8)
    self.assertEqual(comm[("all-reduce", "gradient shards over the replica axes")], 0)  # fsdp divides every leaf
    # The expert-parallel region takes the router [D, E] whole (P()) and psums its gradient over every token axis.
    # The routers [2, 64, 16] and [1, 64, 16] (float32) are split over fsdp on D = 64 and gathered; the router
    # biases [2, 16] and [1, 16] are replicated (fsdp may go neither on the layers nor on the router's expert dim),
    # so nothing is gathered for them, and they get no gradient.
    self.assertEqual([r.shards for r in routers if not r.trainable], [1, 1])
    router = 4 * (2 + 1) * 64 * 16
    self.assertEqual(router, sum(r.bytes for r in routers if r.trainable))
    self.assertAlmostEqual(comm[("all-gather", "FSDP gather of router leaves (fwd + bwd)")], 2 * router * 7 / 8)
    self.assertAlmostEqual(comm[("all-reduce", "router gradients, psum in the expert-parallel region")],
                           2 * router * 7 / 8)

  def test_kimi_gradients_follow_the_param_specs_by_hand(self):
    # fsdp:64 x expert:64 x context:4: context shards the parameters, so no matrix but the embeddings has a replica
    # axis left.
    cfg = presets.kimi_k25()
    mesh = _shape(fsdp=64, expert=64, context=4)
    comm = plan.communication(cfg, mesh, plan.Workload(4096, 32768)).items
    d, v, lm = 7168, 163840, 60
    # The norm vectors and embed [V, D] / lm_head [D, V] (D split over fsdp x context = 256; expert takes neither
    # 7168 / 256 nor the vocab) keep expert as a replica axis: their gradient shards are all-reduced over it.
    # Vectors: 61 decoder blocks + the MTP block, the final norm and the MTP enorm, hnorm, norm.
    vectors = 2 * ((lm + 2) * (512 + 1536 + 2 * d) + 4 * d)
    embeddings = 2 * 2 * v * d
    self.assertAlmostEqual(comm[("all-reduce", "gradient shards over the replica axes")],
                           2 * (vectors + embeddings) / 256 * 63 / 64, delta=1.0)
    # Routed experts (gate, up, down of 61 MoE blocks, bf16): the region keeps 6 of the 384 experts and gathers
    # the rest of the spec (fsdp x context = 256); their gradient is psummed over data x fsdp x context = 256.
    experts = 2 * (lm + 1) * 3 * 384 * d * 2048 / 64
    self.assertAlmostEqual(comm[("all-gather", "FSDP gather of expert weight leaves (fwd + bwd)")],
                           2 * experts * 255 / 256, delta=1.0)
    self.assertAlmostEqual(comm[("all-reduce", "expert weight gradients, psum in the expert-parallel region")],
                           2 * experts * 255 / 256, delta=1.0)
    # Router [D, E] float32, split over fsdp x context = 256 on D (expert may not take the router's 384), gathered
    # whole for the region and psummed over all 16384 token ranks; its bias is replicated: nothing to gather.
    # kv_b [512, 64, 256] bf16 (fsdp x context on 512, expert on 256) likewise in the context-parallel region.
    routers = 4 * (lm + 1) * d * 384
    self.assertAlmostEqual(comm[("all-gather", "FSDP gather of router leaves (fwd + bwd)")],
                           2 * routers * 255 / 256, delta=1.0)
    self.assertAlmostEqual(comm[("all-reduce", "router gradients, psum in the expert-parallel region")],
                           2 * routers * 16383 / 16384, delta=1.0)
    kv_b = 2 * (lm + 2) * 512 * 64 * 256
    self.assertAlmostEqual(comm[("all-reduce", "kv_b gradients, psum in the context-parallel region")],
                           2 * kv_b * 16383 / 16384, delta=1.0)
    self.assertAlmostEqual(comm[("all-gather", "FSDP gather of kv_b leaves (fwd + bwd)")],
                           2 * kv_b * 16383 / 16384, delta=1.0)
    # Without context parallelism kv_b is an ordinary weight, and the data axis is a replica axis of every leaf.
    plain = plan.communication(cfg, _shape(data=2, fsdp=64, expert=64), plan.Workload(8192, 32768)).items
    self.assertNotIn(("all-reduce", "kv_b gradients, psum in the context-parallel region"), plain)
    # Outside the regions: the vectors and the embeddings (fsdp only, 64 ways) are all-reduced over
    # data x expert = 128; the attention, dense-MLP, shared-expert and eh_proj matrices (fsdp x expert, 4096 ways)
    # over data = 2.
    attn = 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168 + 7168 * 1536 + 1536 * 64 * 192
    matrices = 2 * ((lm + 2) * attn + 3 * d * 18432 + (lm + 1) * 3 * d * 2048 + 2 * d * d)
    self.assertAlmostEqual(plain[("all-reduce", "gradient shards over the replica axes")],
                           2 * matrices / 4096 * 1 / 2 + 2 * (vectors + embeddings) / 64 * 127 / 128, delta=1.0)


_HLO = """HloModule test, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x8 = f32[8]{0} get-tuple-element(%p), index=1
  %ag = f32[32]{0} all-gather(%x8), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
  %l = f32[4,5]{1,0} constant({...})
  %r = f32[5,6]{1,0} constant({...})
  %d = f32[4,6]{1,0} dot(%l, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8]{0}) tuple(%j, %x8)
}

%cond (q: (s32[], f32[8])) -> pred[] {
  %q = (s32[], f32[8]{0}) parameter(0)
  %k = s32[] get-tuple-element(%q), index=0
  %c = s32[] constant(5)
  ROOT %lt = pred[] compare(%k, %c), direction=LT
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %a)
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
  %ar = f32[8]{0} all-reduce(%a), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %a2a = (f32[4]{0}, f32[4]{0}) all-to-all(%a, %a), channel_id=3, replica_groups=mesh['x'=2,'y'=4] {'y'}
  ROOT %out = f32[8]{0} get-tuple-element(%w), index=1
}
"""


class HloAccountingTest(parameterized.TestCase):

  def test_collectives_with_trip_counts_and_groups(self):
    records, unknown = hlo_stats.hlo_collectives(_HLO)
    self.assertEqual(unknown, [])
    by_name = {r.name: r for r in records}
    ag, ar, a2a = by_name["ag"], by_name["ar"], by_name["a2a"]
    self.assertEqual((ag.executions, ag.group, ag.result_bytes, ag.operand_bytes), (5, 4, 128, 32))
    self.assertAlmostEqual(ag.wire_bytes, 5 * 128 * 3 / 4)
    self.assertEqual((ar.group, ar.executions), (2, 1))
    self.assertAlmostEqual(ar.wire_bytes, 2 * 32 / 2)
    self.assertEqual((a2a.group, a2a.operand_bytes), (4, 64))
    self.assertAlmostEqual(a2a.wire_bytes, 64 * 3 / 4)
    summary = hlo_stats.summarize_collectives(records)
    self.assertEqual(summary["all-gather"]["executions"], 5)

  def test_known_trip_count_wins(self):
    text = _HLO.replace("body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"7"}}')
    records, _ = hlo_stats.hlo_collectives(text)
    self.assertEqual({r.name: r.executions for r in records}["ag"], 7)

  def test_dot_flops(self):
    flops, _ = hlo_stats.hlo_dot_flops(_HLO)
    self.assertEqual(flops, 5 * 2 * 4 * 6 * 5)

  @parameterized.parameters(
      ("replica_groups={{0,1,2},{3,4,5}}", 3),
      ("replica_groups=[4,2]<=[8]", 2),
      ("replica_groups=[2,4]<=[4,2]T(1,0)", 4),
      ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", 4),
      ("replica_groups=mesh['a'=1,'b'=2,'c'=4], device_ids=([4,2]T(1,0)) {'b','c'}", 8),
      ("source_target_pairs={{0,1},{1,0}}", 2),
  )
  def test_group_size(self, attrs, size):
    self.assertEqual(hlo_stats.group_size(attrs), size)

  def test_buffer_assignment(self):
    text = ("allocation 0: size 100, parameter 0, shape |f32[25]| at ShapeIndex {}:\n"
            "allocation 1: size 40, maybe-live-out:\n"
            "allocation 2: size 1000, preallocated-temp:\n"
            "allocation 3: size 8, constant:\n")
    self.assertEqual(hlo_stats.buffer_assignment_bytes(text),
                     {"argument_bytes": 100.0, "temp_bytes": 1000.0, "total_bytes": 1148.0})

  def test_tiny_lowering_finds_the_expert_all_to_alls(self):
    # Lowered (not compiled) HLO already holds the shard_map's explicit collectives, with per-device shapes.
    cfg = presets.tiny()
    hp = StepConfig(mtp_weight=0.0)
    mesh = make_mesh(MeshConfig(expert=4), jax.devices()[:4])
    trainer = train.make_trainer(cfg, hp, mesh, batch_size=4, seq_len=64)
    state = train.abstract_state(cfg, hp, trainer.state_shardings)
    tokens = jax.ShapeDtypeStruct((4, 64), jnp.int32, sharding=trainer.batch_sharding)
    text = trainer.step.lower(state, {"tokens": tokens}).as_text(dialect="hlo")
    records, unknown = hlo_stats.hlo_collectives(text)
    self.assertLen(unknown, 2)  # the dropless rounds, forward and backward: data-dependent trip counts
    slots = cfg.n_routed_experts * plan.expert_capacity(cfg, 64)  # one sequence of 64 tokens per device
    big = [r for r in records if r.kind == "all-to-all" and r.operand_bytes == slots * cfg.d_model * 4]
    # Per MoE layer: dispatch + combine forward, x / cotangent / dx backward.
    self.assertLen(big, 5)
    self.assertTrue(all(r.group == 4 and r.executions == cfg.n_moe_layers for r in big))
    comm = plan.communication(cfg, _shape(expert=4), plan.Workload(4, 64, with_mtp=False)).items
    hlo_big = sum(r.wire_bytes for r in big)
    model_big = comm[("all-to-all", "EP dispatch + combine (fwd)")] * 5 / 2
    self.assertAlmostEqual(hlo_big, model_big)
    self.assertEqual(math.prod(mesh.shape.values()), 4)

  def test_tiny_lowering_holds_the_region_gradient_psums(self):
    # The shard_map regions' gradient psums are explicit all-reduces in the lowered HLO: the experts' over
    # data x fsdp x context, the router's and (context-parallel) kv_b's over every token axis.
    cfg = presets.tiny()
    hp = StepConfig(mtp_weight=0.0)
    mesh_cfg = MeshConfig(fsdp=2, expert=2, context=2)
    trainer = train.make_trainer(cfg, hp, make_mesh(mesh_cfg, jax.devices()[:8]), batch_size=4, seq_len=64)
    state = train.abstract_state(cfg, hp, trainer.state_shardings)
    tokens = jax.ShapeDtypeStruct((4, 64), jnp.int32, sharding=trainer.batch_sharding)
    records, _ = hlo_stats.hlo_collectives(trainer.step.lower(state, {"tokens": tokens}).as_text(dialect="hlo"))
    by_group = collections.defaultdict(float)
    for r in records:
      if r.kind == "all-reduce" and r.operand_bytes > 4:  # not the scalar round counts and drop counts
        by_group[r.group] += r.wire_bytes
    comm = plan.communication(cfg, mesh_cfg.shape, plan.Workload(4, 64, with_mtp=False)).items
    experts = comm[("all-reduce", "expert weight gradients, psum in the expert-parallel region")]
    everything = (comm[("all-reduce", "router gradients, psum in the expert-parallel region")] +
                  comm[("all-reduce", "kv_b gradients, psum in the context-parallel region")])
    self.assertGreater(experts, 0)
    self.assertAlmostEqual(by_group[4], experts)
    self.assertAlmostEqual(by_group[8], everything)


if __name__ == "__main__":
  absltest.main()
