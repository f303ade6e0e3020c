"""The seconds-scale variant of configs/rl_tiny.py: asynchronous RL of the tiny MoE from a random init on the
built-in toy task char_class (report sections 4 and 6), for tests, quick ablation sweeps and the quickstart notebook.

  python experiments/rl_main.py --config=configs/rl_char_class.py --workdir=runs/rl_char_class
  python experiments/rl_main.py --config=configs/rl_char_class.py --workdir=runs/rl_sync --config.schedule=sync
  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/dr_grpo_vs_grpo.py

A task names a character class after a random prefix (`qzk|digits>`); 8 sampled bytes earn the fraction in the
class (c2jax/envs/token_tasks/char_class.py). It is configs/rl_tiny.py (the coding main job) with the overrides below,
so a sweep file over the RL, actor, trainer and eval fields applies to both; task fields differ by suite.
"""

import ml_collections

from c2jax.services import rl_run_config
from configs import rl_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = rl_tiny.get_config("single_turn")
  # The tiny model at d=64 (2 layers: 1 dense + 1 MoE), from a random init: no SFT.
  del c.model_overrides["d_model"]
  c.model_overrides.vocab_size = 259  # char_class speaks bytes (256 + 3 specials), not the main job's BPE
  c.init_checkpoint = ""
  c.sft.enabled = False
  c.rl.optim.learning_rate = 1e-2  # a tiny model from scratch on a toy task; the report's scale uses ~1e-6
  c.rl.reward.length_penalty.weight = 0.0  # every row has the same length here
  del c.rl.reward.weights["hack_attempts"]  # a verifier in the actor, not a grader a submission could game
  # answer_tokens > 0: only the first n bytes are graded, free text follows (c2jax/envs/token_tasks/char_class.py).
  c.task = rl_run_config.task_defaults("char_class", seed=0, answer_tokens=0)
  c.actors.update(prompt_len=16, max_new_tokens=8, stop_tokens=(),  # fixed-length rows of 8 bytes
                  chunk_steps=2, pending_lease_s=120.0,
                  # One sampler call per actor holds a whole trainer batch (4 groups x 8 rows): a call's fixed cost
                  # dominates 8-token rows, and with 2 per call the actors fell behind the trainer (bench_rl).
                  groups_per_call=4)
  c.trainer.steps = 80
  c.eval.update(tasks=16, samples=8, best_of=8, every_versions=10)
  return c
