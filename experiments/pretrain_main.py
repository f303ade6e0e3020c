"""Continued pretraining (report section 3): bulk code, long-context extension, SFT, with MTP self-distillation.

  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py --workdir=runs/pretrain_tiny

Ctrl-C (or SIGTERM from a scheduler) finishes the current step, checkpoints and exits with code 130; the same
command resumes exactly where it stopped. The final model is `<workdir>/models/<last phase>`.
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from c2jax.parallel.distributed import initialize_from_env
from c2jax.pretrain import loop

_CONFIG = config_flags.DEFINE_config_file("config", "configs/pretrain_tiny.py", "Run config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/pretrain", "Where logs, TensorBoard and checkpoints go.")

_stop_requests = 0


def _request_stop(signum, frame):
  """SIGINT / SIGTERM: stop after the current step and checkpoint (repeated signals change nothing)."""
  del frame
  global _stop_requests
  _stop_requests += 1
  if _stop_requests == 1:
    logging.warning("signal %d: stopping after the current step and checkpointing", signum)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO; --verbosity=0 brings it back
    logging.set_verbosity(logging.WARNING)
  initialize_from_env()  # multi-host when C2JAX_DISTRIBUTED=1
  signal.signal(signal.SIGINT, _request_stop)
  signal.signal(signal.SIGTERM, _request_stop)
  result = loop.run(_CONFIG.value, _WORKDIR.value, stop=lambda: _stop_requests > 0)
  print(json.dumps(result))
  if result.get("interrupted"):
    sys.exit(130)  # so that schedulers (Slurm --requeue, Kubernetes) see an unfinished run


if __name__ == "__main__":
  app.run(main)
