"""RL from a perfect teacher's SFT on the agentic main job: does RL raise held-out pass@1 toward best-of-K when the
policy was not handicapped on purpose? Held-out curves from the evaluator process during RL.

  python tools/sweep.py --sweep=configs/sweeps/rl_from_perfect_teacher.py \\
      --set=sft.base_checkpoint=runs/demo/pretrain/models/bulk     # `make demo`'s pretrained base (optional)
"""

from configs.sweeps import OUTCOME_METRICS

# Every cell: the SFT on spec_fixer's traces alone (no careless copies), 60 RL steps (the demo's 30, twice), and the
# held-out evaluation every 10 versions during RL by the evaluator process (all 35 held-out tasks x 8 samples).
_PERFECT = {"sft.teacher.flawed": 0, "trainer.steps": 60, "eval.process": True, "eval.every_versions": 10}


def get_sweep():
  return {
      "name": "rl_from_perfect_teacher",
      "description": (
          "Report sections 4-5: RL improves a policy beyond its SFT. The demo's gain comes from undoing a careless "
          "teacher (docs/experiments/main_job.md, section 8); here every demonstration is spec_fixer's, so what RL "
          "adds is its own. `default` is the main job's RL (lr 1e-4); `lr_3e-4` moves the policy three times as far "
          "per step."),
      "cells": {
          "default": dict(_PERFECT),
          "lr_3e-4": {**_PERFECT, "rl.optim.learning_rate": 3e-4},
      },
      "config": "configs/rl_tiny.py",
      "seeds": [0, 1, 2],
      "metrics": list(OUTCOME_METRICS) + ["reward_heldout_before", "reward_heldout_after"],
      "curves": ["reward/mean", "heldout/pass@1", "heldout/best_of_8"],
  }
