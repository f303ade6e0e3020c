"""Scripted policies through the agent loop with and without self-summaries: the harness check of a long-horizon
suite (report section 4), as a table and a JSON last line.

  python tools/scripted_chains.py --tasks=10 --context=1280 --trigger=900     # tiny_long_horizon, train split

Each policy (`c2jax.envs.teachers.scripted_policies`) is forced through the engine (the model's weights do not matter:
forced turns take the script's tokens) with the episode's real sandbox and hidden tests, once with summaries
(`--trigger`, `--summary_tokens`, `--segments`) and once without (the truncation baseline). A policy sees only its
segment's observations, so what passes is what the summaries carried. Reported per (policy, summaries): pass rate
(outcome 1), mean outcome, compactions per episode, summary tokens per episode, how the episodes ended.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from absl import app, flags
import jax
import numpy as np

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, SummaryConfig
from c2jax.actors.engine import EngineConfig
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.model import presets
from c2jax.model.params import init_params

FLAGS = flags.FLAGS
flags.DEFINE_string("suite", "tiny_long_horizon", "Coding suite.")
flags.DEFINE_string("split", "train", "Split.")
flags.DEFINE_integer("tasks", 10, "First N tasks of the split.")
flags.DEFINE_list("policies", ["summarizing_reader", "reader", "never_read"], "Scripted policies.")
flags.DEFINE_integer("context", 1280, "Positions per slot.")
flags.DEFINE_integer("trigger", 900, "SummaryConfig.trigger_tokens of the runs with summaries.")
flags.DEFINE_integer("summary_tokens", 120, "SummaryConfig.max_tokens.")
flags.DEFINE_integer("segments", 6, "SummaryConfig.max_segments.")
flags.DEFINE_integer("max_turns", 16, "Tool turns per episode.")
flags.DEFINE_integer("slots", 4, "Engine slots.")
flags.DEFINE_string("tokenizer", "byte", "Tokenizer spec: byte, bpe:<vocab_size>[:repository], a tokenizer.json.")
flags.DEFINE_string("suite_options", "{}", "JSON object of suite fields, e.g. '{\"num_files\": 3}'.")


def run_policy(policy: str, summary: SummaryConfig, suite: CodingTaskSuite, n: int) -> dict:
  tok = suite.text_tokenizer()
  model = presets.model_config("tiny", {"vocab_size": tok.vocab_size, "n_layers": 2, "num_mtp_layers": 0})
  params = jax.device_get(jax.jit(init_params, static_argnums=0)(model, jax.random.key(0)))
  engine = EngineConfig(slots=FLAGS.slots, context=FLAGS.context, chunk_sizes=(16, 64, 256), max_forced=512)
  agent = AgentConfig(max_turns=FLAGS.max_turns, max_turn_tokens=512, max_episode_tokens=1 << 16, chunk_steps=32,
                      tool_workers=4, summary=summary)
  sampling = SamplingConfig(max_new_tokens=1, temperature=1.0, stop_tokens=(tok.eos_id,))
  runner = AgentRunner(model, engine, sampling, agent, tok)
  act = POLICIES.get(policy)()
  episodes = []
  for i in range(n):
    task = suite.task(FLAGS.split, i)
    coding = suite.coding_task(task)
    episodes.append(Episode(prompt=task.prompt, make_env=functools.partial(suite.agent_env, task), key=i,
                            script=lambda turn, obs, c=coding: act.act(c, obs)))
  t0 = time.perf_counter()
  trajs = runner.run(episodes, weights=lambda: (params, 0))
  outcome = np.array([t.reward_terms["outcome"] for t in trajs])
  return {"policy": policy, "summaries": summary.enabled, "episodes": n, "pass_rate": float(np.mean(outcome == 1)),
          "outcome": float(outcome.mean()), "compactions": float(np.mean([t.compactions for t in trajs])),
          "summary_tokens": float(np.mean([t.episode_summary_tokens for t in trajs])),
          "ends": dict(collections.Counter(t.end.value for t in trajs)), "seconds": time.perf_counter() - t0}


def main(argv):
  del argv
  suite = CodingTaskSuite(coding_suite=FLAGS.suite, instructions="none", max_turns=FLAGS.max_turns,
                          tokenizer=FLAGS.tokenizer, suite_options=json.loads(FLAGS.suite_options))
  with_summaries = SummaryConfig(trigger_tokens=FLAGS.trigger, max_tokens=FLAGS.summary_tokens,
                                 max_segments=FLAGS.segments)
  rows = [run_policy(p, s, suite, FLAGS.tasks) for p in FLAGS.policies for s in (with_summaries, SummaryConfig())]
  print(f"{'policy':<20} {'summaries':<9} {'pass':>5} {'outcome':>7} {'compact':>7} {'sum tok':>7}  ends")
  for r in rows:
    print(f"{r['policy']:<20} {str(r['summaries']):<9} {r['pass_rate']:5.2f} {r['outcome']:7.2f} "
          f"{r['compactions']:7.2f} {r['summary_tokens']:7.1f}  {r['ends']}")
  print(json.dumps({"suite": FLAGS.suite, "split": FLAGS.split, "tokenizer": FLAGS.tokenizer,
                    "suite_options": json.loads(FLAGS.suite_options), "context": FLAGS.context,
                    "trigger": FLAGS.trigger, "rows": rows}))


if __name__ == "__main__":
  app.run(main)
