"""The end of an RL run: the before/after table and the training plot, from a run's own logs."""

import json
import os
import pathlib
import shutil
import tempfile

from absl.testing import absltest

from c2jax.services import rl_report as report

RESULT = {"steps": 40, "k": 8, "pass_at_1_before": 0.05, "pass_at_1_after": 0.2, "best_of_k_before": 0.4,
          "best_of_k_after": 0.55, "reward_heldout_before": 0.2, "reward_heldout_after": 0.35,
          "tokens_trained": 123456, "samples_per_s": 5.25, "tokens_per_s": 812.3, "staleness_mean": 0.9,
          "filtered_fraction": 0.0123, "wait_fraction": 0.04, "reward_first": 0.1, "reward_last": 0.3}


class SummaryTableTest(absltest.TestCase):

  def test_rows_hold_before_after_and_change(self):
    table = report.summary_table(RESULT)
    lines = table.splitlines()
    pass_row = next(line for line in lines if line.startswith("pass@1"))
    self.assertEqual(pass_row.split()[1:], ["0.050", "0.200", "+0.150"])
    best_row = next(line for line in lines if line.startswith("best-of-8"))
    self.assertEqual(best_row.split()[1:], ["0.400", "0.550", "+0.150"])
    self.assertIn("123,456", table)
    self.assertIn("0.0123", table)
    self.assertIn("0.90", table)

  def test_behaviour_rows_when_the_run_has_them(self):
    self.assertNotIn("read before edit", report.summary_table(RESULT))  # single-turn runs have none
    table = report.summary_table({**RESULT, "behaviour_turns_per_episode_before": 3.5,
                                  "behaviour_turns_per_episode_after": 4.25,
                                  "behaviour_read_before_edit_before": 0.25, "behaviour_read_before_edit_after": 0.75,
                                  "behaviour_recovery_after_failing_tests_before": None,
                                  "behaviour_recovery_after_failing_tests_after": 0.5})
    row = lambda name: next(line for line in table.splitlines() if line.startswith(name)).split()[-3:]
    self.assertEqual(row("turns / episode"), ["3.50", "4.25", "+0.75"])
    self.assertEqual(row("read before edit"), ["0.250", "0.750", "+0.500"])
    self.assertEqual(row("recovery after failing tests"), ["-", "0.500", "-"])
    self.assertNotIn("tests before finish", table)

  def test_missing_figures_print_a_dash(self):
    table = report.summary_table({"pass_at_1_before": 0.0, "pass_at_1_after": 0.25})
    self.assertIn("+0.250", table)
    best_row = next(line for line in table.splitlines() if line.startswith("best-of-8"))
    self.assertEqual(best_row.split()[1:], ["-", "-", "-"])


class PlotTrainingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.work = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, self.work, ignore_errors=True)

  def test_no_metrics_no_plot(self):
    self.assertIsNone(report.plot_training(self.work))

  def test_writes_a_png_from_the_run_logs(self):
    with open(self.work / "metrics.jsonl", "w") as f:
      for step in range(1, 21):
        f.write(json.dumps({"step": step, "version": step, "reward/mean": step / 40}) + "\n")
      f.write('{"step": 21, "vers')  # a line cut by a kill is skipped
    evals = [{"version": v, "pass@1": v / 40, "best_of_8": 0.5, "reward/mean": 0.3} for v in (10, 20)]
    (self.work / "eval_during.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (self.work / "eval.jsonl").write_text(
        json.dumps({"when": "before", "version": 0, "pass@1": 0.0, "best_of_8": 0.4, "reward/mean": 0.2}) + "\n")
    path = report.plot_training(self.work, k=8)
    self.assertEqual(path, str(self.work / "training.png"))
    with open(path, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertGreater(os.path.getsize(path), 10_000)
    self.assertEqual(_png_height(path), 6 * 110)  # two panels: no evaluation measured behaviour

  def test_behaviour_panel_when_evaluations_measured_it(self):
    (self.work / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "version": s, "reward/mean": 0.5}) + "\n" for s in range(1, 11)))
    nan = float("nan")
    evals = [{"when": w, "version": v, "pass@1": 0.3, "best_of_8": 0.8, "reward/mean": 0.4,
              "behaviour/tests_before_finish": t, "behaviour/recovery_after_failing_tests": r}
             for w, v, t, r in (("before", 0, 0.4, nan), ("after", 10, 0.9, 0.5))]
    (self.work / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    self.assertEqual(_png_height(report.plot_training(self.work)), int(8.5 * 110))


def _png_height(path) -> int:
  with open(path, "rb") as f:
    header = f.read(24)
  return int.from_bytes(header[20:24], "big")  # IHDR: width at 16, height at 20


if __name__ == "__main__":
  absltest.main()
