"""`experiments/rl_main.py` with multi-turn coding episodes (one config switch): the trainer, an actor process and the
held-out evaluation all run whole agent episodes through the agent loop, in real sandboxes, and the buffer holds
their trajectories with the token ledger. It starts from the single-turn mode (tiny_compositions, bpe:512), whose BPE
trains in seconds where the agentic mode's plays its teacher's episodes first."""

import json
import os
import pathlib
import shutil
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
FLAGS = ["--config.actors.episodes=multi_turn", "--config.actors.context=384", "--config.actors.max_turns=3",
         "--config.task.max_turns=3", "--config.actors.max_episode_tokens=160", "--config.actors.max_new_tokens=48",
         "--config.sft.enabled=False", "--config.trainer.steps=2", "--config.trainer.groups_per_step=2",
         "--config.actors.group_size=2", "--config.actors.num=1", "--config.eval.tasks=1", "--config.eval.samples=2",
         "--config.eval.best_of=2", "--config.rl.pass_k=(1,2)", "--config.eval.process=False"]


class MultiTurnRLTest(absltest.TestCase):

  def test_rl_main_runs_multi_turn_coding_episodes(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    work = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    proc = subprocess.run([sys.executable, str(_ROOT / "experiments" / "rl_main.py"),
                           "--config=configs/rl_tiny.py:single_turn", f"--workdir={work}", *FLAGS], cwd=_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    self.assertEqual(result["steps"], 2)
    self.assertIn("pass_at_1_after", result)
    groups = RolloutReader(f"{work}/buffer").poll()
    self.assertGreaterEqual(len(groups), 4)
    turns = set()
    for g in groups:
      d = g.data
      np.testing.assert_array_equal(d["loss_mask"], (d["source"] == Source.MODEL).astype(np.float32))
      for r in range(d["tokens"].shape[0]):
        n = int(d["prompt_length"][r] + d["length"][r])
        self.assertTrue(np.all(d["source"][r, :int(d["prompt_length"][r])] == Source.PROMPT))
        turns.add(int(d["turn"][r, :n].max()) + 1)
    # An untrained model writes no finish call: its episodes take every turn, with observations between them.
    self.assertIn(3, turns)
    lines = [json.loads(x) for x in (pathlib.Path(work) / "metrics.jsonl").read_text().splitlines()]
    self.assertLen(lines, 2)


if __name__ == "__main__":
  absltest.main()
