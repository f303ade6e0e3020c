"""A run config stored as JSON (what rl_main writes to `<workdir>/config.json` and to the buffer):

  python experiments/actor_main.py --config=configs/from_json.py:runs/rl_tiny/config.json ...
"""

import ml_collections


def get_config(path: str) -> ml_collections.ConfigDict:
  with open(path, encoding="utf-8") as f:
    from c2jax.rl.run_config import from_json
    return from_json(f.read())
