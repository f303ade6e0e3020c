"""The Dr. GRPO paper's finding at tiny scale: under GRPO's length normalization the length of incorrect responses
grows; under Dr. GRPO it does not.

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/grpo_length_growth.py

The task is char_class with a two-byte answer and free text after it (`task.answer_tokens=2`): the reward cannot
depend on the length, so any drift of length is the estimator's doing. A row ends at any of 32 stop bytes (0x80-
0x9f, in no character class), which a random policy draws with probability 32/259 per token: rows start ~8 tokens
long, far below the 64-token budget, so lengths have room to move both ways.
"""

from configs.sweeps import OUTCOME_METRICS

STOP_BYTES = list(range(0x80, 0xA0))
_LENGTH_FREE = {"task.answer_tokens": 2, "actors.stop_tokens": STOP_BYTES, "actors.max_new_tokens": 64}


def get_sweep():
  return {
      "name": "grpo_length_growth",
      "description": (
          "Dr. GRPO (Liu et al. 2025): GRPO divides each response's token losses by its own length, so a token of a "
          "long wrong answer is penalized less than a token of a short one, and the stop decisions of short wrong "
          "answers are pushed down hardest: wrong answers grow. Dr. GRPO's constant normalizer (and no std "
          "scaling) gives every token the same weight, an unbiased policy gradient of a reward that does not "
          "depend on length: no drift. Here the reward is the class of the first two bytes only; compare "
          "length/incorrect@delta between the cells against the seed spread."),
      "cells": {
          "grpo": {"rl.advantage": "grpo", "rl.aggregation": "seq_mean_token_mean", **_LENGTH_FREE},
          "dr_grpo": {"rl.advantage": "dr_grpo", "rl.aggregation": "token_sum_constant", **_LENGTH_FREE},
      },
      "seeds": [0, 1, 2],
      "metrics": ["length/incorrect@first", "length/incorrect@last", "length/incorrect@delta",
                  "length/correct@delta", "length/mean@delta", "truncated_fraction@last"] + list(OUTCOME_METRICS),
      "curves": ["length/incorrect", "length/correct", "reward/mean"],
  }
