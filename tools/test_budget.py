"""Runs a command (the test suite) under a wall-time budget: it fails when the command fails, and also when it
succeeds but took longer than the budget, so that a suite which grows past its budget fails loudly instead of
creeping (`.ci/run` sets the budget through `make test`'s TEST_BUDGET_S).

  .venv/bin/python tools/test_budget.py --budget_s=1200 -- .venv/bin/python -m pytest -n 2 tests

The command runs to the end whatever the time (a killed suite would hide which tests failed); the budget is
checked after it. The last line is JSON: {"command", "returncode", "seconds", "budget_s", "within_budget"}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--budget_s", type=float, required=True, help="seconds the command may take")
  parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command:
    parser.error("give the command to run after --, e.g. -- .venv/bin/python -m pytest tests")
  if args.budget_s <= 0:
    parser.error(f"--budget_s must be positive; got {args.budget_s}.")
  start = time.monotonic()
  returncode = subprocess.call(command)
  seconds = time.monotonic() - start
  within = seconds <= args.budget_s
  if returncode == 0 and not within:
    print(f"test_budget: the command passed but took {seconds:.0f} s, over its budget of {args.budget_s:.0f} s: "
          "make the new tests cheaper (reuse tests/tiny.py's models), mark them slow / mesh / e2e (pytest.ini), or "
          "raise the budget in .ci/run with the reason.", file=sys.stderr)
  print(json.dumps({"command": " ".join(command), "returncode": returncode, "seconds": round(seconds, 1),
                    "budget_s": args.budget_s, "within_budget": within}))
  return returncode if returncode else (0 if within else 1)


if __name__ == "__main__":
  sys.exit(main())
