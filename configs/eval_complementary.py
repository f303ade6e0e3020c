"""CursorBench's complementary evaluations (report section 5), one per argument; every field and its default:
c2jax/eval/suite_eval.py. The report's "evaluation" table (report.md) and "complementary" (report.json) hold the
score.

  # code quality: linter findings the diff introduces (ruff in the sandbox), on the realistic suite
  python experiments/eval_main.py --config=configs/eval_complementary.py:code_quality --config.policy=reference
  python experiments/eval_main.py --config=configs/eval_complementary.py:code_quality --config.policy=sloppy
  # instruction following: constraints the prompts state (files not to touch, an API to keep, a style)
  python experiments/eval_main.py --config=configs/eval_complementary.py:instructions --config.policy=reference
  python experiments/eval_main.py --config=configs/eval_complementary.py:instructions --config.policy=shortcut
  # intent: under-specified prompts whose hidden tests check the reasonable reading
  python experiments/eval_main.py --config=configs/eval_complementary.py:intent --config.policy=reference
  python experiments/eval_main.py --config=configs/eval_complementary.py:intent --config.policy=shortcut
  # interruption handling: a user message between turns or cutting a turn; the final state depends on it
  python experiments/eval_main.py --config=configs/eval_complementary.py:interruptions \
      --config.policy=follows_interruptions        # or ignores_interruptions
  # a model: --config.policy=checkpoint --config.checkpoint=runs/demo/rl/model (any of the three)
"""

import ml_collections

from c2jax.eval import suite_eval

# argument -> (suite, the environment's code_quality scorer)
EVALUATIONS = {
    "code_quality": ("realistic", "ruff"),
    "instructions": ("instructions", "off"),
    "intent": ("intent", "off"),
    "interruptions": ("interruptions", "off"),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  name = arg or "code_quality"
  if name not in EVALUATIONS:
    raise ValueError(f"configs/eval_complementary.py:{name} is not one of {', '.join(EVALUATIONS)}.")
  suite, code_quality = EVALUATIONS[name]
  c = suite_eval.defaults()
  c.suite = suite  # c2jax.envs.tasks.coding_tasks.CODING_SUITES
  c.split = "heldout"
  # reference | empty | sloppy | shortcut | follows_interruptions | ignores_interruptions (scripted) | checkpoint
  c.policy = "follows_interruptions" if name == "interruptions" else "reference"
  c.workers = 2  # episodes in flight (sandboxes)
  c.env.update(max_turns=8, max_tokens=8192, max_observation_bytes=8192, code_quality=code_quality)
  c.env.limits.update(wall_s=20.0, cpu_s=20, memory_mb=1024, max_procs=64)
  c.model = "tiny"
  c.model_overrides = ml_collections.ConfigDict({"vocab_size": 259, "n_layers": 2, "num_mtp_layers": 0,
                                                 "scan_unroll": 1})
  c.sampling.update(max_new_tokens=256, temperature=1.0, slots=4, context=4096, max_episode_tokens=2048)
  return c
