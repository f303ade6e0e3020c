"""The main job timed stage by stage: `make demo`'s two commands (the pretraining of configs/pretrain_tiny.py:rl_tiny,
then configs/rl_tiny.py's teacher traces, SFT, held-out evaluations and asynchronous RL from it), optionally against
another commit's code in the same run, interleaved.

  .venv/bin/python tools/bench_main_job.py                                 # from nothing: a fresh C2JAX_CACHE_DIR
  .venv/bin/python tools/bench_main_job.py --cache_dir=$HOME/.cache/c2jax  # what a second `make demo` meets
  .venv/bin/python tools/bench_main_job.py --baseline=cc5afd6 --repeats=2  # current, cc5afd6, current, cc5afd6
  .venv/bin/python tools/bench_main_job.py --rl_flags='--config.trainer.steps=4' --pretrain_flags='...'  # shorter

Each run is the two processes in a workdir of its own, with C2JAX_CACHE_DIR set to a fresh empty directory (the
default: everything is made and compiled, as on a new machine; the install is not timed) or to `--cache_dir` (shared
by every run: the suite BPEs, teacher traces, SFT checkpoint and compiled programs a first run left). A baseline runs
from a detached git worktree of its commit with the same Python, so both codes meet the same packages.

Per run: each process's wall and CPU seconds; the RL job's seconds per stage (`stage_seconds` of its result: the
teacher's traces, the SFT, the evaluation before RL, RL, the evaluation after; a commit older than that report gives
the processes' walls only); the RL loop's samples/s and tokens/s; the held-out pass@1 and best-of-k before and after;
and how many programs the run added to the compilation cache (`<cache>/jax`: 0 on a run that compiled nothing new).
Reported: per code, the medians; with a baseline, baseline / current for each figure both have (above 1: the current
code is faster). The load average at the start and the end says how quiet the box was.

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAIN = ("experiments/pretrain_main.py", "--config=configs/pretrain_tiny.py:rl_tiny")
RL = ("experiments/rl_main.py", "--config=configs/rl_tiny.py")
# The figures a run reports besides its walls: the RL result's keys, as rl_loop writes them.
RL_FIGURES = ("samples_per_s", "tokens_per_s", "pass_at_1_before", "pass_at_1_after", "best_of_k_before",
              "best_of_k_after")


def commands(workdir: str, pretrain_flags: list[str], rl_flags: list[str]) -> list[tuple[str, list[str]]]:
  """`make demo`'s two commands in `workdir` (relative to the code's root), named."""
  pretrain_dir, rl_dir = os.path.join(workdir, "pretrain"), os.path.join(workdir, "rl")
  return [("pretrain", [PRETRAIN[0], PRETRAIN[1], f"--workdir={pretrain_dir}", *pretrain_flags]),
          ("rl", [RL[0], RL[1], f"--workdir={rl_dir}",
                  f"--config.sft.base_checkpoint={os.path.join(pretrain_dir, 'models', 'bulk')}", *rl_flags])]


def _programs(cache: str) -> int:
  """Files in the compilation cache under `cache` (`c2jax.services.compile_cache`: <cache>/jax)."""
  root = os.path.join(cache, "jax")
  return sum(len(files) for _, _, files in os.walk(root)) if os.path.isdir(root) else 0


def _last_json(text: str) -> dict:
  for line in reversed(text.strip().splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  raise ValueError("the process printed no JSON result line")


def run_once(code_root: str, cache: str, pretrain_flags: list[str], rl_flags: list[str], log_dir: str) -> dict:
  """Both processes of one run with `code_root`'s code; returns its figures (see the module docstring)."""
  work = tempfile.mkdtemp(prefix="bench-main-job-")
  env = dict(os.environ, C2JAX_CACHE_DIR=cache, PYTHONPATH=code_root)
  out = {"programs_before": _programs(cache)}
  try:
    for name, argv in commands(work, pretrain_flags, rl_flags):
      before = resource.getrusage(resource.RUSAGE_CHILDREN)
      t0 = time.perf_counter()
      proc = subprocess.run([sys.executable, *argv], cwd=code_root, env=env, capture_output=True, text=True,
                            check=False)
      wall = time.perf_counter() - t0
      after = resource.getrusage(resource.RUSAGE_CHILDREN)
      log = os.path.join(log_dir, f"{len(os.listdir(log_dir)):02d}-{name}.log")
      with open(log, "w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(argv)}\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
      if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode} (its output: {log})")
      out[f"{name}_s"] = round(wall, 1)
      out[f"{name}_cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)
      if name == "rl":
        result = _last_json(proc.stdout)
        out["stage_seconds"] = result.get("stage_seconds", {})
        out.update({k: result.get(k) for k in RL_FIGURES})
  finally:
    shutil.rmtree(work, ignore_errors=True)
  out["total_s"] = round(out.get("pretrain_s", 0) + out.get("rl_s", 0), 1)
  out["new_programs"] = _programs(cache) - out.pop("programs_before")
  return out


def _flat(run: dict) -> dict[str, float]:
  """A run's numeric figures, stage seconds as 'stage: <name>'."""
  flat = {k: v for k, v in run.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
  flat.update({f"stage: {k}": v for k, v in run.get("stage_seconds", {}).items()})
  return flat


def summarize(runs: dict[str, list[dict]], current: str = "current") -> dict:
  """Medians per code; with another code, its median / the current's for every figure both have (for times: above
  1, the current code is faster)."""
  medians = {}
  for code, rs in runs.items():
    flats = [_flat(r) for r in rs]
    keys = sorted(set().union(*flats)) if flats else []
    medians[code] = {k: round(statistics.median(f[k] for f in flats if f.get(k) is not None), 3)
                     for k in keys if any(f.get(k) is not None for f in flats)}
  ratios = {}
  for code, m in medians.items():
    if code != current and current in medians:
      ratios[code] = {k: round(v / medians[current][k], 3) for k, v in m.items()
                      if medians[current].get(k) and isinstance(v, (int, float))}
  return {"median": medians, "ratio_to_current": ratios}


def _table(summary: dict) -> str:
  codes = list(summary["median"])
  keys = sorted(set().union(*(summary["median"][c] for c in codes)))
  lines = ["| figure | " + " | ".join(codes) + " |", "|---|" + "---|" * len(codes)]
  for k in keys:
    lines.append(f"| {k} | " + " | ".join(str(summary["median"][c].get(k, "-")) for c in codes) + " |")
  return "\n".join(lines)


def _baseline_tree(ref: str, parent: str) -> str:
  tree = os.path.join(parent, "baseline")
  subprocess.run(["git", "worktree", "add", "--detach", "-q", tree, ref], cwd=_ROOT, check=True)
  return tree


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--repeats", type=int, default=1, help="runs per code (interleaved)")
  ap.add_argument("--cache_dir", default=None, help="C2JAX_CACHE_DIR shared by every run (default: a fresh empty "
                  "one per run: from nothing)")
  ap.add_argument("--baseline", default=None, help="a git commit whose code runs the same, interleaved")
  ap.add_argument("--pretrain_flags", default="", help="flags added to the pretraining's command")
  ap.add_argument("--rl_flags", default="", help="flags added to the RL job's command")
  ap.add_argument("--log_dir", default=None, help="where each process's output goes (default: a temporary dir)")
  ap.add_argument("--dry_run", action="store_true", help="print the commands and exit")
  args = ap.parse_args(argv)
  if args.repeats < 1:
    ap.error(f"--repeats={args.repeats} must be >= 1.")
  if args.cache_dir is not None and not os.path.isdir(os.path.expanduser(args.cache_dir)):
    ap.error(f"--cache_dir={args.cache_dir} is not a directory; create it or leave the flag out (a fresh one per run).")
  pretrain_flags, rl_flags = shlex.split(args.pretrain_flags), shlex.split(args.rl_flags)
  if args.dry_run:
    for name, cmd in commands("<workdir>", pretrain_flags, rl_flags):
      print(f"{name}: {sys.executable} {shlex.join(cmd)}")
    return {}

  scratch = tempfile.mkdtemp(prefix="bench-main-job-")
  log_dir = args.log_dir or os.path.join(scratch, "logs")
  os.makedirs(log_dir, exist_ok=True)
  codes = {"current": _ROOT}
  try:
    if args.baseline:
      codes[args.baseline] = _baseline_tree(args.baseline, scratch)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    load_start = [round(x, 2) for x in os.getloadavg()]
    runs: dict[str, list[dict]] = {code: [] for code in codes}
    for i in range(args.repeats):
      for code, root in codes.items():
        cache = os.path.expanduser(args.cache_dir) if args.cache_dir else tempfile.mkdtemp(dir=scratch)
        print(f"run {i + 1}/{args.repeats}: {code} (C2JAX_CACHE_DIR={cache}; logs in {log_dir})", file=sys.stderr,
              flush=True)
        runs[code].append(run_once(root, cache, pretrain_flags, rl_flags, log_dir))
        print(json.dumps({code: runs[code][-1]}), file=sys.stderr, flush=True)
        if not args.cache_dir:
          shutil.rmtree(cache, ignore_errors=True)
    summary = summarize(runs)
    print(_table(summary))
    result = {"tool": "bench_main_job", "commit": commit, "baseline": args.baseline, "repeats": args.repeats,
              "from_nothing": args.cache_dir is None, "pretrain_flags": pretrain_flags, "rl_flags": rl_flags,
              "runs": runs, **summary, "load_avg_start": load_start,
              "load_avg_end": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
  finally:
    if args.baseline and os.path.isdir(os.path.join(scratch, "baseline")):
      subprocess.run(["git", "worktree", "remove", "--force", os.path.join(scratch, "baseline")], cwd=_ROOT,
                     check=False)
    if not args.log_dir:
      print(f"logs kept in {log_dir}", file=sys.stderr)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
