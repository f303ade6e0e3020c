"""Does code perplexity predict downstream RL reward (report section 3)? RL from several points of one pretraining.

  python tools/perplexity_vs_reward.py                        # pretrains, runs these cells, fits and plots
  python tools/perplexity_vs_reward.py --job=agentic          # the same for the multi-turn agent (`JOBS`)
  python tools/sweep.py --sweep=configs/sweeps/perplexity_vs_reward.py   # the cells alone, once pretrained

One pretraining of the main job's own model on code (configs/pretrain_tiny.py:rl_tiny_single_turn, the tokenizer
and architecture of configs/rl_tiny.py:single_turn, whose run takes minutes where the agentic job's takes a quarter
of an hour) writes a model at each of `POINTS` (`checkpoint.model_at`); each cell is the main
job (SFT -> RL -> held-out evaluation) with its SFT started from one of them (`sft.base_checkpoint`). Step 0 is the
random init, so the first cell is the single-turn job without a pretrained base.
tools/perplexity_vs_reward.py reads each point's held-out code perplexity from the pretraining's eval.jsonl and fits
reward = a + b ln(perplexity) over the cells.
"""

import dataclasses

from configs.sweeps import OUTCOME_METRICS


@dataclasses.dataclass(frozen=True)
class Job:
  """A main job the sweep can run: its pretraining config (the job's model and tokenizer) and its RL config."""

  pretrain_config: str
  rl_config: str


# The single-turn job (the default: its RL runs take minutes) and the multi-turn agent, `make demo`'s main job (each
# of its runs records teacher traces, trains its SFT and compiles the agent engine's programs first: ~7 minutes).
JOBS = {
    "single_turn": Job("configs/pretrain_tiny.py:rl_tiny_single_turn", "configs/rl_tiny.py:single_turn"),
    "agentic": Job("configs/pretrain_tiny.py:rl_tiny", "configs/rl_tiny.py"),
}
POINTS = (0, 40, 100, 400)  # pretraining steps RL starts from, about log-spaced (400: the config's whole run)
PRETRAIN_DIR = "runs/sweeps/perplexity_vs_reward/pretrain"  # tools/perplexity_vs_reward.py's default


def model_dir(pretrain_dir: str, step: int) -> str:
  """The pretraining's model at `step` (`c2jax.services.pretrain_loop`'s models/step_<N>)."""
  return f"{pretrain_dir}/models/step_{step}"


def get_sweep(pretrain_dir: str = PRETRAIN_DIR, points: tuple[int, ...] = POINTS, job: str = "single_turn"):
  if job not in JOBS:
    raise ValueError(f"job={job!r} is not one of {sorted(JOBS)}.")
  return {
      "name": "perplexity_vs_reward" + ("" if job == "single_turn" else f"_{job}"),
      "description": (
          "Report section 3: code perplexity of the base model predicts the RL reward it reaches, log-linearly. "
          f"Each cell starts the main job's SFT from the pretraining's model at one step ({pretrain_dir}); the "
          f"pretraining ({JOBS[job].pretrain_config}) and the RL ({JOBS[job].rl_config}) share one tokenizer and "
          "one architecture. At tiny size the SFT on the suite's demonstrations may wash out what pretraining on the "
          "standard library taught."),
      "cells": {f"step_{s}": {"sft.base_checkpoint": model_dir(pretrain_dir, s)} for s in points},
      "config": JOBS[job].rl_config,
      "seeds": [0, 1],
      "metrics": list(OUTCOME_METRICS) + ["reward_heldout_before", "reward_heldout_after"],
      "curves": ["reward/mean", "pass@1"],
  }
