"""Packed rows (c2jax/rl/packing.py): the packer moves every token and refuses what does not fit, and the update on a
packed batch equals the update on the same sequences padded (gradients and every metric), with self-summary chains,
a truncated chain, routing replay and micro-batches, on one device and on 8. (The RL loss has no MTP term:
`update.optimizer`.)"""


import dataclasses

from absl.testing import absltest, parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model.losses import token_log_probs
from c2jax.model.transformer import forward
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.rl import batch as batch_lib
from c2jax.rl import packing
from c2jax.rl.config import Overlong, RLConfig, RoutingReplay, ZeroVarianceGroups
from c2jax.rl.filters import FilterMode, PlausibilityFilter
from c2jax.rl.kl import KlPlacement
from c2jax.rl.policy_loss import SequenceUnit
from c2jax.rl.rewards import LengthPenaltyConfig, RewardConfig
from c2jax.rl.sharded import make_rl_trainer
from c2jax.rl.update import rl_gradients
from tests import tiny

T, PROMPT = 16, 3
MODEL = tiny.MODEL
# Sequence lengths (prompt + generation); the last sequence is a padding one (group_id -1).
LENGTHS = np.array([9, 16, 5, 7, 12, 4, 6, 10, 8, 11])
PACKED_ROWS = 6  # first-fit decreasing needs 5 rows of 16 for these 77 tokens; 6 splits into 2 micro-batches


def _padded_batch(seed: int = 0) -> dict:
  """N = 10 sequences of T = 16, one per row, with the tiny model's own log-probs (perturbed: off-policy) and
  routing.

  group 0: chain 0 = sequences 0 + 2 (a self-summary chain), chain 1 = sequences 1 + 3 (truncated: sequence 1 hit
           the budget), chain 2 = sequence 4;
  group 1: chain 5 = sequences 5, 6, 7 (three segments), chain 8 = sequence 8; sequence 9 is padding.
  Sequences 0 and 7 have observation tokens (loss mask 0) between their turns.
  """
  rng = np.random.default_rng(seed)
  n = len(LENGTHS)
  tokens = rng.integers(0, MODEL.vocab_size, (n, T)).astype(np.int32)
  idx = np.arange(T)[None]
  loss_mask = ((idx >= PROMPT) & (idx < LENGTHS[:, None])).astype(np.float32)
  loss_mask[0, 5:7] = 0.0
  loss_mask[7, 6:8] = 0.0
  out = tiny.jit(forward, cfg=MODEL, with_mtp=False)(tiny.params(MODEL), tokens)
  logp = np.zeros((n, T), np.float32)
  logp[:, 1:] = token_log_probs(out.logits[:, :-1], tokens[:, 1:])
  behaviour = ((logp + 0.5 * rng.normal(size=(n, T))) * loss_mask).astype(np.float32)
  return {"tokens": tokens, "loss_mask": loss_mask, "behaviour_logprobs": behaviour,
          "policy_version": rng.integers(0, 3, (n, T)).astype(np.int32),
          "group_id": np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, -1], np.int32),
          "chain_id": np.array([0, 1, 0, 1, 2, 5, 5, 5, 8, -1], np.int32),
          "reward_terms": {"outcome": np.array([1, 0, 1, 0, 0, 1, 1, 1, 0, 0], np.float32),
                           "style": np.array([0.5, -1, 0.5, -1, 0, 0.2, 0.2, 0.2, 0, 0], np.float32)},
          "truncated": (LENGTHS == T).astype(np.float32) * (np.arange(n) < n - 1),
          "expert_ids": np.asarray(out.expert_ids)}


_REWARD = RewardConfig(weights=(("outcome", 1.0), ("style", 0.1)),
                       length_penalty=LengthPenaltyConfig(weight=0.2, k=2.0, q=0.5, scale=10.0))
CONFIGS = {
    # The defaults (Dr. GRPO, C = N x T) with the KL in the loss, overlong masking and two micro-batches.
    "dr_grpo": dict(kl_coef=0.1, kl_placement=KlPlacement.LOSS_STRAIGHT_THROUGH, overlong=Overlong.MASK,
                    micro_batches=2, reward=_REWARD),
    # GRPO's per-sequence mean over segments, the KL in the reward, zero-variance groups dropped, whole sequences
    # filtered, no routing replay (the routing-agreement metric then compares routings token by token).
    "grpo": dict(advantage="grpo", aggregation="seq_mean_token_mean", sequence_unit=SequenceUnit.ROW, kl_coef=0.1,
                 kl_placement=KlPlacement.IN_REWARD, zero_variance_groups=ZeroVarianceGroups.DROP,
                 filter=PlausibilityFilter(mode=FilterMode.SEQUENCE, sequence_max_fraction=0.2),
                 routing_replay=RoutingReplay.OFF, reward=_REWARD),
}


def _grads(name: str, batch: dict):
  cfg = RLConfig(model=MODEL, **CONFIGS[name])
  fn = tiny.jit(rl_gradients, cfg=cfg)
  return jax.device_get(fn(tiny.params(MODEL), tiny.params(MODEL, 1), jnp.int32(3), batch))


class ParityTest(parameterized.TestCase):

  @parameterized.named_parameters(("dr_grpo", "dr_grpo"), ("grpo", "grpo"))
  @pytest.mark.slow
  def test_packed_update_equals_padded(self, name):
    padded = _padded_batch()
    packed = packing.pack_batch(padded, LENGTHS, rows=PACKED_ROWS)
    self.assertEqual(packed["tokens"].shape, (PACKED_ROWS, T))
    grads_padded, m_padded = _grads(name, padded)
    grads_packed, m_packed = _grads(name, packed)
    self.assertEqual(sorted(m_packed), sorted(m_padded))
    for k in m_padded:
      np.testing.assert_allclose(m_packed[k], m_padded[k], rtol=2e-5, atol=1e-6, err_msg=k)
    # The inputs exercise what packing could get wrong: clipped and filtered tokens, a masked truncated chain,
    # advantages that differ, and a gradient that is not zero.
    self.assertGreater(float(m_padded["clip_fraction"]), 0.0)
    self.assertGreater(float(m_padded["filtered_fraction"]), 0.0)
    self.assertGreater(float(m_padded["truncated_fraction"]), 0.0)
    self.assertGreater(float(m_padded["advantage/abs_mean"]), 0.0)
    if name == "grpo":
      self.assertEqual(float(m_padded["routing_agreement"]), 1.0)
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(grads_packed)[0], jax.tree.leaves(grads_padded)):
      scale = max(float(np.max(np.abs(w))), 1e-9)
      np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * scale, err_msg=jax.tree_util.keystr(path))
    self.assertGreater(float(np.max(np.abs(grads_padded["lm_head"]))), 0.0)

  def test_packed_sequence_fields_reach_their_tokens(self):
    padded = _padded_batch()
    packed = packing.pack_batch(padded, LENGTHS, rows=PACKED_ROWS)
    values = jnp.arange(len(LENGTHS), dtype=jnp.float32) + 1
    np.testing.assert_array_equal(batch_lib.per_sequence_sum(batch_lib.to_tokens(values, packed), packed),
                                  np.where(padded["group_id"] >= 0, values * LENGTHS, 0))
    # Each sequence's first token is cleared, whichever row and offset it landed at.
    full = np.asarray(batch_lib.action_mask(packed))
    np.testing.assert_array_equal(batch_lib.per_sequence_sum(full, packed),
                                  batch_lib.per_sequence_sum(batch_lib.action_mask(padded), padded))


class MeshTest(absltest.TestCase):

  @pytest.mark.mesh
  @pytest.mark.slow
  def test_packed_update_on_8_devices_matches_padded_on_one(self):
    # FSDP x EP x CP: the [N] sequence fields sharded over the batch axes like rows, gathered to the tokens. N = 12
    # (two more padding sequences) and 8 packed rows divide over micro-batches x data shards = 2 x 4.
    padded = _padded_batch()
    extra = lambda x, fill: np.concatenate([x, np.full((2,) + x.shape[1:], fill, x.dtype)])
    for f in ("tokens", "loss_mask", "behaviour_logprobs", "policy_version", "truncated"):
      padded[f] = extra(padded[f], 0)
    padded["group_id"], padded["chain_id"] = extra(padded["group_id"], -1), extra(padded["chain_id"], -1)
    padded["reward_terms"] = {k: extra(v, 0) for k, v in padded["reward_terms"].items()}
    padded["expert_ids"] = np.concatenate([padded["expert_ids"], padded["expert_ids"][:, :2]], axis=1)
    packed = packing.pack_batch(padded, np.concatenate([LENGTHS, [0, 0]]), rows=8)
    cfg = RLConfig(model=MODEL, **CONFIGS["dr_grpo"])
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, context=2))
    trainer = make_rl_trainer(cfg, mesh, batch_size=8, seq_len=T)
    state = trainer.init(jax.random.key(0), jax.tree.map(jnp.copy, tiny.params(MODEL)))
    state = dataclasses.replace(state, ref_params=jax.device_put(jax.tree.map(jnp.copy, tiny.params(MODEL, 1)),
                                                                 trainer.state_shardings.ref_params))
    state = dataclasses.replace(state, step=jax.device_put(jnp.int32(3), state.step.sharding))
    _, metrics = trainer.step(state, trainer.put_batch(packed))
    _, want = _grads("dr_grpo", padded)
    self.assertEqual(sorted(metrics), sorted(want))
    for k in want:
      np.testing.assert_allclose(metrics[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)
    self.assertGreater(float(want["filtered_fraction"]), 0.0)


class PackerTest(parameterized.TestCase):

  @parameterized.parameters(0, 1, 2)
  def test_every_token_moves_with_its_fields(self, seed):
    rng = np.random.default_rng(seed)
    n, t, lm, k = 12, 32, 2, 3
    lengths = rng.integers(0, t + 1, n)
    lengths[0] = t
    batch = batch_lib.example_batch(b=n, t=t, n_moe_layers=lm, k=k, seed=seed)
    batch["loss_mask"] = batch["loss_mask"] * (np.arange(t)[None] < lengths[:, None])
    batch["policy_version"] = rng.integers(0, 9, (n, t)).astype(np.int32)
    batch["group_id"][3] = -1  # a padding sequence: left out whatever its length
    rows = packing.rows_needed(np.where(batch["group_id"] >= 0, lengths, 0), t)
    packed = packing.pack_batch(batch, lengths, rows=rows + 1)
    seg = packed["segment_ids"]
    for i in range(n):
      where = seg == i
      want = 0 if i == 3 else lengths[i]
      self.assertEqual(int(where.sum()), want, f"sequence {i}")
      if not want:
        continue
      r = int(np.argmax(where.any(axis=1)))
      self.assertEqual(int(where[r].sum()), want)  # whole, in one row, contiguous
      cols = np.flatnonzero(where[r])
      self.assertEqual(cols[-1] - cols[0] + 1, want)
      np.testing.assert_array_equal(packed["positions"][r, cols], np.arange(want))
      for f in ("tokens", "loss_mask", "behaviour_logprobs", "policy_version"):
        np.testing.assert_array_equal(packed[f][r, cols], batch[f][i, :want], err_msg=f)
      np.testing.assert_array_equal(packed["expert_ids"][:, r, cols], batch["expert_ids"][:, i, :want])
    self.assertEqual(int((seg >= 0).sum()), int(lengths.sum() - lengths[3]))
    np.testing.assert_array_equal(packed["loss_mask"][seg < 0], 0)
    self.assertEqual(float(packed["loss_mask"].sum()), float(batch["loss_mask"][np.arange(n) != 3].sum()))
    for f in ("group_id", "chain_id", "truncated"):
      np.testing.assert_array_equal(packed[f], batch[f])
    batch_lib.check_batch(packed, lm, k)

  def test_refusals(self):
    batch = _padded_batch()
    with self.assertRaisesRegex(ValueError, r"need 5 packed rows of 16, more than rows=4"):
      packing.pack_batch(batch, LENGTHS, rows=4)
    short = LENGTHS.copy()
    short[2] = 3
    with self.assertRaisesRegex(ValueError, "Sequence 2 has loss-mask tokens past its length 3"):
      packing.pack_batch(batch, short, rows=PACKED_ROWS)
    long = LENGTHS.copy()
    long[0] = T + 1
    with self.assertRaisesRegex(ValueError, r"each must be in \[0, T = 16\]"):
      packing.pack_batch(batch, long, rows=PACKED_ROWS)
    packed = packing.pack_batch(batch, LENGTHS, rows=PACKED_ROWS)
    with self.assertRaisesRegex(ValueError, "takes a padded batch"):
      packing.pack_batch(packed, LENGTHS, rows=PACKED_ROWS)

  def test_buckets(self):
    self.assertEqual(packing.first_fit_decreasing([3, 8, 5, 0, 2], 10), [[1, 4], [2, 0]])
    self.assertEqual(packing.row_buckets(4, 32), (4, 8, 16, 32))
    self.assertEqual(packing.row_buckets(12, 32), (12, 24, 32))
    self.assertEqual(packing.row_buckets(32, 32), (32,))
    self.assertEqual(packing.pick_rows(LENGTHS[:-1], T, (4, 8, 10)), 8)
    with self.assertRaisesRegex(ValueError, "need 5 packed rows of 16, more than the largest bucket 4"):
      packing.pick_rows(LENGTHS[:-1], T, (2, 4))


if __name__ == "__main__":
  absltest.main()
