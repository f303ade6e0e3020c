"""tools/bench_main_job.py: its commands are `make demo`'s, its summary's medians and ratios, and its refusals. The
tool's own runs are whole demos (minutes to tens of minutes), so they are benchmarks (docs/benchmarks.md), not tests;
the figures it reads (the RL result's `stage_seconds`) are checked on a real job in
tests/services/multi_turn_rl_test.py."""

import contextlib
import io
import os
import re

from absl.testing import absltest

from tools import bench_main_job

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _demo_commands() -> list[str]:
  """The Makefile's `demo` recipe, one command per line, `$(PY)` dropped."""
  with open(os.path.join(_ROOT, "Makefile"), encoding="utf-8") as f:
    text = f.read().replace("\\\n", " ")
  recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M).group(1)
  return [" ".join(line.replace("$(PY)", "").split()) for line in recipe.splitlines()]


class BenchMainJobTest(absltest.TestCase):

  def test_its_commands_are_make_demos(self):
    ours = [" ".join(cmd) for _, cmd in bench_main_job.commands("runs/demo", [], [])]
    self.assertEqual(ours, _demo_commands())

  def test_flags_are_added_to_their_command(self):
    (_, pretrain), (_, rl) = bench_main_job.commands("w", ["--config.a=1"], ["--config.b=2", "--config.c=3"])
    self.assertEqual(pretrain[-1], "--config.a=1")
    self.assertEqual(rl[-2:], ["--config.b=2", "--config.c=3"])

  def test_summary_medians_and_ratios(self):
    runs = {"current": [{"total_s": 100.0, "rl_s": 60.0, "pass_at_1_after": 0.8, "stage_seconds": {"SFT": 30.0}},
                        {"total_s": 120.0, "rl_s": 70.0, "pass_at_1_after": 0.9, "stage_seconds": {"SFT": 40.0}},
                        {"total_s": 110.0, "rl_s": 80.0, "pass_at_1_after": None, "stage_seconds": {"SFT": 35.0}}],
            "abc123": [{"total_s": 220.0, "rl_s": 150.0, "pass_at_1_after": 0.85}]}
    s = bench_main_job.summarize(runs)
    self.assertEqual(s["median"]["current"], {"total_s": 110.0, "rl_s": 70.0, "pass_at_1_after": 0.85,
                                              "stage: SFT": 35.0})
    # A figure one code lacks (an older commit's stage seconds) has no ratio.
    self.assertEqual(s["ratio_to_current"], {"abc123": {"total_s": 2.0, "rl_s": 2.143, "pass_at_1_after": 1.0}})

  def test_dry_run_prints_the_commands(self):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      bench_main_job.main(["--dry_run", "--rl_flags=--config.trainer.steps=4"])
    lines = out.getvalue().splitlines()
    self.assertLen(lines, 2)
    self.assertIn("experiments/pretrain_main.py --config=configs/pretrain_tiny.py:rl_tiny", lines[0])
    self.assertTrue(lines[1].endswith("--config.trainer.steps=4"), lines[1])

  def test_refusals(self):
    for argv, message in ((["--repeats=0"], "--repeats=0 must be >= 1"),
                          (["--cache_dir=/nonexistent/c2jax"], "is not a directory")):
      err = io.StringIO()
      with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as stop:
        bench_main_job.main(argv)
      self.assertEqual(stop.exception.code, 2)
      self.assertIn(message, err.getvalue())


if __name__ == "__main__":
  absltest.main()
