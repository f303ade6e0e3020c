"""The code-quality scorer counts the findings a diff introduces, with ruff run inside the sandbox: what the
starting repository already had is not charged, the submission cannot silence it, and ruff's default excludes do
not hide a file."""

import collections

from absl.testing import absltest

from c2jax.envs.grading import quality
from c2jax.envs.grading.quality import CodeQuality
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.sandbox import sandbox as sandbox_lib

_COMPLEX = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(11)) + "    return -1\n"


def _task(files) -> CodingTask:
  return CodingTask(task_id="t", prompt="p", files=files, hidden_tests={"hidden_tests/test_t.py": ""})


class IntroducedTest(absltest.TestCase):

  def test_after_minus_before_per_path_and_rule(self):
    report = [{"filename": "/work/before/a.py", "code": "F401"},
              {"filename": "/work/after/a.py", "code": "F401"}, {"filename": "/work/after/a.py", "code": "F401"},
              {"filename": "/work/after/a.py", "code": "E711"},
              {"filename": "/work/after/b.py", "code": None},  # a syntax error
              {"filename": "/work/after/c.py", "code": "F401"},  # not a changed path: ignored
              "not an entry"]
    counts = quality.count_findings(report, ["a.py", "b.py"])
    self.assertEqual(quality.introduced(counts), collections.Counter({"F401": 1, "E711": 1, "syntax": 1}))

  def test_off_scores_nothing(self):
    self.assertEqual(quality.quality_terms(_task({}), {"a.py": "import os\n"}, CodeQuality.OFF), {})


class QualityTermsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)

  def test_counts_only_what_the_diff_introduced(self):
    task = _task({"old.py": "import os\n", "keep.py": "import sys\n"})
    files = {"old.py": "import os\nx = 1\n",  # the unused import was there before: not charged
             "keep.py": "import sys\n",  # unchanged: not linted
             "new.py": "import json  # noqa\n" + _COMPLEX,  # the suppression comment does not count
             "build/x.py": "y = None\nif y == None:\n    pass\n"}  # ruff excludes build/ by default
    terms = quality.quality_terms(task, files, CodeQuality.RUFF)
    self.assertEqual(terms, {"quality_findings": 3.0, "complexity_findings": 1.0, "quality_error": 0.0})

  def test_a_bad_tool_is_refused(self):
    with self.assertRaisesRegex(ValueError, "plain file name"):
      sandbox_lib.Sandbox({}, tools={"../ruff": quality.ruff_path()})
    with self.assertRaisesRegex(ValueError, "not an executable"):
      sandbox_lib.Sandbox({}, tools={"ruff": "/nonexistent/ruff"})


if __name__ == "__main__":
  absltest.main()
