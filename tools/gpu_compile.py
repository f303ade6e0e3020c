"""Deviceless XLA:GPU compiles on a CPU host: every Pallas kernel, the recipe and train steps, for an H100 (sm_90a)
or a Blackwell B200 (sm_100a), with no GPU attached.

jax's CUDA plugin (`jax-cuda12-plugin` + `jax-cuda12-pjrt` at the installed jaxlib's version) makes compile-only
GPU devices from a GPU target description (`jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=...)`); `.lower().compile()` for them runs the whole XLA:GPU pipeline: fusion, buffer assignment,
Pallas -> Triton -> PTX, and ptxas to SASS. The plugin lives in a venv of its own (`make gpu-compile-venv`:
`.venv-cuda`, layered over `.venv`), run with JAX_PLATFORMS=cpu so that jax never looks for a GPU.

  make test-gpu-compile                                    # the tier: tests/gpu_compile (kernels, PTX, spills)
  JAX_PLATFORMS=cpu .venv-cuda/bin/python tools/gpu_compile.py spills                 # ptxas -v of every kernel
  JAX_PLATFORMS=cpu .venv-cuda/bin/python tools/gpu_compile.py memory --batches=4,16  # gpu_mid's train step

`spills` compiles each kernel at its default tiles and at bench_kernels' tiles and prints, per kernel, ptxas'
registers, stack frame and spill bytes and the compile seconds. `memory` compiles configs/model/gpu_mid.py's LM
train step (bf16 compute on float32 params, AdamW) for one H100 at each batch and prints XLA:GPU's own memory
analysis beside `tools/plan.py`'s estimate. Each prints one JSON object as its last line (docs/benchmarks.md,
"tools/gpu_compile.py").

The target descriptions below are written from the devices' published properties (the fields XLA's
`GpuTargetConfigProto` needs for compilation: compute capability, SM count, shared memory and register limits,
memory size and bandwidth, clock).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """What XLA:GPU needs to know of a device to compile for it without one."""

  name: str
  arch: str  # ptxas' -arch
  major: int
  minor: int
  core_count: int
  memory_bytes: int
  memory_bandwidth: int  # bytes/s
  l2_cache_bytes: int
  clock_ghz: float
  shared_memory_per_block_optin: int
  shared_memory_per_core: int

  def text_proto(self) -> str:
    """The `GpuTargetConfigProto` in text format (`get_topology_desc(target_config=...)`)."""
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_core}
  threads_per_core_limit: 2048
  core_count: {self.core_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {self.memory_bandwidth}
  l2_cache_size: {self.l2_cache_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {self.major} minor: {self.minor} feature_extension: ACCELERATED_FEATURES }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
device_description_str: "{self.name}"
"""


TARGETS = {
    "h100": GpuTarget(name="NVIDIA H100 80GB HBM3", arch="sm_90a", major=9, minor=0, core_count=132,
                      memory_bytes=84_942_979_072, memory_bandwidth=3_352_320_000_000, l2_cache_bytes=52_428_800,
                      clock_ghz=1.98, shared_memory_per_block_optin=232_448, shared_memory_per_core=233_472),
    "b200": GpuTarget(name="NVIDIA B200", arch="sm_100a", major=10, minor=0, core_count=148,
                      memory_bytes=191_514_247_168, memory_bandwidth=8_000_000_000_000, l2_cache_bytes=132_120_576,
                      clock_ghz=1.965, shared_memory_per_block_optin=232_448, shared_memory_per_core=233_472),
}


def devices(target: str = "h100", count: int = 1) -> list:
  """`count` compile-only CUDA devices of `target` (one host); needs the CUDA plugin (module docstring)."""
  from jax.experimental import topologies
  try:
    topo = topologies.get_topology_desc(platform="cuda", topology_name="", target_config=TARGETS[target].text_proto(),
                                        topology=f"1x1x{count}")
  except (RuntimeError, ValueError) as e:  # no plugin: "Unknown backend cuda" / "no cuda PJRT plugin"
    raise RuntimeError(f"no deviceless CUDA compiles here ({e}); run with .venv-cuda/bin/python, made by "
                       "`make gpu-compile-venv` (jax's CUDA plugin at the installed jaxlib's version).") from e
  return list(topo.devices)


@dataclasses.dataclass
class Compiled:
  """A deviceless compile: the executable, its seconds, and the PTX of each kernel (entry name -> PTX path)."""

  executable: Any
  seconds: float
  dump_dir: str
  ptx: dict[str, str]


def entry_ptx(dump_dir: str) -> dict[str, str]:
  """{kernel entry name: path of the PTX file defining it} over an XLA dump directory."""
  out = {}
  for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
    with open(path, encoding="utf-8") as f:
      for name in re.findall(r"\.visible \.entry (\w+)\(", f.read()):
        out.setdefault(name, path)
  return out


def compile_for(fn: Callable, *args: Any, target: str = "h100", dump_dir: str | None = None,
                donate_argnums: tuple[int, ...] = ()) -> Compiled:
  """Compiles jit(fn) for one compile-only `target` device; args are ShapeDtypeStructs (placed on that device)."""
  import jax
  device = devices(target)[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
  dump_dir = dump_dir or tempfile.mkdtemp(prefix="c2jax-gpu-compile-")
  t0 = time.perf_counter()
  lowered = jax.jit(fn, donate_argnums=donate_argnums).trace(*placed).lower()
  executable = lowered.compile(compiler_options={"xla_dump_to": dump_dir})
  return Compiled(executable, time.perf_counter() - t0, dump_dir, entry_ptx(dump_dir))


@dataclasses.dataclass(frozen=True)
class PtxasReport:
  """ptxas -v's resource line for one kernel."""

  registers: int
  stack_bytes: int
  spill_stores: int
  spill_loads: int

  @property
  def spills(self) -> bool:
    return self.spill_stores > 0 or self.spill_loads > 0


def ptxas(path: str, arch: str = "sm_90a") -> dict[str, PtxasReport]:
  """Runs `ptxas -v` on a PTX file; {entry function: its registers, stack frame and spill bytes}."""
  exe = shutil.which("ptxas")
  if exe is None:
    raise RuntimeError("ptxas is not on PATH: install CUDA's ptxas (Debian's nvidia-cuda-toolkit, or pip's "
                       "nvidia-cuda-nvcc-cu12, whose bin/ holds one).")
  run = subprocess.run([exe, f"-arch={arch}", "-v", path, "-o", os.devnull], capture_output=True, text=True,
                       check=False)
  if run.returncode:
    raise RuntimeError(f"ptxas failed on {path}: {run.stderr.strip()[-2000:]}")
  text = run.stdout + run.stderr
  out = {}
  for block in re.split(r"Compiling entry function '", text)[1:]:
    name = block.split("'", 1)[0]
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
    regs = re.search(r"Used (\d+) registers", block)
    out[name] = PtxasReport(registers=int(regs.group(1)) if regs else 0,
                            stack_bytes=int(frame.group(1)) if frame else 0,
                            spill_stores=int(frame.group(2)) if frame else 0,
                            spill_loads=int(frame.group(3)) if frame else 0)
  return out


# --------------------------------------------------------------------------------------------- the kernel inventory


def kernel_programs(tiles: tuple[int, ...] | None = None) -> dict[str, tuple[Callable, tuple]]:
  """{case: (fn, abstract args)} for every Pallas kernel, compiled (not interpreted), at its default tiles or the
  matmuls at `tiles` (block_m, block_n, block_k[, num_warps]). Each case's kernel entry is `kernel_entry(case)`."""
  import jax
  import jax.numpy as jnp
  from pallas_kernels.formats import NVFP4Scaling, Rounding
  from pallas_kernels.grouped_matmul import ops as gmm
  from pallas_kernels.quantize import ops as quant
  from pallas_kernels.scaled_matmul import ops as smm
  from pallas_kernels.scaled_matmul.kernel import TuningConfig

  m, k, n, e = 256, 512, 256, 4
  cfg = {} if tiles is None else {"config": TuningConfig(*tiles)}
  compiled = dict(interpret=False)
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((e, k, n), jnp.bfloat16)
  wt = jax.ShapeDtypeStruct((n, k), jnp.bfloat16)
  sizes = jax.ShapeDtypeStruct((e,), jnp.int32)
  f32 = lambda s: jax.ShapeDtypeStruct(s.shape, jnp.float32)
  mx = lambda a, axis=-1: quant.quantize_mxfp8(a, axis=axis, **compiled)
  nv = lambda a: quant.quantize_nvfp4(a, NVFP4Scaling.PER_TOKEN, **compiled)
  progs = {
      "quantize_mxfp8_rows": (lambda a: mx(a), (x,)),
      "quantize_mxfp8_cols": (lambda a: mx(a, 0), (x,)),
      "quantize_nvfp4": (nv, (x,)),
      "quantize_nvfp4_sr": (lambda a, key: quant.quantize_nvfp4(a, NVFP4Scaling.PER_TOKEN, rounding=Rounding.STOCHASTIC,
                                                                key=key, **compiled),
                            (x, jax.eval_shape(lambda: jax.random.key(0)))),
      "scaled_matmul_mxfp8": (lambda a, b: smm.scaled_matmul(mx(a), mx(b), **cfg, **compiled), (x, wt)),
      "scaled_matmul_nvfp4": (lambda a, b: smm.scaled_matmul(nv(a), nv(b), **cfg, **compiled), (x, wt)),
      "scaled_matmul_plain_f32": (lambda a, b: smm.scaled_matmul(a, b, **cfg, **compiled), (f32(x), f32(wt))),
      "grouped_matmul_mxfp8": (lambda a, b, s: gmm.grouped_matmul(mx(a), mx(b, 1), s, **cfg, **compiled),
                               (x, w, sizes)),
      "grouped_matmul_nvfp4": (lambda a, b, s: gmm.grouped_matmul(nv(a), nv(jnp.swapaxes(b, 1, 2)), s, **cfg,
                                                                  **compiled), (x, w, sizes)),
      "grouped_matmul_plain_f32": (lambda a, b, s: gmm.grouped_matmul(a, jnp.swapaxes(b, 1, 2), s, **cfg, **compiled),
                                   (f32(x), f32(w), sizes)),
      "transposed_grouped_matmul_mxfp8": (
          lambda a, d, s: gmm.transposed_grouped_matmul(mx(a, 0), mx(d, 0), s, **cfg, **compiled),
          (x, jax.ShapeDtypeStruct((m, n), jnp.bfloat16), sizes)),
      "transposed_grouped_matmul_plain_f32": (
          lambda a, d, s: gmm.transposed_grouped_matmul(a.T, d.T, s, **cfg, **compiled),
          (f32(x), jax.ShapeDtypeStruct((m, n), jnp.float32), sizes)),
  }
  return progs


def kernel_entry(case: str) -> str:
  """The PTX entry (pallas_call name) of a `kernel_programs` case."""
  for suffix in ("_mxfp8", "_nvfp4", "_plain_f32"):
    if case.endswith(suffix) and not case.startswith("quantize"):
      return case[: -len(suffix)]
  return case


def parse_tiles(text: str) -> tuple[int, ...] | None:
  """'default' -> None; 'MxNxK' or 'MxNxKwW' (W warps) -> (M, N, K[, W])."""
  if text == "default":
    return None
  dims, _, warps = text.partition("w")
  return tuple(int(v) for v in dims.split("x")) + ((int(warps),) if warps else ())


def spill_table(target: str = "h100", tiles: tuple[int, ...] | None = None) -> dict[str, dict]:
  """{case: registers, stack, spill bytes and compile seconds of its kernel} at default tiles or `tiles`."""
  import jax
  out = {}
  for case, (fn, args) in kernel_programs(tiles).items():
    try:
      c = compile_for(fn, *args, target=target)
    except jax.errors.JaxRuntimeError as e:  # e.g. RESOURCE_EXHAUSTED: the tiles need more shared memory
      out[case] = {"error": str(e).splitlines()[0][:300]}
      continue
    entry = kernel_entry(case)
    report = ptxas(c.ptx[entry], TARGETS[target].arch)[entry]
    out[case] = {**dataclasses.asdict(report), "compile_s": round(c.seconds, 2)}
    shutil.rmtree(c.dump_dir, ignore_errors=True)
  return out


# ----------------------------------------------------------------------------------------------------- the CLI


def _memory(batches: list[int], seq_len: int, target: str) -> dict:
  """XLA:GPU's memory analysis of gpu_mid's LM train step at each batch, beside tools/plan.py's estimate."""
  import jax
  import jax.numpy as jnp
  from c2jax.model import presets
  from c2jax.pretrain.step import StepConfig, init_state, train_step
  from pallas_kernels.target import Platform

  cfg = presets.load(os.path.join(_ROOT, "configs/model/gpu_mid.py")).replace(platform=Platform.GPU)
  hp = StepConfig(mtp_weight=0.0)
  state = jax.eval_shape(lambda key: init_state(cfg, hp, key), jax.random.key(0))
  rows = {}
  for b in batches:
    batch = {"tokens": jax.ShapeDtypeStruct((b, seq_len), jnp.int32)}
    # The state is donated, as every trainer does: the new state reuses its buffers.
    c = compile_for(lambda s, x: train_step(s, x, cfg=cfg, hp=hp), state, batch, target=target, donate_argnums=(0,))
    ma = c.executable.memory_analysis()
    gib = lambda v: round(v / 2**30, 2)
    rows[str(b)] = {"compile_s": round(c.seconds, 1), "argument_gib": gib(ma.argument_size_in_bytes),
                    "output_gib": gib(ma.output_size_in_bytes), "temp_gib": gib(ma.temp_size_in_bytes),
                    "alias_gib": gib(ma.alias_size_in_bytes),
                    "peak_gib": gib(ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
                                    + ma.temp_size_in_bytes)}
    shutil.rmtree(c.dump_dir, ignore_errors=True)
    print(f"B={b}: {rows[str(b)]}", flush=True)
  return {"model": "configs/model/gpu_mid.py", "seq_len": seq_len, "target": target, "batches": rows}


def main(argv: list[str]) -> int:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("what", choices=("spills", "memory"))
  parser.add_argument("--target", default="h100", choices=sorted(TARGETS))
  parser.add_argument("--tiles", default="default,128x128x32w8,128x128x128",
                      help="matmul tilings for `spills`: 'default', MxNxK or MxNxKwWARPS, comma-separated")
  parser.add_argument("--batches", default="4,16", help="batches for `memory`")
  parser.add_argument("--seq_len", type=int, default=1024)
  args = parser.parse_args(argv)
  import jax
  result: dict[str, Any] = {"tool": "gpu_compile", "what": args.what, "target": args.target,
                            "jax": jax.__version__, "load_avg": [round(v, 2) for v in os.getloadavg()]}
  if args.what == "spills":
    for tiling in args.tiles.split(","):
      tiles = parse_tiles(tiling)
      table = spill_table(args.target, tiles)
      for case, row in table.items():
        if "error" in row:
          print(f"{tiling:>12} {case:38s} {row['error']}", flush=True)
          continue
        print(f"{tiling:>12} {case:38s} regs {row['registers']:3d} stack {row['stack_bytes']:5d} "
              f"spill {row['spill_stores']:5d}/{row['spill_loads']:5d} B  {row['compile_s']:5.2f} s", flush=True)
      result[tiling] = table
  else:
    result.update(_memory([int(b) for b in args.batches.split(",")], args.seq_len, args.target))
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
