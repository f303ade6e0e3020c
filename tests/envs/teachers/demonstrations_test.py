"""SFT demonstrations: the prompt is exactly the environment's first observation (built without a sandbox), the
response is the reference policy's turn (a parseable write_file + finish), and in packed batches the loss mask
covers exactly the assistant text and its EOS."""

from absl.testing import absltest, parameterized
import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.pipeline import eval_batches
from c2jax.envs.teachers import demonstrations
from c2jax.envs.tools import protocol
from c2jax.envs.tasks import suites  # noqa: F401  (registers the suites)
from c2jax.envs.tasks.coding_tasks import CODING_SUITES
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.teachers.scripted_policies import ReferencePolicy
from tests.data import batches as batch_checks

TOK = ByteTokenizer()


class _ListingOnly:
  """Stands in for the sandbox in CodingEnv.reset, which only lists the starting files."""

  def __init__(self, files, limits):
    del limits
    self._files = files

  def list_files(self):
    return sorted(self._files)

  def close(self):
    pass


class SFTTest(parameterized.TestCase):

  @parameterized.parameters(("tiny_functions", "train", 8, 8192), ("realistic", "heldout", 3, 4096))
  def test_prompt_is_the_first_observation(self, suite, split, max_turns, max_tokens):
    examples = demonstrations.sft_examples(suite, split, max_examples=3, max_turns=max_turns, max_tokens=max_tokens)
    tasks = CODING_SUITES.get(suite).tasks(split)[:3]
    self.assertLen(examples, 3)
    env = CodingEnv(EnvConfig(max_turns=max_turns, max_tokens=max_tokens), sandbox_factory=_ListingOnly)
    for task, (prompt, response) in zip(tasks, examples):
      observation = env.reset(task)
      self.assertEqual(prompt, observation)
      self.assertEqual(response, ReferencePolicy().act(task, [observation]))
      parsed = protocol.parse(response)
      self.assertEqual((parsed.errors, parsed.incomplete), ((), False))
      self.assertEqual(parsed.calls[-1].name, protocol.ToolName.FINISH)
      written = {c.args["path"]: c.args["content"] for c in parsed.calls if c.name == protocol.ToolName.WRITE_FILE}
      self.assertEqual(written, dict(task.solution))

  def test_default_budget_is_the_environment_default(self):
    task = CODING_SUITES.get("tiny_functions").tasks("train")[0]
    self.assertEqual(demonstrations.demonstration(task)[0], CodingEnv(sandbox_factory=_ListingOnly).reset(task))

  def test_loss_mask_covers_exactly_the_assistant_turn(self):
    examples = demonstrations.sft_examples("tiny_functions", "train", max_examples=4)
    seq_len = 2048  # a whole demonstration fits in a row (about 1.4 KB of bytes each)
    batches = eval_batches({"kind": "sft", "max_examples": 4}, TOK, seq_len=seq_len, batch_size=2, n_batches=4)
    segments = []
    for batch in batches:
      batch_checks.check_batch(self, batch, 2, seq_len)
      for row in range(2):
        seg = batch["segment_ids"][row]
        for s in range(1, int(seg.max()) + 1):
          at = seg == s
          segments.append((batch["tokens"][row][at], batch["loss_mask"][row][at]))
    self.assertLen(segments, 4)
    by_prompt = {TOK.decode(tokens[mask == 0]): (tokens, mask) for tokens, mask in segments}
    for prompt, response in examples:
      tokens, mask = by_prompt[prompt]
      n_prompt = len(prompt.encode()) + 1  # BOS + prompt bytes
      np.testing.assert_array_equal(mask, np.r_[np.zeros(n_prompt), np.ones(len(tokens) - n_prompt)])
      self.assertEqual(tokens[0], TOK.BOS)
      self.assertEqual(tokens[-1], TOK.EOS)  # the sampler's stop token is a target
      self.assertEqual(TOK.decode(tokens[mask == 1]), response)


class ImperfectTeacherTest(parameterized.TestCase):

  @parameterized.parameters("tiny_compositions", "realistic")
  def test_exactly_flawed_of_copies_per_task(self, suite):
    clean = demonstrations.sft_examples(suite, "train", max_examples=5)
    examples = demonstrations.sft_examples(suite, "train", max_examples=5, copies=4, flawed=1)
    self.assertLen(examples, 4 * len(clean))
    for i, (prompt, response) in enumerate(clean):
      copies = examples[4 * i:4 * i + 4]
      self.assertEqual({p for p, _ in copies}, {prompt})  # the same prompt, consecutive
      self.assertEqual(sum(r == response for _, r in copies), 3)

  @parameterized.parameters("tiny_compositions", "realistic")
  def test_incomplete_call_writes_nothing_of_its_file(self, suite):
    for task in CODING_SUITES.get(suite).tasks("train")[:5]:
      flawed = demonstrations.FLAWS.get("incomplete_call")(task)
      parsed = protocol.parse(flawed)
      (first, _), *rest = sorted(task.solution.items())
      written = {c.args["path"]: c.args["content"] for c in parsed.calls if c.name == protocol.ToolName.WRITE_FILE}
      # The cut-off call is malformed and dropped; every other call of the reference turn stands, finish included.
      self.assertNotIn(first, written)
      self.assertEqual(written, dict(rest))
      self.assertLen(parsed.errors, 1)
      self.assertIn("not closed", parsed.errors[0])
      self.assertEqual(parsed.calls[-1].name, protocol.ToolName.FINISH)
      reference = ReferencePolicy().act(task, [""])
      self.assertTrue(reference.startswith(flawed.split("\n<tool")[0]))  # a prefix of the reference's call

  def test_which_copies_are_flawed_follows_the_seed(self):
    a = demonstrations.sft_examples("tiny_compositions", "train", max_examples=20, copies=4, flawed=2, seed=0)
    b = demonstrations.sft_examples("tiny_compositions", "train", max_examples=20, copies=4, flawed=2, seed=0)
    c = demonstrations.sft_examples("tiny_compositions", "train", max_examples=20, copies=4, flawed=2, seed=1)
    self.assertEqual(a, b)
    self.assertNotEqual(a, c)
    self.assertEqual(sorted(a), sorted(c))  # the same demonstrations, other positions

  def test_no_flaw_is_the_reference(self):
    self.assertEqual(demonstrations.sft_examples("tiny_compositions", "train", copies=1, flawed=0),
                     demonstrations.sft_examples("tiny_compositions", "train"))
    self.assertEqual(demonstrations.sft_examples("tiny_compositions", "train", max_examples=3, copies=2),
                     [e for e in demonstrations.sft_examples("tiny_compositions", "train", max_examples=3)
                      for _ in range(2)])

  @parameterized.parameters(dict(copies=0), dict(copies=2, flawed=3), dict(flawed=-1), dict(flaw="typo"))
  def test_bad_settings_are_refused(self, **kwargs):
    with self.assertRaises((ValueError, KeyError)):
      demonstrations.sft_examples("tiny_compositions", "train", max_examples=2, **kwargs)


if __name__ == "__main__":
  absltest.main()
