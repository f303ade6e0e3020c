"""Step time of the sharded train step on 8 fake CPU devices, per mesh shape, against the single-device step.

  .venv/bin/python tools/bench_parallel.py                          # tiny config, batch 8 x 64, float32, ~8 min
  .venv/bin/python tools/bench_parallel.py --meshes=fsdp:8,expert:8 --repeats=3

Each mesh runs `c2jax.pretrain.sharded.make_trainer(...).step` (the same `train_step`, traced under the mesh's
layout); the reference is `jax.jit(train_step)` on one device. The 8 "devices" are threads of this one CPU
(`--xla_force_host_platform_device_count=8`, set here before jax loads), so a mesh cannot be faster than one
device here: the ratio t(mesh) / t(single) measures what sharding costs in extra work (collectives as memory
copies, per-shard overheads, capacity slots, replicated routing), not a speed-up. Repeats alternate between
meshes after warm-up so that a slow phase of a shared machine hurts all alike; medians are reported.

From each mesh's compiled HLO (`c2jax.parallel.hlo_stats.hlo_collectives`) the tool also reports the per-device
bytes of every kind of collective per step and, apart, the all-gathers of routed-expert weights: under expert
parallelism each device should gather only its own E / expert experts (over the other axes that shard them: fsdp,
and context where it divides); `full_expert_bytes` > 0 flags the degenerate case of all experts gathered on every
device.

The last line printed is one JSON object with every figure; a readable table precedes it.
"""

from __future__ import annotations

import os
import sys

_N_DEVICES = 8
_FLAG = f"--xla_force_host_platform_device_count={_N_DEVICES}"
# Before jax is imported (absl flags are parsed later, so this cannot be a flag).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import functools
import json
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from c2jax.parallel import hlo_stats
from c2jax.pretrain import sharded as train_lib
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.pretrain.step import StepConfig, init_state, train_step
from c2jax.model import presets

_MESHES = flags.DEFINE_list("meshes", ["fsdp:8", "expert:8", "fsdp:2+expert:4", "fsdp:2+expert:2+context:2",
                                       "data:2+context:4"],
                            "Mesh shapes to time, axis:size items joined by '+' (',' separates meshes).")
_BATCH = flags.DEFINE_integer("batch", 8, "B, sequences per step.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 64, "T, tokens per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per configuration (interleaved); medians reported.")
_STEPS = flags.DEFINE_integer("steps_per_repeat", 3, "Training steps per timed repeat.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the token batch.")


class Runner:
  """A jitted, state-donating train step on a fixed batch (single device, or a mesh's trainer)."""

  def __init__(self, name: str, cfg, hp: StepConfig, tokens: np.ndarray, seed: int, mesh_cfg: MeshConfig | None):
    self.name = name
    self.mesh_cfg = mesh_cfg
    key = jax.random.key(seed)
    if mesh_cfg is None:
      self.step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp), donate_argnums=0)
      self.state = jax.jit(functools.partial(init_state, cfg, hp))(key)
      self.batch = {"tokens": jnp.asarray(tokens, jnp.int32)}
    else:
      mesh = make_mesh(mesh_cfg, jax.devices()[:mesh_cfg.num_devices])
      trainer = train_lib.make_trainer(cfg, hp, mesh, batch_size=tokens.shape[0], seq_len=tokens.shape[1])
      self.step = trainer.step
      self.state = trainer.init(key)
      self.batch = trainer.put_batch({"tokens": tokens.astype(np.int32)})
    t0 = time.perf_counter()
    self.compiled = self.step.lower(self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - t0
    self.hlo = self.compiled.as_text()

  def warmup(self, steps: int = 2):
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch)
    jax.block_until_ready((self.state, metrics))
    self.loss = float(metrics["loss"])

  def repeat(self, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch)
    jax.block_until_ready((self.state, metrics))
    return (time.perf_counter() - t0) / steps


def main(argv):
  del argv
  cfg = presets.tiny().replace(dtype="float32", param_dtype="float32")
  hp = StepConfig()
  b, t = _BATCH.value, _SEQ_LEN.value
  tokens = np.random.default_rng(_SEED.value).integers(0, cfg.vocab_size, size=(b, t))
  meshes = [MeshConfig.parse(m.replace("+", ",")) for m in _MESHES.value]
  print(f"tiny config (E={cfg.n_routed_experts}, K={cfg.num_experts_per_tok}, D={cfg.d_model}, "
        f"F={cfg.moe_intermediate_size}), batch {b} x {t}, float32, MTP weight {hp.mtp_weight}; "
        f"{len(jax.devices())} fake CPU devices on {os.cpu_count()} cores", flush=True)
  runners = []
  for mesh_cfg in [None] + meshes:
    name = "single" if mesh_cfg is None else str(mesh_cfg)
    r = Runner(name, cfg, hp, tokens, _SEED.value, mesh_cfg)
    r.warmup()
    print(f"  compiled {name:<28} in {r.compile_s:6.1f} s, loss {r.loss:.4f}", flush=True)
    runners.append(r)
  times = {r.name: [] for r in runners}
  for _ in range(_REPEATS.value):
    for r in runners:
      times[r.name].append(r.repeat(_STEPS.value))
  base = statistics.median(times["single"])
  results = {}
  print(f"\n{'mesh':<28} {'ms/step':>9} {'ratio':>7}  {'all-gather':>10} {'all-reduce':>10} {'red-scat':>9} "
        f"{'all-to-all':>10} {'c-permute':>9} {'expert AG':>9} {'all-E AG':>8}   (KiB sent per device per step)")
  for r in runners:
    med = statistics.median(times[r.name])
    entry = {"ms_per_step": med * 1e3, "ratio": med / base, "loss_after_warmup": r.loss,
             "compile_s": r.compile_s, "times_ms": [x * 1e3 for x in times[r.name]]}
    if r.mesh_cfg is not None:
      records, unknown = hlo_stats.hlo_collectives(r.hlo)
      summary = hlo_stats.summarize_collectives(records)
      experts = hlo_stats.expert_weight_gathers(records, cfg, r.mesh_cfg.shape)
      entry.update(collectives=summary, expert_weight_all_gather=experts, loops_of_unknown_trip_count=len(unknown))
    results[r.name] = entry
    kib = lambda kind: entry.get("collectives", {}).get(kind, {}).get("wire_bytes", 0.0) / 1024
    ew = entry.get("expert_weight_all_gather", {})
    print(f"{r.name:<28} {med * 1e3:9.1f} {med / base:7.2f}  {kib('all-gather'):10.1f} {kib('all-reduce'):10.1f} "
          f"{kib('reduce-scatter'):9.1f} {kib('all-to-all'):10.1f} {kib('collective-permute'):9.1f} "
          f"{ew.get('wire_bytes', 0.0) / 1024:9.1f} {ew.get('full_expert_bytes', 0.0) / 1024:8.1f}")
  print("\nBytes: what one device sends per step (all-gather/all-to-all/reduce-scatter (g-1)/g of the buffer, "
        "all-reduce 2(g-1)/g), loops counted by trip count; the data-dependent dropless EP rounds count once.")
  print("Ratios > 1 are expected here: 8 fake devices share 2 cores; see the module docstring.")
  out = {"ratios": {k: v["ratio"] for k, v in results.items()}, "single_ms_per_step": base * 1e3,
         "batch": b, "seq_len": t, "repeats": _REPEATS.value, "steps_per_repeat": _STEPS.value,
         "expert_weight_all_gather_bytes": {k: v["expert_weight_all_gather"]["bytes"]
                                            for k, v in results.items() if "expert_weight_all_gather" in v},
         "full_expert_all_gather_bytes": {k: v["expert_weight_all_gather"]["full_expert_bytes"]
                                          for k, v in results.items() if "expert_weight_all_gather" in v},
         "details": results}
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
