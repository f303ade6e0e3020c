"""Writes tests/file_durations.json, the seconds each test file took in a suite run, from that run's JUnit XML:
tests/conftest.py sorts the files longest first by them, which decides the order among files that hold as many tests
(xdist hands out the files with the most tests first: docs/design/tests.md).

  .venv/bin/python -m pytest -n 3 --dist loadfile -m "not gpu_compile" --junitxml=/tmp/suite.xml tests
  .venv/bin/python tools/test_durations.py --junit=/tmp/suite.xml      # rewrites tests/file_durations.json

Only the order depends on these figures: a stale or missing entry changes no result (a file without one is
ordered by its markers). The last line is JSON: {"files", "seconds"}.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "file_durations.json"


def file_seconds(junit_xml: str) -> dict[str, float]:
  """{tests/<...>_test.py: seconds} summed over each file's test cases (setup, call and teardown)."""
  seconds: dict[str, float] = collections.defaultdict(float)
  for case in ET.parse(junit_xml).getroot().iter("testcase"):
    name = case.get("classname", "")
    for module in (name.rsplit(".", 1)[0], name):  # tests.a.b_test.SomeTest, or a module-level test's tests.a.b_test
      path = module.replace(".", "/") + ".py"
      if (ROOT / path).is_file():
        seconds[path] += float(case.get("time") or 0.0)
        break
  return {path: round(s, 1) for path, s in sorted(seconds.items())}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--junit", required=True, help="the suite run's JUnit XML (pytest --junitxml)")
  parser.add_argument("--out", default=str(OUT), help="where to write the JSON")
  args = parser.parse_args(argv)
  if not pathlib.Path(args.junit).is_file():
    parser.error(f"--junit={args.junit} is not a file; run the suite with --junitxml=<file> first.")
  seconds = file_seconds(args.junit)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(seconds, f, indent=0, sort_keys=True)
    f.write("\n")
  print(json.dumps({"files": len(seconds), "seconds": round(sum(seconds.values()), 1)}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
