"""Ablation sweeps: a grid of run-config overrides x seeds, each cell an `experiments/rl_main.py` run, then one
results table (report section 4: every design choice of the RL recipe is one config override).

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/dr_grpo_vs_grpo.py
  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/kl_estimator.py --seeds=3 \
      --parallel=2 --workdir=runs/sweeps/kl_estimator --set=trainer.steps=40 --set=eval.tasks=8
  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/async_vs_sync.py --dry_run

A sweep file (configs/sweeps/<name>.py) defines `get_sweep()` returning

  {"name": str, "description": str,                      # what the report claims, what tiny scale can show
   "cells": {cell_name: {override_key: value, ...}},     # dotted keys of the run config, e.g. "rl.advantage"
   "seeds": [0, 1, 2],                                   # `--config.seed` of each run
   "metrics": [...],                                     # the table's columns (see below)
   "curves": [...],                                      # optional: metrics.jsonl keys plotted over steps,
                                                         # or heldout/<key>: the held-out evaluations' (below)
   "max_parallel": int,                                  # optional: cap on --parallel (timing-sensitive sweeps)
   "config": str}                                        # optional: the base config it is written for (the
                                                         # default of --config; configs/rl_char_class.py if none)

Every (cell, seed) is its own rl_main process with its own workdir `<workdir>/<cell>/seed_<seed>`; rl_main gets
the base config with the overrides applied, as `configs/from_json.py:<run>/sweep_config.json` (the same JSON path
the actors read the trainer's config from; it also carries overrides of list fields such as `actors.stop_tokens`,
which command-line `--config.x=` flags cannot). Overrides apply in order: `--set` (every run), the cell's, then
the seed and the shared compilation cache (`<workdir>/jax_cache`, so that cells compiling the same programs pay
once). A key that is not a field of the base config is an error: a typo cannot silently ablate nothing.

Resuming: a run with `result.json` is finished and skipped; any other run is started again with the same command,
which rl_main resumes from its checkpoint. Ctrl-C or SIGTERM stops the running runs through rl_main's own signal
handling (finish the step, checkpoint) and the sweep then writes the results it has; a sweep killed outright takes
its runs down the same way (each gets SIGTERM when the sweep dies), so a rerun never meets a trainer still at work.
A run dir created with a different resolved config (the sweep file, the base config or --set changed) is refused,
not mixed into the results: use another --workdir or delete the run. `--set` values are read in their field's type
(`--set=eval.process=False`, `--set=actors.stop_tokens=[258]`).

Parallelism: each rl_main run is itself `actors.num` actor processes + the trainer (+ an evaluator when
`eval.process`), so `--parallel` defaults to max(1, cores // processes per run) (on 2 cores: 1 run at a time) rather
than one run per core pair; throughput metrics (tokens_per_s, samples_per_s, wait_fraction) of runs that shared
the machine are only comparable with each other (results.md records the parallelism).

Metrics, per run: a key of its `result.json` (pass_at_1_before/after, best_of_8_before/after, reward_first/last,
staleness_mean, filtered_fraction, tokens_per_s, samples_per_s, wait_fraction), or `<metrics.jsonl key>@<agg>`
over the trainer's per-step log with agg in first / last (mean over the first / last min(5, steps // 2) steps),
mean, max, delta (last - first), e.g. `length/incorrect@delta`.

Outputs in --workdir: results.md (per cell: finished / planned runs, mean +- std [min, max] per metric, and every
failed run's log), results.csv (one row per run), results.png (a bar per cell and metric with each seed's point),
curves.png (each `curves` metric over training steps, the cell's mean over seeds with a min-max band). A curve
`heldout/<key>` (e.g. `heldout/pass@1`) is the held-out evaluations' `<key>` over the weights' version: before RL
(version 0) and after it (eval.jsonl), and the evaluator process's during it (eval_during.jsonl, with `eval.process`
and `eval.every_versions`), one line per run; results.md then also lists it per run and version.
"""

from __future__ import annotations

import ast
import collections
import copy
import csv
import dataclasses
import enum
import importlib.util
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import ml_collections
import numpy as np

from c2jax.services import rl_run_config
from c2jax.services.run_log import read_history, read_records

REPO = pathlib.Path(__file__).resolve().parent.parent
RL_MAIN = REPO / "experiments" / "rl_main.py"
FROM_JSON = REPO / "configs" / "from_json.py"

RUN_CONFIG = "sweep_config.json"  # the resolved config a run was started with
RUN_STATUS = "sweep_status.json"  # the exit of the run's last process
RUN_LOG = "sweep.log"  # rl_main's stdout + stderr (its actors log under <run>/logs)
AGGREGATIONS = ("first", "last", "mean", "max", "delta")
DEFAULT_CONFIG = "configs/rl_char_class.py"  # the base config of a sweep file that names none
WINDOW = 5  # steps averaged by @first / @last, as rl_main's reward_first / reward_last
_CELL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


# ------------------------------------------------------------------------------------------------------------------
# Sweep files and configs.
# ------------------------------------------------------------------------------------------------------------------


HELDOUT = "heldout/"  # a curve of the held-out evaluations (over versions), not of the trainer's step log


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep file's grid (see the module docstring)."""

  name: str
  description: str
  cells: Mapping[str, Mapping[str, Any]]
  seeds: tuple[int, ...]
  metrics: tuple[str, ...]
  curves: tuple[str, ...] = ("reward/mean",)  # metrics.jsonl keys, or HELDOUT + a held-out evaluation's key
  max_parallel: int | None = None
  config: str = DEFAULT_CONFIG


def _load_module(path: str | os.PathLike, what: str):
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"{what} {str(path)!r} does not exist; pass a path to a .py file (relative to the current "
                     "directory or absolute).")
  spec = importlib.util.spec_from_file_location(f"_c2jax_{what}_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_sweep(path: str | os.PathLike, **arguments) -> Sweep:
  """Reads and checks a sweep file's `get_sweep(**arguments)` (keys, cell names, seeds, metric names); arguments
  are for sweep files whose cells depend on a run elsewhere (configs/sweeps/perplexity_vs_reward.py)."""
  module = _load_module(path, "sweep")
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"Sweep file {str(path)!r} defines no get_sweep(); see configs/sweeps/__init__.py.")
  d = dict(module.get_sweep(**arguments))
  required = {"name", "description", "cells", "seeds", "metrics"}
  optional = {"curves", "max_parallel", "config"}
  missing, unknown = sorted(required - set(d)), sorted(set(d) - required - optional)
  if missing or unknown:
    raise ValueError(f"Sweep file {str(path)!r}: get_sweep() lacks {missing} / has unknown keys {unknown}; it returns "
                     f"{sorted(required)} and optionally {sorted(optional)}.")
  cells = {str(k): dict(v) for k, v in d["cells"].items()}
  if not cells:
    raise ValueError(f"Sweep file {str(path)!r} has no cells; give at least one {{name: overrides}}.")
  bad = [c for c in cells if not _CELL_NAME.match(c)]
  if bad:
    raise ValueError(f"Sweep cell names {bad} are not usable as directory names; use letters, digits, _ . -.")
  seeds = tuple(int(s) for s in d["seeds"])
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"Sweep file {str(path)!r}: seeds={list(d['seeds'])} must be a non-empty list of distinct ints.")
  metrics = tuple(d["metrics"])
  for m in metrics:
    parse_metric(m)
  max_parallel = d.get("max_parallel")
  return Sweep(name=str(d["name"]), description=str(d["description"]).strip(), cells=cells, seeds=seeds,
               metrics=metrics, curves=tuple(d.get("curves", Sweep.curves)),
               max_parallel=None if max_parallel is None else int(max_parallel),
               config=str(d.get("config", DEFAULT_CONFIG)))


def load_config(spec: str) -> ml_collections.ConfigDict:
  """The run config of `path[:arg]` (as `--config=` takes it): the file's `get_config(arg)`."""
  path, _, arg = spec.partition(":")
  module = _load_module(path, "config")
  return module.get_config(arg) if arg else module.get_config()


def parse_set(items: Iterable[str]) -> dict[str, str]:
  """`["trainer.steps=3", "rl.advantage=grpo"]` -> {"trainer.steps": "3", "rl.advantage": "grpo"}; `apply_overrides`
  reads each value in its field's type, as a command-line `--config.x=` flag is read."""
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ValueError(f"--set {item!r} is not key=value; write e.g. --set=trainer.steps=20.")
    out[key.strip()] = value.strip()
  return out


def _coerce(old: Any, new: Any, key: str) -> Any:
  """`new` in the type of the field's current value `old`; a string (from --set) is parsed for non-string fields."""
  if isinstance(new, str) and not isinstance(old, str):
    if isinstance(old, bool):
      if new.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"Override {key}={new!r}: the field is a bool; give True or False.")
      return new.lower() in ("true", "1")
    try:
      new = ast.literal_eval(new)
    except (ValueError, SyntaxError):
      if old is not None:  # a field without a value (None) may take a plain string
        raise ValueError(f"Override {key}={new!r} is not a Python literal like the field's {old!r}.") from None
  if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
    return type(old)(new)
  if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
    return float(new)
  if isinstance(old, str) and not isinstance(new, str):
    raise ValueError(f"Override {key}={new!r}: the field holds a string ({old!r}); give a string.")
  return new


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                    where: str = "override") -> ml_collections.ConfigDict:
  """A copy of `config` with dotted-key overrides applied; only existing fields may be set.

  Raises:
    ValueError: for a key that is not a field of the config, or a value of the wrong type.
  """
  config = copy.deepcopy(config)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node, path = config, []
    for p in parents:
      if not isinstance(node, ml_collections.ConfigDict) or p not in node:
        have = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        raise ValueError(f"{where} key {key!r}: {'.'.join(path) or 'the config'} has no section {p!r} (it has "
                         f"{', '.join(have)}); fix the key.")
      node, path = node[p], path + [p]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      have = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      raise ValueError(f"{where} key {key!r}: {'.'.join(path) or 'the config'} has no field {leaf!r} (it has "
                       f"{', '.join(have)}); fix the key.")
    try:
      node[leaf] = _coerce(node[leaf], value, key)
    except TypeError as e:
      raise ValueError(f"{where} {key}={value!r} does not fit the field's type ({e}); give a value like "
                       f"{node[leaf]!r}.") from None
  return config


def config_json(config: ml_collections.ConfigDict) -> str:
  return json.dumps(config.to_dict(), sort_keys=True, indent=1)


# ------------------------------------------------------------------------------------------------------------------
# Runs.
# ------------------------------------------------------------------------------------------------------------------


class Status(enum.Enum):
  DONE = "done"  # result.json written
  FAILED = "failed"  # exited with an error (see its log)
  INTERRUPTED = "interrupted"  # stopped by a signal after checkpointing; rerunning the sweep resumes it
  NOT_RUN = "not run"  # never started here (or killed before its exit was recorded)


@dataclasses.dataclass(frozen=True)
class Run:
  """One (cell, seed): its workdir and the resolved config it runs."""

  cell: str
  seed: int
  workdir: pathlib.Path
  config: str  # JSON of the resolved run config

  @property
  def name(self) -> str:
    return f"{self.cell}/seed_{self.seed}"

  @property
  def log(self) -> pathlib.Path:
    return self.workdir / RUN_LOG

  def command(self, python: str = sys.executable) -> list[str]:
    return [python, str(RL_MAIN), f"--config={FROM_JSON}:{self.workdir / RUN_CONFIG}",
            f"--workdir={self.workdir}"]


def plan_runs(sweep: Sweep, base: ml_collections.ConfigDict, workdir: str | os.PathLike,
              seeds: Sequence[int] | None = None, common: Mapping[str, Any] | None = None) -> list[Run]:
  """Every (cell, seed) of the sweep with its resolved config, cells in the sweep file's order.

  Args:
    sweep: the grid.
    base: the base run config (configs/rl_char_class.py or configs/rl_tiny.py).
    workdir: the sweep's directory; run dirs go under it.
    seeds: replaces the sweep's seeds when given.
    common: `--set` overrides for every run (may not touch a key a cell sets: that would erase the ablation).
  """
  workdir = pathlib.Path(workdir).absolute()
  common = dict(common or {})
  for cell, overrides in sweep.cells.items():
    clash = sorted(set(overrides) & set(common))
    if clash:
      raise ValueError(f"--set {clash} would override what cell {cell!r} ablates; drop it from --set or edit the "
                       "sweep file.")
  config = apply_overrides(base, common, "--set")
  shared = {}
  if "compilation_cache" in config and not config.compilation_cache:
    shared["compilation_cache"] = str(workdir / "jax_cache")
  runs = []
  for cell, overrides in sweep.cells.items():
    cell_config = apply_overrides(config, overrides, f"sweep {sweep.name!r} cell {cell!r}")
    for seed in (sweep.seeds if seeds is None else seeds):
      run_config = apply_overrides(cell_config, {"seed": int(seed), **shared}, "sweep")
      try:  # every value checked now, not when the run starts (c2jax/services/rl_run_config.py)
        rl_run_config.parse(run_config)
      except ValueError as e:
        raise ValueError(f"sweep {sweep.name!r} cell {cell!r}: {e}") from None
      runs.append(Run(cell=cell, seed=int(seed), workdir=workdir / cell / f"seed_{int(seed)}",
                      config=config_json(run_config)))
  return runs


def processes_per_run(config_text: str) -> int:
  """Processes one rl_main run starts: the trainer, its local actors and (optionally) the evaluator."""
  c = json.loads(config_text)
  actors = c.get("actors", {})
  local = 0 if actors.get("external") else int(actors.get("num", 1))
  return 1 + local + int(bool(c.get("eval", {}).get("process")))


def default_parallel(runs: Sequence[Run], cores: int | None = None) -> int:
  cores = cores or os.cpu_count() or 1
  per_run = max((processes_per_run(r.config) for r in runs), default=1)
  return max(1, cores // per_run)


def status(run: Run) -> Status:
  if (run.workdir / "result.json").exists():
    return Status.DONE
  path = run.workdir / RUN_STATUS
  if not path.exists():
    return Status.NOT_RUN
  rc = json.loads(path.read_text())["returncode"]
  return Status.INTERRUPTED if rc in (130, -signal.SIGINT, -signal.SIGTERM) else Status.FAILED


def check_resumable(runs: Sequence[Run]) -> None:
  """Refuses run dirs that were started with another resolved config (loses nothing: it starts no run)."""
  stale = []
  for r in runs:
    path = r.workdir / RUN_CONFIG
    if path.exists() and json.loads(path.read_text()) != json.loads(r.config):
      stale.append(str(r.workdir))
  if stale:
    raise ValueError(f"Run dirs {', '.join(stale)} were started with another config (the sweep file, the base config "
                     "or --set changed); pass another --workdir, or delete those runs to start them afresh.")


def _child_env() -> dict:
  from c2jax.services.pool import child_env
  # Fake-device flags of a test process are dropped.
  return child_env()


def _stop_with_sweep() -> None:
  """In a run's process before rl_main starts: SIGTERM it (checkpoint and exit) when the sweep dies, even by SIGKILL
  (Linux PR_SET_PDEATHSIG), so that a rerun never finds a still-running trainer in the same workdir."""
  if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def execute(runs: Sequence[Run], parallel: int, *, env: Mapping[str, str] | None = None, progress: bool = True,
            poll_s: float = 0.5, command: Callable[[Run], list[str]] = Run.command) -> dict[str, Status]:
  """Runs every unfinished run, at most `parallel` at once; returns each run's status afterwards.

  `command(run)` is the run's argv (rl_main by default), started in the repository root.

  A run that fails is recorded (its exit code in `<run>/sweep_status.json`, its output in `<run>/sweep.log`) and
  the others go on. Ctrl-C / SIGTERM: the running rl_main processes are told to stop (they checkpoint), the sweep
  waits for them and returns; their runs read INTERRUPTED.
  """
  import tqdm

  check_resumable(runs)
  todo = collections.deque(r for r in runs if status(r) is not Status.DONE)
  env = dict(env) if env is not None else _child_env()
  running: dict[str, tuple[Run, subprocess.Popen, float]] = {}
  failed = 0
  bar = tqdm.tqdm(total=len(runs), initial=len(runs) - len(todo), desc="sweep", unit="run", disable=not progress)

  def finish(name: str, rc: int) -> None:
    nonlocal failed
    run, _, t0 = running.pop(name)
    (run.workdir / RUN_STATUS).write_text(json.dumps({"returncode": rc, "seconds": time.time() - t0,
                                                      "log": str(run.log)}))
    if status(run) is Status.FAILED:
      failed += 1
      bar.write(f"run {run.name} failed (exit {rc}); log: {run.log}")
    bar.update(1)
    bar.set_postfix(running=len(running), failed=failed)

  previous_term = signal.getsignal(signal.SIGTERM)

  def on_term(signum, frame):
    del signum, frame
    raise KeyboardInterrupt

  signal.signal(signal.SIGTERM, on_term)
  try:
    try:
      while todo or running:
        while todo and len(running) < parallel:
          run = todo.popleft()
          run.workdir.mkdir(parents=True, exist_ok=True)
          (run.workdir / RUN_CONFIG).write_text(run.config)
          (run.workdir / RUN_STATUS).unlink(missing_ok=True)
          with open(run.log, "ab") as log:
            argv = command(run)
            log.write(f"\n$ {' '.join(argv)}\n".encode())
            log.flush()
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=REPO, env=env, preexec_fn=_stop_with_sweep)
          running[run.name] = (run, process, time.time())
          bar.set_postfix(running=len(running), failed=failed)
        for name, (_, process, _) in list(running.items()):
          rc = process.poll()
          if rc is not None:
            finish(name, rc)
        time.sleep(poll_s)
    except KeyboardInterrupt:
      bar.write(f"stopping: {len(running)} running runs checkpoint and exit; rerun the same command to resume")
      for _, process, _ in running.values():
        if process.poll() is None:
          process.send_signal(signal.SIGINT)  # rl_main: finish the step, checkpoint, exit 130
      for name, (_, process, _) in list(running.items()):
        finish(name, process.wait())
  finally:
    signal.signal(signal.SIGTERM, previous_term)
    bar.close()
  return {r.name: status(r) for r in runs}


# ------------------------------------------------------------------------------------------------------------------
# Results.
# ------------------------------------------------------------------------------------------------------------------


def parse_metric(spec: str) -> tuple[str, str | None]:
  """`"pass_at_1_after"` -> (key, None): from result.json; `"length/incorrect@delta"` -> (key, agg): from
  metrics.jsonl."""
  key, sep, agg = spec.partition("@")
  if not key or (sep and agg not in AGGREGATIONS):
    raise ValueError(f"Metric {spec!r} is not `<result.json key>` or `<metrics.jsonl key>@<agg>` with agg in "
                     f"{', '.join(AGGREGATIONS)}.")
  return key, (agg if sep else None)


def metric_value(spec: str, result: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> float:
  """One run's value of a metric (NaN when the run does not have it)."""
  key, agg = parse_metric(spec)
  if agg is None:
    v = result.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
  values = np.asarray([h[key] for h in history if isinstance(h.get(key), (int, float))], np.float64)
  if not values.size:
    return math.nan
  w = min(WINDOW, max(1, values.size // 2))
  first, last = float(values[:w].mean()), float(values[-w:].mean())
  return {"first": first, "last": last, "mean": float(values.mean()), "max": float(values.max()),
          "delta": last - first}[agg]


@dataclasses.dataclass(frozen=True)
class RunResult:
  run: Run
  status: Status
  returncode: int | None
  values: dict[str, float]  # metric spec -> value (NaN when missing)
  history: list[dict]
  heldout: list[dict] = dataclasses.field(default_factory=list)  # held-out evaluations by version (`read_heldout`)


def read_heldout(workdir: pathlib.Path) -> list[dict]:
  """A run's held-out evaluations in version order: before RL (version 0), the evaluator process's during RL
  (eval_during.jsonl) and after RL (eval.jsonl); where a version was evaluated twice the later record counts."""
  by_version = {}
  for path in (workdir / "eval_during.jsonl", workdir / "eval.jsonl"):
    for r in read_records(path):
      version = r.get("version", 0 if r.get("when") == "before" else None)
      if isinstance(version, int):
        by_version[version] = {**r, "version": version}
  return [by_version[v] for v in sorted(by_version)]


def collect(runs: Sequence[Run], metrics: Sequence[str]) -> list[RunResult]:
  """Reads every run's result.json, metrics.jsonl and exit record (finished or not)."""
  out = []
  for r in runs:
    st = status(r)
    result_path, status_path = r.workdir / "result.json", r.workdir / RUN_STATUS
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    rc = json.loads(status_path.read_text())["returncode"] if status_path.exists() else None
    history = read_history(r.workdir / "metrics.jsonl")
    # Unfinished runs' metrics stay out of the statistics: a half-trained run would skew the cell's mean.
    values = {m: metric_value(m, result, history) if st is Status.DONE else math.nan for m in metrics}
    out.append(RunResult(run=r, status=st, returncode=rc, values=values, history=history,
                         heldout=read_heldout(r.workdir)))
  return out


def _summary(values: Sequence[float]) -> str:
  v = np.asarray([x for x in values if not math.isnan(x)], np.float64)
  if not v.size:
    return "n/a"
  fmt = lambda x: f"{x:.4g}"
  if v.size == 1:
    return fmt(v[0])
  return f"{fmt(v.mean())} ± {fmt(v.std(ddof=1))} [{fmt(v.min())}, {fmt(v.max())}]"


def results_table(sweep: Sweep, results: Sequence[RunResult]) -> str:
  """The Markdown table: one row per cell, finished / planned runs (and failed ones) and mean ± std [min, max] per
  metric over the finished runs."""
  header = ["cell", "runs done"] + list(sweep.metrics)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for cell in sweep.cells:
    rs = [r for r in results if r.run.cell == cell]
    done = sum(r.status is Status.DONE for r in rs)
    failed = sum(r.status is Status.FAILED for r in rs)
    row = [cell, f"{done}/{len(rs)}" + (f", {failed} failed" if failed else "")]
    row += [_summary([r.values[m] for r in rs]) for m in sweep.metrics]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines)


def write_report(sweep: Sweep, results: Sequence[RunResult], workdir: str | os.PathLike, *, base: str = "",
                 common: Mapping[str, Any] | None = None, parallel: int | None = None) -> dict[str, pathlib.Path]:
  """results.md, results.csv, results.png and curves.png in `workdir`; returns their paths."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  paths = {"md": workdir / "results.md", "csv": workdir / "results.csv", "png": workdir / "results.png",
           "curves": workdir / "curves.png"}
  lines = [f"# Sweep `{sweep.name}`", "", sweep.description, ""]
  if base:
    lines.append(f"Base config: `{base}`" + (f"; for every run: `{json.dumps(dict(common))}`" if common else "") + ".")
  if parallel:
    lines.append(f"Runs in parallel: {parallel} (on {os.cpu_count()} cores; throughput metrics compare only runs "
                 "that shared the machine alike).")
  lines += ["", "Cells:", ""] + [f"- `{c}`: `{json.dumps(dict(o))}`" for c, o in sweep.cells.items()]
  lines += ["", "Mean ± sample std [min, max] over the finished seeds (one value: one seed).", "",
            results_table(sweep, results), ""]
  for key in filter(_is_heldout, sweep.curves):
    table = heldout_table(sweep, results, key)
    if table:
      lines += [f"Held-out `{key[len(HELDOUT):]}` by weights version:", "", table, ""]
  unfinished = [r for r in results if r.status is not Status.DONE]
  if unfinished:
    lines += ["Unfinished runs:", ""]
    lines += [f"- `{r.run.name}`: {r.status.value}" + (f" (exit {r.returncode})" if r.returncode is not None else "")
              + (f", log `{r.run.log}`" if r.run.log.exists() else "") for r in unfinished]
    lines.append("")
  paths["md"].write_text("\n".join(lines))

  with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["cell", "seed", "status", "returncode", "workdir", "log"] + list(sweep.metrics))
    for r in results:
      w.writerow([r.run.cell, r.run.seed, r.status.value, "" if r.returncode is None else r.returncode,
                  str(r.run.workdir), str(r.run.log)] + [repr(r.values[m]) for m in sweep.metrics])

  _plot_bars(sweep, results, paths["png"])
  _plot_curves(sweep, results, paths["curves"])
  return paths


def _plot_bars(sweep: Sweep, results: Sequence[RunResult], path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cells = list(sweep.cells)
  n = len(sweep.metrics)
  cols = min(4, n)
  rows = math.ceil(n / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
  for ax, metric in zip(axes.flat, sweep.metrics):
    for i, cell in enumerate(cells):
      v = np.asarray([r.values[metric] for r in results if r.run.cell == cell], np.float64)
      v = v[~np.isnan(v)]
      if v.size:
        ax.bar(i, v.mean(), color=f"C{i}", alpha=0.5)
        # Each seed's value, spread a little sideways so that equal values stay visible.
        ax.scatter(i + np.linspace(-0.15, 0.15, v.size), v, color=f"C{i}", s=14, zorder=3)
    ax.set_xticks(range(len(cells)), cells, rotation=30, ha="right", fontsize=7)
    ax.set_title(metric, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  fig.suptitle(f"{sweep.name}: mean over seeds (bars) and each seed (points)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _is_heldout(key: str) -> bool:
  return key.startswith(HELDOUT)


def curve_points(key: str, results: Sequence[RunResult]) -> dict[int, list[float]]:
  """{step or version: the runs' values} of curve `key` (a metrics.jsonl key over steps, or HELDOUT + a held-out
  evaluation's key over versions)."""
  by_x = collections.defaultdict(list)
  for r in results:
    records, x, name = ((r.heldout, "version", key[len(HELDOUT):]) if _is_heldout(key) else (r.history, "step", key))
    for h in records:
      if isinstance(h.get(name), (int, float)) and not isinstance(h.get(name), bool):
        by_x[h[x]].append(float(h[name]))
  return dict(by_x)


def heldout_table(sweep: Sweep, results: Sequence[RunResult], key: str) -> str:
  """Markdown: per run, held-out curve `key` at each version it was evaluated at (the evaluator process takes the
  newest version when it is free, so runs are evaluated at versions of their own)."""
  lines = []
  for r in results:
    points = curve_points(key, [r])
    if points:
      lines.append(f"- `{r.run.name}`: " + ", ".join(f"v{v}: {points[v][0]:.4g}" for v in sorted(points)))
  return "\n".join(lines)


def _plot_curves(sweep: Sweep, results: Sequence[RunResult], path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  n = max(1, len(sweep.curves))
  fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.0), squeeze=False)
  for ax, key in zip(axes.flat, sweep.curves):
    for i, cell in enumerate(sweep.cells):
      runs = [r for r in results if r.run.cell == cell]
      if _is_heldout(key):  # each run its own line: runs are evaluated at versions of their own
        for j, r in enumerate(runs):
          points = curve_points(key, [r])
          if points:
            x = sorted(points)
            ax.plot(x, [points[v][0] for v in x], color=f"C{i}", marker=".", lw=1, label=cell if j == 0 else None)
        continue
      by_step = curve_points(key, runs)
      if not by_step:
        continue
      steps = sorted(by_step)
      values = [np.asarray(by_step[s]) for s in steps]
      ax.plot(steps, [v.mean() for v in values], color=f"C{i}", label=cell)
      ax.fill_between(steps, [v.min() for v in values], [v.max() for v in values], color=f"C{i}", alpha=0.15)
    ax.set_xlabel("weights version" if _is_heldout(key) else "step", fontsize=8)
    ax.set_title(key, fontsize=9)
    ax.tick_params(labelsize=7)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.suptitle(f"{sweep.name}: mean over seeds, min-max band (held-out curves: one line per run)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------------------------------------------


def parse_seeds(text: str, sweep: Sweep) -> tuple[int, ...]:
  """--seeds: N (seeds 0..N-1) or a comma list (3,7); empty: the sweep file's."""
  if not text:
    return sweep.seeds
  if "," in text:
    return tuple(int(s) for s in text.split(",") if s.strip())
  n = int(text)
  if n < 1:
    raise ValueError(f"--seeds={text} must be >= 1 (or a comma-separated list of seeds).")
  return tuple(range(n))


def main(argv: list[str]) -> None:
  from absl import flags

  del argv
  f = flags.FLAGS
  try:
    sweep = load_sweep(f.sweep)
    # The sweep's own base config, from the repository, unless --config names another.
    config = f.config or (sweep.config if os.path.exists(sweep.config.split(":")[0]) else str(REPO / sweep.config))
    base = load_config(config)
    common = parse_set(f.set or [])
    workdir = pathlib.Path(f.workdir or os.path.join("runs", "sweeps", sweep.name)).absolute()
    runs = plan_runs(sweep, base, workdir, seeds=parse_seeds(f.seeds, sweep), common=common)
    check_resumable(runs)
  except ValueError as e:  # a bad sweep file, key, value or run dir: one sentence, no traceback
    sys.exit(f"tools/sweep.py: {e}")
  parallel = f.parallel or default_parallel(runs)
  if sweep.max_parallel:
    parallel = min(parallel, sweep.max_parallel)
  if f.dry_run:
    for r in runs:
      print(f"[{status(r).value}] {r.name}: {' '.join(r.command())}")
      overrides = {**common, **sweep.cells[r.cell], "seed": r.seed}
      print(f"    overrides of {config}: {json.dumps(overrides)}")
    print(f"{len(runs)} runs, {parallel} at a time, in {workdir}")
    return
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "sweep.json").write_text(json.dumps({**dataclasses.asdict(sweep), "config": config,
                                                  "set": common, "parallel": parallel}, indent=1, default=list))
  statuses = execute(runs, parallel)
  results = collect(runs, sweep.metrics)
  paths = write_report(sweep, results, workdir, base=config, common=common, parallel=parallel)
  print(results_table(sweep, results))
  print(f"\n{paths['md']}\n{paths['csv']}\n{paths['png']}\n{paths['curves']}")
  counts = collections.Counter(s.value for s in statuses.values())
  print(json.dumps({"sweep": sweep.name, "runs": len(runs), **counts, "results": str(paths["md"])}))
  if counts.get(Status.INTERRUPTED.value):
    sys.exit(130)


if __name__ == "__main__":
  from absl import app
  from absl import flags

  flags.DEFINE_string("config", "", "Base run config (path[:arg]); empty: the sweep file's \"config\" "
                      f"({DEFAULT_CONFIG} if it names none). The sweep's keys are its fields.")
  flags.DEFINE_string("sweep", None, "Sweep file (configs/sweeps/<name>.py).", required=True)
  flags.DEFINE_string("seeds", "", "N (seeds 0..N-1) or a comma list; empty: the sweep file's seeds.")
  flags.DEFINE_integer("parallel", 0, "Runs at once; 0: max(1, cores // processes per run).")
  flags.DEFINE_string("workdir", "", "Sweep directory; empty: runs/sweeps/<sweep name>.")
  flags.DEFINE_multi_string("set", [], "key=value override for every run (repeatable), e.g. --set=trainer.steps=20.")
  flags.DEFINE_bool("dry_run", False, "Print the runs' commands and statuses; run nothing.")
  app.run(main)
