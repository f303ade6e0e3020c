"""CursorBench's complementary evaluations discriminate: on each, a scripted policy that should score high does and
one that should score low does, through the evaluation harness (report.md's evaluation table, report.json's
"complementary") and, for one, through the evaluation service eval_main.py runs."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest

import c2jax.envs.tasks.suites  # noqa: F401  (registers the suites)
from c2jax.envs.core.env import EnvConfig
from c2jax.envs.grading.quality import CodeQuality
from c2jax.envs.tasks.coding_tasks import CODING_SUITES
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.eval import harness, suite_eval
from c2jax.sandbox import sandbox as sandbox_lib
from configs import eval_complementary


def _evaluate(tasks, policy: str, config: EnvConfig = EnvConfig()) -> harness.Report:
  return harness.evaluate(tasks, lambda i: POLICIES.get(policy)(), workers=2, config=config, progress=False)


class ComplementaryTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)

  def test_code_quality_scores_clean_code_above_sloppy_code(self):
    tasks = CODING_SUITES.get("realistic")().tasks("heldout")[:2]
    config = EnvConfig(code_quality=CodeQuality.RUFF)
    clean, sloppy = _evaluate(tasks, "reference", config), _evaluate(tasks, "sloppy", config)
    # Both are correct: only the quality of the diff tells them apart.
    self.assertEqual((clean.summary["pass@1"], sloppy.summary["pass@1"]), (1.0, 1.0))
    good, bad = clean.complementary()["code_quality"], sloppy.complementary()["code_quality"]
    self.assertEqual((good["score"], good["complexity_findings"], good["quality_error"]), (0.0, 0.0, 0.0))
    self.assertGreaterEqual(bad["score"], 5.0)  # an unused import, a bare except, == None, ... per file
    self.assertEqual(bad["complexity_findings"], 1.0)  # the 11-branch function, once per episode
    self.assertEqual(bad["quality_error"], 0.0)
    self.assertIn("| code_quality | 2 |", sloppy.markdown())
    self.assertEqual(sloppy.to_json()["complementary"]["code_quality"]["score"], bad["score"])
    # Off by default: no sandbox spent, no row in the table.
    plain = _evaluate(tasks[:1], "sloppy")
    self.assertNotIn("quality_findings", plain.episodes[0].terms)
    self.assertNotIn("code_quality", plain.complementary())

  def test_instruction_following_tells_the_shortcut_from_the_reference(self):
    # One task per kind of constraint: a file not to touch, an API to keep, a style.
    wanted = {"instructions/tax_total", "instructions/duration_units", "instructions/median_annotated"}
    tasks = [t for t in CODING_SUITES.get("instructions")().tasks("heldout") if t.task_id in wanted]
    self.assertLen(tasks, 3)
    followed, shortcut = _evaluate(tasks, "reference"), _evaluate(tasks, "shortcut")
    # The shortcut passes the hidden tests as well as the reference: pass@1 alone cannot see what it broke.
    self.assertEqual((followed.summary["pass@1"], shortcut.summary["pass@1"]), (1.0, 1.0))
    self.assertEqual(followed.complementary()["instruction_following"]["score"], 1.0)
    row = shortcut.complementary()["instruction_following"]
    self.assertEqual((row["score"], row["constraint_violations"]), (0.0, 1.0))
    self.assertIn("| instruction_following | 3 | 0.000 |", shortcut.markdown())

  def test_intent_tells_the_reasonable_reading_from_the_literal_one(self):
    # Through the evaluation service, with the config eval_main.py reads.
    out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out, ignore_errors=True)
    scores = {}
    for policy in ("reference", "shortcut"):
      config = eval_complementary.get_config("intent")
      config.update(policy=policy, max_tasks=2)
      suite_eval.run(suite_eval.parse(config), os.path.join(out, policy))
      with open(os.path.join(out, policy, "report.json")) as f:
        scores[policy] = json.load(f)["complementary"]["intent"]
    self.assertEqual(scores["reference"], {"episodes": 2, "score": 1.0, "pass_fraction": 1.0})
    self.assertEqual(scores["shortcut"]["score"], 0.0)


if __name__ == "__main__":
  absltest.main()
