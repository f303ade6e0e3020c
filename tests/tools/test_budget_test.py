"""tools/test_budget.py: a passing command within its budget passes; past it, or failing, it fails."""

import contextlib
import io
import json
import sys

from absl.testing import absltest

from tools import test_budget


def _run(budget_s: float, code: str) -> tuple[int, dict, str]:
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = test_budget.main([f"--budget_s={budget_s}", "--", sys.executable, "-c", code])
  return rc, json.loads(out.getvalue().splitlines()[-1]), err.getvalue()


class TestBudgetTest(absltest.TestCase):

  def test_within_budget_passes(self):
    rc, line, err = _run(60, "pass")
    self.assertEqual(rc, 0)
    self.assertTrue(line["within_budget"])
    self.assertEqual(err, "")

  def test_over_budget_fails_saying_so(self):
    rc, line, err = _run(0.05, "import time; time.sleep(0.3)")
    self.assertEqual(rc, 1)
    self.assertFalse(line["within_budget"])
    self.assertGreaterEqual(line["seconds"], 0.3)
    self.assertIn("over its budget of 0 s", err)

  def test_a_failing_command_keeps_its_return_code(self):
    rc, line, _ = _run(60, "raise SystemExit(3)")
    self.assertEqual((rc, line["returncode"]), (3, 3))

  def test_no_command_is_refused(self):
    with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
      test_budget.main(["--budget_s=5"])


if __name__ == "__main__":
  absltest.main()
