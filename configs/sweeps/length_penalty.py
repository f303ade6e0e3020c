"""The nonlinear length penalty C_{k,q} on vs off.

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/length_penalty.py
"""

from configs.sweeps import EOS, OUTCOME_METRICS

# Lengths vary only with a stop token; the penalty's scale is the budget, so x = length / 8 lies in [0, 1].
_VARIABLE_LENGTH = {"actors.stop_tokens": [EOS], "actors.max_new_tokens": 8,
                    "rl.reward.length_penalty.scale": 8.0, "rl.reward.length_penalty.k": 1.0,
                    "rl.reward.length_penalty.q": 0.5}


def get_sweep():
  return {
      "name": "length_penalty",
      "description": (
          "The report subtracts a concave length penalty lambda * C_{k,q}(length) from the reward so that easy "
          "tasks get solved quickly while hard ones may think longer. The built-in task has no short correct "
          "answer (EOS counts as a wrong byte, so a stopped row is never fully correct), so here the penalty can "
          "only trade outcome for length: expect shorter responses (length/mean, truncated_fraction) and a lower "
          "outcome with the penalty on, not the report's easy-vs-hard effect."),
      "cells": {
          "off": {"rl.reward.length_penalty.weight": 0.0, **_VARIABLE_LENGTH},
          "on": {"rl.reward.length_penalty.weight": 0.2, **_VARIABLE_LENGTH},
      },
      "seeds": [0, 1, 2],
      "metrics": ["length/mean@last", "truncated_fraction@last", "reward_raw/outcome@last",
                  "reward/length_penalty@last"] + list(OUTCOME_METRICS),
      "curves": ["length/mean", "reward_raw/outcome", "reward/mean"],
  }
