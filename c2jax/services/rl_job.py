"""The asynchronous RL job: the SFT warm start, then the trainer with (by default) a local pool of actor processes
and an evaluator (report sections 3-6). What experiments/rl_main.py runs.

  result = run(cfg, workdir, stop=lambda: False)    # cfg: rl_run_config.parse(...)

In order: the checkpoints the config names, checked (`check_inputs`: a path that is not a checkpoint of the run's
model is refused before anything starts); the compiled-program cache (`c2jax.services.compile_cache`:
`compilation_cache`, else $JAX_COMPILATION_CACHE_DIR, else the user's cache; inherited by the actors, so a restarted
job, or the next run of the same programs, skips its compiles); the SFT warm start when `sft.enabled` and no
`init_checkpoint` (before any actor starts: they sample from what RL starts from; a job that already checkpointed RL
resumes from its own state and needs no SFT); the local pool (`env_service.local` environment servers first,
`c2jax.services.env_servers`, waited for until they listen; then `actors.num` actors and, with `eval.process`, the
evaluator; no actors with `actors.external`); the trainer pinned to `trainer.cpus`; the trainer loop
(`c2jax.services.rl_loop`). A stop request checkpoints and returns with `interrupted`; the same call resumes.

Each stage is announced with its place ("stage 2/6: SFT", `c2jax.services.stages`; `plan` lists them) and labels its
progress bar; the resolved run config's path and the pool's logs are printed when they are written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import jax

from c2jax.actors import placement
from c2jax.actors.actor import EpisodeKind
from c2jax.model.checkpoint import check_checkpoint
from c2jax.services import compile_cache
from c2jax.services import env_servers
from c2jax.services import rl_loop
from c2jax.services import stages
from c2jax.services import teacher_traces
from c2jax.services import warm_start
from c2jax.services.pool import LocalPool
from c2jax.services.rl_run_config import RLRunConfig, to_json


def started_from(workdir: str) -> str | None:
  """The init_checkpoint of the RL run in `workdir` when it has an RL checkpoint to resume from, else None."""
  checkpoints = os.path.join(workdir, "checkpoints")
  steps = [d for d in os.listdir(checkpoints) if d.isdigit()] if os.path.isdir(checkpoints) else []
  config_path = os.path.join(workdir, "config.json")
  if not steps or not os.path.exists(config_path):
    return None
  with open(config_path, encoding="utf-8") as f:
    return json.load(f).get("init_checkpoint") or None


def pool_members(cfg: RLRunConfig, workdir: str, config_path: str) -> dict[str, list[str]]:
  """{name: actor_process arguments} of the local pool (empty with `actors.external`)."""
  if cfg.actors.external:
    return {}
  buffer_url, weights_url = cfg.urls(workdir)
  common = [f"--buffer={buffer_url}", f"--weights={weights_url}", f"--config_json={config_path}"]
  members = {f"actor-{i}": common + [f"--actor_id=actor-{i}"] for i in range(cfg.actors.num)}
  if cfg.eval.process:
    members["evaluator"] = common + ["--role=evaluator", f"--logdir={workdir}"]
  return members


TEACHER, SFT = "recording teacher traces", "SFT"


def plan(cfg: RLRunConfig) -> stages.Stages:
  """The job's stages in order: the teacher's traces (a multi-turn teacher) and the SFT when the job warm-starts,
  then the trainer loop's (`rl_loop.COMPILE` for multi-turn actors, `BEFORE`, `TRAIN`, `AFTER`)."""
  warm = cfg.sft.enabled and not cfg.init_checkpoint
  names = ((TEACHER,) if warm and cfg.sft.teacher.policy else ()) + ((SFT,) if warm else ())
  if cfg.actor_config.episodes is EpisodeKind.MULTI_TURN:
    names += (rl_loop.COMPILE,)
  return stages.Stages(names + (rl_loop.BEFORE, rl_loop.TRAIN, rl_loop.AFTER))


def check_inputs(cfg: RLRunConfig) -> None:
  """The checkpoints `cfg` names exist, are finished and hold the run's model (`check_checkpoint`: MissingInput or
  MismatchedInput, one sentence): checked before the SFT, the environment servers or the actors start."""
  if cfg.init_checkpoint:
    check_checkpoint(cfg.init_checkpoint, "init_checkpoint", cfg.model_config)
  elif cfg.sft.enabled and cfg.sft.base_checkpoint:  # each pretraining phase sets its own rope (as the SFT does)
    check_checkpoint(cfg.sft.base_checkpoint, "sft.base_checkpoint", cfg.model_config, free=("param_dtype", "rope"))


def run(cfg: RLRunConfig, workdir: str, *, stop: Callable[[], bool] = lambda: False) -> dict:
  """Runs (or resumes) the job in `workdir`; returns the trainer's result (`interrupted` and `stage` when a stop
  request ended the SFT)."""
  check_inputs(cfg)
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  compile_cache.use(cfg.compilation_cache)  # inherited by the pool
  rl_loop.check_mesh(cfg)  # a mesh that cannot take the batch: refused now, not after the SFT and the actors' start
  job = plan(cfg)
  # Where the stages' usual times are (the code points to the docs rather than copying their figures).
  stages.note(f"{len(job.names)} stages: {', '.join(job.names)}; their times on a 2-core box: docs/benchmarks.md, "
              "tools/bench_main_job.py")
  if SFT in job.names:
    init = started_from(workdir)
    if init is not None:
      for name in job.names[:job.names.index(SFT) + 1]:
        job.skip(name, f"RL resumes from its checkpoint (it started from {init})")
    else:
      if TEACHER in job.names:  # cached by their settings: recorded once, then read
        with job.stage(TEACHER, f"{cfg.sft.teacher.policy}, train and held-out tasks") as s:
          for split in ("train", "heldout"):
            teacher_traces.ensure_traces(cfg, split, label=s.label)
      with job.stage(SFT, f"{cfg.sft.steps} steps; reused when the cache holds it") as s:
        init = warm_start.sft_checkpoint(cfg, stop=stop, label=s.label)
        s.interrupted = init is None
      if init is None:
        return {"interrupted": True, "stage": "sft"}
    cfg = dataclasses.replace(cfg, init_checkpoint=init)
  config_path = os.path.join(workdir, "config.json")
  primary = jax.process_index() == 0  # a multi-host trainer: process 0 reads the buffer, publishes and runs the pool
  servers, modules = {}, {}
  if primary:
    if cfg.env_service.local:
      env_servers.with_secret(cfg)  # before the pool copies this process's environment
    # The actors, the evaluator and the trainer find the job's servers in the config it writes.
    cfg, servers, modules = env_servers.local_servers(cfg)
    with open(config_path, "w", encoding="utf-8") as f:
      f.write(to_json(cfg))
    stages.note(f"resolved run config: {config_path}")
  placement.pin(placement.parse_cpus(cfg.trainer.cpus))
  members = {**servers, **pool_members(cfg, workdir, config_path)} if primary else {}
  pool = LocalPool(os.path.join(workdir, "logs"), members, optional=("evaluator",), modules=modules)
  if members:
    stages.note(f"starting {', '.join(members)}; their logs: {os.path.join(workdir, 'logs')}")
  with pool:
    env_servers.wait_listening(env_servers.local_addresses(servers), pool.check)
    return rl_loop.run(cfg, workdir, health_check=pool.check, stop=stop, plan=job)
