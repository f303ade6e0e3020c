"""`experiments/rl_main.py` with its multi-turn episodes on 2 environment servers that the job starts itself
(`--config.env_service.local=2`): the actor's episodes and the trainer's held-out evaluation are served by the
servers (their logs count the episodes each opened), the run finishes with its held-out figures, and the actors read
the servers' addresses from the config the job wrote; and the trainer's held-out evaluation before RL, on the
servers, equals the same evaluation run here in-process (the same init, seed and tasks: every figure, the agent's
behaviour included). The same shrunk run as tests/services/multi_turn_rl_test.py."""

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
import pytest

from c2jax.envs.service.config import EnvServiceConfig
from c2jax.rollouts.buffer import RolloutReader
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.services import rl_loop
from c2jax.services import rl_run_config
from c2jax.services.held_out import held_out_evaluation
from tests.services.multi_turn_rl_test import FLAGS

pytestmark = pytest.mark.e2e  # a real trainer with an actor process, 2 environment servers and sandboxes

_ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRET_ENV = "C2JAX_ENV_SECRET"


def _opened(log: str) -> int:
  """Episodes a server's log says it opened (its line on a clean stop)."""
  found = re.findall(r"env server stopped: (\d+) episodes opened", log)
  return sum(map(int, found))


class RLEnvServersTest(absltest.TestCase):

  def test_rl_main_runs_its_episodes_on_two_local_servers(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    work = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    env.pop(SECRET_ENV, None)  # the job draws the secret and exports it to its servers and actors
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    proc = subprocess.run([sys.executable, str(_ROOT / "experiments" / "rl_main.py"),
                           "--config=configs/rl_tiny.py:single_turn", f"--workdir={work}", *FLAGS,
                           "--config.env_service.local=2"], cwd=_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    self.assertEqual(result["steps"], 2)
    for key in ("pass_at_1_before", "pass_at_1_after", "reward_heldout_before", "reward_heldout_after"):
      self.assertIn(key, result)
    groups = RolloutReader(f"{work}/buffer").poll()
    self.assertGreaterEqual(len(groups), 4)

    written = json.loads((pathlib.Path(work) / "config.json").read_text())["env_service"]
    addresses = written["servers"].split(",")
    self.assertLen(addresses, 2)
    self.assertEqual(written["local"], 0)  # the actors start none: they use the job's
    logs = pathlib.Path(work) / "logs"
    opened = []
    for i, address in enumerate(addresses):
      log = (logs / f"env-server-{i}.log").read_text()
      self.assertIn(f"env server listening on {address}", log)
      opened.append(_opened(log))
    # Each server took episodes (the client spreads them over the least loaded); together at least the committed
    # groups' episodes (2 per group) and the held-out evaluation's before and after (1 task x 2 samples each).
    self.assertTrue(all(n > 0 for n in opened), opened)
    self.assertGreaterEqual(sum(opened), 2 * len(groups) + 4)

    # The before-RL evaluation again, in this process with in-process environments: the same figures.
    cfg = rl_run_config.from_json((pathlib.Path(work) / "config.json").read_text())
    local = held_out_evaluation(dataclasses.replace(cfg, env_service=EnvServiceConfig()))
    here = local(jax.device_put(rl_loop.initial_params(cfg)))
    evals = [json.loads(x) for x in (pathlib.Path(work) / "eval.jsonl").read_text().splitlines()]
    (before,) = [e for e in evals if e["when"] == "before"]
    self.assertEqual(before["reward/mean"], result["reward_heldout_before"])
    self.assertEqual(sorted(here), sorted(k for k in before if k not in ("when", "version")))
    self.assertIn("turns/mean", here)  # the agent's episodes, not only their rewards
    for key, value in here.items():
      if isinstance(value, float) and math.isnan(value):
        self.assertTrue(math.isnan(before[key]), key)
      else:
        self.assertAlmostEqual(before[key], value, places=6, msg=key)

if __name__ == "__main__":
  absltest.main()
