"""Sandbox start latency and throughput through a SandboxPool: what one tool call and one graded task cost.

  .venv/bin/python tools/bench_sandbox.py                       # 20 `true` runs, 20 pooled python runs, 4 workers
  .venv/bin/python tools/bench_sandbox.py --runs=50 --workers=8
  .venv/bin/python tools/bench_sandbox.py --module=/tmp/sandbox_before.py   # another sandbox.py, e.g. HEAD's
  .venv/bin/python tools/bench_sandbox.py --baseline=/tmp/sandbox_before.py --runs=60   # call by call against it

1. Start latency: one Sandbox, --runs sequential `true` commands; each call builds and tears down a whole bubblewrap
   container (namespaces, mounts, seccomp filter, rlimits, the call's cgroup, /bin/sh), so this is the fixed cost of
   every shell tool call. Median and 90th percentile of the time the caller waits for `run` (cgroup set-up and
   removal included), and the median of `RunResult.wall_s` beside it. Where the host gives a per-call cgroup or a
   workdir tmpfs (`containment()`), the same calls are timed again with both forced off (the fallback's cost).
   With --baseline, the start latency is instead measured call by call in turn: one call of the baseline
   sandbox.py, one of this one, one of this one with its fallback containment, and again, so that the load of a
   shared machine falls on all of them alike; and so is a test run, `python3 -m unittest` over a one-test module
   (the shape of an agent's test-running tool call: Python's start-up and unittest's import inside the container).
2. Sandbox set-up: --runs times `Sandbox({})` then `close()` (the workdir, its tmpfs where mounted, the removal);
   with --baseline, also call by call in turn with the baseline's, over the one-test module's files.
3. Pool throughput: --runs jobs through SandboxPool(--workers), each creating its own Sandbox with one small file
   and running a short `python3 -c` over it, then closing it (the shape of grading a tiny task). runs/s over the
   wall time of the whole map; the same jobs one at a time give the serial rate beside it.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time
from unittest import mock

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from c2jax.sandbox import sandbox as sandbox_lib

_RUNS = flags.DEFINE_integer("runs", 20, "Commands per measurement.")
_WORKERS = flags.DEFINE_integer("workers", 4, "SandboxPool size for the throughput measurement.")
_BASELINE = flags.DEFINE_string("baseline", None, "Path of a sandbox.py whose start latency is measured call by "
                                "call in turn with this one's (e.g. HEAD's, as for --module).")
_MODULE = flags.DEFINE_string("module", None, "Path of a sandbox.py to measure instead of c2jax.sandbox.sandbox "
                              "(e.g. `git show HEAD:c2jax/sandbox/sandbox.py > /tmp/sandbox_before.py`).")


def _load(path: str | None, name: str = "bench_sandbox_module"):
  if path is None:
    return sandbox_lib
  spec = importlib.util.spec_from_file_location(name, path)
  module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def _median_p90(values: list[float]) -> tuple[float, float]:
  values = sorted(values)
  return statistics.median(values), values[min(len(values) - 1, int(0.9 * len(values)))]


def _start_latency(lib, runs: int) -> dict[str, float]:
  with lib.Sandbox({}) as box:
    box.run("true")  # first call pays the page cache for bwrap, prlimit and sh
    waited, walls = [], []
    for _ in range(runs):
      t = time.perf_counter()
      walls.append(box.run("true").wall_s * 1000)
      waited.append((time.perf_counter() - t) * 1000)
  median, p90 = _median_p90(waited)
  return {"median": round(median, 2), "p90": round(p90, 2), "wall_s_median": round(statistics.median(walls), 2)}


# A one-test module and the command that runs it: what an agent's test-running tool call costs at the least.
UNITTEST_FILES = {"m.py": "def f(x):\n  return x + 1\n",
                  "test_m.py": "import unittest\nfrom m import f\n\n\nclass T(unittest.TestCase):\n\n"
                               "  def test_f(self):\n    self.assertEqual(f(1), 2)\n"}
UNITTEST_COMMAND = "python3 -m unittest -q"


def _interleaved(variants: dict[str, tuple[object, object]], runs: int, command: str = "true",
                 files: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
  """{variant: median, p90 of the caller's wait} for `command` calls over `files`, one call per variant in turn."""
  waited = {name: [] for name in variants}
  with contextlib.ExitStack() as stack:
    boxes = {}
    for name, (lib, context) in variants.items():
      with context:
        boxes[name] = stack.enter_context(lib.Sandbox(files or {}))
        boxes[name].run(command)  # the page cache, once per variant
    for _ in range(runs):
      for name, (_, context) in variants.items():
        with context:
          t = time.perf_counter()
          if not boxes[name].run(command).ok:
            raise SystemExit(f"`{command}` failed in the {name} sandbox: run tests/sandbox/sandbox_test.py.")
          waited[name].append((time.perf_counter() - t) * 1000)
  return {name: dict(zip(("median", "p90"), (round(v, 2) for v in _median_p90(w)))) for name, w in waited.items()}


def _fallback(lib):
  """Forces the fallback containment (no per-call cgroup, no workdir tmpfs) where the module knows one."""
  if not hasattr(lib, "containment"):
    return contextlib.nullcontext()
  off = lib.Containment(cgroup=None, disk=lib.DiskBound.AFTER_CALL, missing=("forced off by the benchmark",))
  return mock.patch.dict(lib._containments, {os.geteuid(): (off, None)})


def main(argv: list[str]) -> None:
  del argv
  lib = _load(_MODULE.value)
  lib.check_available()  # one sentence naming the fix, before any timing
  runs, workers = _RUNS.value, _WORKERS.value
  containment = lib.containment() if hasattr(lib, "containment") else None

  start = _start_latency(lib, runs)
  interleaved = unittest_runs = None
  if _BASELINE.value:
    variants = {"baseline": (_load(_BASELINE.value, "bench_sandbox_baseline"), contextlib.nullcontext()),
                "this": (lib, contextlib.nullcontext())}
    if containment is not None:
      variants["this_fallback"] = (lib, _fallback(lib))
    interleaved = _interleaved(variants, runs)
    unittest_runs = _interleaved(variants, runs, UNITTEST_COMMAND, UNITTEST_FILES)
  start_fallback = None
  if containment is not None and (containment.cgroup is not None or containment.disk == lib.DiskBound.TMPFS):
    with _fallback(lib):
      start_fallback = _start_latency(lib, runs)

  setups = []
  for _ in range(runs):
    t = time.perf_counter()
    lib.Sandbox({}).close()
    setups.append((time.perf_counter() - t) * 1000)
  setup_runs = None
  if _BASELINE.value:
    libs = {name: lib for name, (lib, _) in variants.items() if name != "this_fallback"}
    times = {name: [] for name in libs}
    for _ in range(runs):
      for name, variant in libs.items():
        t = time.perf_counter()
        variant.Sandbox(UNITTEST_FILES).close()
        times[name].append((time.perf_counter() - t) * 1000)
    setup_runs = {name: dict(zip(("median", "p90"), (round(v, 2) for v in _median_p90(w))))
                  for name, w in times.items()}

  def job(i: int) -> bool:
    with lib.Sandbox({"n.txt": str(i)}) as box:
      return box.run("python3 -c 'print(sum(range(int(open(\"n.txt\").read()) + 1000)))'").ok

  t = time.perf_counter()
  serial_ok = [job(i) for i in range(runs)]
  serial_s = time.perf_counter() - t

  with lib.SandboxPool(workers) as pool:
    t = time.perf_counter()
    pool_ok = pool.map(job, range(runs))
    pool_s = time.perf_counter() - t
  if not (all(serial_ok) and all(pool_ok)):
    raise SystemExit("A sandboxed benchmark command failed: run tests/sandbox/sandbox_test.py to see why.")

  result = {
      "module": _MODULE.value or "c2jax.sandbox.sandbox",
      "containment": None if containment is None else {
          "cgroup": containment.cgroup.value if containment.cgroup else None, "disk": containment.disk.value},
      "start_latency_ms_median": start["median"],
      "start_latency_ms_p90": start["p90"],
      "start_wall_s_ms_median": start["wall_s_median"],
      "start_latency_ms_median_fallback": start_fallback and start_fallback["median"],
      "sandbox_setup_ms_median": round(statistics.median(setups), 2),
      "interleaved_start_latency_ms": interleaved,
      "interleaved_unittest_ms": unittest_runs,
      "interleaved_setup_ms": setup_runs,
      "runs_per_s_pool": round(runs / pool_s, 2),
      "runs_per_s_serial": round(runs / serial_s, 2),
      "workers": workers,
      "runs": runs,
      "cpus": os.cpu_count(),
  }
  print(f"sandbox start latency   median {start['median']:7.2f} ms   p90 {start['p90']:7.2f} ms   "
        f"({runs} `true` runs, as the caller waits)")
  if start_fallback:
    print(f"  fallback containment  median {start_fallback['median']:7.2f} ms   (no call cgroup, no workdir tmpfs)")
  for name, figures in (interleaved or {}).items():
    print(f"  interleaved {name:<13} median {figures['median']:7.2f} ms   p90 {figures['p90']:7.2f} ms")
  for name, figures in (unittest_runs or {}).items():
    print(f"  `{UNITTEST_COMMAND}` {name:<13} median {figures['median']:7.2f} ms   p90 {figures['p90']:7.2f} ms")
  print(f"sandbox set-up + close  median {result['sandbox_setup_ms_median']:7.2f} ms")
  for name, figures in (setup_runs or {}).items():
    print(f"  interleaved set-up + close {name:<8} median {figures['median']:7.2f} ms   p90 {figures['p90']:7.2f} ms")
  print(f"sandboxed python jobs   {runs / pool_s:7.2f} /s through SandboxPool({workers})   "
        f"{runs / serial_s:7.2f} /s serially   ({runs} jobs, {os.cpu_count()} CPUs)")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
