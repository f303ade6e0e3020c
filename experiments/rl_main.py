"""Asynchronous RL: the trainer plus, by default, a local pool of actor processes and an evaluator (report
sections 4 and 6).

  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_tiny
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_sync --config.schedule=sync
  python experiments/rl_main.py --config=configs/rl_tiny.py --config.actors.external=True \
      --config.buffer=s3://bucket/run/buffer --config.weights=s3://bucket/run/weights

The trainer consumes committed groups from the tensorstore buffer and publishes weights to the weight store;
actors (`experiments/actor_main.py`) sample with the newest weights, swapping them in between decode chunks.
Ctrl-C checkpoints and stops everything; the same command resumes (the trainer from its orbax checkpoint and
buffer cursor; actors re-run the groups they had begun). Prints the result as JSON on the last line.
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from c2jax.actors import placement
from c2jax.actors.pool import LocalPool
from c2jax.parallel.distributed import initialize_from_env
from c2jax.rl import loop
from c2jax.rl import report
from c2jax.rl import run_config
from c2jax.rl import warm_start

_CONFIG = config_flags.DEFINE_config_file("config", "configs/rl_tiny.py", "Run config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/rl", "Checkpoints, logs, TensorBoard (and, by default, the buffer "
                               "and the weights).")


_stop_requests = 0


def _request_stop(signum, frame):
  """SIGINT (Ctrl-C) and SIGTERM (preemption, scancel, pod eviction): finish the current step, checkpoint, stop
  the pool and exit with code 130. Repeated signals change nothing (schedulers often send two); SIGKILL stops at
  once and loses only the steps since the last checkpoint."""
  del frame
  global _stop_requests
  _stop_requests += 1
  if _stop_requests == 1:
    logging.warning("signal %d: stopping after the current step and checkpointing", signum)


def _started_from(workdir: str) -> str | None:
  """The init_checkpoint of the RL run in `workdir` when it has an RL checkpoint to resume from, else None."""
  checkpoints = os.path.join(workdir, "checkpoints")
  steps = [d for d in os.listdir(checkpoints) if d.isdigit()] if os.path.isdir(checkpoints) else []
  config_path = os.path.join(workdir, "config.json")
  if not steps or not os.path.exists(config_path):
    return None
  with open(config_path, encoding="utf-8") as f:
    return json.load(f).get("init_checkpoint") or None


def main(argv):
  del argv
  signal.signal(signal.SIGINT, _request_stop)
  signal.signal(signal.SIGTERM, _request_stop)
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO; --verbosity=0 brings it back
    logging.set_verbosity(logging.WARNING)
  # A multi-host trainer when C2JAX_DISTRIBUTED=1: process 0 reads the buffer, publishes weights and runs the local
  # pool (if any).
  initialize_from_env()
  c = _CONFIG.value
  # Compiled programs are cached on disk: a restarted trainer or actor skips its compiles.
  cache = c.get("compilation_cache") or os.path.join(os.path.abspath(_WORKDIR.value), "jax_cache")
  jax.config.update("jax_compilation_cache_dir", cache)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = cache  # inherited by the pool
  workdir = os.path.abspath(_WORKDIR.value)
  os.makedirs(workdir, exist_ok=True)
  # Malformed CPU lists fail here, before any SFT; the trainer is pinned after it (SFT may use every core).
  trainer_cpus = placement.parse_cpus(c.trainer.get("cpus", ""))
  placement.parse_cpus(c.actors.get("cpus", ""))
  run_config.best_of(c)  # and a best-of-K the held-out evaluation cannot estimate
  if c.sft.enabled and not c.init_checkpoint:
    # The SFT warm start (cached by its settings), before any actor starts: they sample from what RL starts from.
    # A run that already checkpointed RL resumes from its own state: its SFT is not needed (nor retrained when the
    # cache was cleared).
    c.init_checkpoint = (_started_from(workdir)
                         or warm_start.sft_checkpoint(c, stop=lambda: _stop_requests > 0))
    if c.init_checkpoint is None:
      print(json.dumps({"interrupted": True, "stage": "sft"}))
      sys.exit(130)
  buffer_url, weights_url = run_config.urls(c, workdir)
  config_path = os.path.join(workdir, "config.json")
  if jax.process_index() == 0:
    with open(config_path, "w", encoding="utf-8") as f:
      f.write(run_config.to_json(c))
  members = {}
  if not c.actors.external and jax.process_index() == 0:
    common = [f"--buffer={buffer_url}", f"--weights={weights_url}", f"--config=configs/from_json.py:{config_path}"]
    members = {f"actor-{i}": common + [f"--actor_id=actor-{i}"] for i in range(c.actors.num)}
    if c.eval.process:
      members["evaluator"] = common + ["--role=evaluator", f"--logdir={workdir}"]
  placement.pin(trainer_cpus)
  pool = LocalPool(os.path.join(workdir, "logs"), members, optional=("evaluator",))
  with pool:
    result = loop.run(c, workdir, health_check=pool.check, stop=lambda: _stop_requests > 0)
  if "pass_at_1_after" in result:
    print("\n" + report.summary_table(result) + "\n", flush=True)
  print(json.dumps(result))
  if result.get("interrupted"):
    sys.exit(130)  # so that schedulers (Slurm --requeue, Kubernetes) see an unfinished run


if __name__ == "__main__":
  app.run(main)
