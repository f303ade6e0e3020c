"""Tokens/s of the data pipeline alone against the training step it feeds, per pretraining phase.

  python tools/bench_pretrain.py                                     # every phase of configs/pretrain_tiny.py
  python tools/bench_pretrain.py --phases=bulk --repeats=5 --steps=10

For each phase: the phase's pipeline (`c2jax.data.pipeline.lm_dataset`, its sources, T and B) and its jitted
train step on synthetic batches of the same shape, measured in alternation (`--repeats` rounds, after one
warm-up round that also compiles), each round timing `--steps` batches. A pipeline that keeps up must deliver
many times what the step consumes, since in training it also competes with the step for the same cores: the
target is >= 10x. Tokens counted are real (non-padding) tokens for the pipeline and B x T for the step.
The last line is JSON: per phase medians, and `min_ratio` (pipeline / training tokens/s) over the phases.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import jax
import numpy as np


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--phases", default="", help="comma-separated phase names (default: all of the config's).")
  p.add_argument("--repeats", type=int, default=3, help="measured rounds per phase (median reported).")
  p.add_argument("--steps", type=int, default=5, help="batches per round, for each of pipeline and step.")
  args = p.parse_args()

  from c2jax.data import pipeline
  from c2jax.data.tokenizer import make_tokenizer
  from c2jax.services import pretrain_loop
  from c2jax.services import pretrain_run_config
  from configs import pretrain_tiny

  c = pretrain_tiny.get_config()
  if args.phases:
    c.phase_order = args.phases
  cfg = pretrain_run_config.parse(c)
  tok = make_tokenizer(cfg.tokenizer)
  results = {}
  for phase in cfg.phases_resolved():
    built = pretrain_loop._build(phase, None)  # the loop's own jitted step
    state = built.init(jax.random.key(0))
    it = iter(pipeline.lm_dataset(phase.sources, tok, seq_len=phase.seq_len, batch_size=phase.batch_size,
                                  seed=0))
    sample = next(it)
    synthetic = built.put({k: np.asarray(v) for k, v in sample.items()})

    def run_pipeline():
      n = 0
      for _ in range(args.steps):
        n += int(np.sum(next(it)["segment_ids"] > 0))
      return n

    def run_steps():
      nonlocal state
      for _ in range(args.steps):
        state, metrics = built.step(state, synthetic)
      jax.block_until_ready(metrics)
      return args.steps * phase.batch_size * phase.seq_len

    pipe_rates, step_rates = [], []
    for round_ in range(args.repeats + 1):  # round 0 warms up (compiles the step, fills read-ahead buffers)
      for fn, rates in ((run_pipeline, pipe_rates), (run_steps, step_rates)):
        t0 = time.perf_counter()
        n = fn()
        if round_ > 0:
          rates.append(n / (time.perf_counter() - t0))
    pipe, train = float(np.median(pipe_rates)), float(np.median(step_rates))
    results[phase.name] = {"seq_len": phase.seq_len, "batch_size": phase.batch_size,
                           "pipeline_tokens_per_s": pipe, "train_tokens_per_s": train, "ratio": pipe / train}
    print(f"{phase.name:>14}: T={phase.seq_len} B={phase.batch_size}  pipeline {pipe:12,.0f} tok/s   "
          f"train step {train:9,.0f} tok/s   ratio {pipe / train:7.1f}x", flush=True)
  print(json.dumps({"phases": results, "min_ratio": min(r["ratio"] for r in results.values()),
                    "repeats": args.repeats, "steps": args.steps, "backend": jax.default_backend()}))


if __name__ == "__main__":
  main()
