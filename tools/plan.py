"""Plan a training run on a mesh: per-device memory, FLOPs and communication of the full-size train step.

  .venv/bin/python tools/plan.py --model=kimi_k25 --mesh=fsdp:64,expert:64,context:4 \
      --seq_len=32768                   # minutes on 2 cores (docs/benchmarks.md); ends with a JSON line
  .venv/bin/python tools/plan.py --mesh=fsdp:16,expert:64,context:2 --seq_len=65536 --nocompile    # ~1 min
  .venv/bin/python tools/plan.py --mesh=fsdp:32,expert:64 --seq_len=32768 --nolower --nocompile   # analytic only
  .venv/bin/python tools/plan.py --mesh=... --fused_attention     # what-if: no materialized score blocks

Three sources, always labelled:

  analytic   `c2jax.parallel.plan`: parameters / AdamW state / gradients from the layout's shardings, activations
             itemized per layer, FLOPs per token (6 N_active and the model's matmul + attention FLOPs), and the
             bytes of every collective per step. Pure Python, for the requested mesh.
  lowered    `trainer.step.lower(...)` of the real train step (`c2jax.pretrain.sharded.make_trainer`) on the requested
             mesh of fake CPU devices: proves that the layout, shard_map specs and shapes hold at full size; counts
             the explicit collectives (expert all-to-all, context all-gather) in the StableHLO.
  compiled   XLA:CPU compiles one mesh of at most 2048 devices (the most one XLA:CPU computation may span). When
             the requested mesh is larger, the tool compiles a proxy that keeps expert, context and tensor (so
             per-device activations, token counts, expert buffers, all-to-all and context traffic are the same)
             and shrinks data then fsdp (which change only the shard counts of parameters and optimizer state,
             and ring factors (g-1)/g); the analytic model is printed for the proxy too, so that the two can be
             compared like for like, and the requested mesh's parameter bytes scale exactly. From the compile:
             - XLA's buffer assignment (argument bytes = parameters + optimizer state + batch, temp bytes = the
               rest), read from the dump as soon as the buffer assignment exists, and `memory_analysis` /
               `cost_analysis` if the whole compile (LLVM code generation included, 3-6 min for Kimi K2.5) ends
               before --deadline_s;
             - collectives and matmul FLOPs from the HLO right after SPMD partitioning, multiplied by loop trip
               counts (`hlo_stats.hlo_collectives`, `hlo_stats.hlo_dot_flops`). This HLO keeps the program's
               dtypes; XLA:CPU's later passes compute bf16 in float32 (its final HLO shows twice the bytes), and
               XLA:GPU's later passes (reduce-scatter creation, combiners) are not applied, so gradient all-reduces
               of gathered weights appear there as all-reduce + slice rather than reduce-scatter.

XLA:CPU memory is not GPU memory: CPU buffer assignment keeps bf16 intermediates in float32 and schedules
differently, so its temp bytes overstate a GPU's; the analytic activation figures are the planning numbers and
the CPU figure is a check on their order of magnitude (in particular of the attention score blocks).

The last line printed is one JSON object (also written to --json_out).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

_MODEL = flags.DEFINE_string("model", "kimi_k25", "A model preset (c2jax.model.presets) or a .py file defining "
                             "get_model_config().")
_MESH = flags.DEFINE_string("mesh", "fsdp:64,expert:64,context:4", "Mesh, axis:size items from data, fsdp, expert, "
                            "context, tensor.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 32768, "T, tokens per sequence.")
_BATCH_PER_DEVICE = flags.DEFINE_integer("batch_per_device", 1, "Sequences per batch shard (per data x fsdp x expert "
                                         "coordinate); the global batch is this times data x fsdp x expert.")
_GLOBAL_BATCH = flags.DEFINE_integer("global_batch", None, "B, sequences per step (overrides --batch_per_device).")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Compute dtype (default: the config's).")
_PARAM_DTYPE = flags.DEFINE_enum("param_dtype", None, ["float32", "bfloat16"], "Parameter (and AdamW moment) dtype "
                                 "(default: the config's).")
_REMAT = flags.DEFINE_enum("remat", "full", ["none", "full", "dots_saveable"], "Rematerialization of each decoder "
                           "block (a 1T-parameter run needs full).")
_MTP = flags.DEFINE_bool("mtp", True, "Train the MTP modules (mtp_weight > 0), as the long-context and SFT phases do.")
_FUSED_ATTENTION = flags.DEFINE_bool("fused_attention", False, "Analytic what-if: no materialized attention score "
                                     "blocks (a flash kernel); c2jax's attention does materialize them.")
_LOWER = flags.DEFINE_bool("lower", True, "Lower the real train step on the requested mesh of fake CPU devices.")
_COMPILE = flags.DEFINE_bool("compile", True, "Compile (the requested mesh, or a proxy of at most "
                             "--max_compile_devices devices) for XLA's memory and collective figures.")
_MAX_COMPILE_DEVICES = flags.DEFINE_integer("max_compile_devices", 2048, "Largest mesh XLA:CPU compiles (2048 is its "
                                            "limit for one computation).")
_COMPILE_MESH = flags.DEFINE_string("compile_mesh", None, "Compile this mesh instead of the automatic proxy.")
_DEADLINE = flags.DEFINE_integer("deadline_s", 480, "Stop waiting for the full compile this many seconds after the "
                                 "start (XLA's buffer assignment, read from the dump, usually exists long before).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the final JSON object to this file.")
_KEEP_DUMP = flags.DEFINE_string("keep_dump", None, "Copy XLA's HLO dumps of the train step to this directory.")

GiB = float(1 << 30)


def proxy_mesh(target, max_devices: int):
  """The compile mesh: `target` with data, then fsdp, halved until it fits in `max_devices` (None if it cannot)."""
  from c2jax.parallel.mesh import MeshConfig
  sizes = dict(target.shape)
  for axis in ("data", "fsdp"):
    while math.prod(sizes.values()) > max_devices and sizes[axis] > 1:
      sizes[axis] = sizes[axis] // 2 if sizes[axis] % 2 == 0 else 1
  if math.prod(sizes.values()) > max_devices:
    return None
  return MeshConfig(**sizes)


def _g(x: float) -> str:
  """Bytes in GiB, or in MiB / KiB when small (tiny configs)."""
  for unit, size in (("GiB", GiB), ("MiB", 2.0**20)):
    if abs(x) >= 0.1 * size:
      return f"{x / size:9.2f} {unit}"
  return f"{x / 1024:9.2f} KiB"


def _print_analytic(title: str, a: dict):
  print(f"\n== {title} ==")
  print(f"  per device: b={a['local_batch']} sequences x t={a['local_seq']} tokens = {a['local_tokens']} tokens; "
        f"{a['local_params'] / 1e9:.3f}B parameters")
  print(f"  params               {_g(a['param_bytes'])}")
  print(f"  AdamW mu, nu         {_g(a['optimizer_bytes'])}   (param dtype, as optax.adamw keeps them; no f32 master)")
  print(f"  grads                {_g(a['grad_bytes'])}")
  print(f"  [f32 master+mu+nu    {_g(a['f32_recipe_optimizer_bytes'])}   the usual mixed-precision recipe, for "
        "comparison]")
  print(f"  activations saved    {_g(a['activation_saved_bytes'])}   (layer factor {a['layer_factor_saved']:.2f} x "
        f"n D dt per layer; {a['layer_factor_none']:.1f} without remat)")
  print(f"  one layer's bwd      {_g(a['activation_layer_working_bytes'])}")
  print(f"  attention scores     {_g(a['attention_scores_bytes'])}   (f32 blocks this implementation materializes)")
  print(f"  EP slot buffers      {_g(a['moe_buffer_bytes'])}")
  print(f"  logits + grad (f32)  {_g(a['logits_bytes'])}")
  print(f"  activation peak      {_g(a['activation_peak_bytes'])}")
  print(f"  TOTAL peak           {_g(a['total_peak_bytes'])}")
  print(f"  FLOPs/token: 6 N_active = {a['flops_per_token_nominal_6n']:.4g} (N_active "
        f"{a['active_params'] / 1e9:.2f}B); model {a['flops_per_token_model']:.4g} = matmul "
        f"{a['flops_per_token_dense']:.4g} + attention {a['flops_per_token_attention']:.4g}; executed "
        f"{a['flops_per_token_executed']:.4g}")
  print(f"  FLOPs/device/step: model {a['flops_per_device_step_model']:.4g}, executed "
        f"{a['flops_per_device_step_executed']:.4g}")
  print("  bytes sent per device per step:")
  for k, v in sorted(a["comm_bytes_items"].items(), key=lambda kv: -kv[1]):
    print(f"    {_g(v)}  {k}")
  print("    by kind: " + ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in sorted(a["comm_bytes_by_kind"].items())))


def _stablehlo_collectives(text: str) -> dict[str, int]:
  return {k: text.count(f'"stablehlo.{k}"') for k in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce",
                                                       "collective_permute")}


def main(argv):  # noqa: C901
  del argv
  t_start = time.time()
  from c2jax.model import presets
  cfg = presets.load(_MODEL.value)
  from c2jax.model.config import Remat
  from c2jax.parallel import hlo_stats
  from c2jax.parallel import plan as plan_lib
  from c2jax.parallel.mesh import MeshConfig

  cfg = cfg.replace(remat=Remat(_REMAT.value), **({"dtype": _DTYPE.value} if _DTYPE.value else {}),
                    **({"param_dtype": _PARAM_DTYPE.value} if _PARAM_DTYPE.value else {}))
  target = MeshConfig.parse(_MESH.value)
  global_batch = _GLOBAL_BATCH.value or _BATCH_PER_DEVICE.value * target.batch_shards
  per_shard = global_batch // target.batch_shards
  work = plan_lib.Workload(global_batch=global_batch, seq_len=_SEQ_LEN.value, with_mtp=_MTP.value and
                           cfg.num_mtp_layers > 0, fused_attention=_FUSED_ATTENTION.value)
  print(f"model {_MODEL.value}: {cfg.n_layers} layers ({cfg.n_dense_layers} dense), E={cfg.n_routed_experts} K="
        f"{cfg.num_experts_per_tok}, D={cfg.d_model}, dtype {cfg.dtype}, params {cfg.param_dtype}, remat "
        f"{cfg.remat.value}, MTP {'on' if work.with_mtp else 'off'}")
  print(f"mesh {target} ({target.num_devices} devices), global batch {global_batch} x {work.seq_len} tokens = "
        f"{global_batch * work.seq_len / 1e6:.1f}M tokens per step")
  analytic = plan_lib.analytic_plan(cfg, target.shape, work)
  _print_analytic(f"ANALYTIC, requested mesh {target}", analytic)
  out = {"model": _MODEL.value, "mesh": str(target), "devices": target.num_devices, "seq_len": work.seq_len,
         "global_batch": global_batch, "remat": cfg.remat.value, "dtype": cfg.dtype, "param_dtype": cfg.param_dtype,
         "mtp": work.with_mtp, "fused_attention_what_if": work.fused_attention, "analytic": analytic}

  compile_mesh = None
  if _COMPILE.value:
    compile_mesh = (MeshConfig.parse(_COMPILE_MESH.value) if _COMPILE_MESH.value
                    else proxy_mesh(target, _MAX_COMPILE_DEVICES.value))
    if compile_mesh is None:
      print(f"\nNo mesh of <= {_MAX_COMPILE_DEVICES.value} devices keeps expert x context x tensor of {target}; "
            "not compiling (use --compile_mesh).")
  need = max(target.num_devices if _LOWER.value else 0, compile_mesh.num_devices if compile_mesh else 0)
  if not need:
    _finish(out, t_start)
    return
  dump_dir = tempfile.mkdtemp(prefix="c2jax_plan_") if compile_mesh else None
  xla_flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={need}"]
  if dump_dir:
    xla_flags += [f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_pass_re=spmd-partitioning"]
  os.environ["XLA_FLAGS"] = " ".join(f for f in xla_flags if f)

  import jax
  import jax.numpy as jnp
  from c2jax.pretrain import sharded as train_lib
  from c2jax.parallel.mesh import make_mesh
  from c2jax.pretrain.step import StepConfig

  hp = StepConfig(mtp_weight=0.3 if work.with_mtp else 0.0)
  t0 = time.time()
  devices = jax.devices()
  timings = {"devices_s": time.time() - t0}
  print(f"\n{len(devices)} fake CPU devices in {timings['devices_s']:.0f} s", flush=True)

  def lower(mesh_cfg, batch):
    mesh = make_mesh(mesh_cfg, devices[:mesh_cfg.num_devices])
    trainer = train_lib.make_trainer(cfg, hp, mesh, batch_size=batch, seq_len=work.seq_len)
    state = train_lib.abstract_state(cfg, hp, trainer.state_shardings)
    tokens = jax.ShapeDtypeStruct((batch, work.seq_len), jnp.int32, sharding=trainer.batch_sharding)
    return trainer.step.lower(state, {"tokens": tokens})

  if _LOWER.value:
    t0 = time.time()
    lowered = lower(target, global_batch)
    timings["lower_s"] = time.time() - t0
    text = lowered.as_text()
    static = _stablehlo_collectives(text)
    print(f"== LOWERED, requested mesh {target}: the train step lowers at full size in {timings['lower_s']:.0f} s; "
          f"explicit (shard_map) collectives in the StableHLO, static counts: {static} ==", flush=True)
    out["lowered"] = {"mesh": str(target), "stablehlo_chars": len(text), "static_collectives": static}
    del text

  if compile_mesh is not None:
    proxy_batch = per_shard * compile_mesh.batch_shards
    proxy_work = dataclasses.replace(work, global_batch=proxy_batch)
    same = compile_mesh == target and _LOWER.value
    note = "the requested mesh" if compile_mesh == target else (
        "proxy of the requested mesh (same expert, context, tensor and per-device batch; data/fsdp shrunk)")
    print(f"\nCompiling {compile_mesh} ({compile_mesh.num_devices} devices, {note}) ...", flush=True)
    t0 = time.time()
    low = lowered if same else lower(compile_mesh, proxy_batch)
    result: dict = {}

    def run():
      try:
        result["compiled"] = low.compile()
      except Exception as e:  # noqa: BLE001  (reported below; the dump may still hold what we need)
        result["error"] = repr(e)
      result["seconds"] = time.time() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = t_start + _DEADLINE.value
    while thread.is_alive() and time.time() < deadline:
      thread.join(5)
    # XLA writes the memory-usage report after the buffer assignment: its presence means the latter is complete.
    buffers = sorted((f for f in glob.glob(os.path.join(dump_dir, "*cpu_after_optimizations-buffer-assignment.txt"))
                      if os.path.exists(f.replace("-buffer-assignment.txt", "-memory-usage-report.txt"))),
                     key=os.path.getsize)
    spmd = sorted(glob.glob(os.path.join(dump_dir, "*after_spmd-partitioning*.txt")), key=os.path.getsize)
    xla: dict = {"mesh": str(compile_mesh), "devices": compile_mesh.num_devices, "global_batch": proxy_batch,
                 "compile_finished": "compiled" in result, "compile_s": result.get("seconds")}
    if "error" in result:
      xla["compile_error"] = result["error"][:500]
    print(f"== COMPILED (XLA:CPU), mesh {compile_mesh}: " + (
        f"compile finished in {result['seconds']:.0f} s" if "seconds" in result else
        f"compile still running at the deadline ({time.time() - t0:.0f} s); figures from the HLO dumps") + " ==")
    if "compiled" in result:
      ma = result["compiled"].memory_analysis()
      xla["memory_analysis"] = {k: getattr(ma, k) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                            "alias_size_in_bytes", "temp_size_in_bytes")}
      ca = result["compiled"].cost_analysis() or {}
      ca = ca[0] if isinstance(ca, (list, tuple)) else ca
      xla["cost_analysis_flops"] = ca.get("flops")
      print(f"  memory_analysis: arguments {_g(ma.argument_size_in_bytes)}, temp {_g(ma.temp_size_in_bytes)}, "
            f"outputs {_g(ma.output_size_in_bytes)} (aliased {_g(ma.alias_size_in_bytes)})")
      print(f"  cost_analysis flops {ca.get('flops', float('nan')):.4g} (XLA counts each while body once)")
    if buffers:
      ba = hlo_stats.buffer_assignment_bytes(open(buffers[-1]).read())
      xla["buffer_assignment"] = ba
      print(f"  buffer assignment: arguments (params + AdamW + batch) {_g(ba['argument_bytes'])}, temp "
            f"{_g(ba['temp_bytes'])}, total {_g(ba['total_bytes'])}  [XLA:CPU keeps bf16 temporaries in f32]")
    if spmd:
      hlo = open(spmd[-1]).read()
      records, unknown = hlo_stats.hlo_collectives(hlo)
      summary = hlo_stats.summarize_collectives(records)
      flops, _ = hlo_stats.hlo_dot_flops(hlo)
      experts = hlo_stats.expert_weight_gathers(records, cfg, compile_mesh.shape)
      xla.update(hlo_collectives=summary, hlo_dot_flops=flops, expert_weight_all_gather=experts,
                 loops_of_unknown_trip_count=len(unknown))
      print(f"  HLO after SPMD partitioning ({len(unknown)} loops of data-dependent trip count (dropless EP rounds) "
            "counted once, i.e. balanced routing):")
      for kind, s in sorted(summary.items()):
        print(f"    {kind:<18} {s['count']:4d} ops, {s['executions']:7.0f} executions/step, sends {_g(s['wire_bytes'])}"
              f" (operands {_g(s['operand_bytes'])})")
      print(f"    expert-weight all-gathers: {_g(experts['wire_bytes'])} sent; all-E gathers "
            f"{_g(experts['full_expert_bytes'])}")
      print(f"    dot FLOPs per device per step {flops:.4g}")
      top = sorted(records, key=lambda r: -r.wire_bytes)[:12]
      print("    largest collectives (per step):")
      for r in top:
        print(f"      {r.kind:<15} {r.result_type[:48]:<48} g={r.group:<5d} x{r.executions:<4.0f} {_g(r.wire_bytes)}  "
              f"{r.op_name[-60:]}")
    if compile_mesh != target:
      proxy = plan_lib.analytic_plan(cfg, compile_mesh.shape, proxy_work)
      _print_analytic(f"ANALYTIC for the compiled mesh {compile_mesh} (compare with the XLA figures above)", proxy)
      out["analytic_compile_mesh"] = proxy
    out["xla"] = xla
    if _KEEP_DUMP.value:
      os.makedirs(_KEEP_DUMP.value, exist_ok=True)
      for f in spmd[-1:] + buffers[-1:]:
        shutil.copy(f, _KEEP_DUMP.value)
    shutil.rmtree(dump_dir, ignore_errors=True)
  out["timings"] = dict(timings, total_s=time.time() - t_start)
  _finish(out, t_start)
  # A compile still running in its thread would keep the process alive; everything is printed already.
  sys.stdout.flush()
  os._exit(0)


def _summary(out: dict) -> dict:
  """The headline figures (GiB per device, FLOPs per token), analytic for the requested mesh and XLA's."""
  a = out["analytic"]
  s = {"analytic_params_gib": a["param_bytes"] / GiB, "analytic_optimizer_gib": a["optimizer_bytes"] / GiB,
       "analytic_grads_gib": a["grad_bytes"] / GiB, "analytic_activations_saved_gib": a["activation_saved_bytes"] / GiB,
       "analytic_activations_peak_gib": a["activation_peak_bytes"] / GiB,
       "analytic_total_peak_gib": a["total_peak_bytes"] / GiB,
       "flops_per_token_6n_active": a["flops_per_token_nominal_6n"],
       "flops_per_token_model": a["flops_per_token_model"], "flops_per_token_executed": a["flops_per_token_executed"]}
  for kind, v in a["comm_bytes_by_kind"].items():
    s[f"analytic_{kind.replace('-', '_')}_gib"] = v / GiB
  x = out.get("xla")
  if x:
    s["xla_mesh"] = x["mesh"]
    ba = x.get("buffer_assignment")
    if ba:
      s["xla_arguments_gib"], s["xla_temp_gib"] = ba["argument_bytes"] / GiB, ba["temp_bytes"] / GiB
    for kind, v in x.get("hlo_collectives", {}).items():
      s[f"xla_hlo_{kind.replace('-', '_')}_gib"] = v["wire_bytes"] / GiB
    if "hlo_dot_flops" in x:
      s["xla_hlo_dot_flops_per_device"] = x["hlo_dot_flops"]
      s["analytic_executed_flops_per_device_xla_mesh"] = out["analytic_compile_mesh" if "analytic_compile_mesh" in out
                                                           else "analytic"]["flops_per_device_step_executed"]
  return s


def _finish(out: dict, t_start: float):
  out.setdefault("timings", {"total_s": time.time() - t_start})
  out = {"summary": _summary(out), **out}
  line = json.dumps(out)
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      f.write(line + "\n")
  print(line, flush=True)


if __name__ == "__main__":
  app.run(main)
