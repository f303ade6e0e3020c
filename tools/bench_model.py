"""Training-step throughput of c2jax against HF transformers on this CPU, MFU, and the cost of more experts.

  .venv/bin/python tools/bench_model.py                      # tiny config, batch 8 x 256, ~2-4 min on 2 cores
  .venv/bin/python tools/bench_model.py --malloc_tuning      # glibc keeps freed memory (see the flag)
  .venv/bin/python tools/bench_model.py --c2jax_path=/tmp/candidate --experts_sweep=   # A/B a changed copy
  .venv/bin/python tools/bench_model.py --config=tiny --batch=4 --seq_len=512 --skip_hf
  XLA_FLAGS=--xla_cpu_multi_thread_eigen=false .venv/bin/python tools/bench_model.py   # try an XLA flag
  python tools/bench_model.py --model=configs/model/gpu_mid.py --dtype=bfloat16 --skip_hf --batch=4 \
      --seq_len=1024 --experts_sweep= --matmul_size=8192      # a GPU: MFU (as in tools/gpu_check.sh)
  make peer-maxtext && .venv/bin/python tools/bench_model.py --experts_sweep= --skip_hf --maxtext   # vs MaxText

Three measurements, all in one process so that they share the machine's state of the moment:

1. Throughput (tokens/s) of one training step (forward + backward + AdamW) of the same architecture and batch:
   c2jax's jitted `train_step` (float32, MTP off) against HF `DeepseekV3ForCausalLM` (eager PyTorch, float32,
   forward with labels + backward + `torch.optim.AdamW.step`; --dtype=bfloat16 times c2jax alone, as on a GPU).
   Repeats alternate c2jax, HF, c2jax, ... after warm-up, so that a slow phase of a shared machine hurts both
   sides alike; medians are reported, with the
   process CPU time per step (all threads), which other tenants of a shared machine disturb less than wall
   time. Weights are initialized independently with the same distribution (routing statistics, hence the MoE
   work, match). HF runs with its defaults (sdpa attention, grouped_mm experts), torch threads = available
   cores, and denormals flushed to zero as XLA:CPU does.
2. Achieved FLOP/s of each step as a fraction of a large jitted `jnp.dot` on the same CPU (the practical
   ceiling, best of samples taken between the repeats), with model FLOPs per step
     6 * P_active * B * T  +  6 * L * B * (T^2 / 2) * N * (H_qk + H_v)
   where P_active = `count_params(cfg).active` minus the input embedding (a gather, not a matmul); it still
   counts the LM head, the router and K of the E routed experts per MoE layer. The second term is causal
   attention (QK^T and PV, half of the T x T pairs, 2 FLOPs per multiply-add, x3 for forward + backward).
   Executed FLOPs differ (masked scores, recomputation, capacity padding); this counts the model's.
   MFU is the same model FLOP/s over the accelerator's published dense peak in the compute dtype (--peak_tflops,
   or `device_peak_tflops` of jax.devices()[0].device_kind: 989 TFLOP/s bf16 on H100 SXM and H200); null on CPU.
   --maxtext adds MaxText (an optional peer, `make peer-maxtext`: its own venv, .venv-maxtext) as a third
   interleaved side: tools/maxtext_step.py runs MaxText's jitted training step on the same architecture, batch and
   dtype (`maxtext_overrides`; MaxText's synthetic data, a fixed batch), in a subprocess of that venv that times
   each repeat itself (wall and its own CPU time) when asked. MaxText runs its best CPU setting: dense MoE matmuls
   (`sparse_matmul=False`: its ragged_dot and Pallas paths are slower on CPU, tokamax's fails there), no
   rematerialization, dot-product attention, unscanned layers. `peers` in the JSON lists the peers that ran,
   `maxtext.reason` why MaxText did not.
3. c2jax step time as the number of routed experts grows at fixed top-k (n_group = topk_group = 1), t(E) and
   t(E_max) / t(E_min): dispatch that does work proportional to K (not E) keeps this near 1.

The last line printed is one JSON object with every figure; a readable table precedes it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import select
import statistics
import subprocess
import tempfile
import sys
import time
import types
from typing import TYPE_CHECKING, Any

from absl import app
from absl import flags

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
  from c2jax.model.config import ModelConfig

# Tools run as scripts (`python tools/x.py`): the repo root holds `c2jax`. They are imported in
# main(), after flags, so that --c2jax_path can put a candidate checkout first; `_c2` holds the modules.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_c2 = types.SimpleNamespace()

_MODEL = flags.DEFINE_string("model", "tiny", "A model preset (c2jax.model.presets, e.g. tiny) or a .py file defining "
                             "get_model_config().")
_BATCH = flags.DEFINE_integer("batch", 8, "B, sequences per step.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "T, tokens per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per side (interleaved); medians are reported.")
_STEPS = flags.DEFINE_integer("steps_per_repeat", 3, "Training steps per timed repeat.")
_EXPERTS_SWEEP = flags.DEFINE_string("experts_sweep", "8,32,128", "Routed-expert counts for the c2jax scaling "
                                     "sweep at fixed top-k (empty: skip the sweep).")
_SWEEP_REPEATS = flags.DEFINE_integer("sweep_repeats", 3, "Timed repeats per expert count in the sweep.")
_SKIP_HF = flags.DEFINE_bool("skip_hf", False, "Time c2jax only (no torch / transformers needed).")
_MOE_DISPATCH = flags.DEFINE_enum("moe_dispatch", None, ["dense", "slots", "ragged", "auto"],
                                  "Override the config's moe_dispatch (default: keep the config's).")
_MATMUL_SIZE = flags.DEFINE_integer("matmul_size", 2048, "n of the n x n matmul (in --dtype) that measures the "
                                   "practical peak FLOP/s.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "c2jax's compute dtype (activations and "
                           "matmuls); bfloat16 times c2jax alone (--skip_hf), as on a GPU.")
_PARAM_DTYPE = flags.DEFINE_enum("param_dtype", "float32", ["float32", "bfloat16"], "c2jax's parameter (and AdamW "
                                 "moment) dtype; float32 with --dtype=bfloat16 is mixed precision.")
_PEAK_TFLOPS = flags.DEFINE_float("peak_tflops", None, "The accelerator's dense peak in --dtype, TFLOP/s, for `mfu` "
                                  "(default: known GPUs' bf16 peak from jax.devices()[0].device_kind, see "
                                  "device_peak_tflops; none on CPU).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and of the random token batch.")
_C2JAX_PATH = flags.DEFINE_string("c2jax_path", None, "A directory holding a candidate `c2jax` package to "
                                  "benchmark instead of this checkout's, e.g. a scratch copy.")
_MAXTEXT = flags.DEFINE_bool("maxtext", False, "Also time MaxText's training step on the same architecture "
                             "(interleaved), from --maxtext_python; absent there, the JSON says so and the run goes "
                             "on.")
_MAXTEXT_PYTHON = flags.DEFINE_string("maxtext_python", os.path.join(_ROOT, ".venv-maxtext", "bin", "python"),
                                      "The Python of MaxText's venv (`make peer-maxtext`).")
_MAXTEXT_OVERRIDES = flags.DEFINE_list("maxtext_overrides", [], "Extra MaxText config overrides (key=value, "
                                       "comma-separated), after the ones that match the c2jax config.")
_MAXTEXT_TIMEOUT = flags.DEFINE_integer("maxtext_timeout_s", 1200, "Seconds MaxText may take to set up and "
                                        "compile, and to answer one timed repeat.")
_MALLOC_TUNING = flags.DEFINE_bool(
    "malloc_tuning", False, "Keep freed memory in glibc's main heap (mallopt: one arena, no mmap, no trim) for "
    "both sides. XLA allocates each step's temp buffer afresh; above the mmap threshold (and always from a "
    "thread arena) that is a new mmap whose pages fault in on first touch, every step.")


def _import_c2jax() -> str:
  """Fills `_c2` from --c2jax_path when given, else this checkout; returns the directory it came from."""
  sys.path.insert(0, os.path.abspath(_C2JAX_PATH.value) if _C2JAX_PATH.value else _ROOT)
  _c2.config = importlib.import_module("c2jax.model.config")
  _c2.params = importlib.import_module("c2jax.model.params")
  _c2.presets = importlib.import_module("c2jax.model.presets")
  _c2.step = importlib.import_module("c2jax.pretrain.step")
  return os.path.abspath(os.path.join(os.path.dirname(_c2.config.__file__), "..", ".."))  # <root>/c2jax/model


def _tune_malloc():
  """mallopt(M_ARENA_MAX=1, M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB); must run before JAX and torch start threads."""
  import ctypes
  libc = ctypes.CDLL("libc.so.6")
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8
  ok = libc.mallopt(m_arena_max, 1) and libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)
  if not ok:
    raise RuntimeError("mallopt failed: run without --malloc_tuning (non-glibc libc?).")


# ------------------------------------------------------------------------------------------------------------------
# Config and FLOPs
# ------------------------------------------------------------------------------------------------------------------


def load_model_config(name: str) -> ModelConfig:
  """--model: a preset name or a .py file (`c2jax.model.presets.load`), from the c2jax under test."""
  if not hasattr(_c2, "presets"):
    if flags.FLAGS.is_parsed():
      _import_c2jax()
    else:  # imported by another tool (bench_sampler parses its own command line): this checkout's c2jax
      _c2.presets = importlib.import_module("c2jax.model.presets")
  return _c2.presets.load(name)


def bench_config(cfg: ModelConfig) -> ModelConfig:
  """The config both sides run: --dtype / --param_dtype (float32 by default), no MTP modules (HF's
  DeepseekV3ForCausalLM has none)."""
  cfg = cfg.replace(num_mtp_layers=0, dtype=_DTYPE.value, param_dtype=_PARAM_DTYPE.value)
  if _MOE_DISPATCH.value is not None:
    cfg = cfg.replace(moe_dispatch=_c2.config.MoeDispatch(_MOE_DISPATCH.value))
  return cfg


# Dense (no sparsity) bf16 / fp16 tensor-core peaks, TFLOP/s, by a substring of `device_kind`; first match wins.
_BF16_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))


def device_peak_tflops(device_kind: str, dtype: str) -> float | None:
  """The published dense peak of a known GPU in `dtype` (bfloat16 / float16 only), else None.

  H100 SXM and H200 share one compute die and clocks: 989 TFLOP/s dense bf16 (1979 is with 2:4 sparsity).
  """
  if dtype not in ("bfloat16", "float16"):
    return None
  return next((peak for name, peak in _BF16_PEAK_TFLOPS if name in device_kind), None)


def device_memory_bytes() -> tuple[int, str]:
  """(bytes, where): the first device's memory limit where jax reports one (GPUs), else this host's RAM."""
  stats = jax.devices()[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), jax.devices()[0].device_kind
  return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "host RAM"


def step_flops(cfg: ModelConfig, b: int, t: int) -> float:
  """Model FLOPs of one training step (see the module docstring for the formula)."""
  active = _c2.params.count_params(cfg).active - cfg.vocab_size * cfg.d_model  # the input embedding is a lookup
  attention = 6 * cfg.n_layers * b * (t * t / 2) * cfg.n_heads * (cfg.qk_head_dim + cfg.v_head_dim)
  return 6.0 * active * b * t + attention


# ------------------------------------------------------------------------------------------------------------------
# Timed runners: each is (warm-up, timed repeat) over a fixed batch; `repeat` runs `steps` steps and returns.
# ------------------------------------------------------------------------------------------------------------------


class C2jaxRunner:
  """The jitted, state-donating c2jax `train_step` on a fixed batch."""

  def __init__(self, cfg: ModelConfig, tokens: np.ndarray, seed: int):
    self.cfg = cfg
    self.hp = _c2.step.StepConfig(mtp_weight=0.0)
    self.batch = {"tokens": jnp.asarray(tokens, jnp.int32)}
    self.step = jax.jit(lambda s, b: _c2.step.train_step(s, b, cfg=cfg, hp=self.hp), donate_argnums=0)
    self.state = jax.jit(lambda k: _c2.step.init_state(cfg, self.hp, k))(jax.random.key(seed))
    self.compile_s = 0.0

  def warmup(self, steps: int = 3):
    """Compiles (timed as `compile_s`) and runs `steps` steps; `loss` is the first step's, a sanity check."""
    t0 = time.perf_counter()
    self.state, metrics = self.step(self.state, self.batch)
    jax.block_until_ready((self.state, metrics))
    self.compile_s = time.perf_counter() - t0
    self.loss = float(metrics["loss"])
    for _ in range(steps - 1):
      self.state, metrics = self.step(self.state, self.batch)
    jax.block_until_ready((self.state, metrics))

  def repeat(self, steps: int):
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch)
    jax.block_until_ready((self.state, metrics))


def hf_config_kwargs(cfg: ModelConfig, accepted: set[str]) -> dict[str, Any]:
  """`cfg.to_hf_dict()` restricted to what `DeepseekV3Config` accepts (e.g. drops model_type)."""
  kw = {k: v for k, v in cfg.to_hf_dict().items() if k in accepted}
  if "num_mtp_layers" in accepted:  # transformers 5 names the MTP depth so; keep it 0 like c2jax's side.
    kw["num_mtp_layers"] = 0
  return kw


class HfRunner:
  """HF DeepseekV3ForCausalLM in eager PyTorch: forward with labels, backward, AdamW step."""

  def __init__(self, cfg: ModelConfig, tokens: np.ndarray, seed: int, threads: int):
    import torch
    import transformers

    torch.set_num_threads(threads)
    # XLA:CPU runs with denormals flushed to zero; do the same so that tiny AdamW moments cost the same.
    torch.set_flush_denormal(True)
    torch.manual_seed(seed)
    accepted = set(inspect.signature(transformers.DeepseekV3Config.__init__).parameters) - {"self"}
    hf_cfg = transformers.DeepseekV3Config(**hf_config_kwargs(cfg, accepted))
    self.model = transformers.DeepseekV3ForCausalLM(hf_cfg).float().train()
    self.attn_implementation = self.model.config._attn_implementation
    self.experts_implementation = getattr(self.model.config, "_experts_implementation", None)
    # Same hyperparameters as c2jax's AdamW (the learning-rate schedule does not change the cost).
    hp = _c2.step.StepConfig().optim
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=hp.learning_rate, betas=(hp.b1, hp.b2), eps=hp.eps,
                                 weight_decay=hp.weight_decay)
    self.tokens = torch.from_numpy(tokens.astype(np.int64))
    self.threads = torch.get_num_threads()

  def _step(self):
    self.opt.zero_grad(set_to_none=True)
    out = self.model(input_ids=self.tokens, labels=self.tokens, use_cache=False)
    out.loss.backward()
    self.opt.step()
    return out.loss

  def warmup(self, steps: int = 3):
    """Runs `steps` steps (the first allocate AdamW state and pick kernels); `loss` is the first step's."""
    self.loss = float(self._step().detach())
    for _ in range(steps - 1):
      self._step()

  def repeat(self, steps: int):
    for _ in range(steps):
      self._step()


def maxtext_overrides(cfg: ModelConfig, b: int, t: int, hp=None) -> tuple[list[str], list[str]]:
  """MaxText (0.2.5) config overrides for the architecture, batch and dtype of `cfg`, and the differences that
  remain (in words): (key=value arguments of tools/maxtext_step.py, notes).

  The settings are MaxText's best on CPU: dense MoE matmuls (`sparse_matmul=False`, `megablox=False`; on the tiny
  preset its ragged_dot path took 1.7x as long, its Pallas grouped matmul runs interpreted at ~22 s/step, and
  tokamax's gmm refuses a CPU device), dropless (`capacity_factor=-1`, as c2jax; 1.25,
  which drops tokens, was no faster here), no rematerialization, dot-product attention, unscanned layers (about
  10% faster than scanned on the tiny preset, interleaved; c2jax unrolls its scan there).
  `hp` is c2jax's StepConfig (AdamW hyperparameters, router-bias update rate), default StepConfig().
  """
  hp = hp or _c2.step.StepConfig()
  opt, rope = hp.optim, cfg.rope
  kw: dict[str, Any] = {
      # Run: one CPU process, synthetic data, no checkpoints / tensorboard / goodput.
      "run_name": "c2jax_peer", "base_output_directory": os.path.join(tempfile.gettempdir(), "maxtext_peer"),
      "hardware": "cpu", "skip_jax_distributed_system": "true", "dataset_type": "synthetic", "steps": 1_000_000,
      "enable_checkpointing": "false", "enable_tensorboard": "false", "enable_goodput_recording": "false",
      "jax_cache_dir": "",  # no persistent compilation cache (its default, ~/jax_cache): compile_s as c2jax's
      "monitor_goodput": "false", "per_device_batch_size": b, "max_target_length": t,
      "dtype": cfg.dtype, "weight_dtype": cfg.param_dtype,
      # Architecture.
      "decoder_block": "deepseek", "vocab_size": cfg.vocab_size, "base_emb_dim": cfg.d_model,
      "base_num_decoder_layers": cfg.n_layers, "first_num_dense_layers": cfg.first_k_dense_replace,
      "base_num_query_heads": cfg.n_heads, "base_num_kv_heads": cfg.n_heads,
      "base_mlp_dim": cfg.intermediate_size, "base_moe_mlp_dim": cfg.moe_intermediate_size,
      "mlp_activations": '["silu","linear"]', "logits_via_embedding": "false", "enable_dropout": "false",
      "normalization_layer_epsilon": cfg.rms_norm_eps, "attention_bias": str(cfg.attention_bias).lower(),
      "attention_type": "mla", "q_lora_rank": cfg.q_lora_rank or 0, "kv_lora_rank": cfg.kv_lora_rank,
      "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
      "v_head_dim": cfg.v_head_dim, "num_experts": cfg.n_routed_experts,
      "num_experts_per_tok": cfg.num_experts_per_tok, "shared_experts": cfg.n_shared_experts,
      "routed_scaling_factor": cfg.routed_scaling_factor, "routed_score_func": "sigmoid", "routed_bias": "true",
      "routed_bias_update_rate": hp.bias_update_rate, "norm_topk_prob": str(cfg.norm_topk_prob).lower(),
      "n_routing_groups": cfg.n_group if cfg.n_group > 1 else -1,
      "topk_routing_group": cfg.topk_group if cfg.n_group > 1 else -1,
      "load_balance_loss_weight": 0.0, "mtp_num_layers": 0, "z_loss_multiplier": hp.z_loss_weight,
      "max_position_embeddings": cfg.max_position_embeddings, "rope_max_timescale": rope.theta,
      "rope_interleave": str(rope.layout.value == "interleaved").lower(),
      # Optimizer: AdamW as c2jax's (the schedule does not change the cost).
      "opt_type": "adamw", "learning_rate": opt.learning_rate, "adam_b1": opt.b1, "adam_b2": opt.b2,
      "adam_eps": opt.eps, "adam_weight_decay": opt.weight_decay, "gradient_clipping_threshold": opt.grad_clip,
      # MaxText's best CPU setting.
      "sparse_matmul": "false", "megablox": "false", "capacity_factor": -1, "remat_policy": "none",
      "attention": "dot_product", "scan_layers": "false",
  }
  if rope.type.value == "yarn":
    kw.update(rope_type="yarn", rope_factor=rope.factor,
              original_max_position_embeddings=rope.original_max_position_embeddings, beta_fast=rope.beta_fast,
              beta_slow=rope.beta_slow, mscale=rope.mscale, rope_truncate=str(rope.truncate).lower())
  else:
    kw["rope_type"] = "default"
  notes = [
      "MoE: MaxText's dense matmul (sparse_matmul=False, capacity_factor=-1) runs every token through all "
      f"{cfg.n_routed_experts} routed experts and masks the combine "
      f"({cfg.n_routed_experts / cfg.num_experts_per_tok:g}x "
      "the routed-expert FLOPs of the model); its sparse paths are slower or fail on CPU (measured on the tiny "
      "preset: ragged_dot 1.7x the dense step, the Pallas megablox kernel interpreted ~22 s/step, tokamax's gmm "
      "refuses a CPU device)",
      "weights: each side's own initializer (first-step losses differ); the batch: MaxText's synthetic tokens "
      "(random, like c2jax's), fixed",
      "optimizer: AdamW with c2jax's b1/b2/eps/weight decay/clipping; learning-rate schedules differ (no cost)",
  ]
  if rope.type.value not in ("yarn", "default"):
    notes.append(f"rope {rope.type.value}: MaxText runs default RoPE instead")
  if rope.type.value == "yarn" and rope.mscale_all_dim not in (0.0, rope.mscale):
    notes.append(f"yarn mscale_all_dim={rope.mscale_all_dim} has no MaxText key (its one `mscale` = {rope.mscale})")
  if cfg.dtype != cfg.param_dtype:
    notes.append(f"mixed precision: MaxText's dtype={cfg.dtype}, weight_dtype={cfg.param_dtype}")
  return [f"{k}={v}" for k, v in kw.items()], notes


class MaxtextRunner:
  """MaxText's training step in a subprocess of its venv (tools/maxtext_step.py), which times each repeat itself.

  `timed_repeat` returns that process's wall and CPU seconds per step (the parent only waits on a pipe).
  """

  def __init__(self, python: str, args: list[str], timeout_s: int):
    self.python, self.args, self.timeout_s = python, args, timeout_s
    self.log = tempfile.NamedTemporaryFile("w+", prefix="bench_model_maxtext_", suffix=".log", delete=False)
    self.proc = None
    self.info: dict[str, Any] = {}
    self.compile_s = 0.0

  def _read(self) -> dict[str, Any]:
    ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s)
    line = self.proc.stdout.readline() if ready else ""
    if not line:
      self.close()
      raise RuntimeError(f"MaxText gave no answer ({'timed out' if not ready else 'exited'}); log "
                         f"{self.log.name}:\n" + self.log_tail())
    return json.loads(line)

  def log_tail(self, n: int = 15) -> str:
    with open(self.log.name) as f:
      lines = [x for x in f.read().splitlines() if "rope_scaling" not in x]
    return "\n".join(lines[-n:])

  def warmup(self, steps: int = 3):
    """Starts the subprocess: setup, compile (`compile_s`) and 3 steps there; `loss` is the first step's."""
    del steps  # tools/maxtext_step.py runs 3 warm-up steps
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    self.proc = subprocess.Popen([self.python, os.path.join(_ROOT, "tools", "maxtext_step.py"), *self.args],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                 cwd=tempfile.gettempdir())
    self.info = self._read()
    if not self.info.get("ready"):
      self.close()
      raise RuntimeError(f"MaxText failed to start: {self.info.get('error')}; log {self.log.name}")
    self.compile_s = self.info["compile_s"]
    self.loss = self.info["first_loss"]

  def timed_repeat(self, steps: int) -> tuple[float, float]:
    self.proc.stdin.write(f"{steps}\n")
    self.proc.stdin.flush()
    out = self._read()
    return out["wall_s"], out["cpu_s"]

  def repeat(self, steps: int):
    self.timed_repeat(steps)

  def close(self):
    if self.proc is not None and self.proc.poll() is None:
      try:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)
      except (OSError, subprocess.TimeoutExpired):
        self.proc.kill()
        self.proc.wait()


def maxtext_status(python: str) -> str | None:
  """Why MaxText cannot run (None: it can)."""
  if not os.access(python, os.X_OK):
    return f"not installed: no {python} (make peer-maxtext)"
  return None


def matmul_flops_per_s(n: int, repeats: int = 10, dtype: str = "float32") -> float:
  """Best-of-`repeats` FLOP/s of a jitted n x n `jnp.dot` in `dtype` (2 n^3 FLOPs)."""
  a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(2), (n, n), jnp.float32).astype(dtype)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, b))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(dot(a, b))
    times.append(time.perf_counter() - t0)
  return 2.0 * n ** 3 / min(times)


def torch_matmul_flops_per_s(n: int, repeats: int = 10) -> float:
  """The same for `torch.mm` (oneDNN/MKL), to tell XLA's dot apart from the machine's ceiling."""
  import torch
  a, b = torch.randn(n, n), torch.randn(n, n)
  torch.mm(a, b)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    torch.mm(a, b)
    times.append(time.perf_counter() - t0)
  return 2.0 * n ** 3 / min(times)


def timed(runner, steps: int) -> tuple[float, float]:
  """(wall seconds, process CPU seconds of all threads) per step over one repeat of `steps` steps.

  CPU time is the steadier figure on a shared machine: other tenants stretch wall time, much less our CPU time.
  """
  if hasattr(runner, "timed_repeat"):  # a subprocess (MaxText) that times itself
    return runner.timed_repeat(steps)
  c0, t0 = time.process_time(), time.perf_counter()
  runner.repeat(steps)
  return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


def interleaved(runners: dict[str, Any], repeats: int, steps: int) -> tuple[dict, dict]:
  """Per-step wall and CPU seconds of each runner, alternating runners within each repeat."""
  wall: dict[str, list[float]] = {name: [] for name in runners}
  cpu: dict[str, list[float]] = {name: [] for name in runners}
  for _ in range(repeats):
    for name, runner in runners.items():
      w, c = timed(runner, steps)
      wall[name].append(w)
      cpu[name].append(c)
  return wall, cpu


def _available_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count() or 1


def _log(msg: str):
  print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------------


def _row(name: str, wall: list[float], cpu: list[float], tokens: int, flops: float, peak: float) -> tuple:
  """One table row: median wall ms, its range, median CPU ms, tokens/s, GFLOP/s, fraction of the matmul peak."""
  w = statistics.median(wall)
  return (name, f"{1e3 * w:.1f}", f"{1e3 * min(wall):.1f}..{1e3 * max(wall):.1f}",
          f"{1e3 * statistics.median(cpu):.1f}", f"{tokens / w:.0f}", f"{flops / w / 1e9:.2f}",
          f"{flops / w / peak:.1%}")


def _table(rows: list[tuple]) -> list[str]:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]


def main(argv):  # noqa: C901
  del argv
  if _MALLOC_TUNING.value:
    _tune_malloc()
  c2jax_root = _import_c2jax()
  b, t, steps = _BATCH.value, _SEQ_LEN.value, _STEPS.value
  if not _SKIP_HF.value and (_DTYPE.value, _PARAM_DTYPE.value) != ("float32", "float32"):
    raise ValueError(f"--dtype={_DTYPE.value} --param_dtype={_PARAM_DTYPE.value}: the HF side runs float32 only; "
                     "pass --skip_hf to time c2jax alone in other dtypes.")
  cfg = bench_config(load_model_config(_MODEL.value))
  tokens = np.random.default_rng(_SEED.value).integers(0, cfg.vocab_size, size=(b, t), dtype=np.int64)
  cores = _available_cores()
  flops = step_flops(cfg, b, t)
  pc = _c2.params.count_params(cfg)
  # Params, grads and two AdamW moments per side; a full-size config would only die of memory later.
  state_bytes = 4 * pc.total * jnp.dtype(cfg.param_dtype).itemsize
  need, (have, where) = state_bytes * (1 if _SKIP_HF.value else 2), device_memory_bytes()
  if need > have:
    raise ValueError(f"--model={_MODEL.value} has {pc.total / 1e9:.2f}B params: training it here needs about "
                     f"{need / 2**30:.0f} GiB of {have / 2**30:.0f} GiB ({where}); use a smaller model (e.g. tiny).")
  device_kind = jax.devices()[0].device_kind
  peak_tflops = _PEAK_TFLOPS.value or device_peak_tflops(device_kind, cfg.dtype)
  _log(f"model {_MODEL.value} (c2jax from {c2jax_root}): {pc.total / 1e6:.3f}M params, {pc.active / 1e6:.3f}M "
       f"active; {cfg.dtype} compute, {cfg.param_dtype} params; B={b} T={t}; {cores} cores; jax {jax.__version__} "
       f"({jax.default_backend()}: {device_kind}, {have / 2**30:.1f} GiB); "
       f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; malloc_tuning={_MALLOC_TUNING.value}")

  # 1. Throughput, interleaved; the matmul ceiling is sampled between repeats so that it sees the same machine.
  runners: dict[str, Any] = {"c2jax": C2jaxRunner(cfg, tokens, _SEED.value)}
  if not _SKIP_HF.value:
    runners["hf"] = HfRunner(cfg, tokens, _SEED.value, cores)
  # MaxText, an optional peer: absent or failing, the JSON says why (`maxtext.reason`) and the run goes on.
  maxtext: dict[str, Any] = {"requested": _MAXTEXT.value, "ran": False}
  if _MAXTEXT.value:
    maxtext["reason"] = maxtext_status(_MAXTEXT_PYTHON.value)
    if maxtext["reason"] is None:
      mt_args, maxtext["differences"] = maxtext_overrides(cfg, b, t)
      mt_args += _MAXTEXT_OVERRIDES.value
      maxtext["overrides"] = mt_args
      runners["maxtext"] = MaxtextRunner(_MAXTEXT_PYTHON.value, mt_args, _MAXTEXT_TIMEOUT.value)
      maxtext["log"] = runners["maxtext"].log.name
    else:
      _log(f"maxtext: {maxtext['reason']}")

  def drop_maxtext(e: Exception):
    maxtext["reason"] = f"failed: {e}"
    _log(f"maxtext {maxtext['reason']}")
    runners.pop("maxtext").close()

  for name, runner in list(runners.items()):
    t0 = time.perf_counter()
    try:
      runner.warmup()
    except RuntimeError as e:
      if name != "maxtext":
        raise
      drop_maxtext(e)
      continue
    _log(f"warm-up {name}: {time.perf_counter() - t0:.1f}s")
  wall: dict[str, list[float]] = {name: [] for name in runners}
  cpu: dict[str, list[float]] = {name: [] for name in runners}
  peaks = []
  for _ in range(_REPEATS.value):
    for name, runner in list(runners.items()):  # interleaved: c2jax, hf, maxtext, c2jax, ...
      try:
        w, c = timed(runner, steps)
      except RuntimeError as e:
        if name != "maxtext":
          raise
        drop_maxtext(e)
        del wall[name], cpu[name]
        continue
      wall[name].append(w)
      cpu[name].append(c)
      if name == "c2jax":  # measured so far, for a caller that may stop this run (tools/gpu_check.sh's timeouts)
        tflop_s = flops / statistics.median(wall[name]) / 1e12
        print(json.dumps({"partial": {"c2jax_tflop_s": round(tflop_s, 3), "repeats_done": len(wall[name]),
                                      "mfu": round(tflop_s / peak_tflops, 4) if peak_tflops else None}}), flush=True)
    peaks.append(matmul_flops_per_s(_MATMUL_SIZE.value, repeats=3, dtype=cfg.dtype))
  if "maxtext" in runners:
    maxtext["ran"] = True
    mt = runners["maxtext"]
    mt.close()  # frees its memory and threads before the sweep
    maxtext.update(version=mt.info.get("maxtext_version"), jax_version=mt.info.get("jax_version"),
                   backend=mt.info.get("backend"), params=mt.info.get("params"),
                   params_match=mt.info.get("params") == pc.total, setup_s=mt.info.get("setup_s"))
  peak = max(peaks)
  torch_peak = None if _SKIP_HF.value else torch_matmul_flops_per_s(_MATMUL_SIZE.value)
  med = {name: statistics.median(ws) for name, ws in wall.items()}
  med_cpu = {name: statistics.median(cs) for name, cs in cpu.items()}
  tok_s = {name: b * t / s for name, s in med.items()}
  achieved = {name: flops / s for name, s in med.items()}

  # 2. Expert-count sweep (c2jax only; n_group = 1 so that any E is a valid config), also interleaved.
  experts = [int(x) for x in _EXPERTS_SWEEP.value.split(",") if x.strip()]
  sweep_runners = {}
  for e in experts:
    ecfg = cfg.replace(n_routed_experts=e, n_group=1, topk_group=1, num_experts_per_tok=min(cfg.num_experts_per_tok, e))
    sweep_runners[e] = C2jaxRunner(ecfg, tokens, _SEED.value)
    sweep_runners[e].warmup()
  sweep_wall, sweep_cpu = interleaved(sweep_runners, _SWEEP_REPEATS.value, steps) if experts else ({}, {})
  sweep = {e: statistics.median(ws) for e, ws in sweep_wall.items()}
  e_lo, e_hi = (min(experts), max(experts)) if experts else (None, None)
  sweep_ratio = sweep[e_hi] / sweep[e_lo] if len(sweep) > 1 else None

  rows = [("", "wall ms/step", "min..max", "CPU ms/step", "tok/s", "GFLOP/s", "of jnp.dot")]
  rows += [_row(name, wall[name], cpu[name], b * t, flops, peak) for name in runners]
  rows += [_row(f"c2jax E={e}", sweep_wall[e], sweep_cpu[e], b * t, step_flops(sweep_runners[e].cfg, b, t), peak)
           for e in experts]
  lines = _table(rows)
  lines.append(f"model FLOPs/step {flops / 1e9:.3f} G; jnp.dot {_MATMUL_SIZE.value}^2 {cfg.dtype} "
               f"{peak / 1e9:.1f} GFLOP/s "
               f"(best of {len(peaks)} samples)" + ("" if torch_peak is None else f", torch.mm {torch_peak / 1e9:.1f}"))
  lines.append(f"c2jax: compile {runners['c2jax'].compile_s:.1f}s, dispatch {cfg.moe_dispatch.value}, "
               f"E={cfg.n_routed_experts} K={cfg.num_experts_per_tok}, first-step loss {runners['c2jax'].loss:.4f}")
  if "hf" in runners:
    hf = runners["hf"]
    lines.append(f"hf: attn={hf.attn_implementation} experts={hf.experts_implementation} threads={hf.threads}, "
                 f"first-step loss {hf.loss:.4f}; "
                 f"c2jax/hf tok/s ratio {tok_s['c2jax'] / tok_s['hf']:.2f} "
                 f"(by CPU time {med_cpu['hf'] / med_cpu['c2jax']:.2f})")
  if "maxtext" in runners:
    mt = runners["maxtext"]
    lines.append(f"maxtext {maxtext['version']} (jax {maxtext['jax_version']}): {maxtext['params']:,} params "
                 f"(c2jax {pc.total:,}{'' if maxtext['params_match'] else ': MISMATCH'}), compile {mt.compile_s:.1f}s, "
                 f"first-step loss {mt.loss:.4f}; c2jax/maxtext tok/s ratio {tok_s['c2jax'] / tok_s['maxtext']:.2f} "
                 f"(by CPU time {med_cpu['maxtext'] / med_cpu['c2jax']:.2f})")
    lines += [f"  maxtext differs: {note}" for note in maxtext["differences"]]
  elif _MAXTEXT.value:
    lines.append(f"maxtext did not run: {maxtext['reason']}")
  mfu = achieved["c2jax"] / (peak_tflops * 1e12) if peak_tflops else None
  lines.append(f"c2jax MFU {mfu:.1%} of {device_kind}'s {peak_tflops:g} TFLOP/s dense {cfg.dtype} peak" if mfu else
               f"MFU not computed: no known {cfg.dtype} peak for {device_kind!r} (--peak_tflops gives one)")
  if sweep_ratio:
    lines.append(f"experts sweep at K={cfg.num_experts_per_tok}: t({e_hi})/t({e_lo}) = {sweep_ratio:.2f}")
  print("\n".join(lines), flush=True)

  def ms(x):
    return None if x is None else round(1e3 * x, 2)

  has_hf, has_mt = "hf" in runners, "maxtext" in runners
  result = {
      "peers": [name for name in runners if name != "c2jax"],
      "maxtext_tok_s": round(tok_s["maxtext"], 1) if has_mt else None,
      "ratio_vs_maxtext": round(tok_s["c2jax"] / tok_s["maxtext"], 3) if has_mt else None,
      "ratio_vs_maxtext_cpu_time": round(med_cpu["maxtext"] / med_cpu["c2jax"], 3) if has_mt else None,
      "maxtext_ms_per_step": ms(med.get("maxtext")),
      "maxtext_cpu_ms_per_step": ms(med_cpu.get("maxtext")),
      "maxtext_ms_all": [ms(x) for x in wall["maxtext"]] if has_mt else None,
      "maxtext_params": maxtext.get("params"),
      "maxtext_compile_s": round(runners["maxtext"].compile_s, 2) if has_mt else None,
      "maxtext_first_loss": round(runners["maxtext"].loss, 4) if has_mt else None,
      "maxtext": maxtext,
      "c2jax_tok_s": round(tok_s["c2jax"], 1),
      "hf_tok_s": round(tok_s["hf"], 1) if has_hf else None,
      "ratio": round(tok_s["c2jax"] / tok_s["hf"], 3) if has_hf else None,
      "ratio_cpu_time": round(med_cpu["hf"] / med_cpu["c2jax"], 3) if has_hf else None,
      "c2jax_ms_per_step": ms(med["c2jax"]),
      "hf_ms_per_step": ms(med.get("hf")),
      "c2jax_cpu_ms_per_step": ms(med_cpu["c2jax"]),
      "hf_cpu_ms_per_step": ms(med_cpu.get("hf")),
      "c2jax_ms_all": [ms(x) for x in wall["c2jax"]],
      "hf_ms_all": [ms(x) for x in wall["hf"]] if has_hf else None,
      "model_gflops_per_step": round(flops / 1e9, 4),
      "c2jax_gflop_s": round(achieved["c2jax"] / 1e9, 2),
      "hf_gflop_s": round(achieved["hf"] / 1e9, 2) if has_hf else None,
      "matmul_gflop_s": round(peak / 1e9, 2),
      "torch_matmul_gflop_s": round(torch_peak / 1e9, 2) if torch_peak else None,
      "c2jax_fraction_of_matmul": round(achieved["c2jax"] / peak, 4),
      "c2jax_tflop_s": round(achieved["c2jax"] / 1e12, 3),
      "mfu": round(mfu, 4) if mfu else None, "peak_tflops": peak_tflops, "device_kind": device_kind,
      "backend": jax.default_backend(), "dtype": cfg.dtype, "param_dtype": cfg.param_dtype,
      "device_memory_gib": round(have / 2**30, 1),
      "hf_fraction_of_matmul": round(achieved["hf"] / peak, 4) if has_hf else None,
      "experts_sweep_ms": {str(e): ms(s) for e, s in sweep.items()},
      "experts_sweep_ratio": round(sweep_ratio, 3) if sweep_ratio else None,
      "model": _MODEL.value, "batch": b, "seq_len": t, "steps_per_repeat": steps, "repeats": _REPEATS.value,
      "moe_dispatch": cfg.moe_dispatch.value, "n_routed_experts": cfg.n_routed_experts,
      "num_experts_per_tok": cfg.num_experts_per_tok, "active_params": pc.active, "total_params": pc.total,
      "c2jax_compile_s": round(runners["c2jax"].compile_s, 2), "cores": cores,
      "c2jax_first_loss": round(runners["c2jax"].loss, 4),
      "hf_first_loss": round(runners["hf"].loss, 4) if has_hf else None,
      "malloc_tuning": _MALLOC_TUNING.value, "c2jax_path": c2jax_root,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
