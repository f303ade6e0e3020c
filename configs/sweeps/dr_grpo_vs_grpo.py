"""Dr. GRPO vs GRPO: std normalization of the advantage x length normalization of the loss, a 2 x 2 grid.

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/dr_grpo_vs_grpo.py
"""

from configs.sweeps import OUTCOME_METRICS


def get_sweep():
  return {
      "name": "dr_grpo_vs_grpo",
      "description": (
          "The report trains with Dr. GRPO: advantages r - mean(r) without division by the group's std (which "
          "up-weights nearly all-pass or all-fail groups) and a token sum over a constant instead of a per-sequence "
          "token mean (which favours long wrong answers). At tiny scale every rollout of configs/rl_char_class.py has "
          "the same length (no stop tokens), so length normalization only rescales the gradient, which AdamW "
          "undoes: expect the length axis to change nothing and the std axis to show, at most, a difference in "
          "learning speed within seed noise."),
      "cells": {
          "dr_grpo": {"rl.advantage": "dr_grpo", "rl.aggregation": "token_sum_constant"},
          "grpo": {"rl.advantage": "grpo", "rl.aggregation": "seq_mean_token_mean"},
          "std_norm_only": {"rl.advantage": "grpo", "rl.aggregation": "token_sum_constant"},
          "length_norm_only": {"rl.advantage": "dr_grpo", "rl.aggregation": "seq_mean_token_mean"},
      },
      "seeds": [0, 1, 2],
      "metrics": list(OUTCOME_METRICS) + ["advantage/abs_mean@mean", "grad_norm@mean", "filtered_fraction"],
      "curves": ["reward/mean", "pass@1"],
  }
