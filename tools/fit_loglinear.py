"""Fits held-out perplexity of a pretraining run against steps / tokens / FLOPs on a log scale and plots it.

  python tools/fit_loglinear.py --workdir=runs/pretrain_tiny                  # x = training FLOPs, every phase
  python tools/fit_loglinear.py --workdir=runs/pretrain_tiny --x=step --phases=bulk --min_x=10 --out=bulk.png

Reads `<workdir>/eval.jsonl` (written by experiments/pretrain_main.py), fits ln(ppl) = a + b ln(x) (report
section 3: code perplexity falls log-linearly), writes the PNG and prints the fit as JSON on the last line.
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags

from c2jax.services import loglinear

_WORKDIR = flags.DEFINE_string("workdir", None, "A pretraining run's workdir (holds eval.jsonl).", required=True)
_X = flags.DEFINE_enum("x", "flops", list(loglinear.X_KEYS), "What to fit perplexity against.")
_PHASES = flags.DEFINE_list("phases", [], "Only these phases (default: all).")
_MIN_X = flags.DEFINE_float("min_x", 0.0, "Only evaluations with x above this.")
_OUT = flags.DEFINE_string("out", "", "PNG path (default: <workdir>/perplexity_<x>.png).")


def main(argv):
  del argv
  path = pathlib.Path(_WORKDIR.value) / "eval.jsonl"
  if not path.exists():
    raise SystemExit(f"{path} does not exist: point --workdir at a run of experiments/pretrain_main.py.")
  records = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
  result = loglinear.fit(records, x=_X.value, phases=_PHASES.value or None, min_x=_MIN_X.value)
  out = _OUT.value or str(pathlib.Path(_WORKDIR.value) / f"perplexity_{_X.value}.png")
  loglinear.plot(records, result, out, x=_X.value)
  if result is None:
    print(f"fewer than 3 evaluations with {_X.value} > {_MIN_X.value} to fit; plotted the points to {out}")
    print(json.dumps({"fit": None, "plot": out}))
    return
  print(f"ln(ppl) = {result.intercept:.4f} + {result.slope:.4f} ln({_X.value})   R^2 = {result.r2:.4f}   "
        f"({result.points} evaluations; 10x {_X.value} -> ppl x {result.ppl_ratio_per_10x:.3f}); plot: {out}")
  print(json.dumps({"fit": result.to_dict(), "plot": out}))


if __name__ == "__main__":
  app.run(main)
