"""Evaluation of a policy on the hand-written realistic suite (report section 5); every field and its default:
c2jax/eval/suite_eval.py.

  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=reference   # must be 100%
  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=empty       # must be 0%
  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=checkpoint \
      --config.checkpoint=runs/demo/rl/model --config.samples=8 --config.ks='(1, 8)'
  # the evaluator service: evaluate every new version in a weight store as it appears
  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=checkpoint \
      --config.watch_weights=runs/demo/rl/weights
"""

import ml_collections

from c2jax.eval import suite_eval


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = suite_eval.defaults()
  c.suite = "realistic"  # c2jax.envs.tasks.coding_tasks.CODING_SUITES
  c.split = "heldout"
  c.policy = "reference"  # reference | empty | delete_tests (scripted) | checkpoint (a model)
  c.workers = 2  # episodes in flight (sandboxes)
  c.env.update(max_turns=8, max_tokens=8192, max_observation_bytes=8192)
  c.env.limits.update(wall_s=20.0, cpu_s=20, memory_mb=1024, max_procs=64)
  # The model policy (a c2jax checkpoint, or the newest versions of a weight store) with this architecture.
  c.model = "tiny"
  c.model_overrides = ml_collections.ConfigDict({"vocab_size": 259, "n_layers": 2, "num_mtp_layers": 0,
                                                 "scan_unroll": 1})
  c.sampling.update(max_new_tokens=256, temperature=1.0, slots=4, context=4096, max_episode_tokens=2048)
  return c
