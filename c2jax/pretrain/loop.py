"""Continued pretraining (report section 3): the phases in order, held-out perplexity, exact resume.

  result = run(config, workdir)          # experiments/pretrain_main.py; configs/pretrain_tiny.py

Each phase (`c2jax.pretrain.phases`) trains its own data mix at its own sequence length and rope scaling with
`c2jax.pretrain.step.train_step`, one AdamW state running through all of them. Outputs in `workdir`:

  checkpoints/     orbax, every `checkpoint.every` steps and at each phase's end (async, keeps `checkpoint.keep`):
                   the train state, the data iterator's state and the tokens seen. A run started again in the same
                   workdir resumes from the latest one and trains exactly as the uninterrupted run would have: the
                   same batches in the same order, the same losses.
  models/<phase>/  the model (params + architecture, `c2jax.model.checkpoint`) at the end of each phase: what RL
                   or evaluation starts from (`models/sft` for the tiny default).
  metrics.jsonl    one line per `log_every` steps (loss, ce, mtp_ce/mtp_kl, lr, grad_norm, tokens/s, phase).
  eval.jsonl       held-out code CE / perplexity against step, tokens and training FLOPs (6 x active params x
                   tokens), the input of `tools/fit_loglinear.py`; `perplexity.png` is its plot at the end.
  tb/              TensorBoard events of both.
  result.json      the summary `run` returns.

Multi-host: every process runs this; process i reads shard i of every source (`shard_index`/`shard_count`) and
contributes its rows of the global batch; process 0 writes the logs.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import os
import pathlib
import shutil
import time
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from c2jax.data import pipeline
from c2jax.data.tokenizer import make_tokenizer
from c2jax.model import losses
from c2jax.model.checkpoint import save_checkpoint
from c2jax.model.config import ModelConfig
from c2jax.model.sharding import Layout
from c2jax.model.params import count_params
from c2jax.model.transformer import forward
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.parallel.train import abstract_state, make_trainer, with_layout
from c2jax.pretrain import loglinear
from c2jax.pretrain.phases import Phase, phase_at, phases_from_config
from c2jax.pretrain.step import StepConfig, document_mask, init_state, make_schedule, train_step


def model_config_from(c: ml_collections.ConfigDict) -> ModelConfig:
  """configs/model/<c.model>.py's config with `c.model_overrides` applied."""
  try:
    module = importlib.import_module(f"configs.model.{c.model}")
  except ModuleNotFoundError as e:
    raise ValueError(f"model={c.model!r}: no configs/model/{c.model}.py; pick one of the files there.") from e
  return module.get_model_config().replace(**dict(c.model_overrides))


@functools.lru_cache(maxsize=8)
def _eval_fn(model: ModelConfig, layout: Layout | None):
  def terms(params, batch):
    out = forward(params, batch["tokens"], cfg=model, positions=batch.get("positions"),
                  segment_ids=batch.get("segment_ids"), with_mtp=False)
    return losses.next_token_loss(out.logits, batch["tokens"], document_mask(batch))
  return jax.jit(with_layout(terms, layout))


def heldout_ce(params, model: ModelConfig, batches: list[dict], layout: Layout | None = None,
               put: Callable = lambda b: jax.tree.map(jnp.asarray, b)) -> float:
  """Mean next-token CE (nats/token) over held-out batches {tokens, positions?, segment_ids?, loss_mask?} [B, T]."""
  f = _eval_fn(model, layout)
  total, weight = 0.0, 0.0
  for b in batches:  # one batch at a time: see `cpu_mesh` in `run`
    t = jax.device_get(f(params, put(b)))
    total, weight = total + float(t.sum), weight + float(t.weight)
  return total / max(weight, 1e-9)


@dataclasses.dataclass(frozen=True)
class _Built:
  """A phase's jitted functions.

  init: key -> TrainState; step: (state, batch) -> (state, metrics), state donated; put: this process's rows
  of a batch -> global arrays; put_global: a whole batch every process holds (the held-out batches) -> arrays;
  layout: the model layout (None on one device); abstract: () -> the state's ShapeDtypeStructs for restore.
  """

  init: Callable
  step: Callable
  put: Callable
  put_global: Callable
  layout: Layout | None
  abstract: Callable


def _build(phase: Phase, mesh: jax.sharding.Mesh | None) -> _Built:
  """The phase's step on one device, or on `mesh` (FSDP + EP + CP) with its batch placement (built once per
  (architecture, hyperparameters, shapes, mesh) in a process: a resumed run in the same process recompiles
  nothing)."""
  return _build_cached(phase.model, phase.hp, phase.batch_size, phase.seq_len, mesh)


@functools.lru_cache(maxsize=16)
def _build_cached(model: ModelConfig, hp: StepConfig, batch_size: int, seq_len: int,
                  mesh: jax.sharding.Mesh | None) -> _Built:
  if mesh is None:
    jit_init = jax.jit(functools.partial(init_state, model, hp))
    device = jax.devices()[0]
    # Committed to the device like a restored state, so that a fresh and a resumed run share one compiled step
    # (committedness is part of jit's cache key).
    init = lambda key: jax.device_put(jit_init(key), device)
    to_device = lambda batch: jax.tree.map(jnp.asarray, batch)
    return _Built(
        init=init, step=jax.jit(functools.partial(train_step, cfg=model, hp=hp), donate_argnums=0),
        put=to_device, put_global=to_device, layout=None,
        abstract=lambda: jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(device)),
            jax.eval_shape(jit_init, jax.random.key(0))))
  trainer = make_trainer(model, hp, mesh, batch_size=batch_size, seq_len=seq_len)
  n = jax.process_count()

  def put(batch):
    return {k: jax.make_array_from_process_local_data(trainer.batch_sharding, v, (v.shape[0] * n,) + v.shape[1:])
            for k, v in batch.items()}

  return _Built(init=trainer.init, step=trainer.step, put=put, put_global=trainer.put_batch, layout=trainer.layout,
                abstract=lambda: abstract_state(model, hp, trainer.state_shardings))


def _mesh(c: ml_collections.ConfigDict) -> jax.sharding.Mesh | None:
  if not c.get("mesh"):
    return None
  mesh_config = MeshConfig.parse(c.mesh)
  if mesh_config.num_devices > jax.device_count():
    raise ValueError(f"mesh={c.mesh!r} needs {mesh_config.num_devices} devices but only {jax.device_count()} "
                     "exist; shrink the mesh (or fake CPU devices with "
                     "XLA_FLAGS=--xla_force_host_platform_device_count=N).")
  return make_mesh(mesh_config, jax.devices()[:mesh_config.num_devices])


def _trim(path: pathlib.Path, upto: int) -> None:
  """Drops records past step `upto` (logged by a run killed after its last checkpoint) and lines cut by a kill."""
  if not path.exists():
    return
  keep = []
  for line in path.read_text().splitlines():
    try:
      m = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(m, dict) and isinstance(m.get("step"), int) and m["step"] <= upto:
      keep.append(line)
  path.write_text("".join(l + "\n" for l in keep))


def _records(path: pathlib.Path) -> list[dict]:
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def _summary(work: pathlib.Path, phases: list[Phase], *, steps: int, interrupted: bool, primary: bool) -> dict:
  """The run's summary from what is on disk (written to result.json by process 0 once every phase is done)."""
  result = {"steps": steps, "interrupted": interrupted, "phases": [p.name for p in phases],
            "checkpoint": str(work / "models" / phases[-1].name)}
  evals = _records(work / "eval.jsonl") if primary else []
  if interrupted or not evals:
    return result
  train = _records(work / "metrics.jsonl")
  # The finding is about training on code: SFT phases (chat-formatted demonstrations) are left out of the fit.
  pretraining = [p.name for p in phases if not all(s.get("kind") == "sft" for s in p.sources)]
  fit = loglinear.fit(evals, x="flops", phases=pretraining)
  loglinear.plot(evals, fit, str(work / "perplexity.png"), x="flops")
  result.update({
      "tokens": evals[-1]["tokens"],
      "heldout_ce_before": evals[0]["heldout_ce"], "heldout_ce_after": evals[-1]["heldout_ce"],
      "heldout_ppl_before": evals[0]["heldout_ppl"], "heldout_ppl_after": evals[-1]["heldout_ppl"],
      "heldout_ppl_by_phase": {e["phase"]: e["heldout_ppl"] for e in evals if e["step"] > 0},
      "train_loss": train[-1]["loss"] if train else None,
      "tokens_per_s": float(np.median([m["tokens_per_s"] for m in train])) if train else None,
      "loglinear": fit.to_dict() if fit is not None else None})
  (work / "result.json").write_text(json.dumps(result, indent=2))
  return result


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def _write_model(path: pathlib.Path, params, model: ModelConfig) -> None:
  """A model checkpoint written beside `path` and renamed into place: a kill leaves the previous one (or none),
  never a partial one, and a phase trained again after a restart replaces it."""
  tmp = path.with_name(f".{path.name}.partial")
  primary = jax.process_index() == 0
  if primary:
    shutil.rmtree(tmp, ignore_errors=True)
  _barrier(f"model-{path.name}-clean")
  save_checkpoint(str(tmp), params, model)
  _barrier(f"model-{path.name}-written")
  if primary:
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
  _barrier(f"model-{path.name}-renamed")


def run(c: ml_collections.ConfigDict, workdir: str, *, stop: Callable[[], bool] = lambda: False) -> dict:
  """Trains every phase of `c.phase_order` (resuming from `workdir/checkpoints` when present).

  Args:
    c: the run config (configs/pretrain_tiny.py).
    workdir: where outputs and checkpoints go.
    stop: polled between steps; True checkpoints and returns early with `interrupted` set (the same call
      resumes).

  Returns:
    The summary also written to result.json: steps, held-out CE/perplexity before and after, tokens, tokens/s,
    the final model checkpoint, and the log-linear fit of held-out perplexity.
  """
  work = pathlib.Path(workdir)
  work.mkdir(parents=True, exist_ok=True)
  base = model_config_from(c)
  tok = make_tokenizer(c.tokenizer)
  if base.vocab_size < tok.vocab_size:
    raise ValueError(f"vocab_size={base.vocab_size} < the tokenizer's {tok.vocab_size} tokens: set "
                     f"model_overrides.vocab_size={tok.vocab_size}.")
  phases = phases_from_config(c, base)
  total = phases[-1].end
  n_proc, primary = jax.process_count(), jax.process_index() == 0
  for p in phases:
    if p.batch_size % n_proc:
      raise ValueError(f"phases.{p.name}.batch_size={p.batch_size} is not divisible by the {n_proc} processes.")
  if primary:
    (work / "config.json").write_text(c.to_json_best_effort(indent=2))
  flops_per_token = 6 * count_params(base).active
  mesh = _mesh(c)
  cpu_mesh = mesh is not None and jax.default_backend() == "cpu"
  if mesh is not None and n_proc > 1 and mesh.shape["context"] * mesh.shape["tensor"] > jax.local_device_count():
    # Each host loads whole rows of its own data shard; rows split across hosts would need every host of a row
    # group to read the same shard.
    raise ValueError(f"mesh={c.mesh!r}: context x tensor = {mesh.shape['context'] * mesh.shape['tensor']} spans "
                     f"hosts ({jax.local_device_count()} devices each); pretraining loads whole rows per host: keep "
                     "context x tensor within one host.")
  ckpt = ocp.CheckpointManager(
      (work / "checkpoints").absolute(),
      options=ocp.CheckpointManagerOptions(max_to_keep=c.checkpoint.keep, enable_async_checkpointing=True))
  eval_source = dict(c.eval.source)
  eval_batches = pipeline.eval_batches(eval_source, tok, seq_len=c.eval.seq_len, batch_size=c.eval.batch_size,
                                       n_batches=c.eval.batches)

  restored = ckpt.latest_step()
  phase = phase_at(phases, restored or 0)
  if phase is None:  # every phase already done: report what is on disk
    logging.warning("every phase is already trained in %s (step %d); nothing to do", work, restored)
    return _summary(work, phases, steps=restored, interrupted=False, primary=primary)
  built = _build(phase, mesh)
  extra = {"phase": None, "data": None, "tokens": 0}
  if restored is None:
    state = built.init(jax.random.key(c.seed))
  else:
    got = ckpt.restore(restored, args=ocp.args.Composite(state=ocp.args.StandardRestore(built.abstract()),
                                                         extra=ocp.args.JsonRestore()))
    state, extra = got["state"], got["extra"]
    logging.warning("resumed from step %d (phase %s)", restored, phase.name)
  jax.block_until_ready(state)  # before any other sharded program is dispatched (see `cpu_mesh` below)
  start = int(state.step)
  tokens_seen = int(extra["tokens"])
  if primary:
    for name in ("metrics.jsonl", "eval.jsonl"):
      (_trim(work / name, start) if restored is not None else (work / name).unlink(missing_ok=True))

  tb = None
  if primary:
    try:
      from tensorboardX import SummaryWriter
      # After a restart, TensorBoard drops the events a killed run logged past its checkpoint.
      tb = SummaryWriter(str(work / "tb"), purge_step=None if restored is None else start + 1)
    except ImportError:  # TensorBoard logging is optional; the jsonl files have everything.
      pass

  def log(name: str, record: dict, prefix: str) -> None:
    if not primary:
      return
    with open(work / name, "a") as f:
      f.write(json.dumps(record) + "\n")
    if tb is not None:
      for k, v in record.items():
        if isinstance(v, (int, float)) and k != "step":
          tb.add_scalar(f"{prefix}/{k}", v, record["step"])

  def evaluate(model: ModelConfig, phase_name: str) -> dict:
    ce = heldout_ce(state.params, model, eval_batches, built.layout, built.put_global)
    record = {"step": int(state.step), "phase": phase_name, "tokens": tokens_seen,
              "flops": float(flops_per_token) * tokens_seen, "heldout_ce": ce, "heldout_ppl": math.exp(ce)}
    log("eval.jsonl", record, "eval")
    return record

  if start == 0:
    evaluate(phase.model, phase.name)

  interrupted = False
  it = None
  # tokens/s over each logging window (the first window of a phase includes that phase's compile).
  window = {"t": time.perf_counter(), "tokens": tokens_seen}

  def should_stop() -> bool:
    # Every process must stop before the same step (the next one is a collective): any process's request counts.
    want = bool(stop())
    if n_proc > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      want = bool(np.max(multihost_utils.process_allgather(np.int32(want))))
    return want

  def save(phase_name: str, data_state) -> None:
    meta = {"phase": phase_name, "data": data_state, "tokens": tokens_seen}
    ckpt.save(int(state.step), args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                       extra=ocp.args.JsonSave(meta)))

  with tqdm.tqdm(total=total, initial=start, desc="pretrain", unit="step", disable=not primary) as bar:
    try:
      for phase in phases[phase.index:]:
        if int(state.step) >= phase.end:
          continue
        if it is not None:  # entering the next phase (the first one this run trains was built above)
          built = _build(phase, mesh)
        it = iter(pipeline.lm_dataset(phase.sources, tok, seq_len=phase.seq_len,
                                      batch_size=phase.batch_size // n_proc, seed=c.seed + 1000 * phase.index,
                                      shard_index=jax.process_index(), shard_count=n_proc))
        if extra.get("phase") == phase.name and extra.get("data") is not None and int(state.step) > phase.start:
          it.set_state(extra["data"])  # resume the phase's data exactly where its checkpoint left it
        trained_data = it.get_state()  # the data position of `state`, updated with it in one assignment
        schedule = make_schedule(phase.hp)
        bar.set_description(f"pretrain[{phase.name}]")
        for step in range(int(state.step), phase.end):
          if should_stop():
            interrupted = True
            break
          batch = next(it)
          data_after = it.get_state()
          batch_tokens = int(np.sum(batch["segment_ids"] > 0)) * n_proc if "segment_ids" in batch else int(
              batch["tokens"].size) * n_proc
          state, metrics, trained_data = (*built.step(state, built.put(batch)), data_after)
          if cpu_mesh:
            # XLA:CPU runs every fake device's part of a collective on one shared thread pool: two sharded programs
            # in flight at once can each hold threads the other's collectives wait for (a deadlock, seen with 8
            # fake devices on 2 cores). One program at a time there; accelerators keep async dispatch.
            jax.block_until_ready(metrics)
          tokens_seen += batch_tokens
          done = step + 1
          if done % c.log_every == 0 or done == phase.end:
            m = {k: float(v) for k, v in jax.device_get(metrics).items()}
            now = time.perf_counter()
            rate = (tokens_seen - window["tokens"]) / max(now - window["t"], 1e-9)
            window.update(t=now, tokens=tokens_seen)
            m.update({"step": done, "phase": phase.name, "lr": float(schedule(step)), "tokens_seen": tokens_seen,
                      "tokens_per_s": rate})
            log("metrics.jsonl", m, "train")
            bar.set_postfix(loss=f"{m['loss']:.3f}", ce=f"{m['ce']:.3f}", tok_s=f"{rate:.0f}")
          bar.update(1)
          if done % c.eval.every == 0 and done != phase.end:
            evaluate(phase.model, phase.name)
          if done % c.checkpoint.every == 0 and done != phase.end:
            save(phase.name, trained_data)
        if interrupted:
          break
        # The phase is done: its held-out perplexity, its model, then the checkpoint at the boundary (a run killed
        # before that checkpoint trains the phase's end again and rewrites the model).
        evaluate(phase.model, phase.name)
        _write_model(work / "models" / phase.name, state.params, phase.model)
        save(phase.name, None)
    except KeyboardInterrupt:
      interrupted = True
    finally:
      # Whatever stopped the loop, what was trained is checkpointed with its data position.
      try:
        if int(state.step) > (ckpt.latest_step() or 0) and it is not None:
          save(phase.name, trained_data)
        ckpt.wait_until_finished()
      except Exception as e:  # e.g. interrupted inside a step, whose input state was donated
        logging.warning("could not checkpoint the last steps (%s); a restart resumes from step %s", e,
                        ckpt.latest_step())
      if tb is not None:
        tb.flush()

  if interrupted:
    logging.warning("stopped at step %d; the same command resumes from the checkpoint", int(state.step))
  result = _summary(work, phases, steps=int(state.step), interrupted=interrupted, primary=primary)
  if tb is not None:
    tb.close()
  return result
