"""Forced turns by prefill against step-by-step decoding: recording the agentic main job's teacher traces
(`c2jax.services.teacher_traces`, configs/rl_tiny.py:agentic), where every model turn is a script's.

  .venv/bin/python tools/bench_forced_turns.py                     # 20 train tasks (80 episodes), 3 repeats
  .venv/bin/python tools/bench_forced_turns.py --tasks=6 --repeats=1

Variants (`AgentConfig.forced_turns`, `force_chunk`): `prefill` (the default: up to 64 tokens of each forced turn per
forward), `prefill_256` (up to the largest bucket), `decode` (step by step, as a sampled turn). Each recording runs in
a process of its own, interleaved (prefill, prefill_256, decode, prefill, ...), after one untimed round that fills
a compilation cache shared by all of them, so the timed rounds measure recording, not compiling. Reported per variant
(medians): the recording's wall seconds, the seconds of device calls that advanced turns (`RunStats.decode_intervals`:
forces and decodes), and the tool workers' seconds; then the ratio of decode's wall time to prefill's. Every variant
must train the same tokens (checked: the documents' weighted tokens hash alike; their observations are not compared,
because a test run's output holds its duration, "Ran 3 tests in 0.004s").

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"prefill": ("prefill", 64), "prefill_256": ("prefill", 256), "decode": ("decode", 64)}

_CHILD = r"""
import dataclasses, hashlib, json, sys, tempfile, time
from c2jax.actors import agent_loop
from c2jax.services import rl_run_config, teacher_traces
from configs import rl_tiny

mode, chunk, tasks = agent_loop.ForcedTurns(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
agent_of = teacher_traces._agent
teacher_traces._agent = lambda cfg: dataclasses.replace(agent_of(cfg), forced_turns=mode, force_chunk=chunk)
stats = {}
run = agent_loop.AgentRunner.run

def timed_run(self, *args, **kwargs):
  out = run(self, *args, **kwargs)
  stats.update(device_s=sum(b - a for a, b in self.stats.decode_intervals),
               tool_s=sum(b - a for a, b in self.stats.tool_intervals), forces=self.stats.forces,
               decodes=self.stats.decodes, model_tokens=self.stats.model_tokens)
  return out

agent_loop.AgentRunner.run = timed_run
c = rl_tiny.get_config("agentic")
c.sft.cache_dir = tempfile.mkdtemp()
c.sft.teacher.update(max_tasks=tasks, heldout_tasks=1)
cfg = rl_run_config.parse(c)
t0 = time.perf_counter()
path = teacher_traces.ensure_traces(cfg, "train")
wall = time.perf_counter() - t0
digest = hashlib.sha256()
for line in open(path):
  doc = json.loads(line)
  digest.update(json.dumps([t for t, w in zip(doc["tokens"], doc["weights"]) if w > 0]).encode())
print(json.dumps(dict(stats, wall_s=wall, docs=digest.hexdigest()[:16])))
"""


def record(variant: str, tasks: int, env: dict) -> dict:
  mode, chunk = VARIANTS[variant]
  proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(chunk), str(tasks)], cwd=_ROOT, env=env,
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f"bench_forced_turns: the {variant} recording failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tasks", type=int, default=20, help="train tasks recorded (4 episodes each)")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  env = dict(os.environ, PYTHONPATH=_ROOT, JAX_COMPILATION_CACHE_DIR=tempfile.mkdtemp(prefix="c2jax-bench-forced-"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1")
  print(f"warm-up (compiles): {args.tasks} tasks per variant ...", flush=True)
  docs = {name: record(name, args.tasks, env)["docs"] for name in VARIANTS}
  if len(set(docs.values())) != 1:
    raise SystemExit(f"bench_forced_turns: the variants recorded different documents: {docs}")
  runs = {name: [] for name in VARIANTS}
  for r in range(args.repeats):
    for name in VARIANTS:
      got = record(name, args.tasks, env)
      runs[name].append(got)
      print(f"repeat {r} {name:<12} wall {got['wall_s']:6.1f} s  device {got['device_s']:6.1f} s  "
            f"tools {got['tool_s']:6.1f} s  forces {got['forces']}  decodes {got['decodes']}", flush=True)
  med = {name: {k: statistics.median(x[k] for x in rs) for k in ("wall_s", "device_s", "tool_s")}
         for name, rs in runs.items()}
  out = {"tasks": args.tasks, "repeats": args.repeats, "median": med,
         "wall_ratio_decode_over_prefill": med["decode"]["wall_s"] / med["prefill"]["wall_s"],
         "device_ratio_decode_over_prefill": med["decode"]["device_s"] / med["prefill"]["device_s"],
         "load_avg": os.getloadavg()[0]}
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
