"""The RL trainer's loop: consume committed groups from the rollout buffer, update, publish weights (report sections
4 and 6: the trainer and the actors run independently; PipelineRL-style in-flight weight updates).

  result = run(config, workdir)        # what experiments/rl_main.py calls (after starting the actor pool)

Each step:
  1. `RolloutReader.take(groups_per_step)`: each committed group exactly once, whole (read in a background thread
     during the previous update, c2jax/rollouts/prefetch.py; the checkpointed cursor is that of the trained batches);
  2. `update_step` on the collated batch (`c2jax.rl.update`; the recipe in `config.rl`);
  3. publish the new weights (`WeightStore`: a delta on the previous version, a full snapshot every N), then the
     trainer's progress (`trainer.json`: version and groups consumed), which admission reads;
  4. every `checkpoint_every` steps, an orbax checkpoint of the RL state together with the reader's cursor and the
     weights version, so a restarted trainer resumes exactly: no committed group is lost or trained on twice
     (groups handed out after the checkpoint are handed out again, to the restored state that never saw them).

Versions. The weights version is the weight store's counter: it starts at the store's next free version and
grows by one per update, so it stays monotone across restarts (versions published by a killed run after its last
checkpoint are orphans: tokens sampled with them count as off-policy by the gap). `version - state.step` is saved
with the checkpoint; the update sees token versions in its own step numbering.

Outputs in `workdir`: checkpoints/ (orbax), metrics.jsonl (one line per step), consumed.jsonl (the (shard, seq) of
every group each step trained on; after a restart, the last line of a step is the one that counts), tb/
(TensorBoard), eval.jsonl (held-out evaluations), result.json, training.png (c2jax/rl/report.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import time
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from c2jax.actors.actor import buffer_spec
from c2jax.actors.evaluate import evaluate
from c2jax.actors.sampling import SamplingConfig
from c2jax.model.checkpoint import load_checkpoint
from c2jax.model.params import init_params
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.rl import run_config
from c2jax.rl import trainer as trainer_lib
from c2jax.rl.update import RLState, init_state, update_step
from c2jax.rollouts import admission
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.collate import groups_to_batch
from c2jax.rollouts.prefetch import Prefetcher
from c2jax.rollouts.storage import Store
from c2jax.rollouts.weight_store import WeightStore


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


def _append(path: pathlib.Path):
  """Opens a log for appending, first ending a line that a killed run left unfinished."""
  if path.exists() and path.stat().st_size:
    with open(path, "rb") as f:
      f.seek(-1, os.SEEK_END)
      cut = f.read(1) != b"\n"
    if cut:
      with open(path, "a") as f:
        f.write("\n")
  return open(path, "a")


def read_history(path: str | os.PathLike, upto: int | None = None) -> list[dict]:
  """A run's metrics.jsonl, one record per step up to `upto` (all when None): after a restart the last record of a
  step is the one that counts, and a line cut short by a kill is skipped (tools/sweep.py reads runs with it too)."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  by_step = {}
  for line in path.read_text().splitlines():
    try:
      m = json.loads(line)
    except json.JSONDecodeError:  # a line cut short by a kill
      continue
    if isinstance(m, dict) and isinstance(m.get("step"), int) and (upto is None or m["step"] <= upto):
      by_step[m["step"]] = m
  return [by_step[k] for k in sorted(by_step)]


def batch_template(spec, rows: int) -> dict:
  """Zeros shaped like a collated batch of `rows` rows: what processes other than 0 pass to the broadcast."""
  t = spec.seq_len
  batch = {"tokens": np.zeros((rows, t), np.int32), "loss_mask": np.zeros((rows, t), np.float32),
           "behaviour_logprobs": np.zeros((rows, t), np.float32), "policy_version": np.zeros((rows, t), np.int32),
           "group_id": np.zeros((rows,), np.int32), "chain_id": np.zeros((rows,), np.int32),
           "reward_terms": {n: np.zeros((rows,), np.float32) for n in spec.reward_terms},
           "truncated": np.zeros((rows,), np.float32)}
  if spec.n_moe_layers:
    batch["expert_ids"] = np.zeros((spec.n_moe_layers, rows, t, spec.experts_per_tok), np.int32)
  return batch


def _depth(buffer_url: str, trained: dict) -> int:
  """Committed groups not yet trained on (a batch read ahead included), from the shards' head.json: a metric read
  while the reader belongs to the prefetch thread."""
  return max(0, admission.read_status(buffer_url).committed - sum(trained.values()))


def _abstract(state: RLState):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


@dataclasses.dataclass
class _Clock:
  """Wall time split between waiting for rollouts and everything else."""
  start: float = dataclasses.field(default_factory=time.perf_counter)
  waiting: float = 0.0


def initial_params(c: ml_collections.ConfigDict, model):
  """The policy to start from: `c.init_checkpoint` (a c2jax model checkpoint) or a random init."""
  if c.init_checkpoint:
    params, stored = load_checkpoint(c.init_checkpoint)
    if stored.replace(param_dtype=model.param_dtype) != model:
      raise ValueError(f"init_checkpoint={c.init_checkpoint!r} holds another architecture than the run config's "
                       "model (compare its model_config.json with model / model_overrides).")
    return params
  return jax.jit(init_params, static_argnums=0)(model, jax.random.key(c.seed))


def run(c: ml_collections.ConfigDict, workdir: str, *, health_check: Callable[[], None] = lambda: None,
        stop: Callable[[], bool] = lambda: False) -> dict:
  """Trains for `c.trainer.steps` updates (resuming from `workdir/checkpoints` when present).

  Args:
    c: the run config (configs/rl_tiny.py).
    workdir: outputs and, unless the config names URLs, the buffer and the weights.
    health_check: called while waiting for rollouts; raises when the actor pool has failed.
    stop: polled between steps and while waiting for rollouts; True checkpoints and returns early (a Ctrl-C
      KeyboardInterrupt does the same, but may lose the step it interrupts).
  """
  work = pathlib.Path(workdir)
  work.mkdir(parents=True, exist_ok=True)
  cfg = run_config.rl_config(c)
  model = cfg.model
  actor_cfg = run_config.actor_config(c)
  suite = run_config.task_suite(c)
  buffer_url, weights_url = run_config.urls(c, str(work))
  spec = buffer_spec(model, actor_cfg)
  gps, steps = c.trainer.groups_per_step, c.trainer.steps
  rows = gps * actor_cfg.group_size
  primary = jax.process_index() == 0  # of a multi-host trainer: reads the buffer, publishes, logs
  if primary:
    (work / "config.json").write_text(run_config.to_json(c))
    Store(buffer_url).write(run_config.RUN_CONFIG_KEY, run_config.to_json(c).encode())

  ckpt = ocp.CheckpointManager(
      (work / "checkpoints").absolute(),
      options=ocp.CheckpointManagerOptions(max_to_keep=c.trainer.keep_checkpoints, enable_async_checkpointing=True))
  weights = WeightStore(weights_url, full_every=c.weight_store.full_every, keep=c.weight_store.keep)
  if c.mesh:
    # Sharded over a device mesh (FSDP + EP + CP; every process of a multi-host trainer runs this same code).
    mesh_config = MeshConfig.parse(c.mesh)
    if mesh_config.num_devices > jax.device_count():
      raise ValueError(f"mesh={c.mesh!r} needs {mesh_config.num_devices} devices but only {jax.device_count()} "
                       "exist.")
    trainer = trainer_lib.make_rl_trainer(cfg, make_mesh(mesh_config, jax.devices()[:mesh_config.num_devices]),
                                          batch_size=rows, seq_len=spec.seq_len)
    init, step_fn, put = trainer.init, trainer.step, trainer.put_batch
    abstract_state = lambda: trainer_lib.abstract_state(cfg, trainer.state_shardings)
  else:
    jit_init = jax.jit(functools.partial(init_state, cfg))
    init = lambda key, params=None: jit_init(key, params)
    step_fn = jax.jit(functools.partial(update_step, cfg=cfg), donate_argnums=0)
    put = lambda batch: jax.tree.map(jnp.asarray, batch)
    abstract_state = lambda: _abstract(jax.eval_shape(init, jax.random.key(0)))
  restored_step = ckpt.latest_step()
  eval_sampling = SamplingConfig(max_new_tokens=actor_cfg.max_new_tokens, temperature=actor_cfg.temperature,
                                 stop_tokens=actor_cfg.stop_tokens)
  run_eval = functools.partial(
      evaluate, model=model, suite=suite, tasks=c.eval.tasks, samples=c.eval.samples, sampling=eval_sampling,
      prompt_len=actor_cfg.prompt_len, seed=c.seed, success_threshold=cfg.success_threshold,
      pass_k=tuple(sorted(set(cfg.pass_k) | {run_config.best_of(c)})))

  if restored_step is None:
    state = init(jax.random.key(c.seed), initial_params(c, model))
    latest = weights.latest()
    cursor, version, before = None, 0 if latest is None else latest + 1, None
    logging.info("starting fresh at weights version %d", version)
  else:
    got = ckpt.restore(restored_step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state()),
                                                              extra=ocp.args.JsonRestore()))
    state, extra = got["state"], got["extra"]
    cursor, version, before = extra["cursor"], extra["version"], extra.get("eval_before")
    latest = weights.latest()
    if latest is not None and latest > version:  # a killed run published past its last checkpoint
      version = latest + 1
    logging.warning("resumed from step %d (weights version %d, %d groups consumed)", restored_step, version,
                    sum(cursor.values()))
  offset = version - int(state.step)
  params_host = _host(state.params)
  if primary and weights.latest() != version:
    weights.publish(version, params_host)
  reader = RolloutReader(buffer_url, spec=spec, cursor=cursor)
  if primary:
    reader.publish_progress(version, gps)
  # The next batch is read in the background during each update (process 0 reads for all).
  prefetch = Prefetcher(reader, gps, poll_interval_s=c.trainer.get("poll_interval_s", 0.05))

  if before is None and primary:
    before = {**run_eval(jax.device_put(params_host)), "version": version}

  tb = None
  if primary:
    try:
      from tensorboardX import SummaryWriter
      # After a restart, TensorBoard drops the events a killed run logged past its checkpoint.
      tb = SummaryWriter(str(work / "tb"), purge_step=None if restored_step is None else restored_step + 1)
    except ImportError:  # TensorBoard logging is optional; metrics.jsonl has everything.
      pass

  # The cursor saved with a state is the one of the groups that state was trained on: a Ctrl-C between taking a
  # batch and finishing its update must not checkpoint the batch as consumed.
  trained_cursor = dict(reader.cursor)

  def save(step: int):
    # The version of the saved state, from the state itself (not the loop's variable, which a Ctrl-C between two
    # statements could leave one update behind).
    extra = {"cursor": trained_cursor, "version": int(state.step) + offset, "eval_before": before}
    ckpt.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra)))

  clock = _Clock()
  start = int(state.step)
  trained_tokens = 0
  history = read_history(work / "metrics.jsonl", start) if primary else []
  interrupted = False
  out = (lambda name: _append(work / name)) if primary else (lambda name: open(os.devnull, "w"))
  with prefetch, out("metrics.jsonl") as log, out("consumed.jsonl") as consumed, \
      tqdm.tqdm(total=steps, initial=start, desc="rl", unit="step", disable=not primary) as bar:
    try:
      for step in range(start, steps):
        t_wait = time.perf_counter()
        groups, taken_cursor = [], None
        deadline = time.perf_counter() + c.trainer.take_timeout_s
        # Process 0 reads the buffer; the other processes of a multi-host trainer receive the same batch, and the
        # same decision to stop (all processes must stop at the same step to save one checkpoint together).
        error = None
        try:
          while primary and not groups and not stop():
            health_check()
            # all gps groups or none: a stop never strands half a batch
            groups, taken_cursor = prefetch.take(timeout_s=1.0)
            if not groups and time.perf_counter() > deadline:
              status = admission.read_status(buffer_url)
              raise TimeoutError(
                  f"No batch of {gps} groups arrived in {c.trainer.take_timeout_s:.0f} s; are actors writing to "
                  f"{buffer_url}? Buffer: {status.committed} committed, {status.pending} begun, "
                  f"{status.consumed} consumed (see tools/inspect_buffer.py).")
          batch = groups_to_batch(groups, rows=rows) if groups else batch_template(spec, rows)
        except Exception as e:  # pylint: disable=broad-except  (re-raised below, on every process)
          error, batch = e, batch_template(spec, rows)
        halt = 2 if error is not None else int(primary and not groups)
        waited = time.perf_counter() - t_wait
        clock.waiting += waited
        t_step = time.perf_counter()
        if jax.process_count() > 1:
          # Every process gets the batch, and process 0's decision to stop or fail: the others would otherwise wait
          # in this broadcast forever while process 0 unwinds.
          from jax.experimental import multihost_utils
          got = multihost_utils.broadcast_one_to_all({"batch": batch, "halt": np.int32(halt)})
          batch, halt = jax.tree.map(np.asarray, got["batch"]), int(got["halt"])
        if halt == 2:
          raise error if error is not None else RuntimeError("process 0 of the trainer failed; see its log")
        if halt:
          interrupted = True
          break
        if primary and step + 1 < steps:
          prefetch.start()  # the next batch, read while this one trains
        in_flight = _in_flight_rows(batch)
        # The update counts versions in its own steps (see the module docstring).
        batch["policy_version"] = batch["policy_version"] - offset
        state, metrics = step_fn(state, put(batch))
        if taken_cursor is not None:  # process 0's; the others never read the buffer
          trained_cursor = taken_cursor
        version = int(state.step) + offset
        params_host = _host(state.params)
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        t_publish = time.perf_counter()
        pub = weights.publish(version, params_host) if primary else None
        if primary:
          reader.publish_progress(version, gps, cursor=trained_cursor)
        t_published = time.perf_counter()
        trained_tokens += int(m["tokens"])
        elapsed = time.perf_counter() - clock.start
        depth = _depth(buffer_url, trained_cursor) if primary else 0
        m.update({"step": step + 1, "version": version, "buffer/depth": depth,
                  "buffer/wait_s": waited, "time/step_s": time.perf_counter() - t_step + waited,
                  "time/update_s": t_publish - t_step, "time/publish_s": t_published - t_publish,
                  "time/wait_fraction": clock.waiting / elapsed, "tokens_per_s": trained_tokens / elapsed,
                  "samples_per_s": (step + 1 - start) * rows / elapsed,
                  "weights/stored_bytes": pub.stored_bytes if pub else 0,
                  "weights/full_bytes": pub.full_bytes if pub else 0,
                  "staleness/in_flight_rows": in_flight,
                  "buffer/corrupt_groups": reader.stats.get("corrupt_groups", 0),
                  "buffer/skipped_shards": reader.stats.get("skipped_shards", 0)})
        history.append(m)
        log.write(json.dumps(m) + "\n")
        log.flush()
        consumed.write(json.dumps({"step": step + 1, "groups": [[g.meta["shard"], g.meta["seq"]] for g in groups]})
                       + "\n")
        consumed.flush()
        if tb is not None:
          for k, v in m.items():
            tb.add_scalar(f"train/{k}", v, step + 1)
        bar.update(1)
        bar.set_postfix(reward=f"{m['reward/mean']:.3f}", lag=f"{m['staleness/mean']:.2f}",
                        depth=m["buffer/depth"])
        if (step + 1) % c.trainer.checkpoint_every == 0 and step + 1 < steps:
          save(step + 1)
    except KeyboardInterrupt:
      interrupted = True
    finally:
      # Whatever stopped the loop, what was trained is checkpointed with its cursor (resume picks up here).
      try:
        if int(state.step) > (ckpt.latest_step() or 0):
          save(int(state.step))
        ckpt.wait_until_finished()
      except Exception as e:  # e.g. interrupted inside the update, whose input state was donated
        logging.warning("could not checkpoint the last steps (%s); a restart resumes from step %s", e,
                        ckpt.latest_step())
      if tb is not None:
        tb.flush()

  result = {"steps": int(state.step), "version": version, "interrupted": interrupted,
            "groups_consumed": int(sum(trained_cursor.values())) if primary else None}
  if interrupted:
    logging.warning("stopped at step %d; the same command resumes from the checkpoint", int(state.step))
    if tb is not None:
      tb.close()
    return result
  if not primary:
    return result
  after = {**run_eval(jax.device_put(params_host)), "version": version}
  with open(work / "eval.jsonl", "a") as f:
    f.write(json.dumps({"when": "before", **before}) + "\n")
    f.write(json.dumps({"when": "after", **after}) + "\n")
  rewards = [h["reward/mean"] for h in history]
  k = run_config.best_of(c)
  result.update({
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
  })
  if tb is not None:
    for name, r in (("before", before), ("after", after)):
      for key, v in r.items():
        if isinstance(v, float):
          tb.add_scalar(f"eval_{name}/{key}", v, int(state.step))
    tb.close()
  from c2jax.rl import report  # pylint: disable=g-import-not-at-top  (report imports this module)
  try:
    result["plot"] = report.plot_training(work, k=k)
  except Exception as e:  # pylint: disable=broad-except  (a plot never costs a finished run its result.json)
    logging.warning("could not draw training.png: %s", e)
    result["plot"] = None
  (work / "result.json").write_text(json.dumps(result, indent=2))
  return result
