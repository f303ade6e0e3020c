"""Coding tasks as actor tasks: the prompt is the environment's first observation and the SFT data's prompt; the
reward runs the sampled turn in the sandbox and grades it with the hidden tests."""

from absl.testing import absltest

import c2jax.envs  # noqa: F401  (registers the suites)
from c2jax.data import sft
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs import sandbox as sandbox_lib
from c2jax.envs.coding_tasks import CODING_SUITES
from c2jax.envs.tasks import TASK_SUITES

TOK = ByteTokenizer()


def _tokens(text):
  return TOK.encode(text, bos=False, eos=False)


class CodingTaskSuiteTest(absltest.TestCase):

  def test_prompt_is_the_sft_prompt_and_ids_are_stable(self):
    for instructions in ("brief", "full"):
      suite = TASK_SUITES.get("coding")(coding_suite="tiny_functions", instructions=instructions)
      examples = sft.sft_examples("tiny_functions", "heldout", max_examples=3, instructions=instructions)
      for i, (prompt, _) in enumerate(examples):
        task = suite.task("heldout", i)
        self.assertEqual(task.text, prompt)
        self.assertEqual(task.prompt[0], TOK.BOS)
        self.assertEqual(TOK.decode(task.prompt), prompt)
        self.assertEqual(task.task_id, f"coding/tiny_functions/heldout/{i}")
        self.assertIs(suite.coding_task(task), suite.coding_task(suite.task("heldout", i + suite.size("heldout"))))
    brief, full = (TASK_SUITES.get("coding")(instructions=d).task("train", 0) for d in ("brief", "full"))
    self.assertLess(len(brief.prompt), len(full.prompt) - 400)
    n = CODING_SUITES.get("tiny_functions").tasks("train")
    self.assertEqual(suite.size("train"), len([t for t in n if t.solution is not None]))
    with self.assertRaisesRegex(ValueError, "split"):
      suite.task("dev", 0)

  def test_reward_grades_the_sampled_turn(self):
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))
    suite = TASK_SUITES.get("coding")()
    task = suite.task("train", 3)
    _, reference = sft.sft_examples("tiny_functions", "train", max_examples=4, instructions="brief")[3]
    self.assertEqual(suite.reward(task, _tokens(reference)), {"outcome": 1.0, "malformed_tool_calls": 0.0})
    self.assertEqual(suite.reward(task, _tokens('<tool name="finish"/>'))["outcome"], 0.0)
    # Another task's solution: the file is written and graded, and fails this task's tests.
    _, other = sft.sft_examples("tiny_functions", "train", max_examples=1, instructions="brief")[0]
    self.assertLess(suite.reward(task, _tokens(other))["outcome"], 1.0)
    cut = suite.reward(task, _tokens(reference[:40]))  # a sample cut off inside its first call
    self.assertEqual(cut["outcome"], 0.0)
    self.assertEqual(cut["malformed_tool_calls"], 1.0)
    # Bytes that are not UTF-8 and stray text never raise.
    self.assertEqual(suite.reward(task, [255, 254, 10, 60, 116])["outcome"], 0.0)


if __name__ == "__main__":
  absltest.main()
