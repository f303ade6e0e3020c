"""Evaluates a policy on a coding-task suite in sandboxes: pass@k, best-of-K, over-editing, per-category tables
(report section 5; `c2jax.eval.suite_eval`). Writes report.json, report.md and report.png to --workdir and
prints the summary as JSON on the last line; the resolved run config goes to --workdir too (config.json), and
`--config_help` lists every field of the run config.

  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=reference
  python experiments/eval_main.py --config=configs/eval_realistic.py --config.policy=checkpoint \
      --config.watch_weights=runs/rl/weights      # evaluate each new weight version as it appears

A config key that does not exist, a bad value, or a path that does not exist is refused in one sentence (exit code
2). Ctrl-C stops with one line saying what was kept (exit code 130): of a single evaluation only its
config.json (its report is written at its end), every version already in versions.jsonl when watching.
"""

import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # run from a checkout

from absl import app
from absl import flags

from c2jax.eval import suite_eval
from c2jax.services import cli

_CONFIG = cli.define_config_file(os.path.join(_ROOT, "configs", "eval_realistic.py"), "Eval config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/eval", "Where the reports go.")


def main(argv):
  del argv
  cfg = cli.typed(suite_eval.parse, _CONFIG.value)
  watching = cfg.policy == suite_eval.CHECKPOINT and cfg.watch_weights
  try:
    with cli.refusals():  # a checkpoint or tokenizer path that does not exist: one sentence
      suite_eval.check_inputs(cfg)  # before the workdir is written
      config_path = cli.write_config(cfg, _WORKDIR.value)
      print(f"resolved run config: {config_path}", file=sys.stderr, flush=True)
      if watching:
        suite_eval.watch(cfg, _WORKDIR.value)  # until interrupted
        return
      summary = suite_eval.run(cfg, _WORKDIR.value)
  except KeyboardInterrupt:
    kept = (f"every version evaluated so far is in {os.path.join(_WORKDIR.value, 'versions.jsonl')}" if watching else
            f"no report was written to {_WORKDIR.value}, only its config.json (the report is written when the "
            "evaluation ends)")
    print(f"{os.path.basename(sys.argv[0])}: interrupted; {kept}.", file=sys.stderr, flush=True)
    sys.exit(130)
  print(cli.outputs(_WORKDIR.value, (("report", "report.md", "per category and task; report.json has every episode"),
                                     ("plot", "report.png", ""), ("config", "config.json", "the resolved run config"))),
        flush=True)
  print(json.dumps(summary))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.flags_parser)
