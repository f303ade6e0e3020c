"""A run config stored as JSON (what rl_main writes to `<workdir>/config.json` and a sweep to each run's
sweep_config.json):

  python experiments/rl_main.py --config=configs/from_json.py:runs/rl_tiny/config.json ...
"""

import json

import ml_collections


def get_config(path: str) -> ml_collections.ConfigDict:
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))
