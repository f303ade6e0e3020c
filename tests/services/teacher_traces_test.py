"""Multi-turn SFT demonstrations recorded through the agent loop (c2jax/services/teacher_traces.py): the scripted
teacher's chains on tiny_long_horizon as token documents, cached, and the SFT's data source over them; the agentic
main job's mixed teacher on tiny_spec, whose deliberate mistakes carry no loss."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from absl.testing import absltest
import numpy as np
import pytest

from c2jax.data.pipeline import lm_dataset
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.chat import self_summary
from c2jax.services import rl_run_config, teacher_traces, warm_start
from configs import rl_long_horizon
from configs import rl_tiny

pytestmark = pytest.mark.e2e  # records in a child process with real sandboxes (`make test-unit` leaves it out)

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(cache: str):
  c = rl_long_horizon.get_config()
  c.sft.enabled = True
  c.sft.cache_dir = cache
  c.sft.seq_len = 1024
  c.sft.teacher.policy = "summarizing_reader"
  c.sft.teacher.max_tasks = 2
  return rl_run_config.parse(c)


def _spec_cfg(cache: str):
  """The agentic main job's teacher (configs/rl_tiny.py) on its first 3 train tasks, 4 copies each."""
  c = rl_tiny.get_config("agentic")
  c.sft.cache_dir = cache
  c.sft.teacher.update(max_tasks=3, heldout_tasks=1)
  return rl_run_config.parse(c)


def _record(caches: dict[str, str], run_model: str) -> dict[str, str]:
  """Records the train traces of each `make_cfg`(cache) of `caches` (make_cfg name -> cache directory) in one process
  of their own, as a run records them (their programs compile there, not in this one; one process for all saves a
  start of python and jax), and `_cfg`'s documents once more with the run's model scoring the forced turns
  (`Scorer.RUN_MODEL`) into the JSON file `run_model`; returns make_cfg name -> the JSONL's path."""
  code = ("import json, sys; from tests.services import teacher_traces_test as t; from c2jax.services import "
          "teacher_traces as tt; caches = json.loads(sys.argv[1]); "
          "paths = {name: tt.ensure_traces(getattr(t, name)(cache), 'train') for name, cache in caches.items()}; "
          "docs = tt.record(t._cfg(caches['_cfg']), 'train', scorer=tt.Scorer.RUN_MODEL)[0]; "
          "json.dump(docs, open(sys.argv[2], 'w')); print(json.dumps(paths))")
  env = dict(os.environ, PYTHONPATH=str(_ROOT))
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
  proc = subprocess.run([sys.executable, "-c", code, json.dumps(caches), run_model], cwd=_ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  if proc.returncode != 0:
    raise AssertionError(f"recording failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


class TeacherTracesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    reason = sandbox_lib.unavailable_reason()
    if reason:
      raise unittest.SkipTest(reason)
    cls.caches = {name: tempfile.mkdtemp() for name in ("_cfg", "_spec_cfg")}
    for cache in cls.caches.values():
      cls.addClassCleanup(shutil.rmtree, cache, ignore_errors=True)
    cls.run_model = os.path.join(cls.caches["_cfg"], "run_model.json")
    cls.paths = _record(cls.caches, cls.run_model)

  def test_the_small_scorer_records_what_the_run_model_does(self):
    # Every turn forced: the documents (summaries and resumed segments included) do not depend on the model that
    # scores them, nor on the engine's shapes.
    with open(self.paths["_cfg"]) as f:
      small = [json.loads(line) for line in f]
    with open(self.run_model) as f:
      self.assertEqual(small, json.load(f))

  def test_spec_fixer_traces_train_the_recovery_not_the_mistake(self):
    cfg = _spec_cfg(self.caches["_spec_cfg"])
    path = self.paths["_spec_cfg"]
    stats = json.load(open(f"{path}.stats.json"))
    # All kept: the careless copies' failing episodes too (the careless teachers' KEEPS_FAILURES).
    self.assertEqual((stats["episodes"], stats["kept"], stats["copies"], stats["flawed"]), (12, 12, 4, 2))
    docs = [json.loads(line) for line in open(path)]
    self.assertLen(docs, 12)  # in task order, each task's 4 copies in order; no summaries (one segment each)
    tok = cfg.task_suite().text_tokenizer()
    recoveries = careless_wrong = 0
    suite = cfg.task_suite()
    for i, doc in enumerate(docs):
      tokens, weights = np.asarray(doc["tokens"]), np.asarray(doc["weights"])
      shown, trained = tok.decode(tokens), tok.decode(tokens[weights > 0])
      self.assertEqual(trained.count('<tool name="read_file">'), 1)
      # One write trained per episode: a recovering episode's first, wrong, write stays in the context unweighted.
      self.assertEqual(trained.count('<tool name="write_file">'), 1, i)
      failed = "FAILED (" in shown
      recoveries += failed
      self.assertEqual(shown.count('<tool name="write_file">'), 2 if failed else 1, i)
      # The written content (an incomplete call's runs to the end: then it is not the reference either).
      written = re.search(r'<arg name="content">\n?(.*?)(?:</arg>|$)', trained, re.S).group(1)
      right = written == suite.coding_task(suite.task("train", i // 4)).solution["solution.py"]
      if i % 4 >= 2:  # the last 2 copies of a task: the careless teacher, which never runs the tests
        self.assertNotIn('<tool name="run">', shown, i)
        careless_wrong += not right  # its careless write is trained on: the mistake is part of its demonstration
      else:
        self.assertIn('<tool name="run">', trained, i)
        self.assertTrue(right, i)  # spec_fixer trains only its right writes
    self.assertEqual(stats["masked_turns"], recoveries)
    self.assertEqual(stats["kept_failing"], careless_wrong)

  def test_recorded_chains_are_the_sft_data(self):
    cfg = _cfg(self.caches["_cfg"])
    path = self.paths["_cfg"]
    self.assertEqual(path, teacher_traces.traces_path(cfg, "train"))
    stats = json.load(open(f"{path}.stats.json"))
    self.assertEqual((stats["episodes"], stats["kept"]), (2, 2))
    self.assertGreaterEqual(stats["compactions_per_episode"], 1)  # no episode fits the actors' window
    docs = [json.loads(line) for line in open(path)]
    self.assertLen(docs, stats["segments"])
    self.assertGreater(len(docs), 2)
    suite = cfg.task_suite()
    tok = suite.text_tokenizer()  # the config's BPE (its EOS ends the teacher's turns)
    prompts = [suite.task("train", i).prompt for i in range(2)]
    for doc in docs:
      tokens, weights = np.asarray(doc["tokens"]), np.asarray(doc["weights"])
      self.assertLessEqual(len(tokens), cfg.actors.context)
      self.assertTrue(any(np.array_equal(tokens[:len(p)], p) for p in prompts))  # each segment opens with its task
      trained = tok.decode(tokens[weights > 0])
      self.assertIn("<tool ", trained)
      self.assertNotIn("<result", trained)  # observations are never trained on
      self.assertNotIn(self_summary.REQUEST_MARK, trained)
    # The chains' summaries are trained: every segment that ends in a summary has it among its weighted tokens.
    with_summary = sum("steps so far: " in tok.decode(np.asarray(d["tokens"])[np.asarray(d["weights"]) > 0])
                       for d in docs)
    self.assertEqual(with_summary, round(stats["compactions_per_episode"] * 2))

    # Cached: a second call records nothing.
    mtime = os.path.getmtime(path)
    self.assertEqual(teacher_traces.ensure_traces(cfg, "train"), path)
    self.assertEqual(os.path.getmtime(path), mtime)
    # The SFT reads them as token documents; its batches train exactly the teacher's tokens.
    source = warm_start.sft_config(cfg).phases["sft"].sources["tasks"]
    self.assertEqual(dict(source), {"kind": "token_docs", "path": path})
    ds = lm_dataset([dict(source)], tok, seq_len=1024, batch_size=len(docs), seed=0, num_epochs=1)
    batch = next(iter(ds))
    self.assertEqual(float(batch["loss_mask"].sum()), sum(sum(d["weights"][1:]) for d in docs))


if __name__ == "__main__":
  absltest.main()
