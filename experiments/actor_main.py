"""A rollout worker (or the evaluator) of the asynchronous RL job (report sections 4 and 6).

  python experiments/actor_main.py --buffer=URL --weights=URL [--config=configs/rl_tiny.py] [--actor_id=NAME]
  python experiments/actor_main.py --buffer=URL --weights=URL --role=evaluator --logdir=runs/rl_tiny

Runs anywhere that reaches the two URLs (local paths, s3://, gs://): that is the external actor pool. Without
--config it reads the run config that the trainer stored in the buffer, so every actor agrees with the trainer on
the model, the row layout and the sampling temperature. SIGTERM (or Ctrl-C) finishes the sampler call in
progress and exits; a SIGKILLed actor restarted with the same --actor_id re-runs its unfinished groups.
"""

import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from c2jax.rl import run_config

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (default: the one in the buffer).")
_BUFFER = flags.DEFINE_string("buffer", None, "Rollout buffer URL.", required=True)
_WEIGHTS = flags.DEFINE_string("weights", None, "Weight store URL.", required=True)
_ACTOR_ID = flags.DEFINE_string("actor_id", None, "This actor's shard name (default: host-pid). Reuse it on restart.")
_ROLE = flags.DEFINE_enum("role", "actor", ["actor", "evaluator"], "Sample rollouts, or evaluate held-out tasks.")
_MAX_GROUPS = flags.DEFINE_integer("max_groups", None, "Exit after committing this many groups.")
_LOGDIR = flags.DEFINE_string("logdir", None, "Evaluator: where eval_during.jsonl and tb/ go.")
_EXIT_WITH_PARENT = flags.DEFINE_integer("exit_with_parent", None, "Die when this process (the trainer that started "
                                        "this actor) dies (Linux).")
_WAIT_CONFIG_S = flags.DEFINE_float("wait_config_s", 600.0, "How long to wait for the trainer's run config.")

_stopping = False


def _stop(*_):
  global _stopping
  _stopping = True


def _config():
  if _CONFIG.value is not None:
    return _CONFIG.value
  from c2jax.rollouts.storage import Store
  store, deadline = Store(_BUFFER.value), time.time() + _WAIT_CONFIG_S.value
  while (data := store.read(run_config.RUN_CONFIG_KEY)) is None:
    if time.time() > deadline or _stopping:
      raise SystemExit(f"No {run_config.RUN_CONFIG_KEY} in {_BUFFER.value}: start the trainer or pass --config.")
    time.sleep(1.0)
  return run_config.from_json(data.decode())


def run_actor(c) -> dict:
  from c2jax.actors.actor import Actor
  actor_id = _ACTOR_ID.value or f"{socket.gethostname()}-{os.getpid()}"
  actor = Actor(run_config.actor_config(c), run_config.model_config(c), run_config.task_suite(c),
                buffer_url=_BUFFER.value, weights_url=_WEIGHTS.value, actor_id=actor_id)
  t0 = time.time()

  def report(a):
    if a.stats.groups % 10 == 0:
      logging.info("%s: %d groups, %d tokens, weights v%s, %d in-flight swaps, %.1f tok/s", actor_id, a.stats.groups,
                   a.stats.tokens, a.version, a.stats.in_flight_swaps, a.stats.tokens / (time.time() - t0))

  stats = actor.run(stop=lambda: _stopping, max_groups=_MAX_GROUPS.value, on_step=report)
  return {"actor": actor_id, **vars(stats)}


def run_evaluator(c) -> dict:
  """Evaluates every `eval.every_versions`-th published version on held-out tasks."""
  from c2jax.actors.evaluate import evaluate
  from c2jax.actors.sampling import SamplingConfig
  from c2jax.rollouts.weight_store import WeightStore
  model, actor_cfg, suite, cfg = (run_config.model_config(c), run_config.actor_config(c), run_config.task_suite(c),
                                  run_config.rl_config(c))
  logdir = _LOGDIR.value or "."
  os.makedirs(logdir, exist_ok=True)
  try:
    from tensorboardX import SummaryWriter
    tb = SummaryWriter(os.path.join(logdir, "tb", "evaluator"))
  except ImportError:
    tb = None
  store = WeightStore(_WEIGHTS.value)
  sampling = SamplingConfig(max_new_tokens=actor_cfg.max_new_tokens, temperature=actor_cfg.temperature,
                            stop_tokens=actor_cfg.stop_tokens)
  version, params, last = None, None, None
  evaluated = 0
  while not _stopping:
    got = store.update(version, params)
    if got is not None:
      version, params = got
    if version is None or (last is not None and version < last + c.eval.every_versions):
      time.sleep(1.0)
      continue
    r = evaluate(jax.device_put(params), model=model, suite=suite, tasks=c.eval.tasks, samples=c.eval.samples,
                 sampling=sampling, prompt_len=actor_cfg.prompt_len, seed=c.seed,
                 success_threshold=cfg.success_threshold,
                 pass_k=tuple(sorted(set(cfg.pass_k) | {run_config.best_of(c)})))
    r["version"], r["time"] = version, time.time()
    with open(os.path.join(logdir, "eval_during.jsonl"), "a") as f:
      f.write(json.dumps(r) + "\n")
    if tb is not None:
      for k, v in r.items():
        if k not in ("version", "time", "tasks", "samples"):
          tb.add_scalar(f"eval/{k}", v, version)
      tb.flush()
    last, evaluated = version, evaluated + 1
  return {"evaluator_runs": evaluated, "last_version": last}


def main(argv):
  del argv
  if _EXIT_WITH_PARENT.value:
    from c2jax.actors.pool import die_with_parent
    die_with_parent(_EXIT_WITH_PARENT.value)
  signal.signal(signal.SIGTERM, _stop)
  signal.signal(signal.SIGINT, _stop)
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.INFO)
  c = _config()
  from c2jax.actors import placement
  placement.pin(placement.parse_cpus(c.actors.get("cpus", "")))  # before this process computes anything
  result = run_actor(c) if _ROLE.value == "actor" else run_evaluator(c)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
