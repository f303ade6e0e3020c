"""Throughput of the FP8/FP4 Pallas kernels against XLA's own matmuls on the same shapes, and quantizer bandwidth.

  .venv/bin/python tools/bench_kernels.py                     # CPU: tiny shapes, reference impl (not GPU numbers)
  python tools/bench_kernels.py --m=16384 --k=7168 --n=2048 --experts=64    # GPU (H200): the kernels compiled

Measured (median of --iters timed calls after one warm-up call, each jitted and blocked on):
  dense   [M, K] x [K, N]: jnp.dot in bf16; jnp.dot on float8_e4m3fn inputs (XLA/cuBLAS fp8, f32 out);
          jax.nn.scaled_matmul on MXFP8 codes (JAX's peer; cuDNN, Blackwell only, so it may be unavailable);
          our scaled_matmul on MXFP8 and on NVFP4 (per-token) operands, quantization excluded.
  grouped M rows over E experts (balanced group sizes), [E, K, N] weights: jax.lax.ragged_dot in bf16 and on
          float8_e4m3fn inputs; our grouped_matmul on MXFP8 and NVFP4 operands.
  quant   quantize_mxfp8 along the last axis and along rows (the backward's layout), quantize_nvfp4 per token,
          of an [M, K] bf16 tensor: TB/s = (bytes read + bytes written) / time, against the H200's 4.8 TB/s.
TFLOP/s counts 2 M N K per matmul. Targets on H200 (issue 10): FP8 grouped matmul >= 0.8x the XLA fp8 dot on
large shapes; quantizers >= 50% of memory bandwidth.

On a backend other than GPU the kernels would run in the Pallas interpreter, whose speed means nothing, so the
pure-jnp reference implementations run instead, on tiny default shapes: those numbers are NOT GPU numbers and
the output says so. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable

from absl import app
from absl import flags

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pallas_kernels.formats import Impl, NVFP4Scaling
from pallas_kernels.grouped_matmul.ops import grouped_matmul
from pallas_kernels.quantize.ops import quantize_mxfp8, quantize_nvfp4
from pallas_kernels.scaled_matmul.kernel import TuningConfig
from pallas_kernels.scaled_matmul.ops import scaled_matmul

_M = flags.DEFINE_integer("m", None, "Rows (tokens; for grouped: token-expert assignments). Default: 8192 on GPU, "
                          "256 elsewhere.")
_K = flags.DEFINE_integer("k", None, "Contraction dim. Default: 4096 on GPU, 256 elsewhere.")
_N = flags.DEFINE_integer("n", None, "Output dim. Default: 4096 on GPU, 256 elsewhere.")
_E = flags.DEFINE_integer("experts", 8, "Experts of the grouped matmul (M split evenly).")
_ITERS = flags.DEFINE_integer("iters", None, "Timed calls per measurement. Default: 20 on GPU, 3 elsewhere.")
# 128 x 128 x 32 on 8 warps: the largest tiles measured without a register spill on an H100 (ptxas -v; 128 x 128 x 128
# spilled 0.6-3.9 KB a thread on 4 warps, and the float32 ones did not fit shared memory; tools/gpu_compile.py).
_BLOCK = flags.DEFINE_list("blocks", ["128", "128", "32", "8"], "Kernel tiles block_m,block_n,block_k[,num_warps].")
H200_TBPS = 4.8


def _time(fn: Callable, *args, iters: int) -> float:
  """Median seconds of one call of jit(fn)(*args), after one warm-up (compile) call."""
  f = jax.jit(fn)
  jax.block_until_ready(f(*args))
  samples = []
  for _ in range(iters):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    samples.append(time.perf_counter() - t)
  return statistics.median(samples)


def _try(results: dict, name: str, fn: Callable, *args, iters: int, flops: float = 0.0, nbytes: float = 0.0):
  """Times fn into results[name] (seconds, TFLOP/s or TB/s), or records why it could not run."""
  try:
    s = _time(fn, *args, iters=iters)
  except Exception as e:  # noqa: BLE001
    results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    print(f"{name:34s} unavailable: {results[name]['error']}")
    return
  r = {"seconds": s}
  if flops:
    r["tflops"] = flops / s / 1e12
  if nbytes:
    r["tbps"] = nbytes / s / 1e12
    r["fraction_of_h200_bandwidth"] = r["tbps"] / H200_TBPS
  results[name] = r
  print(json.dumps({"partial": {name: r}}), flush=True)  # kept by tools/gpu_check.sh if a timeout stops the run
  extra = "".join(f"  {k}={v:.4g}" for k, v in r.items() if k != "seconds")
  print(f"{name:34s} {s * 1e3:10.3f} ms{extra}")


def main(argv):
  del argv
  gpu = jax.default_backend() == "gpu"
  m = _M.value or (8192 if gpu else 256)
  k = _K.value or (4096 if gpu else 256)
  n = _N.value or (4096 if gpu else 256)
  e = _E.value
  iters = _ITERS.value or (20 if gpu else 3)
  impl = Impl.PALLAS if gpu else Impl.REFERENCE
  config = TuningConfig(*(int(b) for b in _BLOCK.value))
  bm, bn, bk = config.block_m, config.block_n, config.block_k
  note = ("GPU: compiled Pallas kernels." if gpu else
          f"NOT GPU NUMBERS: backend {jax.default_backend()}, reference implementations on tiny shapes.")
  print(note)
  print(f"M={m} K={k} N={n} E={e} iters={iters} tiles={bm},{bn},{bk}")
  k1, k2 = jax.random.split(jax.random.key(0))
  x = jax.random.normal(k1, (m, k), jnp.float32).astype(jnp.bfloat16)
  w = (jax.random.normal(k2, (k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
  we = (jax.random.normal(k2, (e, k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
  sizes = jnp.full((e,), m // e, jnp.int32)
  flops = 2.0 * m * n * k
  res: dict = {}
  q = dict(impl=Impl.REFERENCE)  # operands are quantized once, outside the timed matmuls

  # Dense.
  x8, w8 = x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn)
  _try(res, "dense_bf16_jnp_dot", lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), x, w,
       iters=iters, flops=flops)
  _try(res, "dense_fp8_jnp_dot", lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), x8, w8,
       iters=iters, flops=flops)
  qx, qw = quantize_mxfp8(x, **q), quantize_mxfp8(w.T, **q)
  as_e8m0 = lambda s: jax.lax.bitcast_convert_type(s, jnp.float8_e8m0fnu)
  _try(res, "dense_mxfp8_jax_nn_scaled_matmul",
       lambda a, b, sa, sb: jax.nn.scaled_matmul(a[None], b[None], as_e8m0(sa)[None], as_e8m0(sb)[None])[0],
       qx.data, qw.data, qx.scale, qw.scale, iters=iters, flops=flops)
  kw = dict(impl=impl, config=config)
  _try(res, "dense_mxfp8_scaled_matmul", lambda a, b: scaled_matmul(a, b, **kw), qx, qw, iters=iters, flops=flops)
  nx, nw = quantize_nvfp4(x, NVFP4Scaling.PER_TOKEN, **q), quantize_nvfp4(w.T, NVFP4Scaling.PER_TOKEN, **q)
  _try(res, "dense_nvfp4_scaled_matmul", lambda a, b: scaled_matmul(a, b, **kw), nx, nw, iters=iters, flops=flops)

  # Grouped.
  ragged = lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=jnp.float32)
  _try(res, "grouped_bf16_ragged_dot", ragged, x, we, sizes, iters=iters, flops=flops)
  _try(res, "grouped_fp8_ragged_dot", ragged, x8, we.astype(jnp.float8_e4m3fn), sizes, iters=iters, flops=flops)
  qwe = quantize_mxfp8(jnp.swapaxes(we, 1, 2), **q)
  _try(res, "grouped_mxfp8_grouped_matmul", lambda a, b, s: grouped_matmul(a, b, s, **kw), qx, qwe, sizes,
       iters=iters, flops=flops)
  nwe = quantize_nvfp4(jnp.swapaxes(we, 1, 2), NVFP4Scaling.PER_TOKEN, **q)
  _try(res, "grouped_nvfp4_grouped_matmul", lambda a, b, s: grouped_matmul(a, b, s, **kw), nx, nwe, sizes,
       iters=iters, flops=flops)

  # Quantizers: bf16 in; MXFP8 writes 1 byte + 1/32 scale byte per element, NVFP4 1/2 + 1/16 (+ a row scale).
  elems = float(m * k)
  _try(res, "quantize_mxfp8_last_axis", lambda a: quantize_mxfp8(a, impl=impl), x, iters=iters,
       nbytes=elems * (2 + 1 + 1 / 32))
  _try(res, "quantize_mxfp8_row_axis", lambda a: quantize_mxfp8(a, axis=0, impl=impl), x, iters=iters,
       nbytes=elems * (2 + 1 + 1 / 32))
  _try(res, "quantize_nvfp4_per_token", lambda a: quantize_nvfp4(a, NVFP4Scaling.PER_TOKEN, impl=impl), x,
       iters=iters, nbytes=elems * (2 + 0.5 + 1 / 16))

  def ratio(a, b):
    ta, tb = res.get(a, {}).get("tflops"), res.get(b, {}).get("tflops")
    return ta / tb if ta and tb else None

  summary = {
      "grouped_mxfp8_vs_fp8_dot": ratio("grouped_mxfp8_grouped_matmul", "dense_fp8_jnp_dot"),
      "grouped_mxfp8_vs_fp8_ragged_dot": ratio("grouped_mxfp8_grouped_matmul", "grouped_fp8_ragged_dot"),
      "dense_mxfp8_vs_fp8_dot": ratio("dense_mxfp8_scaled_matmul", "dense_fp8_jnp_dot"),
  }
  print(json.dumps({"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
                    "gpu_numbers": gpu, "note": note, "impl": impl.value,
                    "shape": {"m": m, "k": k, "n": n, "experts": e}, "tiles": [bm, bn, bk], "iters": iters,
                    "results": res, "summary": summary}))


if __name__ == "__main__":
  app.run(main)
