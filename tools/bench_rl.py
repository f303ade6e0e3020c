"""Throughput of synchronous RL vs asynchronous RL with in-flight weight updates on the same config, in one
invocation (report section 6; PipelineRL reports about 2x); with `--compare=rows`, the RL update on padded vs packed
rows.

  .venv/bin/python tools/bench_rl.py                                    # configs/rl_char_class.py, 20 steps x 3 repeats
  .venv/bin/python tools/bench_rl.py --steps=8 --repeats=1 --warmup=2 --set=actors.num=1   # a quick look
  .venv/bin/python tools/bench_rl.py --config=configs/rl_char_class.py --set=actors.max_lag=2 --keep
  .venv/bin/python tools/bench_rl.py --placement=shared                 # every process on every core
  .venv/bin/python tools/bench_rl.py --compare=rows --repeats=5         # the update: padded vs packed rows (rl_tiny)

Each repeat runs `experiments/rl_main.py` twice, one run at a time, interleaved (sync, async, sync, async, ...) so
that a slow moment of a shared machine hurts both alike: `--config.schedule=sync` (max_lag 0, weights swapped only
between sampler calls: on-policy) and `--config.schedule=async` with `actors.weight_updates=in_flight` (actors keep
sampling during updates and swap new weights into running generations). Both get the same seed per repeat, the
held-out evaluator process off and 2 evaluation tasks (evaluation is not timed), and share one compilation cache
(tools/sweep.py runs them, so the config reaches rl_main as JSON and any `--set` override applies to both).

Figures per run, from the trainer's per-step log (metrics.jsonl) after the first --warmup steps (start-up and
compiles excluded): samples/s = rows trained / sum of step times, trained tokens/s = action tokens trained / sum of
step times, trainer wait fraction = time spent waiting for a batch from the buffer / sum of step times (a step's time
is its wait plus its update and publish). Reported: the medians over repeats per schedule, `ratio` = async / sync
samples/s, `tokens_ratio` the same for tokens/s, `trainer_wait_fraction` = the async runs' median wait fraction.
The whole-run figures of result.json (start-up included; the first run also pays the shared compiles, so they favour
later runs) are printed beside them.

Placement (`--placement`). `split` (the default) pins the trainer to the first half of this process's CPUs and
the actor pool to the rest (`trainer.cpus`, `actors.cpus`; c2jax/actors/placement.py), as a cluster gives training
and inference their own accelerators: synchronous RL then leaves each side idle while the other works, which is
what asynchronous RL wins back. `shared` leaves every process on every core; on a machine with few cores the
actors and the trainer then contend for the same CPU and the comparison mostly measures that contention.

Padded vs packed rows (`--compare=rows`, default config configs/rl_tiny.py: the main job's 32 rows of 1024). The
update alone (`update_step`, jitted, on this process's first device; no actors), on synthetic batches of the run
config's shape: sequence lengths drawn around --mean_length tokens (normal, sd --sd_length, clipped to [64, T]),
a 64-token prompt, the rest actions, groups of actors.group_size, 0/1 outcomes, routed expert ids. The same batch is
trained padded (a row per sequence) and packed (`trainer.rows=packed`: the smallest of the trainer's row buckets it
fits), interleaved (padded, packed, padded, ...; a new batch per repeat), one untimed warm-up step each (the
compile). Reported: median seconds per update each, trained tokens/s (action tokens / update time) and `ratio` =
packed / padded tokens/s.

The last line printed is one JSON object: `ratio` and `trainer_wait_fraction` (schedules), or `ratio` (rows).
"""

from __future__ import annotations

import enum
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
from typing import Mapping, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import numpy as np

from c2jax.actors import placement as placement_lib
from tools import sweep as sweep_lib

SCHEDULES = {
    "sync": {"schedule": "sync"},
    "async": {"schedule": "async", "actors.weight_updates": "in_flight"},
}


def steady_state(history: Sequence[Mapping], rows_per_step: int, warmup: int) -> dict[str, float]:
  """samples/s, tokens/s and the wait fraction of the steps after the first `warmup` of a run's metrics.jsonl.

  Raises:
    ValueError: when the run logged no step past the warm-up.
  """
  steps = [h for h in history if h["step"] > warmup]
  if not steps:
    raise ValueError(f"No step past the {warmup} warm-up steps was logged; raise --steps above --warmup.")
  seconds = sum(h["time/step_s"] for h in steps)
  return {"samples_per_s": len(steps) * rows_per_step / seconds,
          "tokens_per_s": sum(h["tokens"] for h in steps) / seconds,
          "wait_fraction": sum(h["buffer/wait_s"] for h in steps) / seconds,
          "staleness_mean": statistics.fmean(h["staleness/mean"] for h in steps),
          "steps_timed": len(steps)}


def summarize(per_run: Mapping[str, Sequence[Mapping[str, float]]]) -> dict:
  """Medians per schedule and the async / sync ratios."""
  med = {s: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for s, runs in per_run.items()}
  return {"ratio": med["async"]["samples_per_s"] / med["sync"]["samples_per_s"],
          "tokens_ratio": med["async"]["tokens_per_s"] / med["sync"]["tokens_per_s"],
          "trainer_wait_fraction": med["async"]["wait_fraction"],
          "sync_wait_fraction": med["sync"]["wait_fraction"],
          "sync": med["sync"], "async": med["async"]}


class Placement(enum.Enum):
  """Where the processes run (see the module docstring)."""

  SPLIT = "split"
  SHARED = "shared"


def placement_overrides(which: Placement) -> dict[str, str]:
  """The trainer.cpus / actors.cpus overrides of a placement."""
  if which is Placement.SHARED:
    return {}
  trainer, actors = placement_lib.split_cpus()
  return {"trainer.cpus": placement_lib.format_cpus(trainer), "actors.cpus": placement_lib.format_cpus(actors)}


def plan(base, workdir: str | os.PathLike, *, steps: int, repeats: int,
         overrides: Mapping | None = None) -> list[sweep_lib.Run]:
  """The runs in execution order: repeat 0 sync, repeat 0 async, repeat 1 sync, ... (seed = repeat)."""
  common = {"trainer.steps": steps, "eval.process": False, "eval.tasks": 2, **(overrides or {})}
  sweep = sweep_lib.Sweep(name="bench_rl", description="sync vs async", cells=SCHEDULES,
                          seeds=tuple(range(repeats)), metrics=())
  runs = sweep_lib.plan_runs(sweep, base, workdir, common=common)
  return sorted(runs, key=lambda r: (r.seed, list(SCHEDULES).index(r.cell)))


def synthetic_batch(rows: int, seq_len: int, group_size: int, model, terms: Sequence[str], rng, *,
                    mean_length: float, sd_length: float, prompt: int = 64) -> tuple[dict, np.ndarray]:
  """(a padded RL host batch of `rows` x `seq_len`, its sequence lengths [rows]) for `--compare=rows`: the reward
  terms `terms` are 0 but a 0/1 outcome."""
  lengths = np.clip(np.rint(rng.normal(mean_length, sd_length, rows)), max(prompt + 1, 64), seq_len).astype(np.int32)
  idx = np.arange(seq_len)[None]
  loss_mask = ((idx >= prompt) & (idx < lengths[:, None])).astype(np.float32)
  batch = {"tokens": rng.integers(0, model.vocab_size, (rows, seq_len)).astype(np.int32), "loss_mask": loss_mask,
           "behaviour_logprobs": (-rng.random((rows, seq_len)) * loss_mask).astype(np.float32),
           "policy_version": np.zeros((rows, seq_len), np.int32),
           "group_id": (np.arange(rows) // group_size).astype(np.int32), "chain_id": np.arange(rows, dtype=np.int32),
           "reward_terms": {t: (rng.integers(0, 2, rows) if t == "outcome" else np.zeros(rows)).astype(np.float32)
                            for t in terms},
           "truncated": (lengths == seq_len).astype(np.float32)}
  if model.n_moe_layers:
    batch["expert_ids"] = np.stack([  # distinct experts per token, as a router's top-k
        np.argsort(rng.random((rows, seq_len, model.n_routed_experts)), axis=-1)[..., :model.num_experts_per_tok]
        for _ in range(model.n_moe_layers)]).astype(np.int32)
  return batch, lengths


def main_rows(f) -> None:
  """`--compare=rows`: see the module docstring."""
  import functools
  import time

  import jax

  from c2jax.actors.actor import buffer_spec
  from c2jax.envs.token_tasks import suite as tasks_lib
  from c2jax.rl.update import init_state, update_step
  from c2jax.services import rl_loop, rl_run_config
  from c2jax.services.collate import lay_out

  config = sweep_lib.load_config(f.config or "configs/rl_tiny.py")
  config = sweep_lib.apply_overrides(config, {"trainer.rows": "packed", **sweep_lib.parse_set(f.set)})
  cfg = rl_run_config.parse(config)
  rl, model = cfg.rl, cfg.model_config
  rows = rl_loop.batch_rows(cfg)
  terms = tasks_lib.reward_terms(cfg.task_suite())
  seq_len = buffer_spec(model, cfg.actor_config, terms).seq_len
  buckets = rl_loop.row_buckets(cfg)
  rng = np.random.default_rng(0)
  step = jax.jit(functools.partial(update_step, cfg=rl), donate_argnums=0)
  states = {k: jax.jit(functools.partial(init_state, rl))(jax.random.key(0)) for k in ("padded", "packed")}
  times, tokens, packed_rows = {"padded": [], "packed": []}, {"padded": [], "packed": []}, []

  def run(kind, batch):
    t0 = time.perf_counter()
    states[kind], metrics = step(states[kind], jax.device_put(batch))
    n = float(jax.block_until_ready(metrics)["tokens"])
    return time.perf_counter() - t0, n

  for r in range(f.repeats + 1):  # repeat 0: the compiles, untimed
    padded, lengths = synthetic_batch(rows, seq_len, cfg.actor_config.group_size, model, terms, rng,
                                      mean_length=f.mean_length, sd_length=f.sd_length)
    packed = lay_out(padded, lengths, buckets)
    for kind, batch in (("padded", padded), ("packed", packed)):
      seconds, n = run(kind, batch)
      if r:
        times[kind].append(seconds)
        tokens[kind].append(n)
    if r:
      packed_rows.append(int(packed["tokens"].shape[0]))
      print(f"repeat {r}: padded {times['padded'][-1]:.2f} s, packed {times['packed'][-1]:.2f} s "
            f"({packed_rows[-1]} rows), {int(lengths.sum())} tokens in {rows} sequences", flush=True)
  med = {k: statistics.median(v) for k, v in times.items()}
  tps = {k: statistics.median(n / s for n, s in zip(tokens[k], times[k])) for k in times}
  out = {"ratio": tps["packed"] / tps["padded"], "padded_s": med["padded"], "packed_s": med["packed"],
         "padded_tokens_per_s": tps["padded"], "packed_tokens_per_s": tps["packed"], "rows": rows,
         "seq_len": seq_len, "packed_rows": statistics.median(packed_rows), "buckets": list(buckets),
         "repeats": f.repeats, "mean_length": f.mean_length, "sd_length": f.sd_length,
         "config": f.config or "configs/rl_tiny.py", "set": sweep_lib.parse_set(f.set),
         "device": str(jax.devices()[0].device_kind)}
  print(f"{f.repeats} repeats, medians: padded {med['padded']:.2f} s/update ({tps['padded']:.0f} tokens/s), packed "
        f"{med['packed']:.2f} s/update ({tps['packed']:.0f} tokens/s): {out['ratio']:.2f}x")
  print(json.dumps(out))


def main(argv: list[str]) -> None:
  from absl import flags

  del argv
  f = flags.FLAGS
  if f.compare == "rows":
    return main_rows(f)
  if f.steps <= f.warmup:
    raise ValueError(f"--steps={f.steps} must exceed --warmup={f.warmup} (warm-up steps are not timed).")
  overrides = {**placement_overrides(Placement(f.placement)), **sweep_lib.parse_set(f.set)}
  workdir = pathlib.Path(f.workdir or tempfile.mkdtemp(prefix="bench_rl_"))
  config = f.config or "configs/rl_char_class.py"
  runs = plan(sweep_lib.load_config(config), workdir, steps=f.steps, repeats=f.repeats, overrides=overrides)
  statuses = sweep_lib.execute(runs, parallel=1)
  failed = [r for r in runs if statuses[r.name] is not sweep_lib.Status.DONE]
  if failed:
    raise SystemExit("bench_rl: runs did not finish: " + ", ".join(f"{r.name} ({statuses[r.name].value}, log "
                                                                     f"{r.log})" for r in failed))
  per_run, whole = {s: [] for s in SCHEDULES}, {s: [] for s in SCHEDULES}
  for r in runs:
    c = json.loads(r.config)
    rows = c["trainer"]["groups_per_step"] * c["actors"]["group_size"]
    per_run[r.cell].append(steady_state(sweep_lib.read_history(r.workdir / "metrics.jsonl"), rows, f.warmup))
    whole[r.cell].append(json.loads((r.workdir / "result.json").read_text()))
  out = summarize(per_run)
  print(f"\n{f.repeats} repeats x {f.steps} steps ({f.warmup} warm-up steps not timed), medians:")
  print(f"{'schedule':<8} {'samples/s':>10} {'tokens/s':>10} {'wait':>7} {'staleness':>9}   whole run (result.json)")
  for s in SCHEDULES:
    m = out[s]
    w = {k: statistics.median(x[k] for x in whole[s]) for k in ("samples_per_s", "tokens_per_s", "wait_fraction")}
    out[s]["whole_run"] = w
    print(f"{s:<8} {m['samples_per_s']:>10.2f} {m['tokens_per_s']:>10.1f} {m['wait_fraction']:>7.1%} "
          f"{m['staleness_mean']:>9.2f}   {w['samples_per_s']:.2f} samples/s, {w['tokens_per_s']:.1f} tokens/s, "
          f"wait {w['wait_fraction']:.1%}")
  print(f"async / sync: {out['ratio']:.2f}x samples/s, {out['tokens_ratio']:.2f}x tokens/s; trainer waits "
        f"{out['trainer_wait_fraction']:.1%} of its step time (async)")
  if not f.keep and not f.workdir:
    shutil.rmtree(workdir, ignore_errors=True)
  else:
    print(f"runs kept in {workdir}")
  out.update({"steps": f.steps, "repeats": f.repeats, "warmup": f.warmup, "config": config,
              "placement": f.placement, "set": overrides})
  print(json.dumps(out))


if __name__ == "__main__":
  from absl import app
  from absl import flags

  flags.DEFINE_enum("compare", "schedules", ["schedules", "rows"],
                    "schedules: sync vs async runs; rows: the update on padded vs packed rows.")
  flags.DEFINE_string("config", "", "Run config (path[:arg]); empty: configs/rl_char_class.py (schedules) or "
                      "configs/rl_tiny.py (rows).")
  flags.DEFINE_float("mean_length", 370.0, "rows: mean sequence length drawn (tokens).")
  flags.DEFINE_float("sd_length", 130.0, "rows: standard deviation of the sequence lengths drawn.")
  flags.DEFINE_integer("steps", 20, "Trainer steps per run.")
  flags.DEFINE_integer("repeats", 3, "Interleaved (sync, async) pairs.")
  flags.DEFINE_integer("warmup", 3, "Leading steps of each run left out of the timing (start-up, compiles).")
  flags.DEFINE_enum("placement", Placement.SPLIT.value, [p.value for p in Placement],
                    "split: trainer and actors on disjoint halves of the CPUs; shared: all on all.")
  flags.DEFINE_multi_string("set", [], "key=value override for both schedules (repeatable), e.g. --set=actors.num=1.")
  flags.DEFINE_string("workdir", "", "Where the runs go (kept); empty: a temporary directory, deleted unless --keep.")
  flags.DEFINE_bool("keep", False, "Keep the temporary run directories.")
  app.run(main)
