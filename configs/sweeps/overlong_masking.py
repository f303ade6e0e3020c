"""Overlong rollouts (cut at the length budget) kept in the loss (the report, Dr. GRPO) vs masked out (DAPO).

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/overlong_masking.py
"""

from configs.sweeps import EOS, OUTCOME_METRICS

# Without a stop token every row of configs/rl_char_class.py is cut at the budget, and masking would train on nothing.
_VARIABLE_LENGTH = {"actors.stop_tokens": [EOS]}


def get_sweep():
  return {
      "name": "overlong_masking",
      "description": (
          "The report keeps truncated rollouts in the loss rather than masking them (DAPO's overlong masking), so "
          "that running out of budget is penalized like any failure. On the built-in task with EOS as stop token, "
          "a random policy runs ~97% of its 8-token rows to the budget and only those can be fully correct (EOS "
          "counts as a wrong byte), so masking them drops most of the signal: expect `mask` to learn far less. "
          "That shows the cost of masking when the budget binds, not DAPO's benefit at long budgets."),
      "cells": {
          "keep": {"rl.overlong": "keep", **_VARIABLE_LENGTH},
          "mask": {"rl.overlong": "mask", **_VARIABLE_LENGTH},
      },
      "seeds": [0, 1, 2],
      "metrics": list(OUTCOME_METRICS) + ["truncated_fraction@last", "tokens_in_loss@mean", "length/mean@last"],
      "curves": ["reward/mean", "truncated_fraction"],
  }
