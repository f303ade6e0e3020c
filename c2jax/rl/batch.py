"""The RL training batch: what one update consumes, token by token and sequence by sequence (report section 4).

A *sequence* is one training sequence (prompt + response): a whole rollout, or one *segment* of a self-summary
chain: the model generates, summarizes its own context, and generates again on the summary; each generation is a
sequence, and the sequences of one trajectory share its `chain_id` and its final reward (report section 4,
"self-summarization"). The batch holds N sequences in B rows of T tokens, in one of two layouts:

  padded   one sequence per row, right-padded to T: N = B, no `segment_ids` (row b is sequence b)
  packed   several whole sequences per row (`c2jax.rl.packing`): `segment_ids` says which sequence each token
           belongs to and `positions` restart at 0 in each, so the model sees every sequence as it would alone

The padded layout is the packed one's special case, and the update is one function of both (a packed batch's
update equals its padded one's to float tolerance: tests/rl/packing_test.py).

  field               shape            dtype    meaning
  tokens              [B, T]           int32    prompt + response tokens (padding: any id, masked out)
  loss_mask           [B, T]           float32  1 where token t was sampled by the policy (the actions); 0 on
                                                prompt, tool output, summary-prompt and padding tokens
  behaviour_logprobs  [B, T]           float32  log mu(token t | tokens < t): the actor's sampling log-prob
                                                (report: "inference-time probability"), 0 off the mask
  policy_version      [B, T]           int32    version of the weights that sampled token t (in-flight updates
                                                can change it mid-sequence)
  group_id            [N]              int32    the prompt group (GRPO's G samples of one prompt); < 0 marks a
                                                padding sequence that carries no weight at all
  chain_id            [N]              int32    the trajectory; segments of one chain share it (unique per
                                                rollout otherwise)
  reward_terms        {name: [N]}      float32  raw reward signals of the chain, repeated on each of its sequences
                                                (names from `c2jax.rl.rewards.REWARD_TERMS`, e.g. outcome)
  truncated           [N]              float32  1 if the chain was cut at its length budget (overlong)
  expert_ids          [Lm, B, T, K]    int32    optional: the actor's routed experts per MoE layer and token
                                                (routing replay); ids at t are those of input token t
  positions           [B, T]           int32    optional (default arange(T)); required with segment_ids
  segment_ids         [B, T]           int32    packed layout only: the token's sequence, an index into the [N]
                                                fields; -1 on padding tokens (also the model's document ids, so
                                                attention never crosses sequences)

Log-probs are aligned to tokens: entry t is the log-prob of token t given the tokens of its sequence before it, so
the first token of a sequence is never a target and its `loss_mask` is ignored.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

REQUIRED_FIELDS = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version", "group_id", "chain_id",
                   "reward_terms", "truncated")
TOKEN_FIELDS = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version", "positions", "segment_ids")
SEQUENCE_FIELDS = ("group_id", "chain_id", "truncated")


def check_batch(batch: Mapping, n_moe_layers: int | None = None, experts_per_token: int | None = None) -> None:
  """Raises ValueError with one sentence naming the first missing field or inconsistent shape (works on
  arrays or `ShapeDtypeStruct`s, so it runs at trace time)."""
  missing = [f for f in REQUIRED_FIELDS if f not in batch]
  if missing:
    raise ValueError(f"RL batch lacks {', '.join(missing)}; see c2jax/rl/batch.py for the schema.")
  if not batch["reward_terms"]:
    raise ValueError("RL batch has no reward_terms; give at least {'outcome': [B]}.")
  b, t = batch["tokens"].shape
  n = batch["group_id"].shape[0] if len(batch["group_id"].shape) == 1 else None
  for f in TOKEN_FIELDS:
    if f in batch and tuple(batch[f].shape) != (b, t):
      raise ValueError(f"RL batch field {f} has shape {tuple(batch[f].shape)}; expected [B, T] = {(b, t)}.")
  for f in SEQUENCE_FIELDS:
    if tuple(batch[f].shape) != (n,):
      raise ValueError(f"RL batch field {f} has shape {tuple(batch[f].shape)}; expected [N] = {(n,)} like group_id.")
  for name, v in batch["reward_terms"].items():
    if tuple(v.shape) != (n,):
      raise ValueError(f"RL batch reward term {name!r} has shape {tuple(v.shape)}; expected [N] = {(n,)}.")
  if "segment_ids" in batch:
    if "positions" not in batch:
      raise ValueError("A packed RL batch (one with segment_ids) needs per-sequence positions; build it with "
                       "c2jax.rl.packing.pack_batch.")
  elif n != b:
    raise ValueError(f"RL batch has {n} sequences in {b} rows without segment_ids; a padded batch has one sequence "
                     "per row, a packed one needs segment_ids (c2jax.rl.packing.pack_batch).")
  if "expert_ids" in batch and n_moe_layers is not None:
    want = (n_moe_layers, b, t, experts_per_token)
    if tuple(batch["expert_ids"].shape) != want:
      raise ValueError(f"RL batch field expert_ids has shape {tuple(batch['expert_ids'].shape)}; expected "
                       f"[Lm, B, T, K] = {want}.")


def row_valid(batch: Mapping) -> jax.Array:
  """[N] float32: 1 for real sequences, 0 for padding ones (group_id < 0)."""
  return (jnp.asarray(batch["group_id"]) >= 0).astype(jnp.float32)


def sequence_index(batch: Mapping) -> jax.Array:
  """[B, T] int32: each token's sequence (its index into the [N] fields); -1 on the padding of a packed batch."""
  if "segment_ids" in batch:
    return jnp.asarray(batch["segment_ids"], jnp.int32)
  b, t = batch["tokens"].shape
  return jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, t))


def to_tokens(values: jax.Array, batch: Mapping) -> jax.Array:
  """Per-sequence values [N] -> [B, T] on each sequence's tokens, 0 on padding tokens."""
  seq = sequence_index(batch)
  return jnp.where(seq >= 0, jnp.take(jnp.asarray(values), jnp.maximum(seq, 0), axis=0), 0)


def per_sequence_sum(values: jax.Array, batch: Mapping) -> jax.Array:
  """Sums per-token values [B, T] over each sequence's tokens -> [N] (padding tokens count nowhere)."""
  seq = sequence_index(batch)
  values = jnp.where(seq >= 0, values, 0)
  return jax.ops.segment_sum(values.reshape(-1), jnp.maximum(seq, 0).reshape(-1),
                             num_segments=batch["group_id"].shape[0])


def sequence_starts(batch: Mapping) -> jax.Array:
  """[B, T] bool: the first token of each sequence (never a target: nothing of its sequence precedes it)."""
  seq = sequence_index(batch)
  return jnp.concatenate([jnp.ones_like(seq[:, :1], bool), seq[:, 1:] != seq[:, :-1]], axis=1)


def action_mask(batch: Mapping) -> jax.Array:
  """[B, T] float32: the loss mask with each sequence's first token, padding sequences and padding tokens cleared."""
  mask = jnp.asarray(batch["loss_mask"], jnp.float32) * to_tokens(row_valid(batch), batch)
  return jnp.where(sequence_starts(batch), 0.0, mask)


def chain_segments(chain_id: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per sequence: (number of valid sequences in its chain [N], 1 on the chain's first valid sequence else 0 [N]).

  Chains are identified by id, not by position: their sequences may sit anywhere in the batch. Counting a chain's
  statistics once (its reward, its advantage in the group mean) uses the first sequence as the representative.
  """
  same = (chain_id[:, None] == chain_id[None, :]) & (valid[None, :] > 0)  # [N, N] small: N sequences, not tokens
  count = jnp.sum(same, axis=1).astype(jnp.float32)
  earlier = jnp.tril(same, k=-1)  # sequence j < i of the same chain
  first = (~jnp.any(earlier, axis=1)) & (valid > 0)
  return count, first.astype(jnp.float32)


def segment_sum_by(ids: jax.Array, values: jax.Array, valid: jax.Array) -> jax.Array:
  """Per sequence, the sum of `values` over the valid sequences sharing its id: ids [N], values [N] -> [N]."""
  same = (ids[:, None] == ids[None, :]) & (valid[None, :] > 0)
  return jnp.sum(jnp.where(same, values[None, :], 0.0), axis=1)


def from_samples(samples, *, group_id, chain_id, reward_terms: Mapping, policy_version) -> dict:
  """An RL host batch from a sampler's output (`c2jax.actors.reference_sampler.Samples` or the fast sampler's).

  Args:
    samples: tokens, loss_mask, logprobs, expert_ids [Lm, B, T, K], stopped [B].
    group_id, chain_id: [B] int (see the schema above).
    reward_terms: {name: [B]} the environment's raw reward signals.
    policy_version: an int (the weights that sampled the whole batch) or [B, T] per token.
  """
  s = jax.device_get(samples)
  b, t = np.shape(s.tokens)
  version = np.broadcast_to(np.asarray(policy_version, np.int32), (b, t))
  batch = {"tokens": np.asarray(s.tokens, np.int32), "loss_mask": np.asarray(s.loss_mask, np.float32),
           "behaviour_logprobs": np.asarray(s.logprobs, np.float32), "policy_version": np.array(version),
           "group_id": np.asarray(group_id, np.int32), "chain_id": np.asarray(chain_id, np.int32),
           "reward_terms": {k: np.asarray(v, np.float32) for k, v in reward_terms.items()},
           "truncated": (~np.asarray(s.stopped, bool)).astype(np.float32),
           "expert_ids": np.asarray(s.expert_ids, np.int32)}
  check_batch(batch)
  return batch


def example_batch(b: int = 4, t: int = 8, n_moe_layers: int = 0, k: int = 1, seed: int = 0) -> dict:
  """A well-formed random host batch (numpy) for docs and tests: groups of 2 rollouts, prompts of 2 tokens."""
  rng = np.random.default_rng(seed)
  loss_mask = np.zeros((b, t), np.float32)
  loss_mask[:, 2:] = 1.0
  batch = {
      "tokens": rng.integers(0, 32, (b, t)).astype(np.int32),
      "loss_mask": loss_mask,
      "behaviour_logprobs": (-rng.random((b, t)) * loss_mask).astype(np.float32),
      "policy_version": np.zeros((b, t), np.int32),
      "group_id": (np.arange(b) // 2).astype(np.int32),
      "chain_id": np.arange(b, dtype=np.int32),
      "reward_terms": {"outcome": rng.integers(0, 2, b).astype(np.float32)},
      "truncated": np.zeros(b, np.float32),
  }
  if n_moe_layers:
    batch["expert_ids"] = rng.integers(0, 8, (n_moe_layers, b, t, k)).astype(np.int32)
  return batch
