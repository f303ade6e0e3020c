"""The evaluation harness is honest: reference solutions score 100% on the realistic suite, doing nothing scores
0%, deleting the tests does not pass; and its report (pass@k, per-category table, JSON, plot) holds together."""

import json
import os
import shlex
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import pytest

import c2jax.envs.tasks.suites  # noqa: F401  (registers the suites)
from c2jax.actors.agent_loop import AgentConfig, AgentRunner
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, CodingTask
from c2jax.envs.core.env import EnvConfig
from c2jax.envs.tools.protocol import HelpDetail, parse
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.eval import harness
from tests import tiny


_unavailable_reason = sandbox_lib.unavailable_reason


class HarnessTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tasks = CODING_SUITES.get("realistic")().tasks("heldout")

  def require_sandbox(self):
    reason = _unavailable_reason()
    if reason:
      self.skipTest(reason)

  def test_scripted_policies_score_what_they_must(self):
    self.require_sandbox()
    self.assertGreaterEqual(len(self.tasks), 20)
    reference = harness.evaluate(self.tasks, lambda i: POLICIES.get("reference")(), workers=2, progress=False)
    self.assertEqual(reference.summary["pass@1"], 1.0, reference.markdown())
    self.assertEqual(reference.summary["errors"], 0)
    self.assertEqual(reference.summary["num_tasks"], len(self.tasks))
    # Reference edits are the yardstick of over-editing: applying them exactly over-edits nothing.
    self.assertEqual(reference.summary["over_editing"], 0.0)
    some = self.tasks[::4]
    for name in ("empty", "delete_tests"):
      report = harness.evaluate(some, lambda i, name=name: POLICIES.get(name)(), workers=2, progress=False)
      self.assertEqual(report.summary["pass@1"], 0.0, f"{name}:\n{report.markdown()}")

    out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out, ignore_errors=True)
    summary = harness.write_report(reference, out)
    with open(os.path.join(out, "report.json")) as f:
      saved = json.load(f)
    self.assertEqual(saved["summary"]["pass@1"], summary["pass@1"])
    self.assertLen(saved["episodes"], len(self.tasks))
    self.assertSetEqual(set(saved["by_category"]), {t.category.value for t in self.tasks})
    self.assertIn(f"| all | {len(self.tasks)} |", open(os.path.join(out, "report.md")).read())
    self.assertGreater(os.path.getsize(os.path.join(out, "report.png")), 1000)

  def test_a_report_without_pass_at_1_writes_its_plot(self):
    # ks=(2,) has no pass@1 column: the report plots the smallest k it has.
    episodes = [harness.Episode(task_id=f"t{i}", category="c", sample=s, terms={"passed": float(s == 0),
                                                                               "pass_fraction": 0.5},
                                turns=1, seconds=0.0, error=None) for i in range(3) for s in range(2)]
    report = harness.Report(episodes=episodes, samples=2, ks=(2,), seconds=1.0, workers=1)
    out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out, ignore_errors=True)
    summary = harness.write_report(report, out)
    self.assertEqual(summary["pass@2"], 1.0)
    self.assertNotIn("pass@1", summary)
    self.assertGreater(os.path.getsize(os.path.join(out, "report.png")), 1000)

  @pytest.mark.slow
  def test_a_model_runs_through_the_agent_loop(self):
    # An untrained model writes bytes, not tool calls: it must be evaluated (turns taken, nothing raised), and fail.
    self.require_sandbox()
    tasks = CODING_SUITES.get("tiny_functions")().tasks("heldout")[:2]
    runner = AgentRunner(tiny.BYTES, tiny.ENGINE, tiny.ENGINE_SAMPLING,
                         AgentConfig(max_turns=2, max_turn_tokens=16, max_episode_tokens=64), ByteTokenizer())
    config = EnvConfig(max_turns=2, instructions=HelpDetail.NONE)
    report = harness.evaluate_model(tasks, runner, tiny.params(tiny.BYTES), samples=2,
                                    config=config, ks=(1, 2))
    self.assertEqual(report.summary["errors"], 0, report.markdown())
    self.assertLen(report.episodes, 4)
    self.assertTrue(all(e.turns == 2 for e in report.episodes))  # no finish call: the turn budget ends it
    self.assertEqual(report.summary["pass@2"], 0.0)
    self.assertEqual(runner.stats.reprefill_fraction, 0.0)

  def test_an_unusable_sandbox_is_raised_not_scored_zero(self):
    # A probe that cannot start python3 stands for any host that cannot sandbox code (where bubblewrap is missing,
    # the check fails before the probe, with the same exception).
    with mock.patch.object(sandbox_lib, "_probed", set()), \
        mock.patch.object(sandbox_lib, "_PROBE_COMMAND", "/nonexistent/python3 -I -c pass"):
      with self.assertRaises(sandbox_lib.SandboxUnavailable):
        harness.evaluate(self.tasks[:3], lambda i: POLICIES.get("empty")(), workers=1, progress=False)
      with self.assertRaises(sandbox_lib.SandboxUnavailable):
        harness.run_episode(self.tasks[0], POLICIES.get("empty")(), 0, EnvConfig())

  def test_scripted_policies_quote_paths_for_the_shell(self):
    path = "odd dir/it's $(touch x).py"
    task = CodingTask(task_id="quotes", prompt="p", files={path: "x = 1\n", "test_it's.py": ""},
                      hidden_tests={"hidden_tests/test_h.py": ""}, solution={"a.py": "x = 2\n"},
                      solution_deletes=(path,))
    for name, expected in (("reference", path), ("delete_tests", "test_it's.py")):
      calls = parse(POLICIES.get(name)().act(task, [""])).calls
      commands = [c.args["command"] for c in calls if c.name.value == "run"]
      self.assertEqual(commands, [f"rm -f -- {shlex.quote(expected)}"], name)
      self.assertEqual(shlex.split(commands[0]), ["rm", "-f", "--", expected])


if __name__ == "__main__":
  absltest.main()
