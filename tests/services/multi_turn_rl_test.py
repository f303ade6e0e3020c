"""`experiments/rl_main.py` with multi-turn coding episodes that chain self-summaries (the long-horizon suite,
configs/rl_long_horizon.py, shrunk), their environments on 2 environment servers that the job starts itself
(`--config.env_service.local=2`): the trainer, an actor process and the held-out evaluation all run whole agent
episodes through the agent loop, in real sandboxes behind the servers; the actors' groups hold a row per segment
with the token ledger, the trainer trains on them packed (`trainer.rows=packed`: the actors' own rows, their chains
and lengths, through the packer), and the summary figures reach metrics.jsonl, TensorBoard and result.json (report
sections 4 and 6).

One run serves every check (an RL job is the costliest thing the suite starts): the multi-turn trajectories (turns
with observations between them, up to the turn budget); the chains of segments and their figures; that the servers
served the actor's and the evaluation's episodes (their logs count the episodes each opened) and the actors found
them in the config the job wrote; and that the held-out evaluation before RL, on the servers, equals the same
evaluation run here with in-process environments (the same init, seed and tasks: every figure, the agent's
behaviour and its summaries included). In-process environments in a whole run: tests/services/walkthrough_test.py,
`make demo`.
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

from c2jax.actors.ledger import ACTIONS, Source
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.rollouts.buffer import RolloutReader
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.services import rl_loop
from c2jax.services import rl_run_config
from c2jax.services.held_out import held_out_evaluation

pytestmark = pytest.mark.e2e  # a real trainer, an actor process, 2 environment servers and sandboxes

_ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRET_ENV = "C2JAX_ENV_SECRET"
# A cheap multi-turn job without summaries on configs/rl_tiny.py:single_turn (tiny_compositions, bpe:512, whose BPE
# trains in seconds): what tests/tools/slurm_env_servers_test.py runs on a Slurm cluster.
FLAGS = ["--config.actors.episodes=multi_turn", "--config.actors.context=384", "--config.actors.max_turns=3",
         "--config.task.max_turns=3", "--config.actors.max_episode_tokens=160", "--config.actors.max_new_tokens=48",
         "--config.sft.enabled=False", "--config.trainer.steps=2", "--config.trainer.groups_per_step=2",
         "--config.actors.group_size=2", "--config.actors.num=1", "--config.eval.tasks=1", "--config.eval.samples=2",
         "--config.eval.best_of=2", "--config.rl.pass_k=(1,2)", "--config.eval.process=False"]
# This file's job, on configs/rl_long_horizon.py. An untrained model (no SFT): its turns are noise (mostly cut at 96
# bytes: EOS is 1 in 259), each answered by an observation and a notice (111 tokens), so nothing here depends on what
# it learns. Byte tokens: a random model ends a 160-token summary on EOS about half of the time (the config's BPE has
# 1024), so about half of the episodes chain. The first segment (a 292-token prompt) holds two model turns with an
# observation between them (after one it holds at most 292 + 96 + 111 = 499 positions, below the trigger at 512;
# after two, past it) and ends with a summary; a second segment resumes from it and its one model turn is the
# episode's last (max_turns=3): an episode whose summary ends takes every turn, one whose summary runs past its
# budget is cut (so a chain has at most 2 segments here).
MAX_TURNS, STEPS, GROUPS_PER_STEP, GROUP, EVAL_TASKS, EVAL_SAMPLES = 3, 2, 2, 2, 2, 2
CHAIN_FLAGS = [
    "--config.sft.enabled=False", f"--config.trainer.steps={STEPS}",
    f"--config.trainer.groups_per_step={GROUPS_PER_STEP}", "--config.task.tokenizer=byte",
    "--config.model_overrides.vocab_size=259", "--config.actors.stop_tokens=(258,)", "--config.actors.context=1024",
    "--config.actors.prompt_len=512", f"--config.actors.group_size={GROUP}", "--config.actors.num=1",
    "--config.actors.max_new_tokens=96", f"--config.actors.max_turns={MAX_TURNS}",
    f"--config.task.max_turns={MAX_TURNS}",
    "--config.actors.summary.trigger_tokens=512", "--config.actors.summary.max_tokens=160",
    "--config.actors.summary.max_segments=3", f"--config.eval.tasks={EVAL_TASKS}",
    f"--config.eval.samples={EVAL_SAMPLES}", "--config.eval.best_of=2", "--config.rl.pass_k=(1,2)",
    "--config.eval.process=False", "--config.env_service.local=2", "--config.trainer.rows=packed"]


def _opened(log: str) -> int:
  """Episodes a server's log says it opened (its line on a clean stop)."""
  return sum(map(int, re.findall(r"env server stopped: (\d+) episodes opened", log)))


def _tb_tags(directory: pathlib.Path) -> set[str]:
  """The scalar tags of the TensorBoard event files under `directory`, read by TensorBoard's own reader (what
  `tensorboard --logdir` shows; the job writes them with tensorboardX)."""
  from tensorboard.backend.event_processing import event_accumulator
  tags = set()
  for run in {path.parent for path in directory.rglob("events.out.tfevents.*")}:
    tags.update(event_accumulator.EventAccumulator(str(run)).Reload().Tags()["scalars"])
  return tags


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
                               "--config=configs/rl_long_horizon.py", f"--workdir={cls.work}", *CHAIN_FLAGS],
                              cwd=_ROOT, env=env, capture_output=True, text=True, timeout=1200)

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
    self.assertEqual(self.result["steps"], STEPS)
    for key in ("pass_at_1_before", "pass_at_1_after", "reward_heldout_before", "reward_heldout_after"):
      self.assertIn(key, self.result)
    self.assertGreaterEqual(len(self.groups), STEPS * GROUPS_PER_STEP)
    episode_turns, row_turns = [], set()
    for g in self.groups:
      d = g.data
      # The loss is on the model's actions: its turns and its summaries (configs/rl_long_horizon.py trains them).
      np.testing.assert_array_equal(d["loss_mask"], np.isin(d["source"], ACTIONS).astype(np.float32))
      model_turns = {}
      for r in range(d["tokens"].shape[0]):
        n = int(d["prompt_length"][r] + d["length"][r])
        self.assertTrue(np.all(d["source"][r, :int(d["prompt_length"][r])] == Source.PROMPT))
        source, turn = d["source"][r, :n], d["turn"][r, :n]
        turns = np.unique(turn[source == Source.MODEL])
        model_turns.setdefault(int(d["chain_id"][r]), set()).update(turns.tolist())
        for a, b in zip(turns, turns[1:]):  # the row's model turns, each answered by an observation before the next
          end, start = np.flatnonzero((source == Source.MODEL) & (turn == a))[-1], np.argmax(turn == b)
          self.assertIn(Source.OBSERVATION, source[end:start])
        row_turns.add(len(turns))
      episode_turns += [len(t) for t in model_turns.values()]
    # An untrained model writes no finish call: a row holds several turns with observations between them, and an
    # episode takes every turn (across its segments) unless a summary cut it, never more.
    self.assertGreater(max(row_turns), 1, row_turns)
    self.assertLessEqual(max(episode_turns), MAX_TURNS)
    self.assertIn(MAX_TURNS, episode_turns)
    lines = [json.loads(x) for x in (self.work / "metrics.jsonl").read_text().splitlines()]
    self.assertLen(lines, STEPS)

  def test_rl_main_says_where_it_is_and_where_its_outputs_are(self):
    """Each stage by name and place (this job has no SFT: four), the long first compiles announced before they
    start, the resolved config's path, and at the end where each output is (before the JSON line)."""
    err = self.proc.stderr
    names = ("compiling the sampling programs", "held-out evaluation before RL", "RL", "held-out evaluation after RL")
    self.assertIn(f"4 stages: {', '.join(names)}; their times on a 2-core box: docs/benchmarks.md", err)  # the plan
    starts = [err.index(f"stage {i}/4: {name}") for i, name in enumerate(names, 1)]
    self.assertEqual(starts, sorted(starts))
    for i, name in enumerate(names, 1):
      self.assertRegex(err, rf"stage {i}/4: {name} done in \d+")
    self.assertIn(f"stage 3/4: RL ({STEPS} steps)", err)
    self.assertIn("RL 3/4", err)  # the trainer's progress bar
    # The result reports each stage's seconds (tools/bench_main_job.py reads them).
    seconds = self.result["stage_seconds"]
    self.assertEqual(sorted(seconds), sorted(names))
    self.assertTrue(all(s > 0 for s in seconds.values()), seconds)
    # The engine's whole set compiles first, alone (announced once: the evaluations then reuse it); the actors wait
    # for the first weights, published when the evaluation before RL ends.
    engine = err.index("compiling the agent engine's programs")
    self.assertLess(starts[0], engine)
    self.assertLess(engine, starts[1])
    self.assertEqual(err.count("compiling the agent engine's programs"), 1)
    self.assertRegex(err, r"\n\d+ programs\n")
    waits = err.index("the actors start sampling when it ends")
    self.assertLess(starts[1], waits)
    self.assertLess(waits, err.index("stage 2/4: held-out evaluation before RL done"))
    self.assertIn("compiling the RL update", err)
    self.assertIn(f"resolved run config: {self.work}/config.json", err)
    out = self.proc.stdout.strip().splitlines()
    where = out.index(f"outputs in {self.work}:")
    listed = {line.split()[0]: line.split()[1] for line in out[where + 1:-1]}
    self.assertEqual(listed["model"], f"{self.work}/model")
    self.assertEqual(listed["config"], f"{self.work}/config.json")
    self.assertEqual(listed["TensorBoard"], f"{self.work}/tb")
    self.assertEqual(listed["report"], f"{self.work}/result.json")

  def test_rl_main_trains_on_chains_and_reports_their_figures(self):
    result, work = self.result, self.work
    # Every episode is counted once, by its number of compactions (0 .. max_segments - 1).
    counts = [result[f"episodes_with_{k}_compactions"] for k in range(3)]
    self.assertGreaterEqual(sum(counts), STEPS * GROUPS_PER_STEP * GROUP)
    self.assertGreater(result["summary_tokens_per_episode"], 0)
    self.assertAlmostEqual(result["needed_summary_fraction"], (counts[1] + counts[2]) / sum(counts), places=6)
    self.assertAlmostEqual(result["compactions_per_episode"], (counts[1] + 2 * counts[2]) / sum(counts), places=6)

    chained = 0
    for g in self.groups:
      d = g.data
      chains = d["chain_id"]
      np.testing.assert_array_equal(np.unique(chains), np.arange(GROUP))
      for c in range(GROUP):
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
    # groups' episodes (GROUP per group, one environment for all of an episode's segments) and the held-out
    # evaluation's before and after (tasks x samples each).
    self.assertTrue(all(n > 0 for n in opened), opened)
    self.assertGreaterEqual(sum(opened), GROUP * len(self.groups) + 2 * EVAL_TASKS * EVAL_SAMPLES)

  def test_the_evaluation_on_the_servers_equals_it_in_process(self):
    cfg = rl_run_config.from_json((self.work / "config.json").read_text())
    local = held_out_evaluation(dataclasses.replace(cfg, env_service=EnvServiceConfig()))
    here = local(jax.device_put(rl_loop.initial_params(cfg)))
    evals = [json.loads(x) for x in (self.work / "eval.jsonl").read_text().splitlines()]
    (before,) = [e for e in evals if e["when"] == "before"]
    self.assertEqual(before["reward/mean"], self.result["reward_heldout_before"])
    self.assertEqual(sorted(here), sorted(k for k in before if k not in ("when", "version")))
    self.assertIn("turns/mean", here)  # the agent's episodes, not only their rewards
    self.assertIn("compactions/mean", here)  # and their summaries
    for key, value in here.items():
      if isinstance(value, float) and math.isnan(value):
        self.assertTrue(math.isnan(before[key]), key)
      else:
        self.assertAlmostEqual(before[key], value, places=6, msg=key)


if __name__ == "__main__":
  absltest.main()
