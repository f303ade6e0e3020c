"""A rollout worker (or the evaluator) of the asynchronous RL job: the inference and evaluation services of the
report (sections 4 and 6), one process each.

  python -m c2jax.services.actor_process --buffer=URL --weights=URL [--config=configs/rl_tiny.py] [--actor_id=NAME]
  python -m c2jax.services.actor_process --buffer=URL --weights=URL --role=evaluator --logdir=runs/rl_tiny

Runs anywhere that reaches the two URLs (local paths, s3://, gs://): that is the external actor pool; an installed
c2jax needs no checkout. Without --config (or --config_json, a run config as JSON: what the local pool passes) it
reads the run config that the trainer stored in the buffer, so every actor agrees with the trainer on the model, the
row layout and the sampling temperature. SIGTERM (or Ctrl-C) finishes the sampler call in progress and exits; a
SIGKILLed actor restarted with the same --actor_id re-runs its unfinished groups.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from absl import app
from absl import flags
from absl import logging
import jax

from c2jax.actors import placement
from c2jax.services import cli
from c2jax.services import rl_run_config
from c2jax.services.rl_run_config import RLRunConfig

_CONFIG = cli.define_config_file(None, "Run config file (default: the one in the buffer).")
_CONFIG_JSON = flags.DEFINE_string("config_json", None, "A run config as JSON (what the trainer writes to "
                                   "<workdir>/config.json), instead of --config.")
# Required, but checked in `main` rather than by absl: `--config_help` needs neither.
_BUFFER = flags.DEFINE_string("buffer", None, "Rollout buffer URL (required).")
_WEIGHTS = flags.DEFINE_string("weights", None, "Weight store URL (required).")
_ACTOR_ID = flags.DEFINE_string("actor_id", None, "This actor's shard name (default: host-pid). Reuse it on restart.")
_ROLE = flags.DEFINE_enum("role", "actor", ["actor", "evaluator"], "Sample rollouts, or evaluate held-out tasks.")
_MAX_GROUPS = flags.DEFINE_integer("max_groups", None, "Exit after committing this many groups.")
_LOGDIR = flags.DEFINE_string("logdir", None, "Evaluator: where eval_during.jsonl and tb/evaluator go.")
_EXIT_WITH_PARENT = flags.DEFINE_integer("exit_with_parent", None, "Die when this process (the trainer that started "
                                        "this actor) dies (Linux).")
_WAIT_CONFIG_S = flags.DEFINE_float("wait_config_s", 600.0, "How long to wait for the trainer's run config.")

_stopping = False


def _stop(*_):
  global _stopping
  _stopping = True


def _config() -> RLRunConfig:
  if flags.FLAGS.config_help and _CONFIG.value is None and _CONFIG_JSON.value is None:
    return cli.typed(rl_run_config.parse, rl_run_config.defaults())  # prints the defaults' fields and exits
  if _CONFIG.value is not None:
    return cli.typed(rl_run_config.parse, _CONFIG.value)
  if _CONFIG_JSON.value is not None:
    with open(_CONFIG_JSON.value, encoding="utf-8") as f:
      return cli.typed(rl_run_config.from_json, f.read())
  from c2jax.rollouts.storage import Store
  store, deadline = Store(_BUFFER.value), time.time() + _WAIT_CONFIG_S.value
  while (data := store.read(rl_run_config.RUN_CONFIG_KEY)) is None:
    if time.time() > deadline or _stopping:
      cli.refuse(f"No {rl_run_config.RUN_CONFIG_KEY} in {_BUFFER.value}: start the trainer or pass --config.")
    time.sleep(1.0)
  try:
    text = data.decode()
    json.loads(text)
  except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    cli.refuse(f"{rl_run_config.RUN_CONFIG_KEY} in {_BUFFER.value} is damaged ({e}); restart the trainer, which "
               f"rewrites it, or pass --config.")
  return cli.typed(rl_run_config.from_json, text)


def run_actor(cfg: RLRunConfig) -> dict:
  from c2jax.actors.actor import Actor
  from c2jax.envs.service.factory import env_factory
  actor_id = _ACTOR_ID.value or f"{socket.gethostname()}-{os.getpid()}"
  suite = cfg.task_suite()
  actor = Actor(cfg.actor_config, cfg.model_config, suite, buffer_url=_BUFFER.value, weights_url=_WEIGHTS.value,
                actor_id=actor_id, envs=env_factory(cfg.env_service, suite))
  t0 = time.time()

  def report(a):
    if a.stats.groups % 10 == 0:
      logging.info("%s: %d groups, %d tokens, weights v%s, %d in-flight swaps, %.1f tok/s", actor_id, a.stats.groups,
                   a.stats.tokens, a.version, a.stats.in_flight_swaps, a.stats.tokens / (time.time() - t0))

  stats = actor.run(stop=lambda: _stopping, max_groups=_MAX_GROUPS.value, on_step=report)
  return {"actor": actor_id, **vars(stats)}


def run_evaluator(cfg: RLRunConfig) -> dict:
  """Evaluates every `eval.every_versions`-th published version on held-out tasks (eval_during.jsonl, TensorBoard
  under tb/evaluator)."""
  from c2jax.services.held_out import held_out_evaluation
  from c2jax.rollouts.weight_store import WeightStore
  from c2jax.services.run_log import RunLog
  run_eval = held_out_evaluation(cfg)
  log = RunLog(_LOGDIR.value or ".", resumed_at=None, tb_dir=os.path.join("tb", "evaluator"))
  store = WeightStore(_WEIGHTS.value)
  version, params, last = None, None, None
  evaluated = 0
  with log:
    while not _stopping:
      got = store.update(version, params)
      if got is not None:
        version, params = got
      if version is None or (last is not None and version < last + cfg.eval.every_versions):
        time.sleep(1.0)
        continue
      r = run_eval(jax.device_put(params), label=f"evaluator: held-out evaluation of version {version}")
      r["version"], r["time"] = version, time.time()
      log.write("eval_during.jsonl", r)
      log.scalars("eval", {k: v for k, v in r.items() if k not in ("version", "time", "tasks", "samples")}, version)
      log.flush()
      last, evaluated = version, evaluated + 1
  return {"evaluator_runs": evaluated, "last_version": last}


def main(argv):
  del argv
  if _EXIT_WITH_PARENT.value:
    from c2jax.services.pool import die_with_parent
    die_with_parent(_EXIT_WITH_PARENT.value)
  signal.signal(signal.SIGTERM, _stop)
  signal.signal(signal.SIGINT, _stop)
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.INFO)
  if _CONFIG.value is not None and _CONFIG_JSON.value is not None:
    cli.refuse("pass --config or --config_json, not both.")
  missing = [f"--{f}" for f, v in (("buffer", _BUFFER.value), ("weights", _WEIGHTS.value)) if not v]
  if missing and not flags.FLAGS.config_help:
    cli.refuse(f"{' and '.join(missing)} must be given: the URLs of the run's rollout buffer and weight store.")
  cfg = _config()  # with --config_help: prints the run config's fields and exits
  placement.pin(placement.parse_cpus(cfg.actors.cpus))  # before this process computes anything
  with cli.refusals():
    result = run_actor(cfg) if _ROLE.value == "actor" else run_evaluator(cfg)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser)
