"""Asynchronous RL with in-flight weight updates vs weights swapped between sampler calls vs synchronous RL.

  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/async_vs_sync.py
"""

from configs.sweeps import OUTCOME_METRICS


def get_sweep():
  return {
      "name": "async_vs_sync",
      "description": (
          "The report runs actors and trainer asynchronously and swaps new weights into running generations "
          "(PipelineRL), trading a little staleness for throughput. At tiny scale throughput is the measurable "
          "part (samples/s, tokens/s, trainer wait); the learning metrics should agree within seed noise with "
          "staleness ~1 version. Runs one at a time: parallel runs would share the cores and blur the timings "
          "(tools/bench_rl.py measures the throughput ratio with interleaved repeats)."),
      "cells": {
          "async_in_flight": {"schedule": "async", "actors.weight_updates": "in_flight"},
          "async_between_calls": {"schedule": "async", "actors.weight_updates": "between_calls"},
          "sync": {"schedule": "sync"},
      },
      "seeds": [0, 1, 2],
      "metrics": ["samples_per_s", "tokens_per_s", "wait_fraction", "staleness_mean"] + list(OUTCOME_METRICS),
      "curves": ["reward/mean", "staleness/mean"],
      "max_parallel": 1,
  }
