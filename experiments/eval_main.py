"""Evaluates a policy on a coding-task suite in sandboxes: pass@k, best-of-K, over-editing, per-category tables
(report section 5). Writes report.json, report.md and report.png to --workdir and prints the summary as JSON on
the last line.

  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=reference
  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=checkpoint \
      --config.watch_weights=runs/rl/weights      # evaluate each new weight version as it appears
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/eval_realistic.py", "Eval config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/eval", "Where the reports go.")


def _tasks(c):
  from c2jax.envs.coding_tasks import CODING_SUITES
  import c2jax.envs.suites  # noqa: F401  (registers the suites)
  tasks = CODING_SUITES.get(c.suite)().tasks(c.split)
  if not tasks:
    raise SystemExit(f"Suite {c.suite!r} has no tasks in split {c.split!r}.")
  return tasks[:c.max_tasks] if c.max_tasks else tasks


def _env_config(c):
  from c2jax.envs.env import EnvConfig
  from c2jax.envs.sandbox import SandboxLimits
  return EnvConfig(max_turns=c.env.max_turns, max_tokens=c.env.max_tokens,
                   max_observation_bytes=c.env.max_observation_bytes, limits=SandboxLimits(**dict(c.limits)))


def _model_policy_factory(c, params, model):
  from c2jax.actors.sampling import SamplingConfig
  from c2jax.data.byte_tokenizer import ByteTokenizer
  from c2jax.eval.policies import SamplerPolicy
  sampling = SamplingConfig(max_new_tokens=c.sampling.max_new_tokens, temperature=c.sampling.temperature,
                            stop_tokens=(ByteTokenizer.EOS,))
  return lambda i: SamplerPolicy(params=params, model=model, sampling=sampling, prompt_len=c.sampling.prompt_len,
                                 seed=c.seed * 1_000_003 + i)


def _report(c, tasks, make_policy, directory):
  from c2jax.eval import harness
  report = harness.evaluate(tasks, make_policy, samples=c.samples, workers=c.workers, config=_env_config(c),
                            ks=tuple(c.ks))
  summary = harness.write_report(report, directory)
  print(report.markdown())
  return summary


def main(argv):
  del argv
  c = _CONFIG.value
  workdir = _WORKDIR.value
  tasks = _tasks(c)
  if c.policy == "checkpoint":
    import jax
    if c.watch_weights:
      from c2jax.pretrain.loop import model_config_from
      from c2jax.rollouts.weight_store import WeightStore
      model, store = model_config_from(c), WeightStore(c.watch_weights)
      version, params = None, None
      while True:  # the evaluator service: until interrupted
        got = store.update(version, params)
        if got is None:
          time.sleep(c.watch_poll_s)
          continue
        version, params = got
        summary = _report(c, tasks, _model_policy_factory(c, jax.device_put(params), model),
                          os.path.join(workdir, f"v{version:06d}"))
        summary["version"] = version
        with open(os.path.join(workdir, "versions.jsonl"), "a") as f:
          f.write(json.dumps(summary) + "\n")
        print(json.dumps(summary), flush=True)
    if not c.checkpoint:
      raise SystemExit("policy=checkpoint needs --config.checkpoint=DIR or --config.watch_weights=URL.")
    from c2jax.model.checkpoint import load_checkpoint
    params, model = load_checkpoint(c.checkpoint)
    make_policy = _model_policy_factory(c, params, model)
  else:
    from c2jax.eval.policies import POLICIES
    policy_cls = POLICIES.get(c.policy)
    make_policy = lambda i: policy_cls()
  summary = _report(c, tasks, make_policy, workdir)
  summary.update(suite=c.suite, split=c.split, policy=c.policy)
  logging.info("report in %s", workdir)
  print(json.dumps(summary))


if __name__ == "__main__":
  app.run(main)
