"""tools/test_durations.py: a JUnit XML's test cases summed per test file (class-level and module-level tests; cases
of files that do not exist dropped), and the checked-in tests/file_durations.json names only test files that exist."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest

from tools import test_durations

_JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.tools.test_durations_test.DurationsTest" name="a" time="1.25"/>
  <testcase classname="tests.tools.test_durations_test.DurationsTest" name="b" time="2.5"/>
  <testcase classname="tests.conftest" name="module_level" time="0.5"/>
  <testcase classname="tests.no_such_test.SomeTest" name="c" time="9"/>
</testsuite></testsuites>
"""


class DurationsTest(absltest.TestCase):

  def test_cases_are_summed_per_file(self):
    tmp = tempfile.mkdtemp(prefix="c2jax-durations-")
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    junit = os.path.join(tmp, "suite.xml")
    with open(junit, "w", encoding="utf-8") as f:
      f.write(_JUNIT)
    self.assertEqual(test_durations.file_seconds(junit),
                     {"tests/conftest.py": 0.5, "tests/tools/test_durations_test.py": 3.8})

  def test_the_checked_in_figures_name_existing_test_files(self):
    with open(test_durations.OUT, encoding="utf-8") as f:
      figures = json.load(f)
    self.assertNotEmpty(figures)
    for path, seconds in figures.items():
      self.assertTrue((test_durations.ROOT / path).is_file(), f"{path}: rerun tools/test_durations.py")
      self.assertGreaterEqual(seconds, 0.0)


if __name__ == "__main__":
  absltest.main()
