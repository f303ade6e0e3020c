"""The cross-lowering tier: the programs a GPU or a TPU would run, traced and lowered on this CPU host.

Every backend choice follows the program's platform (`pallas_kernels.target`), so `ModelConfig.platform=GPU` (or
the devices of the mesh the program runs on) gives here, on a CPU, the exact program a GPU would compile: the
test lowers it with `lowering_platforms=("cuda",)` / `("tpu",)` and asserts what its StableHLO must hold:
  GPU, BF16 experts:           `ragged_dot` (the grouped-GEMM path), no Pallas call;
  GPU, MXFP8 / NVFP4 experts:  the recipe's Triton kernels (quantizers and grouped matmuls, forward and backward),
                               and no `ragged_dot` (which only the reference quantized path has);
  TPU:                         `ragged_dot` in every precision (the reference quantizers run there), no Triton;
  CPU:                         the tiled dispatch (no `ragged_dot`), no Triton.
Programs: the forward, the LM train step in every precision, the RL update, the agent engine's append and decode,
and the expert-parallel MoE under a mesh whose (abstract) devices are GPUs. Seconds each: nothing is compiled.
Compiling these programs for an H100 is the deviceless GPU compile tier (`make test-gpu-compile`).
"""

from __future__ import annotations

import functools
import re

from absl.testing import absltest, parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh

from c2jax.actors import engine as engine_lib
from c2jax.actors.sampling import SamplingConfig
from c2jax.model import moe
from c2jax.model.config import ModelConfig, MoeDispatch, Precision
from c2jax.model.params import init_params
from c2jax.model.sharding import Layout, use_layout
from c2jax.model.transformer import forward
from c2jax.parallel.expert_parallel import make_expert_parallel
from c2jax.parallel.mesh import AXES, BATCH_AXES, CONTEXT
from c2jax.pretrain.step import StepConfig, init_state, train_step
from c2jax.rl.config import RLConfig
from c2jax.rl import update as rl_update
from pallas_kernels.target import Platform
from tests import tiny
from tests.pallas_kernels.target_test import abstract_device

_LOWERING = {Platform.GPU: "cuda", Platform.TPU: "tpu", Platform.CPU: "cpu"}
B, T = 2, 64
# The Triton kernels each program must call on a GPU: forward-only programs quantize with the recipe's forward
# format and run the grouped matmul; a train step adds the MXFP8 backward (row-wise quantizers, the transposed
# grouped matmul for the weight gradient).
_FORWARD_KERNELS = {Precision.MXFP8: {"quantize_mxfp8_rows", "quantize_mxfp8_cols", "grouped_matmul"},
                    Precision.NVFP4_FWD_MXFP8_BWD: {"quantize_nvfp4", "grouped_matmul"}}
_BACKWARD_KERNELS = {"quantize_mxfp8_rows", "quantize_mxfp8_cols", "grouped_matmul", "transposed_grouped_matmul"}


def triton_kernels(text: str) -> set[str]:
  """Names of the Pallas kernels that a lowered program calls through Triton."""
  names = set()
  for call in re.finditer(r'stablehlo\.custom_call @__gpu\$xla\.gpu\.triton\(.*', text):
    names.update(re.findall(r'name = "([A-Za-z0-9_]+)"', call.group(0)))
  if "__gpu$xla.gpu.triton" in text and not names:
    names.add("<unnamed>")
  return names


_H100 = abstract_device("gpu", "NVIDIA H100 80GB HBM3", 132)


def lower(fn, *args, platform: Platform) -> str:
  """StableHLO text of jit(fn) lowered for `platform`. For a GPU the trace runs under a one-device abstract mesh of
  an H100: jax >= 0.11's Triton lowering reads the GPU's kind from it when no GPU is attached."""
  lowered = lambda: jax.jit(fn).trace(*args).lower(lowering_platforms=(_LOWERING[platform],)).as_text()
  if platform is not Platform.GPU or not jax.sharding.get_abstract_mesh().empty:
    return lowered()
  one_gpu = AbstractMesh((1,), ("gpu",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=_H100)
  with jax.sharding.use_abstract_mesh(one_gpu):
    return lowered()


def _model(platform: Platform, precision: Precision = Precision.BF16) -> ModelConfig:
  return tiny.MODEL.replace(platform=platform, precision=precision)


def _abstract_params(cfg: ModelConfig):
  return jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))


class CrossLoweringTest(parameterized.TestCase):

  def assert_program(self, text: str, platform: Platform, precision: Precision, kernels: set[str]):
    found = triton_kernels(text)
    if platform is Platform.GPU and precision is not Precision.BF16:
      self.assertEqual(found, kernels, "the GPU program must call exactly the recipe's Triton kernels")
      self.assertNotIn("ragged_dot", text, "the reference quantized path (ragged_dot) is in the GPU program")
      return
    self.assertEqual(found, set(), f"a {platform.value} program calls Triton kernels")
    if platform is Platform.CPU:
      self.assertNotIn("ragged_dot", text, "AUTO dispatch on a CPU is the tiled one")
    else:
      self.assertIn("ragged_dot", text, f"the {platform.value} program misses the grouped-GEMM path")

  @parameterized.product(platform=(Platform.GPU, Platform.TPU, Platform.CPU),
                         precision=(Precision.BF16, Precision.NVFP4_FWD_MXFP8_BWD))
  def test_forward(self, platform, precision):
    cfg = _model(platform, precision)
    fn = lambda p, x: forward(p, x, cfg=cfg, with_mtp=False).logits
    text = lower(fn, _abstract_params(cfg), jax.ShapeDtypeStruct((B, T), jnp.int32), platform=platform)
    self.assert_program(text, platform, precision, _FORWARD_KERNELS.get(precision, set()))

  @parameterized.product(platform=(Platform.GPU, Platform.TPU),
                         precision=(Precision.BF16, Precision.MXFP8, Precision.NVFP4_FWD_MXFP8_BWD))
  def test_lm_train_step(self, platform, precision):
    cfg = _model(platform, precision)
    hp = StepConfig(mtp_weight=0.0)
    state = jax.eval_shape(lambda k: init_state(cfg, hp, k), jax.random.key(0))
    batch = {"tokens": jax.ShapeDtypeStruct((B, T), jnp.int32)}
    text = lower(functools.partial(train_step, cfg=cfg, hp=hp), state, batch, platform=platform)
    self.assert_program(text, platform, precision, _FORWARD_KERNELS.get(precision, set()) | _BACKWARD_KERNELS)

  @parameterized.parameters(Platform.GPU, Platform.TPU)
  def test_rl_update(self, platform):
    cfg = RLConfig(model=_model(platform, Precision.NVFP4_FWD_MXFP8_BWD))
    state = jax.eval_shape(lambda k: rl_update.init_state(cfg, k), jax.random.key(0))
    f32, i32 = (lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)), (lambda *s: jax.ShapeDtypeStruct(s, jnp.int32))
    batch = {"tokens": i32(B, T), "loss_mask": f32(B, T), "behaviour_logprobs": f32(B, T),
             "policy_version": i32(B, T), "group_id": i32(B), "chain_id": i32(B), "reward_terms": {"outcome": f32(B)},
             "truncated": f32(B), "expert_ids": i32(cfg.model.n_moe_layers, B, T, cfg.model.num_experts_per_tok)}
    text = lower(functools.partial(rl_update.update_step, cfg=cfg), state, batch, platform=platform)
    self.assert_program(text, platform, cfg.model.precision,
                        _FORWARD_KERNELS[cfg.model.precision] | _BACKWARD_KERNELS)

  @parameterized.parameters(Platform.GPU, Platform.TPU)
  def test_engine_append_and_decode(self, platform):
    cfg = _model(platform)
    engine = engine_lib.EngineConfig(slots=4, context=128, chunk_sizes=(16,), max_forced=8)
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, stop_tokens=(1,))
    params = _abstract_params(cfg)
    state = jax.eval_shape(lambda k: engine_lib.init_state(cfg, engine, sampling, k), jax.random.key(0))
    s = engine.slots

    def append(p, st, chunk, keys):
      every = jnp.ones((s,), bool)
      return engine_lib.append(p, st, chunk, jnp.full((s,), 8, jnp.int32), take_part=every, reset=every, draw=every,
                               turn_end=jnp.full((s,), engine.context, jnp.int32), keys=keys, version=0, cfg=cfg,
                               sampling=sampling)

    keys = jax.eval_shape(lambda k: jax.random.split(k, s), jax.random.key(0))
    text = lower(append, params, state, jax.ShapeDtypeStruct((s, 16), jnp.int32), keys, platform=platform)
    self.assert_program(text, platform, Precision.BF16, set())
    text = lower(lambda p, st: engine_lib.decode(p, st, steps=4, version=0, cfg=cfg, sampling=sampling),
                 params, state, platform=platform)
    self.assert_program(text, platform, Precision.BF16, set())

  @parameterized.parameters(Precision.BF16, Precision.NVFP4_FWD_MXFP8_BWD)
  def test_expert_parallel_moe_on_gpu_mesh_follows_the_mesh(self, precision):
    """AUTO follows the devices the program runs on: under a mesh of (abstract) H100s the expert-parallel MoE's
    shards run the GPU recipe, with no platform named anywhere."""
    gpu = _H100
    sizes = {"data": 1, "fsdp": 2, "expert": 4, "context": 1, "tensor": 1}
    mesh = AbstractMesh(tuple(sizes[a] for a in AXES), AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
                        abstract_device=gpu)  # Auto axes as c2jax's meshes (c2jax.parallel.mesh.make_mesh)
    cfg = tiny.MODEL.replace(precision=precision, moe_dispatch=MoeDispatch.AUTO)
    self.assertIs(cfg.platform, Platform.AUTO)
    layout = Layout(mesh=mesh, rules=(("batch", BATCH_AXES), ("seq", (CONTEXT,))),
                    routed_experts=make_expert_parallel(mesh))
    p_moe = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))["moe_layers"]["moe"]
    p_layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), p_moe)

    def loss(p, x):
      with use_layout(layout):
        return jnp.sum(moe.moe_ffn(p, x, cfg).y)

    x = jax.ShapeDtypeStruct((8, T, cfg.d_model), jnp.float32)
    with jax.sharding.use_abstract_mesh(mesh):
      text = lower(jax.grad(loss, argnums=(0, 1)), p_layer, x, platform=Platform.GPU)
    self.assertIn("all_to_all", text)
    kernels = _FORWARD_KERNELS[precision] | _BACKWARD_KERNELS if precision is not Precision.BF16 else set()
    self.assertEqual(triton_kernels(text), kernels)


if __name__ == "__main__":
  absltest.main()
