"""Trains the model on code with next-token + MTP losses (report section 3).

  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py --workdir=runs/tiny

Until the RL loop lands, this is also `make demo`: a short tiny training run of the MoE model on the Python
standard library's sources, printing held-out loss before and after.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from c2jax.pretrain import loop

_CONFIG = config_flags.DEFINE_config_file("config", "configs/pretrain_tiny.py", "Run config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/pretrain", "Where logs, TensorBoard and checkpoints go.")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO; --verbosity=0 brings it back
    logging.set_verbosity(logging.WARNING)
  result = loop.run(_CONFIG.value, _WORKDIR.value)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
