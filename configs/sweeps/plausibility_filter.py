"""The plausibility filter on (tokens with trainer/actor probability ratio outside [0.5, 2] dropped) vs off.

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/plausibility_filter.py
"""

from configs.sweeps import OUTCOME_METRICS


def get_sweep():
  return {
      "name": "plausibility_filter",
      "description": (
          "The report drops tokens whose trainer and actor probabilities disagree beyond a threshold, since their "
          "gradients are noise (or huge ratios). configs/rl_char_class.py filters about 0.3% of tokens (staleness from "
          "in-flight updates; no precision or kernel mismatch on a CPU), so expect no measurable difference at this "
          "scale: the sweep checks that the filter costs nothing, not that it helps."),
      "cells": {
          "on": {"rl.filter.mode": "token"},
          "off": {"rl.filter.mode": "none"},
      },
      "seeds": [0, 1, 2],
      "metrics": list(OUTCOME_METRICS) + ["filtered_fraction", "kl_behaviour_k3@mean", "grad_norm@max"],
      "curves": ["reward/mean", "filtered_fraction"],
  }
