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
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import jax

from c2jax.actors import placement
from c2jax.model.checkpoint import check_checkpoint
from c2jax.services import compile_cache
from c2jax.services import env_servers
from c2jax.services import rl_loop
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
  if cfg.sft.enabled and not cfg.init_checkpoint:
    init = started_from(workdir) or warm_start.sft_checkpoint(cfg, stop=stop)
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
  placement.pin(placement.parse_cpus(cfg.trainer.cpus))
  members = {**servers, **pool_members(cfg, workdir, config_path)} if primary else {}
  pool = LocalPool(os.path.join(workdir, "logs"), members, optional=("evaluator",), modules=modules)
  with pool:
    env_servers.wait_listening(env_servers.local_addresses(servers), pool.check)
    return rl_loop.run(cfg, workdir, health_check=pool.check, stop=stop)
