"""The bookkeeping of tools/gpu_check.sh: the machine and import check, the kernel tests as JSON, and the per-stage
and summary JSON files. The shell script runs the stages (each under `timeout`); this file never starts one.

  python tools/gpu_check.py preflight [--cpu_smoke]   # backend, device, memory, versions; which imports are missing
  python tools/gpu_check.py kernel_tests [PYTEST ARGS] # pytest in this process; last line: JSON of the outcomes
  python tools/gpu_check.py record OUT WORK STAGE RC SECONDS LIMIT_S   # after a stage: OUT/STAGE.json, the summary
  python tools/gpu_check.py finish OUT                 # prints the summary; exit 1 if any stage failed

Files: OUT/<stage>.json is the stage's own last-line JSON (or {"error": ...}); OUT/gpu_check.json holds every
stage's status, seconds, limit and figures or error, rewritten after each stage so that an interrupted run keeps
what it measured. Nothing here imports jax at module level: `kernel_tests` must let tests/conftest.py set the XLA
flags before jax loads.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import sys
import time
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each stage imports: third-party modules (checked all at once, by find_spec) and the project's modules that
# the stage's tool imports (imported, which also catches a package too old or too new for the code).
STAGE_IMPORTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kernel_tests": (("pytest", "absl", "chex", "jax", "numpy", "ml_dtypes"),
                     ("absl.testing.parameterized", "pallas_kernels.scaled_matmul.ops",
                      "pallas_kernels.grouped_matmul.ops", "pallas_kernels.quantize.ops", "pallas_kernels.recipe.ops")),
    "bench_kernels": (("absl", "jax", "numpy", "ml_dtypes"),
                      ("absl.app", "pallas_kernels.formats", "pallas_kernels.grouped_matmul.ops",
                       "pallas_kernels.quantize.ops", "pallas_kernels.scaled_matmul.ops")),
    "train_mfu": (("absl", "jax", "numpy", "optax"),
                  ("absl.app", "c2jax.model.presets", "c2jax.model.params", "c2jax.pretrain.step")),
    "sampler": (("jax", "numpy", "optax", "orbax", "tensorstore"),
                ("c2jax.actors.sampler", "c2jax.data.stdlib_corpus", "c2jax.data.byte_tokenizer",
                 "c2jax.model.hf_export", "c2jax.pretrain.step")),
}
# pip's name where it differs from the import name.
_DISTRIBUTIONS = {"absl": "absl-py", "ml_dtypes": "ml-dtypes", "orbax": "orbax-checkpoint", "google": "protobuf",
                  "ml_collections": "ml-collections", "yaml": "pyyaml"}
TIMEOUT_RCS = (124, 137)  # timeout(1): the limit passed (SIGTERM), or the kill after it


def check_imports(stages: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = None
                  ) -> tuple[dict[str, list[str]], dict[str, str]]:
  """({missing top-level module: [stages needing it]}, {stage: first import error of its project modules})."""
  stages = STAGE_IMPORTS if stages is None else stages
  if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
  missing: dict[str, list[str]] = {}
  errors: dict[str, str] = {}
  for stage, (third_party, project) in stages.items():
    for name in third_party:
      if importlib.util.find_spec(name) is None:
        missing.setdefault(name, []).append(stage)
    for name in project:
      try:
        importlib.import_module(name)
      except ImportError as e:  # ModuleNotFoundError included
        top = (getattr(e, "name", None) or "").split(".")[0]
        if top and top not in ("c2jax", "pallas_kernels") and importlib.util.find_spec(top) is None:
          missing.setdefault(top, [])
          if stage not in missing[top]:
            missing[top].append(stage)
        errors[stage] = f"import {name}: {type(e).__name__}: {e}"
        break
  return missing, errors


def missing_sentence(missing: dict[str, list[str]], errors: dict[str, str]) -> str | None:
  """One sentence naming what is missing and what to do, or None when every stage's imports load."""
  if not missing and not errors:
    return None
  parts = []
  if missing:
    parts.append("missing Python packages: " + ", ".join(
        f"{_DISTRIBUTIONS.get(m, m)} (for {', '.join(stages) or 'an import'})"
        for m, stages in sorted(missing.items())))
  other = {s: e for s, e in errors.items() if not any(s in st for st in missing.values())}
  if other:
    parts.append("imports failing: " + "; ".join(f"{s}: {e}" for s, e in sorted(other.items())))
  return ("; ".join(parts) + ". Put their wheels (python 3.12, manylinux x86_64) in .whl/ at the repository root: "
          "tools/gpu_check.sh installs them with pip --no-index --target before the stages.")


def preflight(cpu_smoke: bool) -> int:
  """Prints the machine and import check as one JSON line; 2 without a GPU (unless cpu_smoke), 1 if imports fail."""
  import jax

  backend = jax.default_backend()
  dev = jax.devices()[0]
  stats = dev.memory_stats() or {}
  missing, errors = check_imports()
  info: dict[str, Any] = {
      "backend": backend, "device_kind": dev.device_kind, "device_count": jax.device_count(),
      "device_memory_gib": round(stats["bytes_limit"] / 2**30, 1) if stats.get("bytes_limit") else None,
      "jax": jax.__version__, "jaxlib": _version("jaxlib"),
      "python": platform.python_version(), "python_executable": sys.executable, "cpu_smoke": cpu_smoke,
      "missing": missing, "import_errors": errors, "missing_sentence": missing_sentence(missing, errors),
  }
  print(f"backend {backend}: {jax.device_count()} x {dev.device_kind}, memory {info['device_memory_gib']} GiB; "
        f"jax {info['jax']}, python {info['python']} ({sys.executable})", flush=True)
  if info["missing_sentence"]:
    print(info["missing_sentence"], flush=True)
  if backend != "gpu" and not cpu_smoke:
    info["error"] = (f"no GPU: jax.default_backend() is {backend}, and this check measures a GPU "
                     "(GPU_CHECK_CPU_SMOKE=1 runs its stages at tiny shapes on CPU, to test the script)")
    print(info["error"], flush=True)
  print(json.dumps(info), flush=True)
  return 2 if "error" in info else (1 if info["missing_sentence"] else 0)


def _version(dist: str) -> str | None:
  try:
    from importlib import metadata
    return metadata.version(dist)
  except Exception:  # noqa: BLE001
    return None


class _Outcomes:
  """A pytest plugin counting test outcomes (call phase, plus setup/teardown errors and skips)."""

  def __init__(self):
    self.counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    self.failed: list[str] = []
    self.skip_reasons: dict[str, int] = {}

  def pytest_runtest_logreport(self, report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
      if report.skipped:
        self.counts["skipped"] += 1
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")[:160]
        self.skip_reasons[reason] = self.skip_reasons.get(reason, 0) + 1
      elif report.failed:
        self.counts["failed" if report.when == "call" else "errors"] += 1
        self.failed.append(report.nodeid)
      elif report.passed:
        self.counts["passed"] += 1
    elif report.when == "teardown" and report.failed:
      self.counts["errors"] += 1
      self.failed.append(report.nodeid + " (teardown)")

  def pytest_collectreport(self, report):
    if report.failed:
      self.counts["errors"] += 1
      self.failed.append(report.nodeid + " (collection)")


def kernel_tests(pytest_args: list[str]) -> int:
  """pytest.main(pytest_args) here, then one JSON line of the outcomes; pytest's exit code (no tests run: 5)."""
  import pytest
  os.chdir(_ROOT)
  plugin = _Outcomes()
  t0 = time.perf_counter()
  code = int(pytest.main(list(pytest_args), plugins=[plugin]))
  import jax  # loaded by the tests by now; configured by their conftest
  print(json.dumps({**plugin.counts, "exit_code": code, "seconds": round(time.perf_counter() - t0, 1),
                    "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
                    "failed_tests": plugin.failed[:30], "skip_reasons": plugin.skip_reasons,
                    "pytest_args": list(pytest_args)}), flush=True)
  return code


def last_json(text: str) -> dict | None:
  """The last line of `text` that is a JSON object, or None."""
  for line in reversed(text.splitlines()):
    line = line.strip()
    if line.startswith("{") and line.endswith("}"):
      try:
        obj = json.loads(line)
      except ValueError:
        continue
      if isinstance(obj, dict):
        return obj
  return None


def _error_line(text: str) -> str:
  """The most telling line of a failed stage's output: its last exception line, else its last line."""
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  for line in reversed(lines):
    head = line.split(":", 1)[0]
    if head.endswith(("Error", "Exception", "Exhausted")) or line.startswith(("FAILED", "ERROR")):
      return line[:400]
  return lines[-1][:400] if lines else "no output"


def stage_record(stage: str, rc: int, seconds: float, limit_s: float, log_text: str) -> dict[str, Any]:
  """The summary's entry of one stage: ok only if it exited 0 and printed its JSON line.

  The bench tools also print `{"partial": {...}}` lines as each figure is measured: a stage stopped by its timeout
  (or a crash) keeps them, merged, as `partial`.
  """
  figures = last_json("\n".join(line for line in log_text.splitlines() if not line.startswith('{"partial"')))
  rec: dict[str, Any] = {"ok": rc == 0 and figures is not None, "rc": rc, "seconds": round(seconds, 1),
                         "limit_s": limit_s, "timed_out": rc in TIMEOUT_RCS}
  if rec["timed_out"]:
    rec["error"] = f"timed out after {limit_s:g} s (last output: {_error_line(log_text)})"
  elif rc != 0:
    own = figures.get("error") if figures else None
    rec["error"] = f"exit {rc}: {own if isinstance(own, str) else _error_line(log_text)}"
  elif figures is None:
    rec["error"] = "exit 0 but no JSON line in its output"
  if figures is not None:
    rec["figures"] = figures
  elif partial := _partial_figures(log_text):
    rec["partial"] = partial
  return rec


def _partial_figures(log_text: str) -> dict[str, Any]:
  """The `{"partial": {...}}` lines of a stage's output merged in order (nested dicts merged key by key)."""
  def merge(into: dict, new: dict) -> dict:
    for k, v in new.items():
      into[k] = merge(dict(into.get(k) or {}), v) if isinstance(v, dict) and isinstance(into.get(k), dict) else v
    return into

  out: dict[str, Any] = {}
  for line in log_text.splitlines():
    if line.startswith('{"partial"'):
      try:
        merge(out, json.loads(line)["partial"])
      except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        continue  # a line cut by the kill
  return out


def headline(stages: dict[str, dict]) -> dict[str, Any]:
  """The few figures that go in the benchmark docs, picked out of the stages' JSON."""
  def fig(stage, *path):
    x = stages.get(stage, {}).get("figures")
    for p in path:
      x = x.get(p) if isinstance(x, dict) else None
    return x

  out: dict[str, Any] = {}
  if fig("kernel_tests", "passed") is not None:
    out["kernel_tests"] = {k: fig("kernel_tests", k) for k in ("passed", "failed", "skipped", "errors")}
  res = fig("bench_kernels", "results") or {}
  out["kernel_tflops"] = {k: float(f"{v['tflops']:.4g}") for k, v in res.items()
                          if isinstance(v, dict) and "tflops" in v}
  for k in ("c2jax_tflop_s", "mfu", "peak_tflops", "c2jax_tok_s", "batch", "seq_len", "total_params",
            "active_params"):
    if fig("train_mfu", k) is not None:
      out[f"train_{k}"] = fig("train_mfu", k)
  if fig("sampler", "c2jax_tok_s_by_batch") is not None:
    out["sampler_tok_s_by_batch"] = fig("sampler", "c2jax_tok_s_by_batch")
  return out


def record(out_dir: str, work_dir: str, stage: str, rc: int, seconds: float, limit_s: float) -> dict[str, Any]:
  """Writes OUT/<stage>.json and folds the stage into OUT/gpu_check.json; returns the stage's entry."""
  log = os.path.join(work_dir, f"{stage}.log")
  text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
  rec = stage_record(stage, rc, seconds, limit_s, text)
  with open(os.path.join(out_dir, f"{stage}.json"), "w") as f:
    json.dump(rec["figures"] if rec.get("figures") is not None and rec["ok"] else
              {"error": rec.get("error"), **({"figures": rec["figures"]} if "figures" in rec else {})}, f)
    f.write("\n")
  path = os.path.join(out_dir, "gpu_check.json")
  summary = json.load(open(path)) if os.path.exists(path) else {"stages": {}}
  summary["stages"][stage] = rec
  if stage == "preflight" and rec.get("figures"):
    pf = rec["figures"]
    summary["device"] = {k: pf.get(k) for k in ("backend", "device_kind", "device_count", "device_memory_gib",
                                                 "jax", "jaxlib", "python", "python_executable", "cpu_smoke")}
    if pf.get("missing_sentence"):
      summary["missing"] = pf["missing_sentence"]
  summary["failed"] = [s for s, r in summary["stages"].items() if not r["ok"]]
  summary["ok"] = not summary["failed"]
  summary["headline"] = headline(summary["stages"])
  with open(path, "w") as f:
    json.dump(summary, f, indent=1)
    f.write("\n")
  return rec


def finish(out_dir: str, total_s: float | None = None) -> int:
  """Prints each stage's line and the summary JSON (one line, last); 1 if any stage failed or none ran."""
  path = os.path.join(out_dir, "gpu_check.json")
  if not os.path.exists(path):
    print(json.dumps({"ok": False, "error": f"no {path}: no stage ran"}))
    return 1
  summary = json.load(open(path))
  if total_s is not None:
    summary["total_s"] = round(total_s, 1)
    with open(path, "w") as f:
      json.dump(summary, f, indent=1)
      f.write("\n")
  for stage, r in summary["stages"].items():
    print(f"{stage:14s} {'ok    ' if r['ok'] else 'FAILED'} {r['seconds']:7.1f} s of {r['limit_s']:g}"
          + ("" if r["ok"] else f"  {r.get('error')}"))
  # The last line: the summary without the stages' full figures (those are in the files).
  brief = {k: v for k, v in summary.items() if k != "stages"}
  brief["stages"] = {s: {k: v for k, v in r.items() if k != "figures"} for s, r in summary["stages"].items()}
  print(json.dumps(brief))
  return 0 if summary["ok"] and summary["stages"] else 1


def main(argv: list[str]) -> int:
  if len(argv) < 2:
    print(__doc__)
    return 2
  cmd, args = argv[1], argv[2:]
  if cmd == "preflight":
    return preflight(cpu_smoke="--cpu_smoke" in args)
  if cmd == "kernel_tests":
    return kernel_tests(args)
  if cmd == "record":
    out_dir, work_dir, stage, rc, seconds, limit_s = args
    rec = record(out_dir, work_dir, stage, int(rc), float(seconds), float(limit_s))
    return 0 if rec["ok"] else 1
  if cmd == "finish":
    return finish(args[0], float(args[1]) if len(args) > 1 else None)
  print(f"unknown command {cmd!r}: use preflight, kernel_tests, record or finish.", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv))
