#!/usr/bin/env bash
# The GPU check: one script of at most 8 minutes on one H100 or H200 (jax with CUDA installed; no network needed).
#
#   bash tools/gpu_check.sh [python]          # default python: .venv/bin/python if present, else python3
#   bash tools/gpu_check.sh --venv .venv-gpu  # first makes that venv: jax[cuda12] at the tested version and only what
#                                             # the stages import (tools/gpu_check_requirements.txt), from a package
#                                             # registry; an existing venv with the same requirements is reused
#   GPU_CHECK_CPU_SMOKE=1 bash tools/gpu_check.sh   # (or --cpu_smoke) every stage at tiny shapes on CPU: tests this
#                                             # script's plumbing; its figures are NOT GPU figures and say so
#   GPU_CHECK_STAGES=preflight,kernel_tests   # run only these stages (the others are recorded as not run)
#
# Compiled programs persist in GPU_CHECK_XLA_CACHE (default ~/.cache/c2jax/gpu-check-xla): a second run on the same
# machine skips the compiles that dominate the first.
#
# Stages, in order, each under `timeout`: its own budget (seconds) plus whatever the stages before it left unspent,
# never the budgets of the stages after it, so that the whole stays within 470 s (GPU_CHECK_TOTAL_S):
#   preflight      30  the backend, device, memory and versions, and whether every stage's imports load (a missing
#                      package is named in one sentence). Without a GPU the script stops here (exit 2).
#   kernel_tests  100  tests/pallas_kernels without the *InterpretTest classes: on a GPU the *CompiledTest classes,
#                      and the GPU lowering tests run the kernels compiled (they skip on CPU).
#   bench_kernels  60  tools/bench_kernels.py at M=16384 K=7168 N=2048, 64 experts: TFLOP/s of jnp.dot and
#                      jax.lax.ragged_dot in bf16 and fp8 against our MXFP8 / NVFP4 scaled and grouped matmuls;
#                      quantizer TB/s.
#   sampler       120  tools/bench_sampler.py on configs/model/gpu_mid.py in bf16, c2jax alone: generated tokens/s
#                      at B=64 and B=256 (prompt 16, 128 new tokens, greedy).
#   train_mfu     160  tools/bench_model.py on configs/model/gpu_mid.py (2.6B params, bf16 compute on float32 params,
#                      AdamW), B x 1024 tokens with B from the GPU's memory (16 from 110 GiB, 4 from 70 GiB, else 2;
#                      once more at B/2 if it runs out of memory): model FLOP/s and MFU against the device's dense
#                      bf16 peak (989 TFLOP/s on H100 SXM and H200; bench_model.device_peak_tflops).
#
# Output, in OUT (default /tmp/gpu_check): <stage>.json, each stage's last-line JSON (or {"error": ...});
# gpu_check.json, the summary (the device; per stage ok, seconds, limit and figures or error; the headline figures),
# rewritten after every stage; gpu_check.log, every stage's output. Its figures go in docs/benchmarks.md
# ("tools/gpu_check.sh"). The script goes on past a failed stage and exits 1 at the end if any failed.
#
# Imports: beyond jax, numpy and absl the stages need pytest, chex, ml_dtypes, optax, orbax-checkpoint and
# tensorstore (not grain, ml_collections or transformers). A machine that lacks one takes its wheels from .whl/ at
# the repository root (python 3.12, manylinux x86_64, e.g. `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d .whl NAME==VERSION` on a machine with a network): they
# are installed with `pip install --no-index --no-deps --target` into a temporary directory put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C  # EPOCHREALTIME's decimal point
if [ -z "${EPOCHREALTIME:-}" ]; then
  echo "tools/gpu_check.sh needs bash >= 5 (EPOCHREALTIME times the stages); this is bash $BASH_VERSION." >&2
  exit 2
fi

SMOKE=${GPU_CHECK_CPU_SMOKE:-0}
PY=
VENV=
while (( $# )); do
  case $1 in
    --cpu_smoke|--dry_run) SMOKE=1 ;;
    --venv) VENV=${2:?"--venv needs a directory"}; shift ;;
    --venv=*) VENV=${1#--venv=} ;;
    -*) echo "unknown option $1: use [--cpu_smoke] [--venv DIR] [python]" >&2; exit 2 ;;
    *) PY=$1 ;;
  esac
  shift
done
STAGES=${GPU_CHECK_STAGES:-preflight,kernel_tests,bench_kernels,sampler,train_mfu}
wanted() { [[ ",$STAGES," == *",$1,"* ]]; }

# --venv DIR: a venv of the stages' own requirements, made once (its stamp names the requirements' checksum and the
# jax build), from whatever python3 this machine has (3.11 or 3.12).
if [ -n "$VENV" ]; then
  REQS=tools/gpu_check_requirements.txt
  JAX_PIN=$(grep -E '^jax==' "$REQS" | cut -d= -f3)
  if [ "$SMOKE" = 1 ]; then JAX_SPEC="jax==$JAX_PIN"; else JAX_SPEC="jax[cuda12]==$JAX_PIN"; fi
  STAMP="$VENV/.gpu-check-$(cat "$REQS" | md5sum | cut -c1-12)-$( [ "$SMOKE" = 1 ] && echo cpu || echo cuda12)"
  if [ ! -f "$STAMP" ]; then
    echo "making $VENV: $JAX_SPEC and $REQS"
    t0=$EPOCHREALTIME
    { "${GPU_CHECK_BASE_PYTHON:-python3}" -m venv "$VENV" \
        && "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQS" "$JAX_SPEC"; } || {
      echo "could not make $VENV (no package registry here?): put the wheels in .whl/ and run without --venv" >&2
      exit 2; }
    rm -f "$VENV"/.gpu-check-*; touch "$STAMP"
    echo "made $VENV in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s"
  fi
  PY=$VENV/bin/python
fi
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export JAX_COMPILATION_CACHE_DIR=${GPU_CHECK_XLA_CACHE:-$HOME/.cache/c2jax/gpu-check-xla}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-1}
mkdir -p "$JAX_COMPILATION_CACHE_DIR"
OUT=${OUT:-/tmp/gpu_check}
TOTAL=${GPU_CHECK_TOTAL_S:-470}
mkdir -p "$OUT"
rm -f "$OUT"/{preflight,kernel_tests,bench_kernels,sampler,train_mfu,gpu_check}.json "$OUT/gpu_check.log"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
START=$EPOCHREALTIME
export PYTHONUNBUFFERED=1
# One process at a time holds the GPU: let it take 95% of the memory (jax's default preallocation is 75%).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
if [ "$SMOKE" = 1 ]; then
  export JAX_PLATFORMS=cpu
fi

if compgen -G ".whl/*.whl" > /dev/null; then
  echo "installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $WORK/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
    || echo "installing .whl/*.whl failed; the stages run without them"
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi

elapsed() { awk -v a="$START" -v b="$EPOCHREALTIME" -v f="${1:-%d}" 'BEGIN { printf f, b - a }'; }

# Each stage's own budget, seconds; a stage may also use what the stages before it left unspent, never what the
# stages after it are owed (LATER), so that the whole stays within TOTAL.
declare -A BUDGET=([preflight]=30 [kernel_tests]=100 [bench_kernels]=60 [sampler]=120 [train_mfu]=160)
LATER=0
for b in "${BUDGET[@]}"; do LATER=$(( LATER + b )); done

# stage NAME COMMAND...: runs COMMAND under timeout, its output to the terminal and to the log, then folds its last
# JSON line into OUT. Sets RC.
stage() {
  local name=$1
  shift
  LATER=$(( LATER - ${BUDGET[$name]:-0} ))
  (( LATER < 0 )) && LATER=0
  if ! wanted "$name"; then
    echo "==== $name: not run (GPU_CHECK_STAGES=$STAGES)"
    RC=0
    return
  fi
  local limit=$(( TOTAL - $(elapsed) - 3 - LATER ))
  echo "==== $name (limit ${limit} s, $(elapsed) s in): $*" | tee -a "$OUT/gpu_check.log"
  local t0=$EPOCHREALTIME
  if (( limit < 5 )); then
    echo "not run: the ${TOTAL} s total is spent" > "$WORK/$name.log"
    RC=124
  else
    timeout -k 2 "$limit" "$@" 2>&1 | tee "$WORK/$name.log"
    RC=${PIPESTATUS[0]}
  fi
  local secs
  secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  cat "$WORK/$name.log" >> "$OUT/gpu_check.log"
  echo "==== $name: exit $RC after $secs s" | tee -a "$OUT/gpu_check.log"
  "$PY" tools/gpu_check.py record "$OUT" "$WORK" "$name" "$RC" "$secs" "$limit" > /dev/null
}

finish() {
  echo "==== summary ($(elapsed %.1f) s): $OUT/gpu_check.json"
  "$PY" tools/gpu_check.py finish "$OUT" "$(elapsed %.1f)"
}

if [ "$SMOKE" = 1 ]; then
  echo "CPU smoke run: tiny shapes, figures NOT GPU figures"
  stage preflight "$PY" tools/gpu_check.py preflight --cpu_smoke
else
  stage preflight "$PY" tools/gpu_check.py preflight
fi
if [ "$RC" = 2 ]; then  # no GPU: CPU numbers must never pass for GPU ones
  finish
  exit 2
fi

PYTEST=(-q -p no:cacheprovider -rs tests/pallas_kernels)
if [ "$SMOKE" = 1 ]; then
  stage kernel_tests "$PY" tools/gpu_check.py kernel_tests "${PYTEST[@]}" -k "not Interpret and (Formats or Compiled)"
  stage bench_kernels "$PY" tools/bench_kernels.py --iters=1
  MODEL=tiny; SAMPLER_TOKENS=(--prompt_len=4 --new_tokens=4 --repeats=1)
  TRAIN=(--seq_len=64 --repeats=1 --steps_per_repeat=1 --matmul_size=256); BATCH=2
else
  stage kernel_tests "$PY" tools/gpu_check.py kernel_tests "${PYTEST[@]}" -k "not Interpret"
  stage bench_kernels "$PY" tools/bench_kernels.py --m=16384 --k=7168 --n=2048 --experts=64
  MODEL=configs/model/gpu_mid.py; SAMPLER_TOKENS=(--prompt_len=16 --new_tokens=128 --repeats=3)
  TRAIN=(--seq_len=1024 --repeats=3 --steps_per_repeat=5 --matmul_size=8192)
  MEM=$("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d = d.get("figures") or d
print(int(d.get("device_memory_gib") or 0))' "$OUT/preflight.json" 2>/dev/null || echo 0)
  BATCH=$(( MEM >= 110 ? 16 : (MEM >= 70 ? 4 : 2) ))
fi

stage sampler "$PY" tools/bench_sampler.py --model="$MODEL" --dtype=bfloat16 --skip_hf --skip_spec \
  --vllm_python=none --skip_breakdown --batches=64,256 "${SAMPLER_TOKENS[@]}"

train() {
  stage train_mfu "$PY" tools/bench_model.py --model="$MODEL" --dtype=bfloat16 --param_dtype=float32 --skip_hf \
    --experts_sweep= --batch="$1" "${TRAIN[@]}"
}
train "$BATCH"
if [ "$RC" != 0 ] && (( BATCH > 1 )) && grep -qE "RESOURCE_EXHAUSTED|[Oo]ut of memory" "$WORK/train_mfu.log"; then
  echo "train_mfu ran out of memory at B=$BATCH: once more at B=$(( BATCH / 2 ))"
  train $(( BATCH / 2 ))
fi

finish
