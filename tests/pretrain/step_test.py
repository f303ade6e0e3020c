"""The LM train step and the phased pretraining loop: outputs, phases, exact resume, errors."""

import functools
import json
import os
import shutil
import tempfile

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import checkpoint
from c2jax.pretrain import loop
from c2jax.pretrain import phases as phases_lib
from c2jax.pretrain.step import MtpTarget, StepConfig, init_state, train_step
from configs import pretrain_tiny
from configs.model import tiny


class StepTest(absltest.TestCase):

  def test_steps_lower_loss_and_bias_follows_balancing_rule(self):
    cfg = tiny.get_model_config()
    hp = StepConfig(learning_rate=3e-3, warmup_steps=1, total_steps=20, bias_update_rate=1e-2, z_loss_weight=1e-4,
                    mtp_target=MtpTarget.SELF_DISTILL)
    state = init_state(cfg, hp, jax.random.key(0))
    bias0 = state.params["moe_layers"]["moe"]["router_bias"]
    step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp))
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, cfg.vocab_size)
    segments = jnp.concatenate([jnp.ones((4, 20), jnp.int32), 2 * jnp.ones((4, 12), jnp.int32)], axis=1)
    positions = jnp.concatenate([jnp.arange(20), jnp.arange(12)])[None].repeat(4, 0)
    batch = {"tokens": tokens, "segment_ids": segments, "positions": positions}
    losses = []
    for _ in range(6):
      prev = state
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    self.assertLess(losses[-1], losses[0] - 0.1)
    chex.assert_tree_all_finite(state.params)
    self.assertEqual(int(state.step), 6)
    # The bias moves by exactly +-rate (or 0) per step: AdamW and weight decay never touch it.
    delta = np.abs(np.asarray(state.params["moe_layers"]["moe"]["router_bias"] -
                              prev.params["moe_layers"]["moe"]["router_bias"]))
    self.assertTrue(np.all(np.isclose(delta, 0.0) | np.isclose(delta, 1e-2)), delta)
    self.assertGreater(float(jnp.abs(state.params["moe_layers"]["moe"]["router_bias"] - bias0).max()), 0)
    for key in ("ce", "mtp_ce", "mtp_kl", "z_loss", "grad_norm", "expert_load_max"):
      self.assertIn(key, metrics)
    # 2 documents of 20 and 12 tokens: 19 + 11 next-token targets per row (document starts are not targets).
    self.assertEqual(float(metrics["tokens"]), 4 * 30)


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
    cls.full = loop.run(_small_config(), cls.full_dir)

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
    first = loop.run(c, d, stop=_StopAfter(2))  # stops inside the bulk phase
    self.assertTrue(first["interrupted"])
    self.assertEqual(first["steps"], 2)
    second = loop.run(c, d, stop=_StopAfter(3))  # finishes bulk, stops inside the long phase
    self.assertEqual(second["steps"], 5)
    final = loop.run(c, d)
    self.assertEqual(final["steps"], 7)
    # Bitwise: the same batches in the same order and the same optimizer state after every restart.
    self.assertEqual(_losses(d), _losses(self.full_dir))
    evals = [json.loads(l) for l in open(f"{d}/eval.jsonl")]
    full_evals = [json.loads(l) for l in open(f"{self.full_dir}/eval.jsonl")]
    self.assertEqual(evals, full_evals)
    # Nothing left to do: a fourth call reports the finished run.
    self.assertEqual(loop.run(c, d)["steps"], 7)


  def test_a_kill_after_a_periodic_checkpoint_loses_only_the_steps_after_it(self):
    d = tempfile.mkdtemp()
    c = _small_config()
    c.checkpoint.every = 2
    loop.run(c, d, stop=_StopAfter(3))  # checkpoints at step 2 (periodic) and 3 (on stop), logs steps 1-3
    # A kill right after step 3: its checkpoint never committed, its logs did.
    shutil.rmtree(os.path.join(d, "checkpoints", "3"))
    self.assertIn(3, _losses(d))
    final = loop.run(c, d)  # resumes from step 2, drops the logs of step 3, trains it again
    self.assertEqual(final["steps"], 7)
    self.assertEqual(_losses(d), _losses(self.full_dir))
    self.assertEqual([json.loads(l) for l in open(f"{d}/eval.jsonl")],
                     [json.loads(l) for l in open(f"{self.full_dir}/eval.jsonl")])


class ConfigTest(absltest.TestCase):

  def test_default_phases(self):
    c = pretrain_tiny.get_config()
    phases = phases_lib.phases_from_config(c, loop.model_config_from(c))
    self.assertEqual([p.name for p in phases], ["bulk", "long_context", "sft"])
    self.assertEqual([p.start for p in phases], [0, 60, 75])
    self.assertEqual([p.hp.mtp_weight > 0 for p in phases], [False, True, True])
    self.assertEqual({p.hp.mtp_target for p in phases[1:]}, {MtpTarget.SELF_DISTILL})
    self.assertEqual(phases[0].model.rope.type.value, "default")
    self.assertEqual((phases[1].model.rope.type.value, phases[1].model.rope.factor), ("yarn", 4.0))
    self.assertEqual(phases[2].model.rope, phases[1].model.rope)  # rope overrides carry into later phases
    self.assertEqual(phases[2].sources[0]["kind"], "sft")

  def test_errors_name_the_field(self):
    base = loop.model_config_from(pretrain_tiny.get_config())
    cases = [({"phase_order": "bulk,nope"}, "phases has only|`phases` has only"),
             ({"phase_order": ""}, "phase_order is empty"),
             ({"phase_order": "bulk,bulk"}, "twice")]
    for override, pattern in cases:
      c = pretrain_tiny.get_config()
      c.update(override)
      with self.assertRaisesRegex(ValueError, pattern):
        phases_lib.phases_from_config(c, base)
    c = pretrain_tiny.get_config()
    c.phases.bulk.decay = "exponential"
    with self.assertRaisesRegex(ValueError, "phases.bulk.decay"):
      phases_lib.phases_from_config(c, base)
    c = pretrain_tiny.get_config()
    c.phases.bulk.rope = {"factr": 2.0}
    with self.assertRaisesRegex(ValueError, "phases.bulk.rope has unknown fields"):
      phases_lib.phases_from_config(c, base)
    c = pretrain_tiny.get_config()
    c.phases.sft.seq_len = 100_000
    with self.assertRaisesRegex(ValueError, "max_position_embeddings"):
      phases_lib.phases_from_config(c, base)

  def test_unknown_model_name(self):
    c = pretrain_tiny.get_config()
    c.model = "nope"
    with self.assertRaisesRegex(ValueError, "configs/model/nope.py"):
      loop.model_config_from(c)


if __name__ == "__main__":
  absltest.main()
