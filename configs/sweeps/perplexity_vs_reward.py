"""Does code perplexity predict downstream RL reward (report section 3)? RL from several points of one pretraining.

  python tools/perplexity_vs_reward.py                        # pretrains, runs these cells, fits and plots
  python tools/sweep.py --sweep=configs/sweeps/perplexity_vs_reward.py   # the cells alone, once pretrained

One pretraining of the main job's own model on code (configs/pretrain_tiny.py:rl_tiny_single_turn, the tokenizer
and architecture of configs/rl_tiny.py:single_turn, whose run takes minutes where the agentic job's takes a quarter
of an hour) writes a model at each of `POINTS` (`checkpoint.model_at`); each cell is the main
job (SFT -> RL -> held-out evaluation) with its SFT started from one of them (`sft.base_checkpoint`). Step 0 is the
random init, so the first cell is the single-turn job without a pretrained base.
tools/perplexity_vs_reward.py reads each point's held-out code perplexity from the pretraining's eval.jsonl and fits
reward = a + b ln(perplexity) over the cells.
"""

from configs.sweeps import OUTCOME_METRICS

PRETRAIN_CONFIG = "configs/pretrain_tiny.py:rl_tiny_single_turn"
POINTS = (0, 40, 100, 400)  # pretraining steps RL starts from, about log-spaced (400: the config's whole run)
PRETRAIN_DIR = "runs/sweeps/perplexity_vs_reward/pretrain"  # tools/perplexity_vs_reward.py's default


def model_dir(pretrain_dir: str, step: int) -> str:
  """The pretraining's model at `step` (`c2jax.services.pretrain_loop`'s models/step_<N>)."""
  return f"{pretrain_dir}/models/step_{step}"


def get_sweep(pretrain_dir: str = PRETRAIN_DIR, points: tuple[int, ...] = POINTS):
  return {
      "name": "perplexity_vs_reward",
      "description": (
          "Report section 3: code perplexity of the base model predicts the RL reward it reaches, log-linearly. "
          f"Each cell starts the main job's SFT from the pretraining's model at one step ({pretrain_dir}); the "
          "pretraining and the RL share one tokenizer and one architecture. At tiny size the SFT (300 steps on "
          "the suite's demonstrations) may wash out what pretraining on the standard library taught."),
      "cells": {f"step_{s}": {"sft.base_checkpoint": model_dir(pretrain_dir, s)} for s in points},
      "config": "configs/rl_tiny.py:single_turn",
      "seeds": [0, 1],
      "metrics": list(OUTCOME_METRICS) + ["reward_heldout_before", "reward_heldout_after"],
      "curves": ["reward/mean", "pass@1"],
  }
