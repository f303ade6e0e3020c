"""tiny_compositions: distinct functions, held-out compositions whose parts are all trained on, graded in the sandbox
(references that compute their spec and no constant-solvable task: suites_test.py, for every grammar)."""

import random

from absl.testing import absltest

from c2jax.envs.tasks import coding_tasks as ct
from c2jax.envs.grading import grading
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tasks import suites  # noqa: F401  (registers the suites)
from c2jax.sandbox.sandbox import SandboxPool
from c2jax.envs.tasks.suites import compositions


def _parts(task_id: str) -> list[str]:
  """The reducer, filter and mapper of a task id "tiny_compositions/<reducer>.<filter>[.<mapper>]"."""
  return task_id.split("/")[1].split(".")


class CompositionsTest(absltest.TestCase):

  def test_disjoint_distinct_functions(self):
    suite = compositions.TinyCompositionsSuite(seed=0)
    train, heldout = suite.tasks("train"), suite.tasks("heldout")
    self.assertLen(train + heldout, len(compositions.all_specs()))
    self.assertEqual((suite.size("train"), suite.size("heldout")), (len(train), len(heldout)))
    self.assertGreaterEqual(len(heldout), 32)  # the main job evaluates 32 held-out tasks
    self.assertEmpty({t.task_id for t in train} & {t.task_id for t in heldout})
    self.assertEmpty({t.solution["solution.py"] for t in train} & {t.solution["solution.py"] for t in heldout})
    self.assertLen({t.solution["solution.py"] for t in train + heldout}, len(train) + len(heldout))

  def test_every_heldout_part_is_trained_on(self):
    # Held out are compositions, not words: each reducer, filter and mapper of a held-out task is in >= 3 train tasks.
    for seed in (0, 1, 2):
      suite = compositions.TinyCompositionsSuite(seed=seed)
      train = [_parts(t.task_id) for t in suite.tasks("train")]
      for task in suite.tasks("heldout"):
        for position, part in enumerate(_parts(task.task_id)):
          uses = sum(len(p) > position and p[position] == part for p in train)
          self.assertGreaterEqual(uses, 3, f"{task.task_id} (seed {seed}): {part!r}")

  def test_prompts_name_parts_in_words(self):
    # No digit in the statement besides the example and two fixed phrases: nothing to copy.
    for task in compositions.TinyCompositionsSuite().tasks("train"):
      statement = task.prompt.split(" Example: ")[0].replace("(x + 1)", "").replace("or 0 if", "")
      self.assertNotRegex(statement, r"\d", task.task_id)
      self.assertRegex(task.prompt, r"^Write `def f\(xs\):` in solution.py returning .+\. Example: f\(\[.*\]\) == ")

  def test_max_difficulty_and_determinism(self):
    easy = compositions.TinyCompositionsSuite(max_difficulty=1)
    self.assertTrue(all(t.difficulty == 1 for t in easy.tasks("train") + easy.tasks("heldout")))
    a, b = compositions.TinyCompositionsSuite(seed=5), compositions.TinyCompositionsSuite(seed=5)
    self.assertEqual(a.tasks("heldout"), b.tasks("heldout"))
    self.assertNotEqual([t.task_id for t in a.tasks("heldout")],
                        [t.task_id for t in compositions.TinyCompositionsSuite(seed=6).tasks("heldout")])

  @absltest.skipIf(sandbox_lib.unavailable_reason() is not None, sandbox_lib.unavailable_reason() or "")
  def test_sample_graded_in_sandbox(self):
    suite = compositions.TinyCompositionsSuite(seed=0)
    rng = random.Random(1)
    sample = [suite.task(split, rng.randrange(suite.size(split))) for split in ct.SPLITS for _ in range(6)]
    # Each reference passes; a neighbour's reference (another composition) does not pass every case.
    jobs = [(t, t.solved_files()) for t in sample] + [(a, b.solved_files()) for a, b in zip(sample, sample[1:])]
    with SandboxPool(2) as pool:
      results = pool.map(lambda job: grading.grade(*job), jobs)
    for i, ((task, _), terms) in enumerate(zip(jobs, results)):
      self.assertEqual(terms["passed"], 1.0 if i < len(sample) else 0.0, task.task_id)


if __name__ == "__main__":
  absltest.main()
