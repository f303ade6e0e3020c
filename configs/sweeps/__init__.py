"""Ablation sweeps of the RL recipe's design choices (report section 4), run by tools/sweep.py:

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/dr_grpo_vs_grpo.py [--seeds=3]

Each file defines `get_sweep()` -> {"name", "description", "cells": {cell: {dotted override key: value}}, "seeds",
"metrics", and optionally "curves" (metrics.jsonl keys plotted over steps, or `heldout/<key>` over versions),
"max_parallel" and "config"}; override keys are fields of the file's base config (configs/rl_char_class.py's when it
names none; tests/tools/sweep_test.py checks that every file's keys exist). Metrics are result.json keys or
`<metrics.jsonl key>@<first|last|mean|max|delta>` (see tools/sweep.py).

  dr_grpo_vs_grpo      std normalization x length normalization of the advantage / loss
  grpo_length_growth   length of incorrect responses under GRPO vs Dr. GRPO (the Dr. GRPO paper's finding)
  kl_estimator         k1 vs k3 vs no KL
  routing_replay       actor expert choices replayed in the update vs routed afresh
  plausibility_filter  trainer/actor probability filter on vs off
  overlong_masking     truncated rollouts kept vs masked
  async_vs_sync        asynchronous with in-flight weight updates vs between sampler calls vs synchronous
  length_penalty       the nonlinear length penalty on vs off
  self_summary         self-summaries trained vs masked vs truncation (configs/rl_long_horizon.py)
  perplexity_vs_reward RL from several points of one pretraining (tools/perplexity_vs_reward.py runs it)
  rl_from_perfect_teacher  the agentic main job's RL from a perfect teacher's SFT, held-out curves (configs/rl_tiny.py)
"""

# Held-out evaluation before and after RL, and the training reward: every sweep reports these.
OUTCOME_METRICS = ("pass_at_1_before", "pass_at_1_after", "best_of_8_before", "best_of_8_after", "reward_first",
                   "reward_last")

# Variable response lengths on the built-in char_class task: a row ends at EOS (byte tokenizer id 258) or at
# actors.max_new_tokens. (configs/rl_char_class.py samples fixed-length rows: no stop tokens.)
EOS = 258
