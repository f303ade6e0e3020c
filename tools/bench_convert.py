"""What the INT4 path of tools/convert_hf.py costs: conversion seconds and peak RSS of one model stored as an HF
DeepSeek-V3 BF16 checkpoint and as a Kimi K2.5 release (routed experts INT4 pack-quantized), converted alike.

  .venv/bin/python tools/bench_convert.py                        # ~270M params (d_model 1024, 8 layers, 32 experts)
  .venv/bin/python tools/bench_convert.py --sources=bf16,kimi_k25,kimi_k2_thinking --dtype=float32
  .venv/bin/python tools/bench_convert.py --d_model=64 --n_layers=2 --n_routed_experts=4 --moe_intermediate_size=32 \
      --vocab_size=512 --repeats=1                               # seconds: a look at the tool itself

1. A random model of the given size (no MTP module: K2.5 has none) is written by `c2jax.model.hf_export.export_params`
   as a BF16 DeepSeek-V3 checkpoint ("bf16"; the router and its correction bias float32, as HF keeps them). The
   same stored tensors are then rewritten as the Kimi K2.5 release lays them out ("kimi_k25": every name under
   `language_model.`, config.json with `text_config` holding the text model and its `quantization_config`,
   model_type kimi_k25; no vision tower) and optionally as the flat Kimi K2 Thinking layout ("kimi_k2_thinking":
   the DeepSeek-V3 names, quantization_config at the top level). In both, every routed expert Linear is INT4
   pack-quantized as compressed-tensors quantizes it (symmetric, one BF16 scale per 32 input columns:
   `weight_packed` int32 [out, in / 8], `weight_scale` [out, in / 32], `weight_shape` int64 [2]) with this file's
   numpy packer (`quantize_int4`), checked bit for bit against compressed-tensors' own compressor on one expert
   before anything is measured. The other tensors are copied unchanged, so the two sources differ only in the
   experts' storage.
2. `tools/convert_hf.py --noprogress` runs on each source as a fresh process, one at a time, interleaved (imports,
   bf16, kimi_k25, imports, bf16, kimi_k25, ...) so that a slow moment of a shared machine hurts every source
   alike. Per run: wall seconds of the whole command (Python start-up and imports included), CPU seconds and peak
   RSS of that process alone (`os.wait4` in a small launcher process: see `_LAUNCHER`). "imports" is
   `convert_hf.py --helpshort`, which exits after every import: the fixed cost inside each figure. Each converted
   checkpoint is deleted after its run.
3. The last line printed is one JSON object: per source its bytes on disk, the per-run and median seconds and peak
   RSS, the dtype the converted params (dequantized experts included) were stored in and the number of tensors
   dequantized from INT4; `ratios` per INT4 source over bf16 (time, peak RSS, bytes); `int4_dequantize_s`, the
   seconds `HfWeights` takes in this process to dequantize every INT4 weight of the kimi_k25 source to float32
   (the extra work of that path, without the converter's transposes and writes).

Sources are in the page cache when converted (just written), so the figures leave out a cold disk read.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import jax
import ml_dtypes
import numpy as np
import safetensors.numpy

from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_convert
from c2jax.model import hf_export
from c2jax.model import int4_pack
from c2jax.model import params as params_lib
from c2jax.model.config import ModelConfig
from c2jax.model.safetensors_io import INDEX_FILE, HfWeights, SafetensorsReader
from c2jax.model.safetensors_io import quantization_from_hf_config

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERT = os.path.join(_ROOT, "tools", "convert_hf.py")
GROUP_SIZE = 32  # the Kimi releases' INT4 group
BF16 = "bf16"
SOURCES = (BF16, "kimi_k25", "kimi_k2_thinking")
IMPORTS = "imports"
# The releases' ignore lists (Kimi K2.5 and Kimi K2 Thinking config.json): only routed experts are INT4.
K25_IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
              "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"]
K2_THINKING_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                      r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]
_ROUTED_EXPERT_RE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
_INT4_COUNT_RE = re.compile(r"(\d+) dequantized from INT4")
_BF16 = np.dtype(ml_dtypes.bfloat16)
_INT4_MAX = (1 << (int4_pack.NUM_BITS - 1)) - 1  # 7
_INT4_MIN = -(1 << (int4_pack.NUM_BITS - 1))  # -8


# Model and sources -----------------------------------------------------------------------------------------------


def model_config(*, d_model: int = 1024, n_layers: int = 8, first_k_dense_replace: int = 1,
                 n_routed_experts: int = 32, moe_intermediate_size: int = 256, n_shared_experts: int = 1,
                 vocab_size: int = 32000) -> ModelConfig:
  """A DeepSeek-V3-shaped BF16 model without MTP; the defaults are the ~270M model of docs/benchmarks.md.

  Attention and the dense MLP follow d_model: N = d_model / 64 heads of 64 + 32 (rope) dims, q rank d_model / 4,
  kv rank d_model / 8, dense width 2 * d_model.
  """
  for name, v in (("d_model", d_model), ("moe_intermediate_size", moe_intermediate_size)):
    if v % GROUP_SIZE:
      raise ValueError(f"--{name}={v} is not a multiple of {GROUP_SIZE}: the experts' INT4 groups cover "
                       f"{GROUP_SIZE} input columns, so pick a multiple of {GROUP_SIZE}.")
  return ModelConfig(
      vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=max(1, d_model // 64),
      q_lora_rank=d_model // 4, kv_lora_rank=d_model // 8, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
      intermediate_size=2 * d_model, moe_intermediate_size=moe_intermediate_size,
      n_routed_experts=n_routed_experts, n_shared_experts=n_shared_experts,
      num_experts_per_tok=min(4, n_routed_experts), first_k_dense_replace=first_k_dense_replace, num_mtp_layers=0,
      dtype="bfloat16", param_dtype="bfloat16")


def random_params(cfg: ModelConfig, seed: int = 0) -> Any:
  """Normal(0, 0.02) params of `cfg` in their stored dtypes (numpy: jax.random would compile a kernel per shape)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: (rng.standard_normal(a.shape, dtype=np.float32) * 0.02).astype(a.dtype),
                      params_lib.abstract_params(cfg))


def pack_int4(q: np.ndarray) -> np.ndarray:
  """int8 q [out, in] in [-8, 7] -> int32 [out, ceil(in / 8)]: the inverse of `int4_pack.unpack` (its bit layout)."""
  out, inp = q.shape
  words = -(-inp // int4_pack.VALUES_PER_WORD)
  u = np.zeros((out, words * int4_pack.VALUES_PER_WORD), np.uint8)  # padding columns are zero nibbles
  np.add(q, int4_pack.OFFSET, out=u[:, :inp], casting="unsafe")
  pairs = u.reshape(out, -1, 2)
  raw = pairs[..., 0] | (pairs[..., 1] << 4)  # byte b: column 2b low, 2b + 1 high; little-endian words
  return raw.view("<i4").reshape(out, words)


def quantize_int4(w: np.ndarray, group_size: int = GROUP_SIZE) -> tuple[np.ndarray, np.ndarray]:
  """compressed-tensors' symmetric group INT4 quantization of w [out, in] (BF16) -> (packed int32, scale BF16).

  As compressed-tensors computes it: scale = absmax of the group / 7.5 in float32 (0 replaced by float32's eps),
  rounded to BF16; q = clamp(round_half_even(w / scale), -8, 7), the quotient rounded to BF16 first (torch divides
  BF16 tensors in BF16).

  Returns:
    packed [out, ceil(in / 8)] int32 and scale [out, in / group_size] BF16.
  """
  out, inp = w.shape
  g = np.asarray(w, np.float32).reshape(out, inp // group_size, group_size)
  scale = np.abs(g).max(-1) / np.float32((_INT4_MAX - _INT4_MIN) / 2)
  scale[scale == 0] = np.finfo(np.float32).eps
  scale = scale.astype(_BF16)
  x = (g / scale.astype(np.float32)[..., None]).astype(_BF16).astype(np.float32)
  q = np.clip(np.rint(x), _INT4_MIN, _INT4_MAX).astype(np.int8).reshape(out, inp)
  return pack_int4(q), scale


def quantization_config(ignore: Sequence[str]) -> dict[str, Any]:
  """The releases' quantization_config: routed-expert Linears INT4 pack-quantized, symmetric, group 32."""
  return {
      "quant_method": int4_pack.QUANT_METHOD, "format": int4_pack.FORMAT, "quantization_status": "compressed",
      "config_groups": {"group_0": {
          "targets": ["Linear"], "input_activations": None, "output_activations": None,
          "weights": {"num_bits": int4_pack.NUM_BITS, "type": "int", "symmetric": True, "strategy": "group",
                      "group_size": GROUP_SIZE, "dynamic": False, "actorder": None, "observer": "minmax"}}},
      "ignore": list(ignore), "kv_cache_scheme": None, "sparsity_config": {},
  }


def write_bf16_source(params: Any, cfg: ModelConfig, out_dir: str, max_shard_size: str) -> None:
  """The HF DeepSeek-V3 BF16 checkpoint of `params` (router and its bias float32)."""
  hf_export.export_params(params, cfg, out_dir, dtype="bfloat16", max_shard_size=max_shard_size)


def _source_config(bf16_config: Mapping[str, Any], layout: str) -> dict[str, Any]:
  text = dict(bf16_config, model_type="kimi_k2")  # the releases' text model_type
  if layout == "kimi_k25":
    text["quantization_config"] = quantization_config(K25_IGNORE)
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
            "tie_word_embeddings": False}
  return dict(text, architectures=["DeepseekV3ForCausalLM"],
              quantization_config=quantization_config(K2_THINKING_IGNORE))


def write_int4_source(bf16_dir: str, out_dir: str, layout: str, max_shard_size: str) -> int:
  """Rewrites the BF16 checkpoint in `bf16_dir` as a Kimi release (`layout` kimi_k25 or kimi_k2_thinking).

  Tensors keep the BF16 checkpoint's order; routed experts become their three INT4 tensors. Shards hold at most
  `max_shard_size` bytes (one `model.safetensors` when everything fits, else shards and an index).

  Returns:
    the number of INT4 weights written.
  """
  if layout not in SOURCES[1:]:
    raise ValueError(f"layout {layout!r} is not one of {list(SOURCES[1:])}.")
  prefix = "language_model." if layout == "kimi_k25" else ""
  reader = SafetensorsReader(bf16_dir)
  names = sorted(reader.keys(), key=lambda n: (reader.info(n).file, reader.info(n).offset))
  entries, sizes = [], []  # (name in the source, quantized?), stored bytes
  for n in names:
    info = reader.info(n)
    if _ROUTED_EXPERT_RE.match(n):
      sizes.append(4 * math.prod(int4_pack.packed_shape(info.shape))
                   + 2 * math.prod(int4_pack.scale_shape(info.shape, GROUP_SIZE)) + 16)
      entries.append((n, True))
    else:
      sizes.append(info.nbytes)
      entries.append((n, False))
  limit = hf_export.parse_size(max_shard_size)
  shards, current, used = [], [], 0
  for e, size in zip(entries, sizes):
    if current and used + size > limit:
      shards.append(current)
      current, used = [], 0
    current.append(e)
    used += size
  shards.append(current)
  os.makedirs(out_dir, exist_ok=False)
  weight_map, total, n_int4 = {}, 0, 0
  for i, shard in enumerate(shards):
    file = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    tensors = {}
    for n, quantized in shard:
      w = reader.get(n)
      if quantized:
        packed, scale = quantize_int4(w)
        tensors[prefix + n + int4_pack.PACKED_SUFFIX] = packed
        tensors[prefix + n + int4_pack.SCALE_SUFFIX] = scale
        tensors[prefix + n + int4_pack.SHAPE_SUFFIX] = np.asarray(w.shape, np.int64)
        n_int4 += 1
      else:
        tensors[prefix + n] = np.ascontiguousarray(w)
    safetensors.numpy.save_file(tensors, os.path.join(out_dir, file), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(tensors, file))
    total += sum(t.nbytes for t in tensors.values())
    del tensors
  if len(shards) > 1:
    with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
  with open(os.path.join(bf16_dir, hf_export.CONFIG_FILE)) as f:
    bf16_config = json.load(f)
  with open(os.path.join(out_dir, hf_export.CONFIG_FILE), "w") as f:
    json.dump(_source_config(bf16_config, layout), f, indent=2)
  return n_int4


def check_packing_against_compressed_tensors(w: np.ndarray) -> None:
  """Raises unless `quantize_int4(w)` is compressed-tensors' own quantization and packing of w, bit for bit."""
  # torch and compressed-tensors only for this check (seconds of imports).
  from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
  from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
  from compressed_tensors.quantization.utils import calculate_qparams
  import torch

  scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
      num_bits=int4_pack.NUM_BITS, type="int", symmetric=True, strategy="group", group_size=GROUP_SIZE))
  t = torch.from_numpy(np.ascontiguousarray(w, _BF16).view(np.int16)).view(torch.bfloat16)
  groups = t.float().reshape(t.shape[0], -1, GROUP_SIZE)
  scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
  ref = PackedQuantizationCompressor.compress({"weight": t, "weight_scale": scale.bfloat16()}, scheme)
  packed, ours_scale = quantize_int4(w)
  ref_scale = ref["weight_scale"].view(torch.int16).numpy()
  if not (np.array_equal(packed, ref["weight_packed"].numpy()) and np.array_equal(ours_scale.view(np.int16),
                                                                                   ref_scale)):
    raise AssertionError("quantize_int4 differs from compressed-tensors' pack-quantized compression; the INT4 "
                         "source would not be what a release holds.")


def dir_bytes(directory: str) -> int:
  return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


# Measurement -----------------------------------------------------------------------------------------------------


# Started by the benchmark (a process of several hundred MB once torch and jax are in), this small process starts
# the measured command and reaps it. Linux carries a process's peak RSS across fork and exec (the child's peak starts
# at its parent's RSS at the fork), so the command must be forked from a small process to be measured on its own;
# wait4 then gives the rusage of that one child, not the maximum over all children so far of RUSAGE_CHILDREN.
_LAUNCHER = """
import json, os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, ru = os.wait4(pid, 0)
out = {"seconds": time.perf_counter() - start, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kib": ru.ru_maxrss,
       "returncode": os.waitstatus_to_exitcode(status)}
with open(sys.argv[1], "w") as f:
  json.dump(out, f)
"""


def run_measured(cmd: Sequence[str], log_path: str, ok_codes: Sequence[int] = (0,)) -> dict[str, float]:
  """Runs `cmd` to completion: wall seconds, CPU seconds and peak RSS (GB) of that process alone (`_LAUNCHER`).

  Output goes to `log_path`.
  """
  usage_path = log_path + ".usage.json"
  with open(log_path, "w") as log:
    subprocess.run([sys.executable, "-c", _LAUNCHER, usage_path, *cmd], stdout=log, stderr=subprocess.STDOUT,
                   cwd=_ROOT, check=True)
  with open(usage_path) as f:
    u = json.load(f)
  if u["returncode"] not in ok_codes:
    with open(log_path) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f"{' '.join(cmd)} exited with {u['returncode']}; its output ends with:\n{tail}")
  # ru_maxrss is in KiB on Linux.
  return {"seconds": u["seconds"], "cpu_s": u["cpu_s"], "peak_rss_gb": u["maxrss_kib"] * 1024 / 1e9}


def convert_command(src: str | None, out_dir: str | None, dtype: str | None) -> list[str]:
  """convert_hf.py on `src`; src None: --helpshort, which exits (status 1) once everything is imported."""
  if src is None:
    return [sys.executable, CONVERT, "--helpshort"]
  return [sys.executable, CONVERT, f"--hf_dir={src}", f"--out_dir={out_dir}", "--noprogress"] + (
      [f"--dtype={dtype}"] if dtype else [])


def summarize(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, dict[str, Any]]:
  """Per name: the per-run figures and their medians (median_s, median_cpu_s, median_peak_rss_gb)."""
  out = {}
  for name, rs in runs.items():
    out[name] = {k: [round(r[k], 3) for r in rs] for k in ("seconds", "cpu_s", "peak_rss_gb")}
    out[name].update(median_s=round(statistics.median(r["seconds"] for r in rs), 3),
                     median_cpu_s=round(statistics.median(r["cpu_s"] for r in rs), 3),
                     median_peak_rss_gb=round(statistics.median(r["peak_rss_gb"] for r in rs), 3))
  return out


def ratios(sources: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
  """Per INT4 source: its median seconds, median peak RSS and bytes over bf16's."""
  base = sources[BF16]
  return {name: {"time": round(s["median_s"] / base["median_s"], 3),
                 "peak_rss": round(s["median_peak_rss_gb"] / base["median_peak_rss_gb"], 3),
                 "bytes": round(s["bytes"] / base["bytes"], 3)}
          for name, s in sources.items() if name != BF16}


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())
  except OSError:
    return platform.machine()


def main(argv: Sequence[str]) -> None:  # noqa: C901
  from absl import flags

  del argv
  f = flags.FLAGS
  if BF16 not in f.sources or len(f.sources) < 2:
    raise ValueError(f"--sources={','.join(f.sources)} must hold bf16 and at least one INT4 layout (kimi_k25, "
                     "kimi_k2_thinking): the ratios are over bf16.")
  if f.repeats < 1:
    raise ValueError(f"--repeats={f.repeats} must be at least 1.")
  cfg = model_config(d_model=f.d_model, n_layers=f.n_layers, first_k_dense_replace=f.first_k_dense_replace,
                     n_routed_experts=f.n_routed_experts, moe_intermediate_size=f.moe_intermediate_size,
                     n_shared_experts=f.n_shared_experts, vocab_size=f.vocab_size)
  if cfg.n_moe_layers < 1:
    raise ValueError(f"--n_layers={f.n_layers} with --first_k_dense_replace={f.first_k_dense_replace} leaves no MoE "
                     "layer, so nothing would be INT4; raise --n_layers.")
  count = params_lib.count_params(cfg)
  routed = cfg.n_moe_layers * cfg.n_routed_experts * 3 * cfg.d_model * cfg.moe_intermediate_size
  workdir = f.workdir or tempfile.mkdtemp(prefix="bench_convert_")
  os.makedirs(workdir, exist_ok=True)
  load_start = [round(x, 2) for x in os.getloadavg()]
  print(f"model: {count.total:,} params ({routed:,} in routed experts), d_model {cfg.d_model}, {cfg.n_layers} "
        f"layers ({cfg.n_dense_layers} dense + {cfg.n_moe_layers} MoE of {cfg.n_routed_experts} experts, "
        f"F={cfg.moe_intermediate_size}, {cfg.n_shared_experts} shared), vocab {cfg.vocab_size}; load {load_start}",
        flush=True)

  t0 = time.perf_counter()
  dirs = {s: os.path.join(workdir, f"src_{s}") for s in f.sources}
  params = random_params(cfg, f.seed)
  write_bf16_source(params, cfg, dirs[BF16], f.max_shard_size)
  del params
  n_int4 = {}
  for s in f.sources:
    if s != BF16:
      n_int4[s] = write_int4_source(dirs[BF16], dirs[s], s, f.max_shard_size)
  if f.check_packing:
    first = next(n for n in SafetensorsReader(dirs[BF16]).keys() if _ROUTED_EXPERT_RE.match(n))
    check_packing_against_compressed_tensors(SafetensorsReader(dirs[BF16]).get(first))
  sizes = {s: dir_bytes(d) for s, d in dirs.items()}
  print(f"sources written in {time.perf_counter() - t0:.1f} s: "
        + ", ".join(f"{s} {sizes[s] / 1e9:.3f} GB" for s in f.sources)
        + (" (packing checked against compressed-tensors)" if f.check_packing else ""), flush=True)

  runs = {name: [] for name in (IMPORTS, *f.sources)}
  dtypes, int4_counts = {}, {}
  out_dir = os.path.join(workdir, "out")
  for r in range(f.repeats):
    runs[IMPORTS].append(run_measured(convert_command(None, None, None), os.path.join(workdir, f"imports_{r}.log"),
                                      ok_codes=(0, 1)))
    for s in f.sources:
      log = os.path.join(workdir, f"{s}_{r}.log")
      runs[s].append(run_measured(convert_command(dirs[s], out_dir, f.dtype), log))
      dtypes[s] = ckpt_lib.read_config(out_dir).param_dtype
      with open(log) as fh:
        m = _INT4_COUNT_RE.search(fh.read())
      int4_counts[s] = int(m.group(1)) if m else None
      shutil.rmtree(out_dir)
      print(f"repeat {r} {s:<16} {runs[s][-1]['seconds']:7.2f} s  cpu {runs[s][-1]['cpu_s']:7.2f} s  peak RSS "
            f"{runs[s][-1]['peak_rss_gb']:.3f} GB", flush=True)
  for s, n in n_int4.items():
    if int4_counts[s] != n:
      raise RuntimeError(f"the converter dequantized {int4_counts[s]} INT4 tensors of {s}, but the source holds {n}.")

  int4_src = next(s for s in f.sources if s != BF16)
  weights = HfWeights(dirs[int4_src], quantization_from_hf_config(hf_convert.read_hf_config(dirs[int4_src])))
  start = time.perf_counter()
  for n in weights.keys():
    if weights.is_int4(n):
      weights.get(n)
  dequantize_s = time.perf_counter() - start

  stats = summarize(runs)
  sources = {s: {"bytes": sizes[s], **stats[s], "dtype": dtypes[s], "int4_tensors": int4_counts[s]}
             for s in f.sources}
  result = {
      "model": {"params": count.total, "routed_expert_params": routed, "d_model": cfg.d_model,
                "n_layers": cfg.n_layers, "n_moe_layers": cfg.n_moe_layers, "n_routed_experts": cfg.n_routed_experts,
                "moe_intermediate_size": cfg.moe_intermediate_size, "vocab_size": cfg.vocab_size},
      "repeats": f.repeats, "dtype_flag": f.dtype, "experts_dtype": dtypes[int4_src],
      "imports": stats[IMPORTS], "sources": sources, "ratios": ratios(sources),
      "int4_dequantize_s": {int4_src: round(dequantize_s, 3)},
      "machine": {"cores": os.cpu_count(), "cpu": _cpu_name(), "load_avg_start": load_start,
                  "load_avg_end": [round(x, 2) for x in os.getloadavg()]},
  }
  print(f"\nmedians of {f.repeats} (imports {stats[IMPORTS]['median_s']:.2f} s, "
        f"{stats[IMPORTS]['median_peak_rss_gb']:.3f} GB):")
  for s in f.sources:
    x = sources[s]
    print(f"{s:<16} {x['bytes'] / 1e9:6.3f} GB on disk  {x['median_s']:7.2f} s  cpu {x['median_cpu_s']:7.2f} s  "
          f"peak RSS {x['median_peak_rss_gb']:.3f} GB  stored {x['dtype']}")
  for s, q in result["ratios"].items():
    print(f"{s} / bf16: time {q['time']:.2f}x, peak RSS {q['peak_rss']:.2f}x, bytes {q['bytes']:.2f}x")
  if f.workdir or f.keep:
    print(f"sources and logs kept in {workdir}")
  else:
    shutil.rmtree(workdir, ignore_errors=True)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  from absl import app
  from absl import flags

  flags.DEFINE_list("sources", [BF16, "kimi_k25"], f"Source layouts among {list(SOURCES)}; bf16 and one INT4 "
                    "layout at least.")
  flags.DEFINE_integer("repeats", 3, "Interleaved rounds (imports, then every source).")
  flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "convert_hf.py --dtype; default: its own default "
                    "(the checkpoint's bfloat16).")
  flags.DEFINE_integer("d_model", 1024, "Model width (a multiple of 32).")
  flags.DEFINE_integer("n_layers", 8, "Decoder layers.")
  flags.DEFINE_integer("first_k_dense_replace", 1, "Leading dense layers; the rest are MoE.")
  flags.DEFINE_integer("n_routed_experts", 32, "Routed experts per MoE layer.")
  flags.DEFINE_integer("moe_intermediate_size", 256, "Expert width F (a multiple of 32).")
  flags.DEFINE_integer("n_shared_experts", 1, "Shared experts per MoE layer.")
  flags.DEFINE_integer("vocab_size", 32000, "Vocabulary.")
  flags.DEFINE_integer("seed", 0, "Seed of the random params.")
  flags.DEFINE_string("max_shard_size", hf_export.DEFAULT_MAX_SHARD_SIZE, "Largest safetensors shard of every source.")
  flags.DEFINE_bool("check_packing", True, "Check the INT4 packing against compressed-tensors on one expert first "
                    "(imports torch).")
  flags.DEFINE_string("workdir", "", "Where sources and logs go (kept); empty: a temporary directory, deleted unless "
                      "--keep.")
  flags.DEFINE_bool("keep", False, "Keep the temporary directory.")
  app.run(main)
