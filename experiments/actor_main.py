"""A rollout worker (or the evaluator) of the asynchronous RL job, from a checkout; the same as
`python -m c2jax.services.actor_process` (which an installed c2jax runs; see that module for the flags).

  python experiments/actor_main.py --buffer=URL --weights=URL [--config=configs/rl_tiny.py] [--actor_id=NAME]
  python experiments/actor_main.py --buffer=URL --weights=URL --role=evaluator --logdir=runs/rl_tiny
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app

from c2jax.services import actor_process
from c2jax.services import cli

if __name__ == "__main__":
  app.run(actor_process.main, flags_parser=cli.flags_parser)
