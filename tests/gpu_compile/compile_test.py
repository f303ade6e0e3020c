"""The deviceless GPU compile tier: XLA:GPU compiles for an H100 (and a B200) on this CPU host, no GPU attached.

Run by `make test-gpu-compile` (and `.ci/run`) in .venv-cuda, the venv with jax's CUDA plugin; marked gpu_compile,
which the CPU tiers leave out. What it proves that the cross-lowering tier (tests/cross_lowering_test.py) cannot: the
programs survive XLA:GPU's whole pipeline (fusion, buffer assignment, Pallas -> Triton -> PTX, ptxas to SASS for
sm_90a / sm_100a), and the SASS-level properties of the kernels hold:
  - every Pallas kernel compiles at its default tiles with no register spill (ptxas -v);
  - float32 (PLAIN) matmul kernels contain no TF32 instruction; the NVFP4 quantizers no approximate division;
  - the recipe's forward + VJP and the tiny model's LM train step (BF16 and NVFP4) compile, the GPU train step
    calls the recipe's Triton kernels, and XLA:GPU's memory analysis is nonzero; so do the RL update on packed rows
    and the agent engine's append, decode and forced-turn prefill;
  - planted faults fail: a kernel whose blocks need more shared memory than an H100 has does not compile, and a
    kernel at tiles that spill is reported as spilling.
"""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import tempfile

from absl.testing import absltest, parameterized
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt
import pytest

from c2jax.model.config import Precision
from c2jax.model.params import init_params
from c2jax.pretrain.step import StepConfig, init_state, train_step
from pallas_kernels.recipe.ops import expert_matmul
from pallas_kernels.target import Platform
from tests import tiny
from tools import gpu_compile

pytestmark = pytest.mark.gpu_compile

_CASES = tuple(gpu_compile.kernel_programs())
_APPROX_DIVISION = re.compile(r"\b(div\.(full|approx)(\.ftz)?\.f32|rcp\.approx(\.ftz)?\.f32)\b")


_DUMP_ROOT = tempfile.mkdtemp(prefix="c2jax-gpu-compile-tests-")
atexit.register(shutil.rmtree, _DUMP_ROOT, ignore_errors=True)


def _compile(fn, *args, **kw) -> gpu_compile.Compiled:
  """gpu_compile.compile_for with its XLA dump in a directory of this module's, removed at exit."""
  return gpu_compile.compile_for(fn, *args, dump_dir=tempfile.mkdtemp(dir=_DUMP_ROOT), **kw)


def _kernel(case: str, target: str = "h100") -> tuple[gpu_compile.Compiled, str]:
  fn, args = gpu_compile.kernel_programs()[case]
  return _compile(fn, *args, target=target), gpu_compile.kernel_entry(case)


def _ptx(compiled: gpu_compile.Compiled, entry: str) -> str:
  with open(compiled.ptx[entry], encoding="utf-8") as f:
    return f.read()


class KernelCompileTest(parameterized.TestCase):

  @parameterized.parameters(*_CASES)
  def test_compiles_for_h100_without_spills(self, case):
    compiled, entry = _kernel(case)
    self.assertIn(entry, compiled.ptx, f"no PTX entry {entry} among {sorted(compiled.ptx)}")
    report = gpu_compile.ptxas(compiled.ptx[entry], gpu_compile.TARGETS["h100"].arch)[entry]
    self.assertFalse(report.spills, f"{entry} spills at its default tiles: {report}")

  @parameterized.parameters(*[c for c in _CASES if c.endswith("plain_f32")])
  def test_float32_matmuls_use_no_tf32(self, case):
    compiled, entry = _kernel(case)
    self.assertNotIn("tf32", _ptx(compiled, entry), "a float32 dot lowered to TF32 (10-bit mantissas)")

  @parameterized.parameters("quantize_nvfp4", "quantize_nvfp4_sr")
  def test_nvfp4_quantizers_divide_exactly(self, case):
    compiled, entry = _kernel(case)
    found = sorted({m.group(0) for m in _APPROX_DIVISION.finditer(_ptx(compiled, entry))})
    self.assertEqual(found, [], "approximate float32 division in the NVFP4 quantizer")


class ProgramCompileTest(parameterized.TestCase):

  @parameterized.product(precision=(Precision.MXFP8, Precision.NVFP4_FWD_MXFP8_BWD), target=("h100", "b200"))
  def test_recipe_forward_and_vjp(self, precision, target):
    def loss(x, w, sizes):
      return jnp.sum(expert_matmul(x, w, sizes, precision, interpret=False).astype(jnp.float32) ** 2)

    args = (jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), jax.ShapeDtypeStruct((4, 256, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((4,), jnp.int32))
    compiled = _compile(jax.grad(loss, argnums=(0, 1)), *args, target=target)
    self.assertContainsSubset({"grouped_matmul", "transposed_grouped_matmul", "quantize_mxfp8_rows"},
                              set(compiled.ptx))

  @parameterized.parameters(Precision.BF16, Precision.NVFP4_FWD_MXFP8_BWD)
  def test_tiny_lm_train_step(self, precision):
    cfg = tiny.MODEL.replace(platform=Platform.GPU, precision=precision, dtype="bfloat16")
    hp = StepConfig(mtp_weight=0.0)
    state = jax.eval_shape(lambda k: init_state(cfg, hp, k), jax.random.key(0))
    batch = {"tokens": jax.ShapeDtypeStruct((4, 128), jnp.int32)}
    compiled = _compile(functools.partial(train_step, cfg=cfg, hp=hp), state, batch)
    memory = compiled.executable.memory_analysis()
    self.assertGreater(memory.temp_size_in_bytes, 0)
    params = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    self.assertGreaterEqual(memory.argument_size_in_bytes, sum(a.size * a.dtype.itemsize
                                                               for a in jax.tree.leaves(params)))
    kernels = {"quantize_nvfp4", "grouped_matmul", "transposed_grouped_matmul"}
    if precision is Precision.BF16:
      self.assertEmpty(kernels & set(compiled.ptx))
    else:
      self.assertContainsSubset(kernels, set(compiled.ptx))


  def test_rl_update_on_packed_rows(self):
    # The RL update (c2jax/rl/update.py) on a packed batch: 8 sequences in 4 rows, their [N] fields reaching the
    # tokens through segment_ids (gathers and segment sums), routing replay, two micro-batches.
    from c2jax.rl.config import RLConfig
    from c2jax.rl.update import init_state as rl_init_state, update_step

    model = tiny.MODEL.replace(platform=Platform.GPU, dtype="bfloat16")
    cfg = RLConfig(model=model, micro_batches=2)
    state = jax.eval_shape(functools.partial(rl_init_state, cfg), jax.random.key(0))
    b, t, n = 4, 128, 8
    sds = jax.ShapeDtypeStruct
    batch = {"tokens": sds((b, t), jnp.int32), "loss_mask": sds((b, t), jnp.float32),
             "behaviour_logprobs": sds((b, t), jnp.float32), "policy_version": sds((b, t), jnp.int32),
             "positions": sds((b, t), jnp.int32), "segment_ids": sds((b, t), jnp.int32),
             "expert_ids": sds((model.n_moe_layers, b, t, model.num_experts_per_tok), jnp.int32),
             "group_id": sds((n,), jnp.int32), "chain_id": sds((n,), jnp.int32), "truncated": sds((n,), jnp.float32),
             "reward_terms": {"outcome": sds((n,), jnp.float32)}}
    compiled = _compile(functools.partial(update_step, cfg=cfg), state, batch)
    self.assertGreater(compiled.executable.memory_analysis().temp_size_in_bytes, 0)

  def test_agent_engine_programs(self):
    # The agent loop's three device programs on its slots (c2jax/actors/engine.py): an append of a chunk, a decode
    # loop, and the prefill of forced turns.
    from c2jax.actors import engine
    cfg = tiny.BYTES.replace(platform=Platform.GPU)
    eng = tiny.ENGINE
    sampling = tiny.ENGINE_SAMPLING
    static = dict(cfg=cfg, sampling=engine._static(sampling), mode=sampling.mode, window=512)
    params = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    state = jax.eval_shape(lambda: engine.init_state(cfg, eng, sampling))
    s, c, f = eng.slots, eng.chunk_sizes[1], eng.max_forced
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    flags = jax.ShapeDtypeStruct((s,), jnp.bool_)
    stops = i32(len(sampling.stop_tokens))  # a traced argument of append and decode
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), s))
    programs = {
        "append": (functools.partial(engine._append_body, **static),
                   (params, state, i32(s, c), i32(s), flags, flags, flags, i32(s), keys, i32(s, f), i32(s), i32(s),
                    i32(), stops)),
        "decode": (functools.partial(engine._decode_loop, **static), (params, state, i32(), i32(), stops)),
        "force": (functools.partial(engine._force_body, chunk=c, **static), (params, state, i32())),
    }
    for name, (fn, args) in programs.items():
      memory = _compile(fn, *args).executable.memory_analysis()
      self.assertGreater(memory.temp_size_in_bytes, 0, name)


def _oversized(x, y):
  """A matmul kernel whose 256 x 256 float32 operand blocks (512 KiB staged in shared memory for the dot) cannot
  fit an H100's 227 KiB of shared memory per block."""
  def body(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=jax.lax.Precision.HIGHEST)
  spec = pl.BlockSpec((256, 256), lambda i: (i, 0))
  return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 256,),
                        in_specs=[spec, pl.BlockSpec((256, 256), lambda i: (0, 0))], out_specs=spec,
                        compiler_params=plt.CompilerParams(num_warps=4), name="planted_oversized")(x, y)


class PlantedFaultTest(absltest.TestCase):

  def test_a_kernel_beyond_shared_memory_fails_to_compile(self):
    x, y = jax.ShapeDtypeStruct((512, 256), jnp.float32), jax.ShapeDtypeStruct((256, 256), jnp.float32)
    with self.assertRaisesRegex(jax.errors.JaxRuntimeError, "RESOURCE_EXHAUSTED|[Ss]hared memory"):
      _compile(_oversized, x, y)

  def test_a_kernel_at_spilling_tiles_is_reported(self):
    fn, args = gpu_compile.kernel_programs((128, 128, 64, 4))["grouped_matmul_mxfp8"]
    compiled = _compile(fn, *args)
    report = gpu_compile.ptxas(compiled.ptx["grouped_matmul"], "sm_90a")["grouped_matmul"]
    self.assertTrue(report.spills, f"128x128x64 tiles on 4 warps no longer spill: plant another kernel ({report})")


if __name__ == "__main__":
  absltest.main()
