"""Asynchronous RL: the SFT warm start, then the trainer plus, by default, a local pool of actor processes and an
evaluator (report sections 3-6; `c2jax.services.rl_job`).

  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_tiny
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_sync --config.schedule=sync
  python experiments/rl_main.py --config=configs/rl_tiny.py --config.actors.external=True \
      --config.buffer=s3://bucket/run/buffer --config.weights=s3://bucket/run/weights

The trainer consumes committed groups from the tensorstore buffer and publishes weights to the weight store;
actors (`python -m c2jax.services.actor_process`) sample with the newest weights, swapping them in between decode
chunks. SIGINT (Ctrl-C) and SIGTERM (preemption, scancel, pod eviction) finish the current step, checkpoint, stop
the pool and exit with code 130; the same command resumes (the trainer from its orbax checkpoint and buffer cursor;
actors re-run the groups they had begun; a finished run trains nothing and only evaluates again). Repeated signals
change nothing (schedulers often send two); SIGKILL stops at once and loses only the steps since the last
checkpoint. A config key that does not exist or a bad value is refused in one sentence (exit code 2). Each stage
is announced with its place ("stage 2/6: SFT"; `c2jax.services.rl_job.plan`); at the end the job prints where its
outputs are, then the result as JSON on the last line. `--config_help` lists every field of the run config.
"""

import json
import os
import signal
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # run from a checkout

import jax
from absl import app
from absl import flags
from absl import logging

from c2jax.parallel.distributed import initialize_from_env
from c2jax.services import cli
from c2jax.services import rl_job
from c2jax.services import rl_report
from c2jax.services import rl_run_config

_CONFIG = cli.define_config_file(os.path.join(_ROOT, "configs", "rl_tiny.py"), "Run config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/rl", "Checkpoints, logs, TensorBoard (and, by default, the buffer "
                               "and the weights).")
_RESULT_FILE = flags.DEFINE_string("result_file", "", "Also write the JSON result line to this file (a scheduler's "
                                   "batch script reads it there: a signalled step's stdout may arrive late or not at "
                                   "all).")

_stop_requests = 0

# (what, path in the workdir, how to use it) of the job's outputs, printed at its end (those that exist).
_OUTPUTS = (
    ("model", "model", "the trained policy: eval_main's --config.checkpoint, export_hf's --checkpoint"),
    ("checkpoints", "checkpoints", "the trainer's state: the same command resumes from it"),
    ("config", "config.json", "the resolved run config"),
    ("metrics", "metrics.jsonl", "one line per step"),
    ("evaluations", "eval.jsonl", "held-out before and after RL"),
    ("TensorBoard", "tb", "tensorboard --logdir={path}"),
    ("report", "result.json", "the result below"),
    ("plot", "training.png", ""),
    ("logs", "logs", "the actors' and the evaluator's"),
)


def _request_stop(signum, frame):
  del frame
  global _stop_requests
  _stop_requests += 1
  if _stop_requests == 1:
    logging.warning("signal %d: stopping after the current step and checkpointing", signum)


def main(argv):
  del argv
  cfg = cli.typed(rl_run_config.parse, _CONFIG.value)
  signal.signal(signal.SIGINT, _request_stop)
  signal.signal(signal.SIGTERM, _request_stop)
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO; --verbosity=0 brings it back
    logging.set_verbosity(logging.WARNING)
  initialize_from_env()  # a multi-host trainer when C2JAX_DISTRIBUTED=1
  with cli.refusals():  # a damaged weight store, a buffer cursor of another buffer: one sentence
    result = rl_job.run(cfg, _WORKDIR.value, stop=lambda: _stop_requests > 0)
  if "pass_at_1_after" in result:
    print("\n" + rl_report.summary_table(result) + "\n", flush=True)
  if jax.process_index() == 0:
    print(cli.outputs(_WORKDIR.value, _OUTPUTS), flush=True)
  line = json.dumps(result)
  if _RESULT_FILE.value and jax.process_index() == 0:
    tmp = _RESULT_FILE.value + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(line + "\n")
    os.replace(tmp, _RESULT_FILE.value)
  print(line, flush=True)
  if result.get("interrupted"):
    sys.exit(130)  # so that schedulers (Slurm --requeue, Kubernetes) see an unfinished run


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser)
