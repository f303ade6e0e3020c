"""Recording the agentic main job's teacher traces (`c2jax.services.teacher_traces`, configs/rl_tiny.py:agentic),
where every model turn is a script's: how the engine runs the forced turns, and the recording against an older
commit's.

  .venv/bin/python tools/bench_forced_turns.py                     # 20 train tasks (80 episodes), 3 repeats
  .venv/bin/python tools/bench_forced_turns.py --tasks=6 --repeats=1
  .venv/bin/python tools/bench_forced_turns.py --variants=prefill --baseline=bdf7534   # now against bdf7534

Variants (`AgentConfig.forced_turns`, `force_chunk`): `prefill` (the default: up to 64 tokens of each forced turn per
forward), `prefill_256` (up to the largest bucket), `decode` (step by step, as a sampled turn). `--baseline=<commit>`
adds `baseline`: the default recording as the code at that commit runs it (its tree exported by `git archive` to a
temporary directory, run from there). Each recording runs in a process of its own, interleaved (prefill,
prefill_256, decode, baseline, prefill, ...), after one untimed round that fills a compilation cache shared by all of
them, so the timed rounds measure recording, not compiling. Reported per variant (medians): the recording's wall
seconds, the recording process's CPU seconds (its threads: host, tool workers, the engine; not the sandboxed
commands, whose processes bubblewrap does not hand back to it), the whole machine's busy CPU seconds over the
recording (/proc/stat: the recording and its sandboxed commands, on a machine with nothing else running; `box_cpu`
against wall x cores says whether the recording is bound by the CPU), the seconds of device calls that advanced turns
(`RunStats.decode_intervals`: forces and decodes), and the tool workers' seconds (summed over the workers); then
the ratios of wall times (decode / prefill, baseline / prefill). Every variant must record the same documents,
checked twice: their weighted tokens hash alike, and so do their whole texts with the weight of each piece once
the durations unittest prints ("Ran 3 tests in 0.004s") are blanked (a commit before traces format 3 shows them, and
they were the only bytes that differed between two of its recordings; since then the run tool shows 0.000s).

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"prefill": ("prefill", 64), "prefill_256": ("prefill", 256), "decode": ("decode", 64)}
BASELINE = "baseline"

_CHILD = r"""
import dataclasses, hashlib, json, os, re, sys, tempfile, time
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
def busy_s():  # the machine's busy CPU seconds so far: every field of /proc/stat's cpu line but idle and iowait
  f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
  return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")

cpu0, box0, t0 = os.times(), busy_s(), time.perf_counter()
path = teacher_traces.ensure_traces(cfg, "train")
wall, cpu1, box1 = time.perf_counter() - t0, os.times(), busy_s()
tok = cfg.task_suite().text_tokenizer()
weighted, texts = hashlib.sha256(), hashlib.sha256()
for line in open(path):
  doc = json.loads(line)
  weighted.update(json.dumps([t for t, w in zip(doc["tokens"], doc["weights"]) if w > 0]).encode())
  runs, start = [], 0
  for i in range(1, len(doc["tokens"]) + 1):
    if i == len(doc["tokens"]) or doc["weights"][i] != doc["weights"][start]:
      text = re.sub(r"(Ran \d+ tests?) in \d+\.\d+s", r"\1 in _s", tok.decode(doc["tokens"][start:i]))
      runs.append([doc["weights"][start], text])
      start = i
  texts.update(json.dumps(runs).encode())
print(json.dumps(dict(stats, wall_s=wall, cpu_s=cpu1.user + cpu1.system - cpu0.user - cpu0.system,
                      box_cpu_s=box1 - box0, docs=weighted.hexdigest()[:16], texts=texts.hexdigest()[:16])))
"""


def record(variant: str, tasks: int, env: dict, baseline_root: str | None) -> dict:
  mode, chunk = VARIANTS["prefill" if variant == BASELINE else variant]
  root = baseline_root if variant == BASELINE else _ROOT
  proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(chunk), str(tasks)], cwd=root,
                        env=dict(env, PYTHONPATH=root), capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f"bench_forced_turns: the {variant} recording failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def export(commit: str) -> str:
  """A temporary directory holding the tree of `commit` (git archive)."""
  out = tempfile.mkdtemp(prefix="c2jax-bench-forced-baseline-")
  archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=_ROOT, capture_output=True, check=False)
  if archive.returncode:
    raise SystemExit(f"bench_forced_turns: cannot export --baseline={commit}: {archive.stderr.decode().strip()}; "
                     "name a commit of this repository.")
  subprocess.run(["tar", "-x", "-C", out], input=archive.stdout, check=True)
  return out


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tasks", type=int, default=20, help="train tasks recorded (4 episodes each)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
  parser.add_argument("--baseline", default="", help="a commit whose default recording runs beside (empty: none)")
  args = parser.parse_args(argv)
  names = [v for v in args.variants.split(",") if v]
  if not names or any(v not in VARIANTS for v in names):
    raise SystemExit(f"bench_forced_turns: --variants={args.variants!r}; name some of {', '.join(VARIANTS)}.")
  baseline_root = export(args.baseline) if args.baseline else None
  names += [BASELINE] * bool(baseline_root)
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=tempfile.mkdtemp(prefix="c2jax-bench-forced-"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1")
  try:
    print(f"warm-up (compiles): {args.tasks} tasks per variant ...", flush=True)
    first = {name: record(name, args.tasks, env, baseline_root) for name in names}
    for key in ("docs", "texts"):
      if len({got[key] for got in first.values()}) != 1:
        raise SystemExit(f"bench_forced_turns: the variants recorded different documents ({key}): "
                         f"{ {name: got[key] for name, got in first.items()} }")
    runs = {name: [] for name in names}
    for r in range(args.repeats):
      for name in names:
        got = record(name, args.tasks, env, baseline_root)
        runs[name].append(got)
        print(f"repeat {r} {name:<12} wall {got['wall_s']:6.1f} s  cpu {got['cpu_s']:6.1f} s  box cpu "
              f"{got['box_cpu_s']:6.1f} s of {got['wall_s'] * os.cpu_count():6.1f}  device "
              f"{got['device_s']:6.1f} s  tools {got['tool_s']:6.1f} s  forces {got['forces']}  decodes "
              f"{got['decodes']}  load {os.getloadavg()[0]:.1f}", flush=True)
  finally:
    if baseline_root:
      shutil.rmtree(baseline_root, ignore_errors=True)
  med = {name: {k: statistics.median(x[k] for x in rs) for k in ("wall_s", "cpu_s", "box_cpu_s", "device_s", "tool_s")}
         for name, rs in runs.items()}
  out = {"tasks": args.tasks, "repeats": args.repeats, "baseline": args.baseline, "median": med, "cpus": os.cpu_count(),
         "docs": first[names[0]]["docs"], "texts": first[names[0]]["texts"], "load_avg": os.getloadavg()[0]}
  if "decode" in med and "prefill" in med:
    out["wall_ratio_decode_over_prefill"] = med["decode"]["wall_s"] / med["prefill"]["wall_s"]
    out["device_ratio_decode_over_prefill"] = med["decode"]["device_s"] / med["prefill"]["device_s"]
  if baseline_root and "prefill" in med:
    out["wall_ratio_baseline_over_prefill"] = med[BASELINE]["wall_s"] / med["prefill"]["wall_s"]
    out["cpu_ratio_baseline_over_prefill"] = med[BASELINE]["cpu_s"] / med["prefill"]["cpu_s"]
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
