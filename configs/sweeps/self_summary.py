"""Self-summaries trained (the report) vs masked out of the loss vs no summaries at all (the truncation baseline),
on the long-horizon suite.

  python tools/sweep.py --sweep=configs/sweeps/self_summary.py        # its base: configs/rl_long_horizon.py
"""

from configs.sweeps import OUTCOME_METRICS


def get_sweep():
  return {
      "name": "self_summary",
      "description": (
          "Report section 4 (after Composer 1.5): chaining generations by self-summaries, with the episode's reward "
          "on every token of the chain, keeps context on long-horizon tasks. `trained` is that; `masked` samples the "
          "same summaries but leaves their tokens out of the loss (the CompactionRL paper reports its summaries "
          "degenerate); `truncation` writes none and cuts an episode when its window is full. On "
          "tiny_long_horizon no episode fits one window, so truncation can only pass by guessing."),
      "cells": {
          "trained": {"actors.summary_tokens": "trained"},  # with the base config's summaries
          "masked": {"actors.summary_tokens": "masked"},
          "truncation": {"actors.summary.trigger_tokens": 0},
      },
      "config": "configs/rl_long_horizon.py",
      "seeds": [0, 1],
      "metrics": list(OUTCOME_METRICS[:2]) + [
          "best_of_k_before", "best_of_k_after", "reward_first", "reward_last", "compactions_per_episode",
          "needed_summary_fraction", "summary_tokens_per_episode"] + [
              f"outcome_with_{k}_compactions" for k in range(4)],
      "curves": ["reward/mean", "summary/compactions_per_episode", "summary/tokens_per_episode"],
  }
