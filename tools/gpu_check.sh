#!/usr/bin/env bash
# GPU check of the FP8/FP4 Pallas kernels (issue 10), for a machine with a CUDA GPU and jax[cuda] installed.
#
#   bash tools/gpu_check.sh [python]        # default python: .venv/bin/python if present, else python3
#
# 1. tests/pallas_kernels: on a GPU the compiled test classes (ScaledMatmulCompiledTest, GroupedMatmulCompiledTest,
#    RecipeCompiledTest, QuantizeKernelTest, ...) run every kernel test with the kernels compiled (interpret=False),
#    which they skip elsewhere; the *InterpretTest classes run them interpreted, as on CPU. -rs lists the skips.
# 2. tools/bench_kernels.py on large shapes: TFLOP/s of our MXFP8 / NVFP4 dense and grouped matmuls against
#    jnp.dot and jax.lax.ragged_dot in bf16 and fp8, and quantizer TB/s against 4.8 TB/s (H200). Its last line is
#    JSON; it is also written to $OUT/bench_kernels.json when OUT is set.
# Exits non-zero if there is no GPU (so that CPU numbers are never mistaken for GPU ones) or a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PY" -c 'import jax, sys; b = jax.default_backend(); print("backend:", b, jax.devices());
sys.exit(0 if b == "gpu" else "no GPU: jax.default_backend() is " + b)'
"$PY" -m pytest -q -p no:cacheprovider -rs tests/pallas_kernels
out=${OUT:-/tmp}
"$PY" tools/bench_kernels.py --m=16384 --k=4096 --n=4096 --experts=8 2>&1 | tee "$out/bench_kernels.log"
tail -n 1 "$out/bench_kernels.log" > "$out/bench_kernels.json"
