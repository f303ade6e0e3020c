"""tools/perplexity_vs_reward.py: a real (small) pretraining with its points, RL runs stood in for, the fit."""

import json
import math
import os
import pathlib
import sys
import tempfile
import textwrap
from unittest import mock

from absl.testing import absltest
import numpy as np
import pytest

from tools import perplexity_vs_reward
from tools import sweep as sweep_lib

pytestmark = pytest.mark.e2e  # a pretraining process and sweep processes

# A stand-in for rl_main: its held-out figures fall with the pretraining step its SFT started from (read from the
# run's own config, as rl_main would read sft.base_checkpoint), so the fit has a known sign.
_FAKE_RUN = textwrap.dedent("""
    import json, pathlib, sys
    workdir = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir=")))
    config = json.loads((workdir / "sweep_config.json").read_text())
    base = config["sft"]["base_checkpoint"]
    assert (pathlib.Path(base) / "model_config.json").exists(), base
    step = int(base.rsplit("step_", 1)[1])
    (workdir / "result.json").write_text(json.dumps({
        "pass_at_1_before": 0.1, "pass_at_1_after": 0.2 + 0.01 * step, "best_of_k_before": 0.5,
        "best_of_k_after": 0.6, "reward_heldout_before": 0.1, "reward_heldout_after": 0.3 + 0.02 * step}))
""")

# The pretraining at test size: a few stdlib files, rows of 32 tokens.
_PRETRAIN_SETS = ("phases.bulk.seq_len=32", "phases.bulk.batch_size=2", "phases.bulk.warmup_steps=1",
                  "phases.bulk.sources.stdlib.max_files=6", "eval.seq_len=32", "eval.batches=1", "eval.batch_size=2",
                  "log_every=1")


class PerplexityVsRewardTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    root = pathlib.Path(tempfile.mkdtemp())
    fake = root / "fake_rl_main.py"
    fake.write_text(_FAKE_RUN)
    cls.workdir = root / "sweep"
    with mock.patch.dict(os.environ, {"C2JAX_CACHE_DIR": str(root / "cache")}):
      cls.summary = perplexity_vs_reward.run(
          cls.workdir, points=(4, 0, 2), seeds="1", pretrain_sets=_PRETRAIN_SETS, parallel=2, progress=False,
          command=lambda run: [sys.executable, str(fake), f"--workdir={run.workdir}"])

  def test_every_point_is_a_model_with_its_perplexity(self):
    evals = {}
    for line in open(self.workdir / "pretrain" / "eval.jsonl"):
      record = json.loads(line)
      evals[record["step"]] = record["heldout_ppl"]
    self.assertEqual(self.summary["points"], {str(s): evals[s] for s in (0, 2, 4)})
    self.assertGreater(evals[0], evals[4])  # pretraining lowered the held-out perplexity
    for s in (0, 2, 4):
      self.assertTrue((self.workdir / "pretrain" / "models" / f"step_{s}" / "model_config.json").exists())

  def test_each_cell_started_its_sft_from_its_point_and_the_fit_reads_them(self):
    self.assertEqual((self.summary["runs"], self.summary["finished"]), (3, 3))
    rows = sorted(self.summary["rows"], key=lambda r: r["step"])
    self.assertEqual([r["step"] for r in rows], [0, 2, 4])
    np.testing.assert_allclose([r["pass_at_1_after"] for r in rows], [0.2, 0.22, 0.24])
    fit = self.summary["fit_pass_at_1_after"]
    self.assertEqual(fit["points"], 3)
    self.assertLess(fit["slope"], 0.0)  # more reward at lower perplexity, as the stand-in says
    self.assertGreater(fit["per_halving"], 0.0)
    self.assertTrue(math.isfinite(fit["r2"]))
    for name in ("perplexity_vs_reward.md", "perplexity_vs_reward.png", "results.md"):
      self.assertTrue((self.workdir / name).exists(), name)
    self.assertIn("| step 2 |", (self.workdir / "perplexity_vs_reward.md").read_text())

  def test_a_second_call_reuses_everything(self):
    with mock.patch.object(perplexity_vs_reward.subprocess, "run", side_effect=AssertionError("pretrained again")):
      again = perplexity_vs_reward.run(self.workdir, points=(0, 2, 4), seeds="1", pretrain_sets=_PRETRAIN_SETS,
                                       progress=False, command=lambda run: ["false"])
    self.assertEqual(again["points"], self.summary["points"])
    self.assertEqual(again["finished"], 3)

  def test_a_point_the_pretraining_did_not_evaluate_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"no evaluation at steps \[3\]"):
      perplexity_vs_reward.perplexities(self.workdir / "pretrain", (0, 3))


class SweepFileTest(absltest.TestCase):

  def test_cells_point_at_the_pretraining_models(self):
    sweep = sweep_lib.load_sweep(perplexity_vs_reward.SWEEP_FILE, pretrain_dir="/p", points=(0, 10))
    self.assertEqual(dict(sweep.cells), {"step_0": {"sft.base_checkpoint": "/p/models/step_0"},
                                         "step_10": {"sft.base_checkpoint": "/p/models/step_10"}})
    self.assertEqual((sweep.name, sweep.config), ("perplexity_vs_reward", "configs/rl_tiny.py:single_turn"))

  def test_the_agentic_job_pairs_the_demos_pretraining_and_rl_configs(self):
    sweep = sweep_lib.load_sweep(perplexity_vs_reward.SWEEP_FILE, pretrain_dir="/p", points=(0,), job="agentic")
    self.assertEqual((sweep.name, sweep.config), ("perplexity_vs_reward_agentic", "configs/rl_tiny.py"))
    job = perplexity_vs_reward.JOBS["agentic"]
    # The pretraining `make demo` runs before this RL config (the Makefile's demo target), so the SFT's base checkpoint
    # is of the RL run's own model and tokenizer.
    makefile = (pathlib.Path(perplexity_vs_reward.REPO) / "Makefile").read_text()
    self.assertIn(f"--config={job.pretrain_config}", makefile)
    self.assertIn(f"--config={job.rl_config}", makefile)
    with self.assertRaisesRegex(ValueError, r"job='multi' is not one of \['agentic', 'single_turn'\]"):
      sweep_lib.load_sweep(perplexity_vs_reward.SWEEP_FILE, pretrain_dir="/p", points=(0,), job="multi")


if __name__ == "__main__":
  absltest.main()
