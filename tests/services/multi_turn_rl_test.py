"""`experiments/rl_main.py` with multi-turn coding episodes (one config switch), their environments on 2 environment
servers that the job starts itself (`--config.env_service.local=2`): the trainer, an actor process and the held-out
evaluation all run whole agent episodes through the agent loop, in real sandboxes behind the servers, and the buffer
holds their trajectories with the token ledger. It starts from the single-turn mode (tiny_compositions, bpe:512),
whose BPE trains in seconds where the agentic mode's plays its teacher's episodes first.

One run serves every check (an RL job is the costliest thing the suite starts): the multi-turn trajectories; that
the servers served the actor's and the evaluation's episodes (their logs count the episodes each opened) and the
actors found them in the config the job wrote; and that the held-out evaluation before RL, on the servers, equals
the same evaluation run here with in-process environments (the same init, seed and tasks: every figure, the agent's
behaviour included). In-process environments in a whole run: tests/services/self_summary_rl_test.py, `make demo`.
"""

import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.actors.ledger import Source
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.rollouts.buffer import RolloutReader
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.services import rl_loop
from c2jax.services import rl_run_config
from c2jax.services.held_out import held_out_evaluation

pytestmark = pytest.mark.e2e  # a real trainer, an actor process, 2 environment servers and sandboxes

_ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRET_ENV = "C2JAX_ENV_SECRET"
FLAGS = ["--config.actors.episodes=multi_turn", "--config.actors.context=384", "--config.actors.max_turns=3",
         "--config.task.max_turns=3", "--config.actors.max_episode_tokens=160", "--config.actors.max_new_tokens=48",
         "--config.sft.enabled=False", "--config.trainer.steps=2", "--config.trainer.groups_per_step=2",
         "--config.actors.group_size=2", "--config.actors.num=1", "--config.eval.tasks=1", "--config.eval.samples=2",
         "--config.eval.best_of=2", "--config.rl.pass_k=(1,2)", "--config.eval.process=False"]


def _opened(log: str) -> int:
  """Episodes a server's log says it opened (its line on a clean stop)."""
  return sum(map(int, re.findall(r"env server stopped: (\d+) episodes opened", log)))


class MultiTurnRLTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.skip = sandbox_lib.unavailable_reason()
    if cls.skip:
      return
    cls.work = pathlib.Path(tempfile.mkdtemp())
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    env.pop(SECRET_ENV, None)  # the job draws the secret and exports it to its servers and actors
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    cls.proc = subprocess.run([sys.executable, str(_ROOT / "experiments" / "rl_main.py"),
                               "--config=configs/rl_tiny.py:single_turn", f"--workdir={cls.work}", *FLAGS,
                               "--config.env_service.local=2"], cwd=_ROOT, env=env, capture_output=True, text=True,
                              timeout=900)

  @classmethod
  def tearDownClass(cls):
    if not cls.skip:
      shutil.rmtree(cls.work, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    if self.skip:
      self.skipTest(self.skip)
    self.assertEqual(self.proc.returncode, 0, self.proc.stderr[-3000:])
    self.result = json.loads(self.proc.stdout.strip().splitlines()[-1])
    self.groups = RolloutReader(f"{self.work}/buffer").poll()

  def test_rl_main_runs_multi_turn_coding_episodes(self):
    self.assertEqual(self.result["steps"], 2)
    for key in ("pass_at_1_before", "pass_at_1_after", "reward_heldout_before", "reward_heldout_after"):
      self.assertIn(key, self.result)
    self.assertGreaterEqual(len(self.groups), 4)
    turns = set()
    for g in self.groups:
      d = g.data
      np.testing.assert_array_equal(d["loss_mask"], (d["source"] == Source.MODEL).astype(np.float32))
      for r in range(d["tokens"].shape[0]):
        n = int(d["prompt_length"][r] + d["length"][r])
        self.assertTrue(np.all(d["source"][r, :int(d["prompt_length"][r])] == Source.PROMPT))
        turns.add(int(d["turn"][r, :n].max()) + 1)
    # An untrained model writes no finish call: its episodes take every turn, with observations between them.
    self.assertIn(3, turns)
    lines = [json.loads(x) for x in (self.work / "metrics.jsonl").read_text().splitlines()]
    self.assertLen(lines, 2)

  def test_its_episodes_ran_on_the_two_servers_the_job_started(self):
    written = json.loads((self.work / "config.json").read_text())["env_service"]
    addresses = written["servers"].split(",")
    self.assertLen(addresses, 2)
    self.assertEqual(written["local"], 0)  # the actors start none: they use the job's
    opened = []
    for i, address in enumerate(addresses):
      log = (self.work / "logs" / f"env-server-{i}.log").read_text()
      self.assertIn(f"env server listening on {address}", log)
      opened.append(_opened(log))
    # Each server took episodes (the client spreads them over the least loaded); together at least the committed
    # groups' episodes (2 per group) and the held-out evaluation's before and after (1 task x 2 samples each).
    self.assertTrue(all(n > 0 for n in opened), opened)
    self.assertGreaterEqual(sum(opened), 2 * len(self.groups) + 4)

  def test_the_evaluation_on_the_servers_equals_it_in_process(self):
    cfg = rl_run_config.from_json((self.work / "config.json").read_text())
    local = held_out_evaluation(dataclasses.replace(cfg, env_service=EnvServiceConfig()))
    here = local(jax.device_put(rl_loop.initial_params(cfg)))
    evals = [json.loads(x) for x in (self.work / "eval.jsonl").read_text().splitlines()]
    (before,) = [e for e in evals if e["when"] == "before"]
    self.assertEqual(before["reward/mean"], self.result["reward_heldout_before"])
    self.assertEqual(sorted(here), sorted(k for k in before if k not in ("when", "version")))
    self.assertIn("turns/mean", here)  # the agent's episodes, not only their rewards
    for key, value in here.items():
      if isinstance(value, float) and math.isnan(value):
        self.assertTrue(math.isnan(before[key]), key)
      else:
        self.assertAlmostEqual(before[key], value, places=6, msg=key)


if __name__ == "__main__":
  absltest.main()
