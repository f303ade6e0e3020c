"""Coding tasks as actor tasks: the prompt is the environment's first observation and the SFT data's prompt; the
reward runs the sampled turn in the sandbox and grades it with the hidden tests."""

import threading

from absl.testing import absltest

import c2jax.envs  # noqa: F401  (registers the suites)
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.teachers import demonstrations
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.token_tasks import suite as tasks_lib
from c2jax.envs.tasks.coding_tasks import CODING_SUITES
from c2jax.envs.token_tasks.suite import TASK_SUITES

TOK = ByteTokenizer()


def _tokens(text):
  return TOK.encode(text, bos=False, eos=False)


class CodingTaskSuiteTest(absltest.TestCase):

  def test_prompt_is_the_sft_prompt_and_ids_are_stable(self):
    for instructions in ("none", "brief", "full"):
      suite = TASK_SUITES.get("coding")(coding_suite="tiny_functions", instructions=instructions)
      examples = demonstrations.sft_examples("tiny_functions", "heldout", max_examples=3, instructions=instructions)
      for i, (prompt, _) in enumerate(examples):
        task = suite.task("heldout", i)
        self.assertEqual(task.text, prompt)
        self.assertEqual(task.prompt[0], TOK.BOS)
        self.assertEqual(TOK.decode(task.prompt), prompt)
        self.assertEqual(task.task_id, f"coding/tiny_functions/heldout/{i}")
        self.assertIs(suite.coding_task(task), suite.coding_task(suite.task("heldout", i + suite.size("heldout"))))
    none, brief, full = (TASK_SUITES.get("coding")(instructions=d).task("train", 0) for d in ("none", "brief", "full"))
    self.assertLess(len(brief.prompt), len(full.prompt) - 400)
    self.assertLess(len(none.prompt), len(brief.prompt) - 200)
    # The task statement ends every prompt: the answer follows it directly.
    statement = suite.coding_task(full).prompt.strip()
    for task in (none, brief, full):
      self.assertTrue(task.text.endswith(statement), task.text[-200:])
    n = CODING_SUITES.get("tiny_functions").tasks("train")
    self.assertEqual(suite.size("train"), len([t for t in n if t.solution is not None]))
    with self.assertRaisesRegex(ValueError, "split"):
      suite.task("dev", 0)

  def test_suite_options_select_tasks_and_keep_the_suite_hashable(self):
    easy = TASK_SUITES.get("coding")(suite_options={"max_difficulty": 1}, instructions="none")
    self.assertEqual(easy.suite_options, (("max_difficulty", 1),))
    hash(easy)
    self.assertEqual(easy, TASK_SUITES.get("coding")(suite_options=(("max_difficulty", 1),), instructions="none"))
    tasks = [easy.coding_task(easy.task("train", i)) for i in range(easy.size("train"))]
    self.assertEqual({t.difficulty for t in tasks}, {1})
    self.assertLess(easy.size("train"), TASK_SUITES.get("coding")().size("train"))
    # The SFT data of the same options are the same prompts.
    examples = demonstrations.sft_examples("tiny_functions", "train", max_examples=5, instructions="none",
                                suite_options={"max_difficulty": 1})
    self.assertEqual([easy.task("train", i).text for i in range(5)], [p for p, _ in examples])
    with self.assertRaisesRegex(ValueError, "no heldout tasks"):
      TASK_SUITES.get("coding")(suite_options={"max_difficulty": 0}).size("heldout")

  def test_rewards_grade_many_samples_in_threads_in_order(self):
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))
    suite = TASK_SUITES.get("coding")(instructions="brief", reward_workers=3)
    examples = demonstrations.sft_examples("tiny_functions", "train", max_examples=3, instructions="brief")
    tasks = [suite.task("train", i) for i in range(3)] * 2
    # Each task's own reference, then each task with the next task's reference.
    answers = [_tokens(r) for _, r in examples] + [_tokens(examples[(i + 1) % 3][1]) for i in range(3)]
    terms = tasks_lib.rewards(suite, tasks, answers)
    serial = [suite.reward(t, a) for t, a in zip(tasks, answers)]
    self.assertEqual(terms, serial)
    self.assertEqual([t["outcome"] for t in terms[:3]], [1.0, 1.0, 1.0])
    self.assertTrue(all(t["outcome"] < 1.0 for t in terms[3:]))
    with self.assertRaisesRegex(ValueError, "2 tasks for 1 samples"):
      tasks_lib.rewards(suite, tasks[:2], answers[:1])

  def test_reward_grades_the_sampled_turn(self):
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))
    suite = TASK_SUITES.get("coding")()
    task = suite.task("train", 3)
    _, reference = demonstrations.sft_examples("tiny_functions", "train", max_examples=4, instructions="brief")[3]
    self.assertEqual(suite.reward(task, _tokens(reference)),
                     {"outcome": 1.0, "malformed_tool_calls": 0.0, "hack_attempts": 0.0})
    self.assertEqual(tasks_lib.reward_terms(suite), tuple(suite.reward(task, _tokens(reference))))
    self.assertEqual(suite.reward(task, _tokens('<tool name="finish"/>'))["outcome"], 0.0)
    # Another task's solution: the file is written and graded, and fails this task's tests.
    _, other = demonstrations.sft_examples("tiny_functions", "train", max_examples=1, instructions="brief")[0]
    self.assertLess(suite.reward(task, _tokens(other))["outcome"], 1.0)
    cut = suite.reward(task, _tokens(reference[:40]))  # a sample cut off inside its first call
    self.assertEqual(cut["outcome"], 0.0)
    self.assertEqual(cut["malformed_tool_calls"], 1.0)
    # Bytes that are not UTF-8 and stray text never raise.
    self.assertEqual(suite.reward(task, [255, 254, 10, 60, 116])["outcome"], 0.0)


class RewardsTest(absltest.TestCase):
  """`tasks.rewards` with a verifier that waits (as a sandbox does): threads overlap the waits."""

  def test_workers_overlap_and_order_is_kept(self):
    barrier = threading.Barrier(3, timeout=10)

    class Waiting:
      name = "waiting"
      reward_workers = 3

      def reward(self, task, generated):
        barrier.wait()  # returns only when 3 calls are in flight at once
        return {"outcome": float(generated[0]), "task": task}

    terms = tasks_lib.rewards(Waiting(), ["a", "b", "c"] * 2, [[i] for i in range(6)])
    self.assertEqual([t["outcome"] for t in terms], [0, 1, 2, 3, 4, 5])
    self.assertEqual([t["task"] for t in terms], ["a", "b", "c"] * 2)

  def test_one_worker_by_default(self):
    seen = []

    class Plain:
      name = "plain"

      def reward(self, task, generated):
        seen.append(threading.current_thread().name)
        return {"outcome": 1.0}

    tasks_lib.rewards(Plain(), ["a", "b"], [[1], [2]])
    self.assertEqual(seen, [threading.current_thread().name] * 2)


if __name__ == "__main__":
  absltest.main()
