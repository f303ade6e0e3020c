"""Code perplexity against downstream RL reward (report section 3): one pretraining, RL from several of its points.

  python tools/perplexity_vs_reward.py                                  # every step below, resumable
  python tools/perplexity_vs_reward.py --seeds=0 --set=trainer.steps=20 --workdir=runs/ppl_quick
  python tools/perplexity_vs_reward.py --job=agentic --seeds=0     # the multi-turn agent, `make demo`'s main job

1. Pretrains the main job's model (the pretraining config of configs/sweeps/perplexity_vs_reward.py's `JOBS[job]`, as
   experiments/pretrain_main.py) into <workdir>/pretrain, writing a model at each of the sweep's POINTS with its
   held-out code perplexity (`checkpoint.model_at`); a finished pretraining is reused, an interrupted one resumes.
2. Runs the sweep's cells (tools/sweep.py: one experiments/rl_main.py run per point and seed, resumable): the main
   job with its SFT started from that point's model.
3. Reads each point's perplexity from <workdir>/pretrain/eval.jsonl and each run's held-out figures from its
   result.json, fits reward = a + b ln(perplexity) (`c2jax.services.loglinear.fit_reward`) for the held-out mean
   reward and pass@1 after RL, and writes

     <workdir>/perplexity_vs_reward.md    the table (per point: perplexity, figures before and after RL per seed)
                                           and the fits
     <workdir>/perplexity_vs_reward.png   reward and pass@1 after RL against perplexity (log axis), with the fits
     <workdir>/results.md, results.png    tools/sweep.py's own report of the cells

The last line printed is a JSON summary (the fits' slopes, R^2 and the points).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
from typing import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from c2jax.services import loglinear
from c2jax.services.run_log import read_records
from configs.sweeps.perplexity_vs_reward import JOBS, POINTS
from tools import sweep as sweep_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
SWEEP_FILE = REPO / "configs" / "sweeps" / "perplexity_vs_reward.py"
PRETRAIN_MAIN = REPO / "experiments" / "pretrain_main.py"
# The RL figures fitted against perplexity: result.json keys (held-out, after RL), and the same before RL (the SFT).
FITTED = ("reward_heldout_after", "pass_at_1_after")


def pretrain(pretrain_dir: pathlib.Path, config: str, points: Sequence[int],
             sets: Sequence[str] = ()) -> dict[int, float]:
  """Runs (or resumes, or reuses) the pretraining, `max(points)` steps of its one phase; returns {step: held-out
  perplexity} at every point. `sets`: `key=value` overrides of the pretraining config."""
  models = [pretrain_dir / "models" / f"step_{s}" / "model_config.json" for s in points]
  if not all(m.exists() for m in models):
    argv = [sys.executable, str(PRETRAIN_MAIN), f"--config={REPO / config}", f"--workdir={pretrain_dir}",
            f"--config.phases.bulk.steps={max(points)}",
            f"--config.checkpoint.model_at=({','.join(map(str, points))},)"] + [f"--config.{s}" for s in sets]
    print(f"$ {' '.join(argv)}", flush=True)
    rc = subprocess.run(argv, cwd=REPO, check=False).returncode
    if rc:
      raise ValueError(f"the pretraining exited {rc} (its output is above); rerun to resume it ({pretrain_dir})")
  return perplexities(pretrain_dir, points)


def perplexities(pretrain_dir: pathlib.Path, points: Sequence[int]) -> dict[int, float]:
  """{step: held-out perplexity} from the pretraining's eval.jsonl (the last record of each step)."""
  by_step = {int(r["step"]): float(r["heldout_ppl"]) for r in read_records(pretrain_dir / "eval.jsonl")}
  missing = [s for s in points if s not in by_step]
  if missing:
    raise ValueError(f"{pretrain_dir}/eval.jsonl has no evaluation at steps {missing}; was it pretrained with "
                     "another checkpoint.model_at? Delete it or pass another --workdir.")
  return {s: by_step[s] for s in points}


def table(rows: list[dict], fits: dict[str, loglinear.RewardFit | None]) -> str:
  """The markdown table (one line per run) and the fits."""
  keys = ("pass_at_1_before", "pass_at_1_after", "best_of_k_before", "best_of_k_after", "reward_heldout_before",
          "reward_heldout_after")
  out = ["| point | perplexity | seed | " + " | ".join(keys) + " |", "|" + "---|" * (3 + len(keys))]
  for r in rows:
    cells = [f"{r[k]:.3f}" if isinstance(r.get(k), float) and math.isfinite(r[k]) else "-" for k in keys]
    out.append(f"| step {r['step']} | {r['ppl']:.2f} | {r['seed']} | " + " | ".join(cells) + " |")
  out.append("")
  for key, f in fits.items():
    out.append(f"- `{key}` = {f.intercept:.3f} + ({f.slope:.4f}) ln(ppl): R² {f.r2:.3f} over {f.points} runs, "
               f"{f.per_halving:+.4f} per halving of perplexity" if f else f"- `{key}`: too few points to fit")
  return "\n".join(out)


def plot(rows: list[dict], fits: dict[str, loglinear.RewardFit | None], path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axes = plt.subplots(1, len(FITTED), figsize=(5.2 * len(FITTED), 3.8), squeeze=False)
  for ax, key in zip(axes.flat, FITTED):
    before = key.replace("_after", "_before")
    for seed in sorted({r["seed"] for r in rows}):
      mine = [r for r in rows if r["seed"] == seed and math.isfinite(r.get(key, math.nan))]
      ax.plot([r["ppl"] for r in mine], [r[key] for r in mine], "o", color=f"C{seed}", label=f"after RL, seed {seed}")
      ax.plot([r["ppl"] for r in mine], [r.get(before, math.nan) for r in mine], "x", color=f"C{seed}", alpha=0.6,
              label=f"SFT (before RL), seed {seed}")
    f = fits.get(key)
    if f is not None:
      xs = np.geomspace(*f.ppl_range, 50)
      ax.plot(xs, [f.predict(v) for v in xs], "k--", lw=1, label=f"fit: {f.slope:+.3f} ln(ppl), R²={f.r2:.2f}")
    ax.set_xscale("log")
    ax.set_xlabel("held-out code perplexity of the base model")
    ax.set_ylabel(key.replace("_", " "))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("RL from points of one pretraining (tools/perplexity_vs_reward.py)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run(workdir: pathlib.Path, *, points: Sequence[int] = POINTS, seeds: str = "", sets: Sequence[str] = (),
        pretrain_sets: Sequence[str] = (), parallel: int = 0, progress: bool = True, job: str = "single_turn",
        command: Callable[[sweep_lib.Run], list[str]] = sweep_lib.Run.command) -> dict:
  """Steps 1-3 of the module docstring in `workdir`; returns the JSON summary.

  Args:
    workdir: the pretraining goes to <workdir>/pretrain, the runs to <workdir>/<cell>/seed_<seed>.
    points: the pretraining steps RL starts from (0: the random init).
    seeds: as tools/sweep.py's --seeds (empty: the sweep file's).
    sets: `key=value` overrides of every RL run; pretrain_sets: of the pretraining (`--config.` flags' keys).
    parallel: RL runs at once (0: as tools/sweep.py chooses).
    job: which main job (configs/sweeps/perplexity_vs_reward.py's JOBS): its pretraining and RL configs.
    command: a run's argv (tools/sweep.py's `execute`; rl_main by default).
  Raises:
    ValueError: a bad point, seed, override or run directory (before anything runs).
  """
  pretrain_dir = workdir / "pretrain"
  points = tuple(sorted(set(int(p) for p in points)))
  sweep = sweep_lib.load_sweep(SWEEP_FILE, pretrain_dir=str(pretrain_dir), points=points, job=job)
  base = sweep_lib.load_config(str(REPO / sweep.config))
  common = sweep_lib.parse_set(sets)
  runs = sweep_lib.plan_runs(sweep, base, workdir, seeds=sweep_lib.parse_seeds(seeds, sweep), common=common)
  sweep_lib.check_resumable(runs)
  ppl = pretrain(pretrain_dir, JOBS[job].pretrain_config, points, pretrain_sets)
  statuses = sweep_lib.execute(runs, parallel or sweep_lib.default_parallel(runs), progress=progress,
                               command=command)
  results = sweep_lib.collect(runs, sweep.metrics)
  sweep_lib.write_report(sweep, results, workdir, base=sweep.config, common=common)
  rows = []
  for r in results:
    result_path = r.run.workdir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    step = int(r.run.cell.split("_")[1])
    rows.append({"step": step, "ppl": ppl[step], "seed": r.run.seed,
                 **{k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}})
  fits = {key: loglinear.fit_reward([(r["ppl"], r.get(key, math.nan)) for r in rows]) for key in FITTED}
  text = table(rows, fits)
  (workdir / "perplexity_vs_reward.md").write_text(
      f"# Held-out code perplexity against RL reward\n\n{sweep.description}\n\n{text}\n")
  plot(rows, fits, workdir / "perplexity_vs_reward.png")
  print(text)
  print(f"\n{workdir / 'perplexity_vs_reward.md'}\n{workdir / 'perplexity_vs_reward.png'}")
  return {"points": {str(s): ppl[s] for s in points}, "runs": len(runs),
          "finished": sum(s is sweep_lib.Status.DONE for s in statuses.values()), "rows": rows,
          **{f"fit_{k}": (fits[k].to_dict() if fits[k] else None) for k in FITTED}}


def main(argv: list[str]) -> None:
  from absl import flags

  del argv
  f = flags.FLAGS
  try:
    name = sweep_lib.load_sweep(SWEEP_FILE, job=f.job).name  # the default workdir is the job's sweep's
    workdir = pathlib.Path(f.workdir or os.path.join("runs", "sweeps", name)).absolute()
    points = tuple(int(s) for s in f.points.split(",")) if f.points else POINTS
    summary = run(workdir, points=points, seeds=f.seeds, sets=f.set or [], pretrain_sets=f.pretrain_set or [],
                  parallel=f.parallel, job=f.job)
  except ValueError as e:  # a bad point, seed, key, value or run dir: one sentence, no traceback
    sys.exit(f"tools/perplexity_vs_reward.py: {e}")
  summary.pop("rows")
  print(json.dumps(summary))


if __name__ == "__main__":
  from absl import app
  from absl import flags

  flags.DEFINE_enum("job", "single_turn", sorted(JOBS), "Which main job: its pretraining and RL configs "
                    "(configs/sweeps/perplexity_vs_reward.py's JOBS).")
  flags.DEFINE_string("workdir", "", "Where the pretraining and the runs go; empty: runs/sweeps/perplexity_vs_reward "
                      "(with _<job> for a job other than single_turn).")
  flags.DEFINE_string("points", "", "Comma-separated pretraining steps; empty: the sweep file's POINTS.")
  flags.DEFINE_string("seeds", "", "N (seeds 0..N-1) or a comma list; empty: the sweep file's seeds.")
  flags.DEFINE_integer("parallel", 0, "RL runs at once; 0: max(1, cores // processes per run).")
  flags.DEFINE_multi_string("set", [], "key=value override for every RL run, e.g. --set=trainer.steps=20.")
  flags.DEFINE_multi_string("pretrain_set", [], "key=value override of the pretraining, e.g. "
                            "--pretrain_set=phases.bulk.batch_size=16.")
  app.run(main)
