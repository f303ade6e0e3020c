"""KL estimator: k1 (the report's choice) vs k3 vs no KL penalty.

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/kl_estimator.py
"""

from configs.sweeps import OUTCOME_METRICS


def get_sweep():
  return {
      "name": "kl_estimator",
      "description": (
          "The report keeps a KL penalty to the reference policy with the k1 estimator (-log r), chosen over k3 "
          "(r - 1 - log r) to avoid variance blow-up where the policy moves far from the reference. At tiny scale "
          "(beta = 1e-3 in the reward, a few dozen updates) the penalty is small next to the task reward, so expect "
          "the cells to differ within seed noise; the KL columns show how far each run drifts from its reference."),
      "cells": {
          "k1": {"rl.kl_estimator": "k1"},
          "k3": {"rl.kl_estimator": "k3"},
          "none": {"rl.kl_coef": 0.0},
      },
      "seeds": [0, 1, 2],
      "metrics": list(OUTCOME_METRICS) + ["kl_ref_k1@last", "kl_ref_k3@last", "reward/mean@last"],
      "curves": ["reward/mean", "kl_ref_k3"],
  }
