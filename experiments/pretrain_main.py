"""Continued pretraining (report section 3): bulk code, long-context extension, SFT, with MTP self-distillation
(`c2jax.services.pretrain_loop`).

  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py --workdir=runs/pretrain_tiny

Ctrl-C (or SIGTERM from a scheduler) finishes the current step, checkpoints and exits with code 130; the same
command resumes exactly where it stopped. The final model is `<workdir>/models/<last phase>`. A config key that does
not exist or a bad value is refused in one sentence (exit code 2). The progress bar names the phase ("pretrain: bulk
1/3"); at the end the run prints where its outputs are, then its result as JSON on the last line. `--config_help`
lists every field of the run config.
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
from c2jax.services import pretrain_loop
from c2jax.services import pretrain_run_config

_CONFIG = cli.define_config_file(os.path.join(_ROOT, "configs", "pretrain_tiny.py"), "Run config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/pretrain", "Where logs, TensorBoard and checkpoints go.")

_stop_requests = 0

# (what, path in the workdir, how to use it) of the run's outputs, printed at its end (those that exist).
_OUTPUTS = (
    ("models", "models", "one per phase: models/<phase>, RL's init_checkpoint or sft.base_checkpoint"),
    ("checkpoints", "checkpoints", "the train state: the same command resumes from it"),
    ("config", "config.json", "the resolved run config"),
    ("metrics", "metrics.jsonl", "one line per log_every steps"),
    ("evaluations", "eval.jsonl", "held-out perplexity: tools/fit_loglinear.py"),
    ("TensorBoard", "tb", "tensorboard --logdir={path}"),
    ("report", "result.json", "the result below"),
)


def _request_stop(signum, frame):
  """SIGINT / SIGTERM: stop after the current step and checkpoint (repeated signals change nothing)."""
  del frame
  global _stop_requests
  _stop_requests += 1
  if _stop_requests == 1:
    logging.warning("signal %d: stopping after the current step and checkpointing", signum)


def main(argv):
  del argv
  cfg = cli.typed(pretrain_run_config.parse, _CONFIG.value)
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO; --verbosity=0 brings it back
    logging.set_verbosity(logging.WARNING)
  initialize_from_env()  # multi-host when C2JAX_DISTRIBUTED=1
  signal.signal(signal.SIGINT, _request_stop)
  signal.signal(signal.SIGTERM, _request_stop)
  with cli.refusals():  # a mesh that the devices, the model or a phase's batch cannot take: one sentence
    result = pretrain_loop.run(cfg, _WORKDIR.value, stop=lambda: _stop_requests > 0)
  if jax.process_index() == 0:
    print(cli.outputs(_WORKDIR.value, _OUTPUTS), flush=True)
  print(json.dumps(result))
  if result.get("interrupted"):
    sys.exit(130)  # so that schedulers (Slurm --requeue, Kubernetes) see an unfinished run


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser)
