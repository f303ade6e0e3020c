"""Continued pretraining (report section 3): the phases in order, held-out perplexity, exact resume.

  result = run(parse(config), workdir)   # experiments/pretrain_main.py; configs/pretrain_tiny.py

Each phase (`c2jax.services.pretrain_run_config`) trains its own data mix at its own sequence length and rope
scaling with `c2jax.pretrain.step.train_step`, one AdamW state running through all of them. Outputs in `workdir`:

  checkpoints/     orbax, every `checkpoint.every` steps and at each phase's end (async, keeps `checkpoint.keep`):
                   the train state, the data iterator's state and the tokens seen. A run started again in the same
                   workdir resumes from the latest one and trains exactly as the uninterrupted run would have: the
                   same batches in the same order, the same losses.
  models/<phase>/  the model (params + architecture, `c2jax.model.checkpoint`) at the end of each phase: what RL
                   or evaluation starts from (`models/sft` for the tiny default), or an RL run's SFT
                   (`sft.base_checkpoint`).
  models/step_<N>/ the model at each step of `checkpoint.model_at`, each with a held-out evaluation in eval.jsonl
                   (the points of tools/perplexity_vs_reward.py).
  metrics.jsonl    one line per `log_every` steps (loss, ce, mtp_ce/mtp_kl, lr, grad_norm, tokens/s, phase).
  eval.jsonl       held-out code CE / perplexity against step, tokens and training FLOPs (6 x active params x
                   tokens), the input of `tools/fit_loglinear.py`; `perplexity.png` is its plot at the end. Each
                   record also holds the copying probe (`c2jax.services.copy_metrics`: second / first copy CE of
                   held-out strings, later / first use CE of names in held-out code); `copying.png` is its plot.
  tb/              TensorBoard events of both (`c2jax.services.run_log`).
  result.json      the summary `run` returns.
  config.json      the resolved run config (every field, `c2jax.typed_config.to_plain`).

The progress bar is labelled by the caller's stage (`label`: "pretrain", an RL job's "SFT 2/5") and the phase
("pretrain: bulk 1/3"); each phase's first step, which compiles the step at the phase's shape, is announced.

A run's steps: `_Run.__init__` (checks, checkpoint manager, held-out batches, restore or init), then per phase
`_Run.train_phase` (its data, its steps, its end: evaluation, model, checkpoint), then `summary`.

Multi-host: every process runs this; process i reads shard i of every source (`shard_index`/`shard_count`) and
contributes its rows of the global batch; process 0 writes the logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib
import shutil
import time
from typing import Any, Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from c2jax import typed_config
from c2jax.data import pipeline
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs.teachers import demonstrations  # noqa: F401  (registers the "sft" data source kind)
from c2jax.envs.teachers import suite_tokenizer
from c2jax.model.checkpoint import check_checkpoint, load_checkpoint_for, save_checkpoint
from c2jax.model.config import ModelConfig
from c2jax.model.params import count_params
from c2jax.model.sharding import Layout
from c2jax.optim import make_schedule
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import MeshRefusal, mesh_of
from c2jax.pretrain.sharded import abstract_state, make_trainer
from c2jax.pretrain.step import StepConfig, init_state, train_step
from c2jax.services import compile_cache
from c2jax.services import copy_metrics
from c2jax.services import loglinear
from c2jax.services import stages
from c2jax.services.pretrain_run_config import Phase, PretrainRunConfig, phase_at
from c2jax.services.run_log import RunLog, read_records
from pallas_kernels import target
from pallas_kernels.target import Platform


def heldout_ce(params, model: ModelConfig, batches: list[dict], layout: Layout | None = None,
               put: Callable = lambda b: jax.tree.map(jnp.asarray, b)) -> float:
  """Mean next-token CE (nats/token) over held-out batches {tokens, positions, segment_ids, loss_mask} [B, T]."""
  f = copy_metrics.token_ce_fn(model, layout)
  total, weight = 0.0, 0.0
  for b in batches:  # one batch at a time: see `_Run.cpu_mesh`
    ce, w = jax.device_get(f(params, put(b)))
    total, weight = total + float(np.sum(ce * w, dtype=np.float64)), weight + float(np.sum(w))
  return total / max(weight, 1e-9)


@dataclasses.dataclass(frozen=True)
class _Built:
  """A phase's jitted functions.

  init: (key, params=None) -> TrainState (params: a base model's); step: (state, batch) -> (state, metrics), state
  donated; put: this process's rows of a batch -> global arrays; put_global: a whole batch every process holds (the
  held-out batches) -> arrays; layout: the model layout (None on one device); abstract: () -> the state's
  ShapeDtypeStructs for restore; param_shardings: where a base model's params are restored to (None: one device).
  """

  init: Callable
  step: Callable
  put: Callable
  put_global: Callable
  layout: Layout | None
  abstract: Callable
  param_shardings: Any = None


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
    init = lambda key, params=None: jax.device_put(jit_init(key, params), device)
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
                abstract=lambda: abstract_state(model, hp, trainer.state_shardings),
                param_shardings=trainer.state_shardings.params)


def _summary(work: pathlib.Path, phases: list[Phase], *, steps: int, interrupted: bool, primary: bool) -> dict:
  """The run's summary from what is on disk (written to result.json by process 0 once every phase is done)."""
  result = {"steps": steps, "interrupted": interrupted, "phases": [p.name for p in phases],
            "checkpoint": str(work / "models" / phases[-1].name)}
  evals = read_records(work / "eval.jsonl") if primary else []
  if interrupted or not evals:
    return result
  train = read_records(work / "metrics.jsonl")
  # The finding is about training on code: SFT phases (chat-formatted demonstrations) are left out of the fit.
  pretraining = [p.name for p in phases if not all(s.get("kind") == "sft" for s in p.sources)]
  fit = loglinear.fit(evals, x="flops", phases=pretraining)
  loglinear.plot(evals, fit, str(work / "perplexity.png"), x="flops")
  copy_metrics.plot(evals, str(work / "copying.png"))
  result.update({
      "tokens": evals[-1]["tokens"],
      "heldout_ce_before": evals[0]["heldout_ce"], "heldout_ce_after": evals[-1]["heldout_ce"],
      "heldout_ppl_before": evals[0]["heldout_ppl"], "heldout_ppl_after": evals[-1]["heldout_ppl"],
      "heldout_ppl_by_phase": {e["phase"]: e["heldout_ppl"] for e in evals if e["step"] > 0},
      "copy_ratio_after": evals[-1].get("copy_ratio"), "name_ratio_after": evals[-1].get("name_ratio"),
      "train_loss": train[-1]["loss"] if train else None,
      "tokens_per_s": float(np.median([m["tokens_per_s"] for m in train])) if train else None,
      "loglinear": fit.to_dict() if fit is not None else None})
  (work / "result.json").write_text(json.dumps(result, indent=2))
  return result


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
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


class _Interrupted(Exception):
  """A stop request between steps."""


class _Run:
  """One `run` call's state: the train state, its data position and tokens seen, the logs."""

  def __init__(self, cfg: PretrainRunConfig, workdir: str, stop: Callable[[], bool], label: str = "pretrain"):
    self.label = label  # the progress bar's
    self.cfg, self.stop = cfg, stop
    self.work = pathlib.Path(workdir)
    self.work.mkdir(parents=True, exist_ok=True)
    base = cfg.model_config
    self.tok = make_tokenizer(suite_tokenizer.resolve(cfg.tokenizer, cfg.tokenizer_suite))
    if base.vocab_size < self.tok.vocab_size:
      raise ValueError(f"vocab_size={base.vocab_size} < the tokenizer's {self.tok.vocab_size} tokens: set "
                       f"model_overrides.vocab_size={self.tok.vocab_size}.")
    self.phases = cfg.phases_resolved()
    self.n_proc, self.primary = jax.process_count(), jax.process_index() == 0
    for p in self.phases:
      if p.batch_size % self.n_proc:
        raise ValueError(f"phases.{p.name}.batch_size={p.batch_size} is not divisible by the {self.n_proc} "
                         "processes.")
    self.flops_per_token = 6 * count_params(base).active
    self.mesh = mesh_of(cfg.mesh)
    # XLA:CPU runs every fake device's part of a collective on one shared thread pool: two sharded programs in flight
    # at once can each hold threads the other's collectives wait for (a deadlock, seen with 8 fake devices on 2
    # cores). One program at a time there; accelerators keep async dispatch.
    self.cpu_mesh = self.mesh is not None and target.of_mesh(self.mesh) is Platform.CPU
    if (self.mesh is not None and self.n_proc > 1
        and self.mesh.shape["context"] * self.mesh.shape["tensor"] > jax.local_device_count()):
      # Each host loads whole rows of its own data shard; rows split across hosts would need every host of a row
      # group to read the same shard.
      span = self.mesh.shape["context"] * self.mesh.shape["tensor"]
      raise MeshRefusal(f"mesh={cfg.mesh!r}: context x tensor = {span} spans hosts ({jax.local_device_count()} "
                        "devices each); pretraining loads whole rows per host: keep context x tensor within one host.")
    if self.mesh is not None:
      for phase in self.phases:  # every phase now, not hours into the run at its start
        try:
          layout_lib.check_mesh(phase.model, dict(self.mesh.shape), phase.batch_size, phase.seq_len)
        except MeshRefusal as e:
          raise MeshRefusal(f"mesh={cfg.mesh!r}, phase {phase.name!r}: {e}") from None
    self.ckpt = ocp.CheckpointManager(
        (self.work / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.checkpoint.keep, enable_async_checkpointing=True))
    self.restored = self.ckpt.latest_step()
    self.it = None  # the current phase's data iterator
    self.trained_data = None  # the data position of `self.state`, updated with it in one assignment

  def restore_or_init(self, phase: Phase) -> None:
    self.built = _build(phase, self.mesh)
    extra = {"phase": None, "data": None, "tokens": 0}
    if self.restored is None:
      base = None
      if self.cfg.init_checkpoint:  # continued pretraining of a base model (each phase sets its own rope)
        base = load_checkpoint_for(self.cfg.init_checkpoint, phase.model, what="init_checkpoint",
                                   free=("param_dtype", "rope"), shardings=self.built.param_shardings)
        logging.warning("continuing from the base model %s", self.cfg.init_checkpoint)
      self.state = self.built.init(jax.random.key(self.cfg.seed), base)
    else:
      got = self.ckpt.restore(self.restored, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(self.built.abstract()), extra=ocp.args.JsonRestore()))
      self.state, extra = got["state"], got["extra"]
      logging.warning("resumed from step %d (phase %s)", self.restored, phase.name)
    jax.block_until_ready(self.state)  # before any other sharded program is dispatched (see `cpu_mesh`)
    self.extra = extra
    self.tokens_seen = int(extra["tokens"])
    if self.primary:
      (self.work / "config.json").write_text(json.dumps(typed_config.to_plain(self.cfg), indent=2))
    self.log = RunLog(self.work, resumed_at=None if self.restored is None else int(self.state.step),
                      step_logs=("metrics.jsonl", "eval.jsonl"), primary=self.primary)
    self.eval_batches = pipeline.eval_batches(dict(self.cfg.eval.source), self.tok, seq_len=self.cfg.eval.seq_len,
                                              batch_size=self.cfg.eval.batch_size, n_batches=self.cfg.eval.batches)
    self.copy_probe = copy_metrics.CopyProbe.build(self.tok, dict(self.cfg.eval.source), seq_len=self.cfg.eval.seq_len,
                                                   rows=self.cfg.eval.batch_size)

  def evaluate(self, phase: Phase) -> dict:
    ce = heldout_ce(self.state.params, phase.model, self.eval_batches, self.built.layout, self.built.put_global)
    record = {"step": int(self.state.step), "phase": phase.name, "tokens": self.tokens_seen,
              "flops": float(self.flops_per_token) * self.tokens_seen, "heldout_ce": ce, "heldout_ppl": math.exp(ce),
              **self.copy_probe.evaluate(self.state.params, phase.model, self.built.layout, self.built.put_global)}
    self.log.write("eval.jsonl", record, tb_prefix="eval")
    return record

  def save(self, phase_name: str, data_state) -> None:
    meta = {"phase": phase_name, "data": data_state, "tokens": self.tokens_seen}
    self.ckpt.save(int(self.state.step), args=ocp.args.Composite(state=ocp.args.StandardSave(self.state),
                                                                 extra=ocp.args.JsonSave(meta)))

  def should_stop(self) -> bool:
    # Every process must stop before the same step (the next one is a collective): any process's request counts.
    want = bool(self.stop())
    if self.n_proc > 1:
      from jax.experimental import multihost_utils
      want = bool(np.max(multihost_utils.process_allgather(np.int32(want))))
    return want

  def train_phase(self, phase: Phase, bar: tqdm.tqdm) -> None:
    """Trains `phase` from the state's step to its end, then evaluates, writes its model and checkpoints; raises
    `_Interrupted` at a stop request (after the last finished step)."""
    if self.it is not None:  # entering the next phase (the first one this run trains was built at restore)
      self.built = _build(phase, self.mesh)
    self.it = iter(pipeline.lm_dataset(phase.sources, self.tok, seq_len=phase.seq_len,
                                       batch_size=phase.batch_size // self.n_proc,
                                       seed=self.cfg.seed + 1000 * phase.index, shard_index=jax.process_index(),
                                       shard_count=self.n_proc))
    extra = self.extra
    if extra.get("phase") == phase.name and extra.get("data") is not None and int(self.state.step) > phase.start:
      self.it.set_state(extra["data"])  # resume the phase's data exactly where its checkpoint left it
    self.trained_data = self.it.get_state()
    schedule = make_schedule(phase.hp.optim)
    n = len(self.phases)
    bar.set_description(self.label if n == 1 else f"{self.label}: {phase.name} {phase.index + 1}/{n}")
    if int(self.state.step) < phase.end:
      stages.note_once(("pretrain step", repr((phase.model, phase.hp, phase.batch_size, phase.seq_len, self.mesh))),
                       f"compiling the training step of phase {phase.name!r} (batch {phase.batch_size} x "
                       f"{phase.seq_len} tokens; first step, cached after)")
    # tokens/s over each logging window (the first window of a phase includes that phase's compile).
    window = {"t": time.perf_counter(), "tokens": self.tokens_seen}
    for step in range(int(self.state.step), phase.end):
      if self.should_stop():
        raise _Interrupted
      batch = next(self.it)
      data_after = self.it.get_state()
      rows_tokens = int(np.sum(batch["segment_ids"] > 0)) if "segment_ids" in batch else int(batch["tokens"].size)
      self.state, metrics, self.trained_data = (*self.built.step(self.state, self.built.put(batch)), data_after)
      if self.cpu_mesh:
        jax.block_until_ready(metrics)
      self.tokens_seen += rows_tokens * self.n_proc
      done = step + 1
      if done % self.cfg.log_every == 0 or done == phase.end:
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        now = time.perf_counter()
        rate = (self.tokens_seen - window["tokens"]) / max(now - window["t"], 1e-9)
        window.update(t=now, tokens=self.tokens_seen)
        m.update({"step": done, "phase": phase.name, "lr": float(schedule(step)), "tokens_seen": self.tokens_seen,
                  "tokens_per_s": rate})
        self.log.write("metrics.jsonl", m, tb_prefix="train")
        bar.set_postfix(loss=f"{m['loss']:.3f}", ce=f"{m['ce']:.3f}", tok_s=f"{rate:.0f}")
      bar.update(1)
      snapshot = done in self.cfg.checkpoint.model_at
      if (done % self.cfg.eval.every == 0 or snapshot) and done != phase.end:
        self.evaluate(phase)
      if snapshot:  # a point of pretraining to start RL from, with its held-out perplexity in eval.jsonl
        _write_model(self.work / "models" / f"step_{done}", self.state.params, phase.model)
      if done % self.cfg.checkpoint.every == 0 and done != phase.end:
        self.save(phase.name, self.trained_data)
    # The phase is done: its held-out perplexity, its model, then the checkpoint at the boundary (a run killed
    # before that checkpoint trains the phase's end again and rewrites the model).
    self.evaluate(phase)
    _write_model(self.work / "models" / phase.name, self.state.params, phase.model)
    self.save(phase.name, None)

  def checkpoint_what_was_trained(self, phase: Phase) -> None:
    """Whatever stopped the loop, what was trained is checkpointed with its data position."""
    try:
      if int(self.state.step) > (self.ckpt.latest_step() or 0) and self.it is not None:
        self.save(phase.name, self.trained_data)
      self.ckpt.wait_until_finished()
    except Exception as e:  # noqa: BLE001  (e.g. interrupted inside a step: its state was donated)
      logging.warning("could not checkpoint the last steps (%s); a restart resumes from step %s", e,
                      self.ckpt.latest_step())
    self.log.flush()


def run(cfg: PretrainRunConfig, workdir: str, *, stop: Callable[[], bool] = lambda: False,
        label: str = "pretrain") -> dict:
  """Trains every phase of `cfg.phase_order` (resuming from `workdir/checkpoints` when present).

  Args:
    cfg: the run config (`c2jax.services.pretrain_run_config.parse` of configs/pretrain_tiny.py).
    workdir: where outputs and checkpoints go.
    stop: polled between steps; True checkpoints and returns early with `interrupted` set (the same call
      resumes).
    label: the progress bar's label (the caller's stage).

  Returns:
    The summary also written to result.json: steps, held-out CE/perplexity before and after, tokens, tokens/s,
    the final model checkpoint, and the log-linear fit of held-out perplexity.
  """
  if cfg.init_checkpoint:  # refused before anything is built (its architecture is checked where it is loaded)
    check_checkpoint(cfg.init_checkpoint, "init_checkpoint")
  compile_cache.use()  # $JAX_COMPILATION_CACHE_DIR (an RL job's, for its SFT), else the user's cache
  r = _Run(cfg, workdir, stop, label)
  phase = phase_at(r.phases, r.restored or 0)
  if phase is None:  # every phase already done: report what is on disk
    logging.warning("every phase is already trained in %s (step %d); nothing to do", r.work, r.restored)
    return _summary(r.work, r.phases, steps=r.restored, interrupted=False, primary=r.primary)
  r.restore_or_init(phase)
  start = int(r.state.step)
  if start == 0:
    r.evaluate(phase)
    if 0 in cfg.checkpoint.model_at:  # the random init (or the base model) as a sweep point
      _write_model(r.work / "models" / "step_0", r.state.params, phase.model)
  interrupted = False
  total = r.phases[-1].end
  # Several phases are the run's stages ("stage 2/3: phase long_context"); one phase is the caller's stage.
  plan = stages.Stages(tuple(f"phase {p.name}" for p in r.phases)) if len(r.phases) > 1 and r.primary else None
  for done in r.phases[:phase.index] if plan else ():
    plan.skip(f"phase {done.name}", "trained before this run resumed")
  with tqdm.tqdm(total=total, initial=start, desc=label, unit="step", disable=not r.primary) as bar:
    try:
      for current in r.phases[phase.index:]:
        phase = current  # the phase a stop checkpoints
        if int(r.state.step) < phase.end:
          size = f"{phase.steps} steps of {phase.batch_size} x {phase.seq_len} tokens"
          with plan.stage(f"phase {phase.name}", size) if plan else contextlib.nullcontext():
            r.train_phase(phase, bar)
    except (_Interrupted, KeyboardInterrupt):
      interrupted = True
    finally:
      r.checkpoint_what_was_trained(phase)
  if interrupted:
    logging.warning("stopped at step %d; the same command resumes from the checkpoint", int(r.state.step))
  result = _summary(r.work, r.phases, steps=int(r.state.step), interrupted=interrupted, primary=r.primary)
  r.log.close()
  return result
