"""The RL trainer's loop: consume committed groups from the rollout buffer, update, publish weights (report sections
4 and 6: the trainer and the actors run independently; PipelineRL-style in-flight weight updates).

  result = run(cfg, workdir)        # cfg: `rl_run_config.parse(...)`; what c2jax.services.rl_job runs

Each step (`_Trainer.step`):
  1. `take_batch`: `RolloutReader.take(groups_per_step)`, each committed group exactly once, whole (read in a
     background thread during the previous update, c2jax/rollouts/prefetch.py; the checkpointed cursor is that of
     the trained batches); a multi-host trainer broadcasts process 0's batch and its decision to stop or fail;
  2. `update`: `update_step` on the collated batch (`c2jax.rl.update`; the recipe in `cfg.rl`), a row per sequence or
     packed (`trainer.rows`, `c2jax.rl.packing`: the same update with less padding);
  3. `publish`: the new weights (`WeightStore`: a delta on the previous version, a full snapshot every N), then the
     trainer's progress (`trainer.json`: version and groups consumed), which admission reads;
  4. `log_step`: metrics.jsonl, consumed.jsonl and TensorBoard (`c2jax.services.run_log`);
  5. every `checkpoint_every` steps, an orbax checkpoint of the RL state together with the reader's cursor and the
     weights version, so a restarted trainer resumes exactly: no committed group is lost or trained on twice
     (groups handed out after the checkpoint are handed out again, to the restored state that never saw them).

Versions. The weights version is the weight store's counter: it starts at the store's next free version and
grows by one per update, so it stays monotone across restarts (versions published by a killed run after its last
checkpoint are orphans: tokens sampled with them count as off-policy by the gap). `version - state.step` is saved
with the checkpoint; the update sees token versions in its own step numbering.

Outputs in `workdir`: checkpoints/ (orbax), config.json (the run config), metrics.jsonl (one line per step),
consumed.jsonl (the (shard, seq) of every group each step trained on), tb/ (TensorBoard), eval.jsonl (held-out
evaluations before and after), result.json, training.png (c2jax/services/rl_report.py), and model/: the trained
policy as a c2jax model checkpoint (`c2jax.model.checkpoint`; what tools/export_hf.py exports, eval_main evaluates
and another run starts from), written when the run finishes. A restart drops the records a killed run logged past
its checkpoint.

The loop's stages (`COMPILE` for multi-turn actors, `BEFORE`, `TRAIN`, `AFTER`) are announced with their place in the
job's plan (`c2jax.services.stages`), their progress bars labelled by it; the first update, which compiles, is
announced. `COMPILE` compiles the evaluation's agent engine's whole set of programs, which the actors (the same engine
shapes and XLA flags) then read from the compilation cache. The first weights are published after `BEFORE` (the
actors start sampling then).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import shutil
import time
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from c2jax.actors import behaviour
from c2jax.actors.actor import buffer_spec
from c2jax.envs.token_tasks import suite as tasks_lib
from c2jax.model.checkpoint import load_checkpoint_for, save_checkpoint
from c2jax.model.params import init_params
from c2jax.parallel.mesh import MeshRefusal, mesh_of
from c2jax.rl import packing, sharded
from c2jax.rl.packing import RowLayout
from c2jax.rl.update import init_state, update_step
from c2jax.rollouts import admission
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.prefetch import Prefetcher
from c2jax.rollouts.storage import Store
from c2jax.rollouts.weight_store import WeightStore
from c2jax.services import chain_metrics, rl_report
from c2jax.services import stages
from c2jax.services.collate import empty_batch, groups_to_batch, lay_out, sequence_lengths
from c2jax.services.held_out import held_out_evaluation
from c2jax.services.rl_run_config import RUN_CONFIG_KEY, RLRunConfig, to_json
from c2jax.services.run_log import RunLog, read_history

MODEL_DIR = "model"  # in the workdir: the trained policy as a c2jax model checkpoint

# The trainer's stages, as an RL job's plan names them (`c2jax.services.stages`).
BEFORE, TRAIN, AFTER = "held-out evaluation before RL", "RL", "held-out evaluation after RL"
# Multi-turn jobs only: the agent engine's whole bounded set of programs, before the first evaluation.
COMPILE = "compiling the sampling programs"


def _host(tree):
  """Host numpy copies of (possibly sharded, possibly multi-host) arrays; every process must call it."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    tree = multihost_utils.process_allgather(tree, tiled=True)
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _in_flight_rows(batch: dict) -> float:
  """Fraction of rows whose generated tokens came from more than one weights version (in-flight updates)."""
  mask = batch["loss_mask"] > 0
  rows = mask.any(1)
  if not rows.any():
    return 0.0
  v = batch["policy_version"]
  big = np.iinfo(np.int32).max
  lo = np.where(mask, v, big).min(1)
  hi = np.where(mask, v, -1).max(1)
  return float(np.mean((hi > lo)[rows]))


def initial_params(cfg: RLRunConfig):
  """The policy to start from: `cfg.init_checkpoint` (a c2jax model checkpoint) or a random init."""
  model = cfg.model_config
  if cfg.init_checkpoint:
    return load_checkpoint_for(cfg.init_checkpoint, model, what="init_checkpoint")
  return jax.jit(init_params, static_argnums=0)(model, jax.random.key(cfg.seed))


@dataclasses.dataclass(frozen=True)
class _StepFns:
  """The update on one device or on a mesh: init(key, params) -> state, step(state, batch), put(host batch),
  abstract() -> the state's ShapeDtypeStructs for restore."""

  init: Callable
  step: Callable
  put: Callable
  abstract: Callable


def batch_rows(cfg: RLRunConfig) -> int:
  """Rows of the trainer's batch: a row per segment with self-summaries (padding otherwise) of every group."""
  return cfg.trainer.groups_per_step * cfg.actor_config.max_group_rows


def row_buckets(cfg: RLRunConfig) -> tuple[int, ...] | None:
  """The packed row counts of the trainer's batches (`c2jax.rl.packing.row_buckets`); None for padded rows."""
  if cfg.trainer.rows is RowLayout.PADDED:
    return None
  rows, micro = batch_rows(cfg), cfg.rl.micro_batches
  first = cfg.trainer.packed_rows or -(-max(rows // 2, 1) // micro) * micro  # half, up to a multiple of micro
  if first % micro:
    raise ValueError(f"trainer.packed_rows={first} does not split into rl.micro_batches={micro}; use a multiple of "
                     f"{micro}.")
  return packing.row_buckets(min(first, rows), rows)


def check_mesh(cfg: RLRunConfig) -> None:
  """Raises MeshRefusal when the trainer's mesh cannot take its batch: called before the SFT warm start and the
  actors start, not after them."""
  mesh = mesh_of(cfg.mesh)
  if mesh is not None:
    seq_len = buffer_spec(cfg.model_config, cfg.actor_config, tasks_lib.reward_terms(cfg.task_suite())).seq_len
    try:
      for rows in row_buckets(cfg) or (batch_rows(cfg),):
        sharded.check_mesh(cfg.rl, dict(mesh.shape), rows, seq_len)
    except MeshRefusal as e:
      raise MeshRefusal(f"mesh={cfg.mesh!r}: {e}") from None


def _step_fns(cfg: RLRunConfig, rows: int, seq_len: int) -> _StepFns:
  rl = cfg.rl
  mesh = mesh_of(cfg.mesh)
  if mesh is not None:  # sharded over a device mesh (FSDP + EP + CP; every process of a multi-host trainer runs this)
    trainer = sharded.make_rl_trainer(rl, mesh, batch_size=rows, seq_len=seq_len)
    return _StepFns(init=trainer.init, step=trainer.step, put=trainer.put_batch,
                    abstract=lambda: sharded.abstract_state(rl, trainer.state_shardings))
  jit_init = jax.jit(functools.partial(init_state, rl))
  return _StepFns(
      init=lambda key, params=None: jit_init(key, params),
      step=jax.jit(functools.partial(update_step, cfg=rl), donate_argnums=0),
      put=lambda batch: jax.tree.map(jnp.asarray, batch),
      abstract=lambda: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                    jax.eval_shape(jit_init, jax.random.key(0))))


@dataclasses.dataclass
class _Clock:
  """Wall time split between waiting for rollouts and everything else."""
  start: float = dataclasses.field(default_factory=time.perf_counter)
  waiting: float = 0.0


class _Halt(Exception):
  """Process 0 asked to stop (a stop request, or the prefetch returned nothing because of one)."""


class _Trainer:
  """One `run` call: set-up and restore in `__init__`, then `step` per update, then `finish`."""

  def __init__(self, cfg: RLRunConfig, workdir: str, health_check: Callable[[], None], stop: Callable[[], bool],
               plan: stages.Stages | None = None):
    self.cfg, self.health_check, self.stop = cfg, health_check, stop
    self.run_eval = held_out_evaluation(cfg)
    # A multi-turn evaluation first compiles its engine's whole set of programs (`_compile_programs`).
    self.plan = stages.Stages.of(plan, *((COMPILE,) if self.run_eval.runner is not None else ()), BEFORE, TRAIN, AFTER)
    self.work = pathlib.Path(workdir)
    self.work.mkdir(parents=True, exist_ok=True)
    actor_cfg = cfg.actor_config
    self.buffer_url, weights_url = cfg.urls(str(self.work))
    self.spec = buffer_spec(cfg.model_config, actor_cfg, tasks_lib.reward_terms(cfg.task_suite()))
    self.gps = cfg.trainer.groups_per_step
    self.rows = batch_rows(cfg)
    self.buckets = row_buckets(cfg)
    self.max_compactions = actor_cfg.max_group_rows // actor_cfg.group_size - 1
    self.primary = jax.process_index() == 0  # of a multi-host trainer: reads the buffer, publishes, logs
    if self.primary:
      (self.work / "config.json").write_text(to_json(cfg))
      Store(self.buffer_url).write(RUN_CONFIG_KEY, to_json(cfg).encode())
    self.ckpt = ocp.CheckpointManager(
        (self.work / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.trainer.keep_checkpoints,
                                             enable_async_checkpointing=True))
    self.weights = WeightStore(weights_url, full_every=cfg.weight_store.full_every, keep=cfg.weight_store.keep,
                               zstd_level=cfg.weight_store.zstd_level)
    self.fns = _step_fns(cfg, self.rows, self.spec.seq_len)
    self.restored_step = self.ckpt.latest_step()
    self._restore_or_init()
    self.reader = RolloutReader(self.buffer_url, spec=self.spec, cursor=self.cursor)
    if self.primary:
      self.reader.publish_progress(self.version, self.gps)
    # The next batch is read in the background during each update (process 0 reads for all).
    self.prefetch = Prefetcher(self.reader, self.gps, poll_interval_s=cfg.trainer.poll_interval_s)
    if self.primary and self.run_eval.runner is not None:
      self._compile_programs()
    if self.before is None and self.primary:
      with self.plan.stage(BEFORE, self._eval_size()) as s:
        stages.note("the actors start sampling when it ends (reading the programs compiled for it from the "
                    "compilation cache)")
        self.before = {**self.run_eval(jax.device_put(self.params_host), label=s.label), "version": self.version}
    elif self.primary:
      self.plan.skip(BEFORE, "restored from the checkpoint")
    # The first weights only now: the actors wait for them, so the evaluation before RL has the machine to itself and
    # compiles the sampling programs once (the agent engine's, for multi-turn actors); the actors (the trainer's XLA
    # flags, `pool.child_env`, so the same cache keys) then read those instead of compiling their own beside it
    # (the runs that chose this: docs/benchmarks.md, tools/bench_main_job.py).
    if self.primary and self.weights.latest() != self.version:
      self.weights.publish(self.version, self.params_host)
    self.start = int(self.state.step)
    self.log = RunLog(self.work, resumed_at=None if self.restored_step is None else self.start,
                      step_logs=("metrics.jsonl", "consumed.jsonl"), primary=self.primary)
    # The cursor saved with a state is the one of the groups that state was trained on: a Ctrl-C between taking a
    # batch and finishing its update must not checkpoint the batch as consumed.
    self.trained_cursor = dict(self.reader.cursor)
    self.clock = _Clock()
    self.trained_tokens = 0
    self.history = read_history(self.work / "metrics.jsonl", self.start) if self.primary else []

  def _restore_or_init(self) -> None:
    """The state, the reader's cursor, the weights version and the before-RL evaluation: fresh, or restored."""
    if self.restored_step is None:
      self.state = self.fns.init(jax.random.key(self.cfg.seed), initial_params(self.cfg))
      latest = self.weights.latest()
      self.cursor, self.version, self.before = None, 0 if latest is None else latest + 1, None
      logging.info("starting fresh at weights version %d", self.version)
    else:
      got = self.ckpt.restore(self.restored_step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(self.fns.abstract()), extra=ocp.args.JsonRestore()))
      self.state, extra = got["state"], got["extra"]
      self.cursor, self.version, self.before = extra["cursor"], extra["version"], extra.get("eval_before")
      latest = self.weights.latest()
      if latest is not None and latest > self.version:  # a killed run published past its last checkpoint
        self.version = latest + 1
      logging.warning("resumed from step %d (weights version %d, %d groups consumed)", self.restored_step,
                      self.version, sum(self.cursor.values()))
    self.offset = self.version - int(self.state.step)
    self.params_host = _host(self.state.params)

  def _compile_programs(self) -> None:
    """The evaluation's agent engine compiles (or reads from the compilation cache) every program of its bounded
    set (`AgentRunner.compile_programs`) before the first evaluation: the evaluations then compile none (the one
    before RL is no slower than the one after), the actors, with the same engine shapes and XLA flags, read them
    all from the cache whichever shapes their episodes meet, and a later run of the job compiles none."""
    with self.plan.stage(COMPILE, "the agent engine's, every shape it can take"):
      n = self.run_eval.runner.compile_programs(jax.device_put(self.params_host))
      stages.note(f"{n} programs")

  def _eval_size(self) -> str:
    tasks, samples = self.cfg.eval.tasks, self.cfg.eval.samples
    return f"{tasks} task{'s' * (tasks != 1)} x {samples} sample{'s' * (samples != 1)}"

  def save(self, step: int) -> None:
    # The version of the saved state, from the state itself (not a variable that a Ctrl-C between two statements
    # could leave one update behind).
    extra = {"cursor": self.trained_cursor, "version": int(self.state.step) + self.offset,
             "eval_before": self.before}
    self.ckpt.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(self.state),
                                                 extra=ocp.args.JsonSave(extra)))

  def take_batch(self, prefetch_next: bool) -> tuple[dict, np.ndarray, list, dict | None, float]:
    """(padded host batch, its sequence lengths, groups, their cursor, seconds waited). Process 0 reads the buffer;
    the other processes of a
    multi-host trainer receive the same batch and the same decision to stop (all must stop at the same step to save
    one checkpoint together). Raises `_Halt` on a stop request, and every process raises process 0's error."""
    t_wait = time.perf_counter()
    groups, taken_cursor, error = [], None, None
    deadline = time.perf_counter() + self.cfg.trainer.take_timeout_s
    try:
      while self.primary and not groups and not self.stop():
        self.health_check()
        groups, taken_cursor = self.prefetch.take(timeout_s=1.0)  # all gps groups or none: a stop strands none
        if not groups and time.perf_counter() > deadline:
          status = admission.read_status(self.buffer_url)
          raise TimeoutError(
              f"No batch of {self.gps} groups arrived in {self.cfg.trainer.take_timeout_s:.0f} s; are actors writing "
              f"to {self.buffer_url}? Buffer: {status.committed} committed, {status.pending} begun, "
              f"{status.consumed} consumed (see tools/inspect_buffer.py).")
      batch = groups_to_batch(groups, rows=self.rows) if groups else empty_batch(self.spec, self.rows)
      lengths = sequence_lengths(groups, self.rows)
    except Exception as e:  # noqa: BLE001  (re-raised below, on every process)
      error, batch, lengths = e, empty_batch(self.spec, self.rows), np.zeros(self.rows, np.int32)
    halt = 2 if error is not None else int(self.primary and not groups)
    waited = time.perf_counter() - t_wait
    self.clock.waiting += waited
    if jax.process_count() > 1:
      # Every process gets the batch, and process 0's decision to stop or fail: the others would otherwise wait in
      # this broadcast forever while process 0 unwinds.
      from jax.experimental import multihost_utils
      got = multihost_utils.broadcast_one_to_all({"batch": batch, "lengths": lengths, "halt": np.int32(halt)})
      batch, lengths, halt = jax.tree.map(np.asarray, got["batch"]), np.asarray(got["lengths"]), int(got["halt"])
    if halt == 2:
      raise error if error is not None else RuntimeError("process 0 of the trainer failed; see its log")
    if halt:
      raise _Halt
    if self.primary and prefetch_next:
      self.prefetch.start()  # the next batch, read while this one trains
    return batch, lengths, groups, taken_cursor, waited

  def update(self, batch: dict) -> dict:
    """One update_step on `batch`; returns its metrics as floats."""
    # The update counts versions in its own steps (see the module docstring).
    batch["policy_version"] = batch["policy_version"] - self.offset
    self.state, metrics = self.fns.step(self.state, self.fns.put(batch))
    self.version = int(self.state.step) + self.offset
    self.params_host = _host(self.state.params)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  def publish(self):
    """The new weights, then the trainer's progress; returns the publish's record (None off process 0)."""
    if not self.primary:
      return None
    pub = self.weights.publish(self.version, self.params_host)
    self.reader.publish_progress(self.version, self.gps, cursor=self.trained_cursor)
    return pub

  def step(self, step: int, bar: tqdm.tqdm) -> None:
    """Trains step `step` (0-based): take, update, publish, log, maybe checkpoint."""
    batch, lengths, groups, taken_cursor, waited = self.take_batch(prefetch_next=step + 1 < self.cfg.trainer.steps)
    t_step = time.perf_counter()
    in_flight = _in_flight_rows(batch)
    # Packed (trainer.rows) on every process alike, after the broadcast: the padded batch's shape is fixed.
    laid = lay_out(batch, lengths, self.buckets)
    rows = laid["tokens"].shape[0]  # each row bucket compiles once
    stages.note_once(("rl update", repr(self.cfg.rl), rows, self.spec.seq_len, self.cfg.mesh),
                     f"compiling the RL update ({rows} rows x {self.spec.seq_len} tokens; first step, cached after)")
    m = self.update(laid)
    if taken_cursor is not None:  # process 0's; the others never read the buffer
      self.trained_cursor = taken_cursor
    t_publish = time.perf_counter()
    pub = self.publish()
    t_published = time.perf_counter()
    self.trained_tokens += int(m["tokens"])
    elapsed = time.perf_counter() - self.clock.start
    depth = self._depth() if self.primary else 0
    m.update({"step": step + 1, "version": self.version, "buffer/depth": depth,
              "buffer/wait_s": waited, "time/step_s": time.perf_counter() - t_step + waited,
              "time/update_s": t_publish - t_step, "time/publish_s": t_published - t_publish,
              "time/wait_fraction": self.clock.waiting / elapsed, "tokens_per_s": self.trained_tokens / elapsed,
              "samples_per_s": (step + 1 - self.start) * self.rows / elapsed,
              "weights/stored_bytes": pub.stored_bytes if pub else 0,
              "weights/full_bytes": pub.full_bytes if pub else 0,
              "staleness/in_flight_rows": in_flight,
              "buffer/corrupt_groups": self.reader.stats.get("corrupt_groups", 0),
              "buffer/lost_groups": self.reader.stats.get("lost_groups", 0),
              "buffer/rejected_records": self.reader.stats.get("rejected_records", 0),
              "buffer/skipped_shards": self.reader.stats.get("skipped_shards", 0)})
    m.update(chain_metrics.batch_metrics(groups))
    self.log_step(m, groups)
    bar.update(1)
    bar.set_postfix(reward=f"{m['reward/mean']:.3f}", lag=f"{m['staleness/mean']:.2f}", depth=m["buffer/depth"])
    if (step + 1) % self.cfg.trainer.checkpoint_every == 0 and step + 1 < self.cfg.trainer.steps:
      self.save(step + 1)

  def _depth(self) -> int:
    """Committed groups not yet trained on (a batch read ahead included), from the shards' head.json: a metric read
    while the reader belongs to the prefetch thread."""
    return max(0, admission.read_status(self.buffer_url).committed - sum(self.trained_cursor.values()))

  def log_step(self, m: dict, groups: list) -> None:
    self.history.append(m)
    self.log.write("metrics.jsonl", m, tb_prefix="train")
    self.log.write("consumed.jsonl", {"step": m["step"],
                                      "groups": [[g.meta["shard"], g.meta["seq"]] for g in groups]})

  def checkpoint_what_was_trained(self) -> None:
    """Whatever stopped the loop, what was trained is checkpointed with its cursor (resume picks up here)."""
    try:
      if int(self.state.step) > (self.ckpt.latest_step() or 0):
        self.save(int(self.state.step))
      self.ckpt.wait_until_finished()
    except Exception as e:  # noqa: BLE001  (e.g. interrupted inside the update: its state was donated)
      logging.warning("could not checkpoint the last steps (%s); a restart resumes from step %s", e,
                      self.ckpt.latest_step())
    self.log.flush()

  def finish(self) -> dict:
    """The trained policy as model/, the held-out evaluation after training, eval.jsonl, result.json and the
    training plot (process 0)."""
    # Written aside and swapped in: a finished run resumed with more steps replaces it whole.
    model, partial = self.work / MODEL_DIR, self.work / (MODEL_DIR + ".incomplete")
    shutil.rmtree(partial, ignore_errors=True)
    save_checkpoint(str(partial), self.params_host, self.cfg.model_config)
    shutil.rmtree(model, ignore_errors=True)
    partial.rename(model)
    with self.plan.stage(AFTER, self._eval_size()) as s:
      after = {**self.run_eval(jax.device_put(self.params_host), label=s.label), "version": self.version}
    with open(self.work / "eval.jsonl", "a") as f:
      f.write(json.dumps({"when": "before", **self.before}) + "\n")
      f.write(json.dumps({"when": "after", **after}) + "\n")
    before, history, k = self.before, self.history, self.cfg.eval.k
    rewards = [h["reward/mean"] for h in history]
    result = {
        "reward_first": float(np.mean(rewards[:5])) if rewards else None,
        "reward_last": float(np.mean(rewards[-5:])) if rewards else None,
        "pass_at_1_before": before["pass@1"], "pass_at_1_after": after["pass@1"],
        # best-of-K under a fixed name (K = eval.best_of, in "k") and under its K-specific one
        "k": k, "best_of_k_before": before[f"best_of_{k}"], "best_of_k_after": after[f"best_of_{k}"],
        f"best_of_{k}_before": before[f"best_of_{k}"], f"best_of_{k}_after": after[f"best_of_{k}"],
        "reward_heldout_before": before["reward/mean"], "reward_heldout_after": after["reward/mean"],
        "tokens_trained": int(sum(h.get("tokens", 0) for h in history)),
        "staleness_mean": float(np.mean([h["staleness/mean"] for h in history])) if history else None,
        "filtered_fraction": float(np.mean([h["filtered_fraction"] for h in history])) if history else None,
        "tokens_per_s": history[-1]["tokens_per_s"] if history else None,
        "samples_per_s": history[-1]["samples_per_s"] if history else None,
        "wait_fraction": history[-1]["time/wait_fraction"] if history else None,
        **chain_metrics.run_metrics(history, self.max_compactions),
        **_behaviour_before_after(before, after),
    }
    for name, r in (("before", before), ("after", after)):
      self.log.scalars(f"eval_{name}", {key: v for key, v in r.items() if isinstance(v, float)}, int(self.state.step))
    try:
      result["plot"] = rl_report.plot_training(self.work, k=k)
    except Exception as e:  # noqa: BLE001  (a plot never costs a finished run its result.json)
      logging.warning("could not draw training.png: %s", e)
      result["plot"] = None
    return result


def _behaviour_before_after(before: dict, after: dict) -> dict:
  """result.json's behaviour figures: "behaviour_<name>_before" / "_after" for each of `behaviour.METRICS` that
  the held-out evaluation reported (multi-turn runs); None where it is NaN (no episode applied) or absent (a before
  restored from a run that predates them), so result.json stays strict JSON."""
  out = {}
  for name in behaviour.METRICS:
    if name not in before and name not in after:
      continue
    short = name.split("/", 1)[1]
    for when, r in (("before", before), ("after", after)):
      v = r.get(name)
      out[f"behaviour_{short}_{when}"] = None if v is None or math.isnan(v) else float(v)
  return out


def _steps_left(start: int, steps: int) -> str:
  if start >= steps:
    return f"all {steps} steps already trained"
  if not start:
    return f"{steps} steps"
  return f"step {steps} of {steps}" if start + 1 == steps else f"steps {start + 1}-{steps} of {steps}"


def run(cfg: RLRunConfig, workdir: str, *, health_check: Callable[[], None] = lambda: None,
        stop: Callable[[], bool] = lambda: False, plan: stages.Stages | None = None) -> dict:
  """Trains for `cfg.trainer.steps` updates (resuming from `workdir/checkpoints` when present).

  Args:
    cfg: the run config (`rl_run_config.parse` of configs/rl_tiny.py).
    workdir: outputs and, unless the config names URLs, the buffer and the weights.
    health_check: called while waiting for rollouts; raises when the actor pool has failed.
    stop: polled between steps and while waiting for rollouts; True checkpoints and returns early (a Ctrl-C
      KeyboardInterrupt does the same, but may lose the step it interrupts).
    plan: the job's stages (`c2jax.services.rl_job`), which name this loop's: `BEFORE`, `TRAIN`, `AFTER`; None:
      those three alone.
  """
  t = _Trainer(cfg, workdir, health_check, stop, plan)
  interrupted = False
  with t.prefetch, t.plan.stage(TRAIN, _steps_left(t.start, cfg.trainer.steps)) as s, \
      tqdm.tqdm(total=cfg.trainer.steps, initial=t.start, desc=s.label, unit="step", disable=not t.primary) as bar:
    try:
      for step in range(t.start, cfg.trainer.steps):
        t.step(step, bar)
    except (_Halt, KeyboardInterrupt):
      interrupted = s.interrupted = True
    finally:
      t.checkpoint_what_was_trained()
  result = {"steps": int(t.state.step), "version": t.version, "interrupted": interrupted,
            "groups_consumed": int(sum(t.trained_cursor.values())) if t.primary else None}
  if interrupted:
    logging.warning("stopped at step %d; the same command resumes from the checkpoint", int(t.state.step))
  elif t.primary:
    result.update(t.finish())
    # Every stage of the job that ran in this process (the teacher's traces and the SFT before this loop included).
    result["stage_seconds"] = {name: round(s, 2) for name, s in t.plan.seconds.items()}
    (t.work / "result.json").write_text(json.dumps(result, indent=2))
  t.log.close()
  return result
