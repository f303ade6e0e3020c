"""The Dr. GRPO paper's finding at tiny scale: under GRPO's length normalization the length of incorrect responses
grows; under Dr. GRPO it does not.

  python tools/sweep.py --config=configs/rl_tiny.py --sweep=configs/sweeps/grpo_length_growth.py
"""

from configs.sweeps import EOS, OUTCOME_METRICS

# Rows end at EOS or after 32 tokens: lengths can vary (configs/rl_tiny.py's rows are all 8 tokens long).
_VARIABLE_LENGTH = {"actors.stop_tokens": [EOS], "actors.max_new_tokens": 32}


def get_sweep():
  return {
      "name": "grpo_length_growth",
      "description": (
          "Dr. GRPO (Liu et al. 2025) shows that GRPO's per-sequence token mean gives each token of a long wrong "
          "answer a smaller penalty than a short one's, so the length of incorrect responses grows during RL, "
          "while Dr. GRPO's constant normalizer does not. The built-in char_class task can vary lengths only "
          "through EOS (stop_tokens, here with a 32-token budget), and it scores EOS as a wrong byte, so stopping "
          "early is always incorrect and learning lengthens responses under both estimators; a random policy "
          "emits EOS with probability ~1/259 per token (~12% of rows stop within 32 tokens), so incorrect lengths "
          "start near the budget and the effect has little room: compare length/incorrect@delta between cells "
          "against the seed spread, and expect at most a faster rise under GRPO, not the paper's growth."),
      "cells": {
          "grpo": {"rl.advantage": "grpo", "rl.aggregation": "seq_mean_token_mean", **_VARIABLE_LENGTH},
          "dr_grpo": {"rl.advantage": "dr_grpo", "rl.aggregation": "token_sum_constant", **_VARIABLE_LENGTH},
      },
      "seeds": [0, 1, 2],
      "metrics": ["length/incorrect@first", "length/incorrect@last", "length/incorrect@delta", "length/mean@delta",
                  "truncated_fraction@last"] + list(OUTCOME_METRICS),
      "curves": ["length/incorrect", "length/mean", "reward/mean"],
  }
