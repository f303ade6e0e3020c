"""CursorBench's complementary evaluations discriminate: on each, a scripted policy that should score high does and
one that should score low does, through the evaluation harness (report.md's evaluation table, report.json's
"complementary") and, for one, through the evaluation service eval_main.py runs."""

import dataclasses
import functools
import json
import os
import shutil
import tempfile

from absl.testing import absltest
import jax
import numpy as np
import pytest

import c2jax.envs.tasks.suites  # noqa: F401  (registers the suites)
from c2jax.actors.agent_loop import AgentConfig, AgentRunner
from c2jax.actors.agent_loop import Episode as AgentEpisode
from c2jax.actors.ledger import Source
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.core.agent_env import CodingAgentEnv
from c2jax.envs.core.env import EnvConfig, first_observation
from c2jax.envs.tasks import coding_tasks, interruptions
from c2jax.envs.tools.protocol import HelpDetail
from c2jax.envs.grading.quality import CodeQuality
from c2jax.envs.tasks.coding_tasks import CODING_SUITES
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.eval import harness, suite_eval
from c2jax.sandbox import sandbox as sandbox_lib
from configs import eval_complementary
from tests import tiny
from tools import validate_tasks


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

  def test_interruption_handling_tells_the_listener_from_the_deaf(self):
    tasks = CODING_SUITES.get("interruptions")().tasks("heldout")
    # Both ways the message arrives: after the first turn ends, and cutting it mid-way.
    self.assertEqual({interruptions.task_interruption(t).cut_tokens is None for t in tasks}, {True, False})
    follows, ignores = _evaluate(tasks, "follows_interruptions"), _evaluate(tasks, "ignores_interruptions")
    good, bad = follows.complementary()["interruption"], ignores.complementary()["interruption"]
    self.assertEqual((good["score"], good["interruption_delivered"]), (1.0, 1.0))
    # The deaf agent heard it too (the environment overruled its finish): it failed by ignoring it.
    self.assertEqual((bad["score"], bad["interruption_delivered"]), (0.0, 1.0))
    self.assertIn(f"| interruption | {len(tasks)} | 1.000 |", follows.markdown())
    # The changed request's solution passes (the tasks are sound); the prompt's alone does not (the message decides).
    self.assertEqual(_evaluate(tasks, "reference").summary["pass@1"], 1.0)

  @pytest.mark.slow
  def test_the_agent_loop_cuts_an_interrupted_turn_and_appends_the_message(self):
    # The same episode twice, with the same key (the same draws): uncut, its first turn runs past the cut; cut,
    # that turn ends exactly at the cut (a prefix of the uncut one), the episode goes on, and the user's message
    # follows the cut turn's observation.
    task = next(t for t in CODING_SUITES.get("interruptions")().tasks("heldout")
                if interruptions.task_interruption(t).cut_tokens is not None)
    interruption = interruptions.task_interruption(task)
    agent = AgentConfig(max_turns=2, max_turn_tokens=4 * interruption.cut_tokens, max_episode_tokens=1024)
    sampling = dataclasses.replace(tiny.ENGINE_SAMPLING, stop_tokens=(258,))  # no early stop at '>'
    runner = AgentRunner(tiny.BYTES, tiny.ENGINE, sampling, agent, ByteTokenizer())
    config = EnvConfig(max_turns=2, instructions=HelpDetail.NONE)
    text = first_observation(task, config, sorted(task.files))
    turn_tokens = interruptions.turn_tokens(task, agent.max_turn_tokens)
    self.assertEqual(turn_tokens, (interruption.cut_tokens,))
    episodes = [AgentEpisode(prompt=runner.chat.prompt(text), make_env=functools.partial(CodingAgentEnv, task, config),
                             key=jax.random.key(0), first_observation=text, turn_tokens=budgets)
                for budgets in ((), turn_tokens)]
    uncut, cut = runner.run(episodes, weights=lambda: (tiny.params(tiny.BYTES), 0))

    def first_turn(traj):
      return traj.tokens[(traj.source == Source.MODEL) & (traj.turn == 0)]

    self.assertGreater(len(first_turn(uncut)), interruption.cut_tokens)
    np.testing.assert_array_equal(first_turn(cut), first_turn(uncut)[:interruption.cut_tokens])
    self.assertEqual(cut.turns, 2)
    after = np.isin(cut.source, [Source.OBSERVATION, Source.NOTICE]) & (cut.turn == 0)
    self.assertIn(interruptions.framed(interruption.message), ByteTokenizer().decode(cut.tokens[after]))
    self.assertEqual(cut.reward_terms["interruption_delivered"], 1.0)

  @pytest.mark.slow
  def test_every_task_of_the_three_suites_is_sound(self):
    # Through tools/validate_tasks.py on their records: each reference passes, each starting repository fails, and
    # the metadata holding constraints, interruptions and shortcuts survives a JSONL round trip.
    tasks = [t for name in ("instructions", "intent", "interruptions")
             for t in CODING_SUITES.get(name)().tasks("heldout")]
    self.assertGreaterEqual(len(tasks), 16)
    out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out, ignore_errors=True)
    path = os.path.join(out, "tasks.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(coding_tasks.to_record(t)) + "\n" for t in tasks)
    self.assertEqual(validate_tasks.run(path, workers=2, progress=False), 0)


if __name__ == "__main__":
  absltest.main()
