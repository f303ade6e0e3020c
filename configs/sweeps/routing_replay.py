"""Routing replay on (the actor's expert choices forced in the update) vs off (the trainer routes afresh).

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/routing_replay.py
"""

from configs.sweeps import OUTCOME_METRICS


def get_sweep():
  return {
      "name": "routing_replay",
      "description": (
          "The report replays the inference engine's MoE routing in the training forward pass so that the trainer "
          "scores the tokens with the experts that produced them; without it, routing flips between engines make "
          "trainer and actor probabilities disagree. Here both run float32 on one CPU, so flips come only from "
          "rows sampled by older weights (staleness ~1) and the cached sampler's rounding: expect kl_behaviour_k3 "
          "and the filtered fraction to rise a little without replay, and no reliable difference in reward."),
      "cells": {
          "replay": {"rl.routing_replay": "replay"},
          "off": {"rl.routing_replay": "off"},
      },
      "seeds": [0, 1, 2],
      "metrics": list(OUTCOME_METRICS) + ["kl_behaviour_k3@mean", "filtered_fraction", "clip_fraction@mean"],
      "curves": ["reward/mean", "kl_behaviour_k3"],
  }
