"""`experiments/rl_main.py` with self-summaries on the long-horizon suite (configs/rl_long_horizon.py, shrunk): the
actors' groups hold a row per segment, the trainer trains on them, and the summary figures reach metrics.jsonl,
TensorBoard and result.json (report section 4)."""

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.actors.ledger import Source
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.rollouts.buffer import RolloutReader

pytestmark = pytest.mark.e2e  # a real trainer with an actor process and sandboxes (`make test-unit` leaves it out)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
# An untrained model (no SFT): its turns are noise, its context fills within a few turns, and some of its summaries end
# (on EOS) within their budget, so episodes chain; nothing here depends on what it learns. Byte tokens: a random
# model ends a 160-token summary on EOS about half of the time (1 in 259 per token; the config's BPE has 1024).
FLAGS = ["--config.sft.enabled=False", "--config.trainer.steps=2", "--config.trainer.groups_per_step=2",
         "--config.task.tokenizer=byte", "--config.model_overrides.vocab_size=259",
         "--config.actors.stop_tokens=(258,)", "--config.actors.context=1024", "--config.actors.prompt_len=512",
         "--config.actors.group_size=2",
         "--config.actors.num=1", "--config.actors.max_new_tokens=96", "--config.actors.max_turns=6",
         "--config.task.max_turns=6", "--config.actors.summary.trigger_tokens=400",
         "--config.actors.summary.max_tokens=160", "--config.actors.summary.max_segments=3",
         "--config.eval.tasks=2", "--config.eval.samples=2", "--config.eval.best_of=2", "--config.rl.pass_k=(1,2)"]


def _tb_tags(directory: pathlib.Path) -> set[str]:
  """The scalar tags of the TensorBoard event files under `directory` (TFRecord framing, Event protos)."""
  from tensorboardX.proto import event_pb2
  tags = set()
  for path in directory.rglob("events.out.tfevents.*"):
    data = path.read_bytes()
    i = 0
    while i + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      tags.update(v.tag for v in event.summary.value)
      i += 12 + n + 4
  return tags


class SelfSummaryRLTest(absltest.TestCase):

  def test_rl_main_trains_on_chains_and_reports_their_figures(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    work = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    proc = subprocess.run([sys.executable, str(_ROOT / "experiments" / "rl_main.py"),
                           "--config=configs/rl_long_horizon.py", f"--workdir={work}", *FLAGS], cwd=_ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    self.assertEqual(result["steps"], 2)
    # Every episode is counted once, by its number of compactions (0 .. max_segments - 1).
    counts = [result[f"episodes_with_{k}_compactions"] for k in range(3)]
    self.assertGreaterEqual(sum(counts), 2 * 2 * 2)
    self.assertGreater(result["summary_tokens_per_episode"], 0)
    self.assertAlmostEqual(result["needed_summary_fraction"], (counts[1] + counts[2]) / sum(counts), places=6)
    self.assertAlmostEqual(result["compactions_per_episode"], (counts[1] + 2 * counts[2]) / sum(counts), places=6)

    chained = 0
    for g in RolloutReader(f"{work}/buffer").poll():
      d = g.data
      chains = d["chain_id"]
      np.testing.assert_array_equal(np.unique(chains), [0, 1])
      for c in (0, 1):
        rows = np.flatnonzero(chains == c)
        np.testing.assert_array_equal(d["segment"][rows], np.arange(len(rows)))
        self.assertLen(set(d["reward_terms"]["outcome"][rows]), 1)  # the episode's reward on each segment
        for r in rows[1:]:  # a later segment: the task, then the summary framed
          chained += 1
          n = int(d["prompt_length"][r])
          self.assertEqual(int(d["source"][r, n]), Source.RESUME)
        for r in rows[:-1]:  # an earlier one ends with the summary, which is trained
          last = int(d["prompt_length"][r] + d["length"][r]) - 1
          self.assertEqual(int(d["source"][r, last]), Source.SUMMARY)
          self.assertEqual(float(d["loss_mask"][r, last]), 1.0)
    self.assertGreaterEqual(chained, 1)
    # The held-out evaluation runs the same chains and counts them.
    evals = [json.loads(x) for x in (work / "eval.jsonl").read_text().splitlines()]
    self.assertTrue(all(e["compactions/mean"] >= 0 for e in evals), evals)
    steps = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    self.assertIn("summary/compactions_per_episode", steps[-1])
    tags = _tb_tags(work / "tb")
    for tag in ("summary/compactions_per_episode", "summary/needed_fraction", "summary/tokens_per_episode"):
      self.assertTrue(any(t.endswith(tag) for t in tags), (tag, sorted(tags)[:10]))


if __name__ == "__main__":
  absltest.main()
