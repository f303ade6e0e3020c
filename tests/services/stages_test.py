"""A job's stages by name and place, their bar labels and durations, the notes printed once, and the RL job's plan
for each way it starts (a warm start with a multi-turn teacher, a single-turn one, none)."""

import contextlib
import dataclasses
import io

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.services import rl_job
from c2jax.services import rl_loop
from c2jax.services import rl_run_config
from c2jax.services import stages
from configs import rl_tiny


def _printed(fn) -> str:
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    fn()
  return err.getvalue()


class StagesTest(parameterized.TestCase):

  def test_a_stage_says_its_place_and_how_it_ended(self):
    plan = stages.Stages(("SFT", "RL"))

    def finished():
      with plan.stage("SFT", "300 steps") as run:
        self.assertEqual(run.label, "SFT 1/2")

    self.assertRegex(_printed(finished), r"^stage 1/2: SFT \(300 steps\)\nstage 1/2: SFT done in \d+ s\n$")

    def stopped():
      with plan.stage("RL") as run:
        run.interrupted = True

    self.assertRegex(_printed(stopped), r"stage 2/2: RL stopped after \d+ s\n$")

    def failed():
      with self.assertRaises(KeyboardInterrupt), plan.stage("RL"):
        raise KeyboardInterrupt

    self.assertRegex(_printed(failed), r"stage 2/2: RL stopped after")
    self.assertEqual(_printed(lambda: plan.skip("SFT", "cached")), "stage 1/2: SFT: cached\n")
    # Each stage's seconds, the last run of a name kept (a job's result reports them); a skip records none.
    self.assertEqual(sorted(plan.seconds), ["RL", "SFT"])
    self.assertTrue(all(0 <= s < 60 for s in plan.seconds.values()), plan.seconds)
    self.assertEqual(plan, stages.Stages(("SFT", "RL")))  # the seconds are a record, not part of the plan

  def test_a_loop_outside_its_job_is_its_own_plan(self):
    job = stages.Stages(("SFT", "a", "b"))
    self.assertIs(stages.Stages.of(job, "a", "b"), job)
    self.assertEqual(stages.Stages.of(None, "a", "b").label("b"), "b 2/2")
    self.assertEqual(stages.Stages.of(stages.Stages(("a",)), "a", "b").names, ("a", "b"))

  def test_a_note_once_per_key(self):
    key = ("stages_test", id(self))
    self.assertEqual(_printed(lambda: stages.note_once(key, "compiling x")), "compiling x\n")
    self.assertEqual(_printed(lambda: stages.note_once(key, "compiling x")), "")

  @parameterized.parameters((5, "5 s"), (184, "3 min 4 s"), (3720, "1 h 2 min"))
  def test_duration(self, seconds, text):
    self.assertEqual(stages.duration(seconds), text)

  @parameterized.parameters((0, "40 steps"), (10, "steps 11-40 of 40"), (39, "step 40 of 40"),
                            (40, "all 40 steps already trained"))
  def test_the_rl_stages_detail_says_which_steps_this_run_trains(self, start, text):
    self.assertEqual(rl_loop._steps_left(start, 40), text)

  def test_the_rl_jobs_plan(self):
    cfg = rl_run_config.parse(rl_tiny.get_config())  # SFT on a multi-turn teacher's recorded traces
    self.assertTrue(cfg.sft.enabled and cfg.sft.teacher.policy)
    # Multi-turn actors compile their engine's programs first.
    loop = ("compiling the sampling programs", "held-out evaluation before RL", "RL", "held-out evaluation after RL")
    self.assertEqual(rl_job.plan(cfg).names, ("recording teacher traces", "SFT") + loop)
    self.assertEqual(rl_job.plan(dataclasses.replace(cfg, init_checkpoint="/some/model")).names, loop)
    one_turn = rl_run_config.parse(rl_tiny.get_config("single_turn"))  # SFT on demonstrations, no teacher traces
    self.assertEqual(rl_job.plan(one_turn).names, ("SFT",) + loop[1:])


if __name__ == "__main__":
  absltest.main()
