"""The phased pretraining loop: metrics, models and the perplexity fit; exact resume after interruptions and kills."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
import chex
import pytest

from c2jax.model import checkpoint
from c2jax.services import pretrain_loop
from c2jax.services import pretrain_run_config
from configs import pretrain_tiny

pytestmark = pytest.mark.e2e  # whole pretraining runs, interrupted and resumed (`make test-unit` leaves them out)


def _small_config():
  """Two phases on a few stdlib files: bulk (T=32, plain rope) then a long phase (T=64, YaRN, MTP distilled)."""
  c = pretrain_tiny.get_config()
  c.phase_order = "bulk,long_context"
  c.phases.bulk.update(steps=4, seq_len=32, batch_size=2, warmup_steps=1)
  c.phases.bulk.sources.stdlib.max_files = 6
  c.phases.long_context.update(steps=3, seq_len=64, batch_size=2, warmup_steps=1)
  c.phases.long_context.rope.original_max_position_embeddings = 32
  c.phases.long_context.sources.stdlib_long.update(max_files=6, min_bytes=2000)
  c.eval.update(every=100, batches=1, batch_size=2, seq_len=32)
  c.log_every = 1
  c.checkpoint.every = 100
  return c


def _run(c, workdir, **kw):
  return pretrain_loop.run(pretrain_run_config.parse(c), workdir, **kw)


class _StopAfter:
  """stop() that turns True once `n` steps have run (it is polled once before each step)."""

  def __init__(self, n: int):
    self.calls, self.n = 0, n

  def __call__(self) -> bool:
    self.calls += 1
    return self.calls > self.n


def _losses(workdir: str) -> dict[int, tuple[float, float]]:
  out = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    m = json.loads(line)
    out[m["step"]] = (m["loss"], m["ce"])
  return out


class LoopTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.full_dir = tempfile.mkdtemp()
    cls.full = _run(_small_config(), cls.full_dir)

  def test_phases_write_metrics_models_and_a_perplexity_fit(self):
    r, d = self.full, self.full_dir
    self.assertEqual(r["steps"], 7)
    self.assertFalse(r["interrupted"])
    self.assertEqual(sorted(_losses(d)), list(range(1, 8)))
    phases = [json.loads(l)["phase"] for l in open(f"{d}/metrics.jsonl")]
    self.assertEqual(phases, ["bulk"] * 4 + ["long_context"] * 3)
    records = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    self.assertIn("mtp_kl", records[-1])  # self-distillation runs in the long phase only
    self.assertNotIn("mtp_ce", records[0])
    evals = [json.loads(l) for l in open(f"{d}/eval.jsonl")]
    self.assertEqual([e["step"] for e in evals], [0, 4, 7])
    self.assertTrue(all(b["tokens"] > a["tokens"] and b["flops"] > a["flops"] for a, b in zip(evals, evals[1:])))
    self.assertLess(r["heldout_ce_after"], r["heldout_ce_before"])
    self.assertTrue(os.path.exists(f"{d}/perplexity.png"))
    self.assertTrue(os.listdir(f"{d}/tb"))
    for name, rope_type in (("bulk", "default"), ("long_context", "yarn")):
      params, cfg = checkpoint.load_checkpoint(f"{d}/models/{name}")
      self.assertEqual(cfg.rope.type.value, rope_type)
      chex.assert_tree_all_finite(params)
    self.assertEqual(r["checkpoint"], f"{d}/models/long_context")

  def test_interrupted_and_resumed_run_trains_exactly_as_the_uninterrupted_one(self):
    d = tempfile.mkdtemp()
    c = _small_config()
    first = _run(c, d, stop=_StopAfter(2))  # stops inside the bulk phase
    self.assertTrue(first["interrupted"])
    self.assertEqual(first["steps"], 2)
    second = _run(c, d, stop=_StopAfter(3))  # finishes bulk, stops inside the long phase
    self.assertEqual(second["steps"], 5)
    final = _run(c, d)
    self.assertEqual(final["steps"], 7)
    # Bitwise: the same batches in the same order and the same optimizer state after every restart.
    self.assertEqual(_losses(d), _losses(self.full_dir))
    evals = [json.loads(l) for l in open(f"{d}/eval.jsonl")]
    full_evals = [json.loads(l) for l in open(f"{self.full_dir}/eval.jsonl")]
    self.assertEqual(evals, full_evals)
    # Nothing left to do: a fourth call reports the finished run.
    self.assertEqual(_run(c, d)["steps"], 7)

  def test_a_kill_after_a_periodic_checkpoint_loses_only_the_steps_after_it(self):
    d = tempfile.mkdtemp()
    c = _small_config()
    c.checkpoint.every = 2
    _run(c, d, stop=_StopAfter(3))  # checkpoints at step 2 (periodic) and 3 (on stop), logs steps 1-3
    # A kill right after step 3: its checkpoint never committed, its logs did.
    shutil.rmtree(os.path.join(d, "checkpoints", "3"))
    self.assertIn(3, _losses(d))
    final = _run(c, d)  # resumes from step 2, drops the logs of step 3, trains it again
    self.assertEqual(final["steps"], 7)
    self.assertEqual(_losses(d), _losses(self.full_dir))
    self.assertEqual([json.loads(l) for l in open(f"{d}/eval.jsonl")],
                     [json.loads(l) for l in open(f"{self.full_dir}/eval.jsonl")])


if __name__ == "__main__":
  absltest.main()
