"""Sandbox start latency and throughput through a SandboxPool: what one tool call and one graded task cost.

  .venv/bin/python tools/bench_sandbox.py                       # 20 `true` runs, 20 pooled python runs, 4 workers
  .venv/bin/python tools/bench_sandbox.py --runs=50 --workers=8

1. Start latency: one Sandbox, --runs sequential `true` commands; each call builds and tears down a whole bubblewrap
   container (namespaces, mounts, prlimit, /bin/sh), so this is the fixed cost of every shell tool call. Median
   and 90th percentile of the wall time seen by the caller (`RunResult.wall_s`).
2. Pool throughput: --runs jobs through SandboxPool(--workers), each creating its own Sandbox with one small file
   and running a short `python3 -c` over it, then closing it (the shape of grading a tiny task). runs/s over the
   wall time of the whole map; the same jobs one at a time give the serial rate beside it.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from c2jax.envs import sandbox as sandbox_lib  # noqa: E402

_RUNS = flags.DEFINE_integer("runs", 20, "Commands per measurement.")
_WORKERS = flags.DEFINE_integer("workers", 4, "SandboxPool size for the throughput measurement.")


def _job(i: int) -> bool:
  with sandbox_lib.Sandbox({"n.txt": str(i)}) as box:
    return box.run("python3 -c 'print(sum(range(int(open(\"n.txt\").read()) + 1000)))'").ok


def main(argv: list[str]) -> None:
  del argv
  sandbox_lib.check_available()  # one sentence naming the fix, before any timing
  runs, workers = _RUNS.value, _WORKERS.value

  with sandbox_lib.Sandbox({}) as box:
    box.run("true")  # first call pays the page cache for bwrap, prlimit and sh
    starts = sorted(box.run("true").wall_s * 1000 for _ in range(runs))
  start_median = statistics.median(starts)
  start_p90 = starts[min(len(starts) - 1, int(0.9 * len(starts)))]

  t = time.perf_counter()
  serial_ok = [_job(i) for i in range(runs)]
  serial_s = time.perf_counter() - t

  with sandbox_lib.SandboxPool(workers) as pool:
    t = time.perf_counter()
    pool_ok = pool.map(_job, range(runs))
    pool_s = time.perf_counter() - t
  if not (all(serial_ok) and all(pool_ok)):
    raise SystemExit("A sandboxed benchmark command failed: run tests/envs/sandbox_test.py to see why.")

  result = {
      "start_latency_ms_median": round(start_median, 2),
      "start_latency_ms_p90": round(start_p90, 2),
      "runs_per_s_pool": round(runs / pool_s, 2),
      "runs_per_s_serial": round(runs / serial_s, 2),
      "workers": workers,
      "runs": runs,
      "cpus": os.cpu_count(),
  }
  print(f"sandbox start latency   median {start_median:7.2f} ms   p90 {start_p90:7.2f} ms   ({runs} `true` runs)")
  print(f"sandboxed python jobs   {runs / pool_s:7.2f} /s through SandboxPool({workers})   "
        f"{runs / serial_s:7.2f} /s serially   ({runs} jobs, {os.cpu_count()} CPUs)")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
