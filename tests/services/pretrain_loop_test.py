"""The phased pretraining loop: metrics, models and the perplexity fit; exact resume after interruptions and kills."""

import contextlib
import glob
import io
import json
import os
import shutil
import struct
import tempfile

from absl.testing import absltest
import chex
import jax
import pytest

from c2jax.model import checkpoint
from c2jax.model.params import init_params
from c2jax.services import copy_metrics
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


def _run_saying(c, workdir, **kw) -> tuple[dict, str]:
  """`_run` and what it wrote to stderr (its stage lines and progress bar)."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    result = _run(c, workdir, **kw)
  return result, err.getvalue()


class _StopAfter:
  """stop() that turns True once `n` steps have run (it is polled once before each step)."""

  def __init__(self, n: int):
    self.calls, self.n = 0, n

  def __call__(self) -> bool:
    self.calls += 1
    return self.calls > self.n


def _tb_tags(paths) -> set[str]:
  """The scalar tags of TensorBoard event files (TFRecord framing: length, crc, Event proto, crc)."""
  from tensorboardX.proto import event_pb2
  tags = set()
  for path in paths:
    data, i = open(path, "rb").read(), 0
    while i + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      tags.update(v.tag for v in event_pb2.Event.FromString(data[i + 12:i + 12 + n]).summary.value)
      i += 12 + n + 4
  return tags


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
    cls.full, cls.said = _run_saying(_small_config(), cls.full_dir)

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
    # The copying probe at every evaluation: finite CEs of both batches, their ratios, and its plot.
    for e in evals:
      chex.assert_tree_all_finite({k: e[k] for k in copy_metrics.KEYS})
      self.assertAlmostEqual(e["copy_ratio"], e["copy_second_ce"] / e["copy_first_ce"])
      self.assertAlmostEqual(e["name_ratio"], e["name_later_ce"] / e["name_first_ce"])
    self.assertAlmostEqual(evals[0]["copy_ratio"], 1.0, delta=0.05)  # the random init copies nothing
    self.assertEqual(r["copy_ratio_after"], evals[-1]["copy_ratio"])
    self.assertTrue(os.path.exists(f"{d}/copying.png"))
    tags = _tb_tags(glob.glob(f"{d}/tb/events.out.tfevents.*"))
    self.assertContainsSubset({"eval/copy_ratio", "eval/name_ratio"}, tags)
    for name, rope_type in (("bulk", "default"), ("long_context", "yarn")):
      params, cfg = checkpoint.load_checkpoint(f"{d}/models/{name}")
      self.assertEqual(cfg.rope.type.value, rope_type)
      chex.assert_tree_all_finite(params)
    self.assertEqual(r["checkpoint"], f"{d}/models/long_context")
    # Each phase a stage by name and place, its bar labelled by it, its first (compiling) step announced.
    for line in ("stage 1/2: phase bulk (4 steps of 2 x 32 tokens)", "stage 1/2: phase bulk done in",
                 "pretrain: bulk 1/2", "compiling the training step of phase 'bulk' (batch 2 x 32 tokens",
                 "stage 2/2: phase long_context (3 steps of 2 x 64 tokens)", "stage 2/2: phase long_context done in",
                 "pretrain: long_context 2/2"):
      self.assertIn(line, self.said)

  def test_interrupted_and_resumed_run_trains_exactly_as_the_uninterrupted_one(self):
    d = tempfile.mkdtemp()
    c = _small_config()
    first = _run(c, d, stop=_StopAfter(2))  # stops inside the bulk phase
    self.assertTrue(first["interrupted"])
    self.assertEqual(first["steps"], 2)
    second, said = _run_saying(c, d, stop=_StopAfter(3))  # finishes bulk, stops inside the long phase
    self.assertEqual(second["steps"], 5)
    self.assertIn("stage 1/2: phase bulk done in", said)
    self.assertIn("stage 2/2: phase long_context stopped after", said)
    final, said = _run_saying(c, d)
    self.assertEqual(final["steps"], 7)
    self.assertIn("stage 1/2: phase bulk: trained before this run resumed", said)
    self.assertIn("stage 2/2: phase long_context done in", said)
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


def _bulk_config(steps=4, **checkpoint):
  """The bulk phase alone (T=32), with `checkpoint` fields."""
  c = _small_config()
  c.phase_order = "bulk"
  c.phases.bulk.steps = steps
  c.checkpoint.update(checkpoint)
  return c


class BaseModelTest(absltest.TestCase):
  """Points of a pretraining (`checkpoint.model_at`) and continued pretraining from one (`init_checkpoint`)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.result = _run(_bulk_config(model_at=(0, 2, 4)), cls.dir)

  def test_model_at_writes_each_point_with_its_perplexity(self):
    d = self.dir
    self.assertEqual(sorted(os.listdir(f"{d}/models")), ["bulk", "step_0", "step_2", "step_4"])
    self.assertEqual([json.loads(l)["step"] for l in open(f"{d}/eval.jsonl")], [0, 2, 4])
    last, _ = checkpoint.load_checkpoint(f"{d}/models/step_4")
    chex.assert_trees_all_equal(last, checkpoint.load_checkpoint(f"{d}/models/bulk")[0])
    cfg = pretrain_run_config.parse(_bulk_config())
    init = init_params(cfg.model_config, jax.random.key(cfg.seed))
    chex.assert_trees_all_equal(checkpoint.load_checkpoint(f"{d}/models/step_0")[0], init)  # the random init

  def test_continued_pretraining_starts_from_the_base_model(self):
    d = tempfile.mkdtemp()
    base = f"{self.dir}/models/step_2"
    # 4 steps, as the base run: the same schedule, so the base run's compiled step serves (what is checked is the
    # continued run's start, step 0).
    c = _bulk_config(steps=4, model_at=(0,))
    c.init_checkpoint = base
    _run(c, d)
    # Step 0 is the base's params: the same held-out CE as the base run at its step 2, the same weights.
    evals = {json.loads(l)["step"]: json.loads(l)["heldout_ce"] for l in open(f"{self.dir}/eval.jsonl")}
    first = json.loads(open(f"{d}/eval.jsonl").readline())
    self.assertEqual(first["step"], 0)
    self.assertAlmostEqual(first["heldout_ce"], evals[2], places=5)
    chex.assert_trees_all_equal(checkpoint.load_checkpoint(f"{d}/models/step_0")[0],
                                checkpoint.load_checkpoint(base)[0])

  def test_a_base_of_another_architecture_is_refused_naming_the_field(self):
    c = _bulk_config(steps=1)
    c.model_overrides.n_layers = 1
    c.init_checkpoint = f"{self.dir}/models/step_2"
    with self.assertRaisesRegex(ValueError, r"init_checkpoint=.* another architecture.*n_layers=3 \(the run: 1\)"):
      _run(c, tempfile.mkdtemp())

  def test_model_at_past_the_end_and_a_suite_bpe_without_its_suite_are_refused(self):
    with self.assertRaisesRegex(ValueError, r"model_at=\(9,\) names steps \[9\] after the last phase's end"):
      pretrain_run_config.parse(_bulk_config(model_at=(9,)))
    c = _bulk_config()
    c.tokenizer = "bpe:512"
    with self.assertRaisesRegex(ValueError, "name the suite in tokenizer_suite"):
      pretrain_run_config.parse(c)

  def test_the_main_jobs_pretraining_shares_its_model_and_tokenizer(self):
    from configs import rl_tiny
    from c2jax.services import rl_run_config
    p = pretrain_run_config.parse(pretrain_tiny.get_config("rl_tiny"))
    rl = rl_run_config.parse(rl_tiny.get_config())  # the default mode: what `make demo` runs after the pretraining
    self.assertEqual(p.model_config, rl.model_config)
    self.assertEqual((p.tokenizer, p.tokenizer_suite), (rl.task["tokenizer"], rl.task["coding_suite"]))


if __name__ == "__main__":
  absltest.main()
