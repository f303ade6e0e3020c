"""The RL training batch: what one update consumes, row by row (report section 4).

A batch is a dict of arrays. A row is one training sequence (prompt + response, right-padded to T). A row is a
whole rollout, or one *segment* of a self-summary chain: the model generates, summarizes its own context, and
generates again on the summary; each generation is a row, and the rows of one trajectory share its `chain_id`
and its final reward (report section 4, "self-summarization").

  field               shape            dtype    meaning
  tokens              [B, T]           int32    prompt + response tokens (padding: any id, masked out)
  loss_mask           [B, T]           float32  1 where token t was sampled by the policy (the actions); 0 on
                                                prompt, tool output, summary-prompt and padding tokens
  behaviour_logprobs  [B, T]           float32  log mu(token t | tokens < t): the actor's sampling log-prob
                                                (report: "inference-time probability"), 0 off the mask
  policy_version      [B, T]           int32    version of the weights that sampled token t (in-flight updates
                                                can change it mid-sequence)
  group_id            [B]              int32    the prompt group (GRPO's G samples of one prompt); < 0 marks a
                                                padding row that carries no weight at all
  chain_id            [B]              int32    the trajectory; segments of one chain share it (unique per
                                                rollout otherwise)
  reward_terms        {name: [B]}      float32  raw reward signals of the chain, repeated on each of its rows
                                                (names from `c2jax.rl.rewards.REWARD_TERMS`, e.g. outcome)
  truncated           [B]              float32  1 if the chain was cut at its length budget (overlong)
  expert_ids          [Lm, B, T, K]    int32    optional: the actor's routed experts per MoE layer and token
                                                (routing replay); ids at t are those of input token t
  positions           [B, T]           int32    optional (default arange(T))
  segment_ids         [B, T]           int32    optional packing ids (default one document per row)

Log-probs are aligned to tokens: entry t is the log-prob of token t given the tokens before it, so entry 0 is
never a target and `loss_mask[:, 0]` is ignored.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

REQUIRED_FIELDS = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version", "group_id", "chain_id",
                   "reward_terms", "truncated")
TOKEN_FIELDS = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version", "positions", "segment_ids")
ROW_FIELDS = ("group_id", "chain_id", "truncated")


def check_batch(batch: Mapping, n_moe_layers: int | None = None, experts_per_token: int | None = None) -> None:
  """Raises ValueError with one sentence naming the first missing field or inconsistent shape (works on
  arrays or `ShapeDtypeStruct`s, so it runs at trace time)."""
  missing = [f for f in REQUIRED_FIELDS if f not in batch]
  if missing:
    raise ValueError(f"RL batch lacks {', '.join(missing)}; see c2jax/rl/batch.py for the schema.")
  if not batch["reward_terms"]:
    raise ValueError("RL batch has no reward_terms; give at least {'outcome': [B]}.")
  b, t = batch["tokens"].shape
  for f in TOKEN_FIELDS:
    if f in batch and tuple(batch[f].shape) != (b, t):
      raise ValueError(f"RL batch field {f} has shape {tuple(batch[f].shape)}; expected [B, T] = {(b, t)}.")
  for f in ROW_FIELDS:
    if tuple(batch[f].shape) != (b,):
      raise ValueError(f"RL batch field {f} has shape {tuple(batch[f].shape)}; expected [B] = {(b,)}.")
  for name, v in batch["reward_terms"].items():
    if tuple(v.shape) != (b,):
      raise ValueError(f"RL batch reward term {name!r} has shape {tuple(v.shape)}; expected [B] = {(b,)}.")
  if "expert_ids" in batch and n_moe_layers is not None:
    want = (n_moe_layers, b, t, experts_per_token)
    if tuple(batch["expert_ids"].shape) != want:
      raise ValueError(f"RL batch field expert_ids has shape {tuple(batch['expert_ids'].shape)}; expected "
                       f"[Lm, B, T, K] = {want}.")


def row_valid(batch: Mapping) -> jax.Array:
  """[B] float32: 1 for real rows, 0 for padding rows (group_id < 0)."""
  return (jnp.asarray(batch["group_id"]) >= 0).astype(jnp.float32)


def action_mask(batch: Mapping) -> jax.Array:
  """[B, T] float32: the loss mask with position 0 (never a target) and padding rows cleared."""
  mask = jnp.asarray(batch["loss_mask"], jnp.float32) * row_valid(batch)[:, None]
  return mask.at[:, 0].set(0.0)


def chain_segments(chain_id: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per row: (number of valid rows in its chain [B], 1 on the chain's first valid row else 0 [B]).

  Chains are identified by id, not by position: their rows may sit anywhere in the batch. Counting a chain's
  statistics once (its reward, its advantage in the group mean) uses the first row as the representative.
  """
  same = (chain_id[:, None] == chain_id[None, :]) & (valid[None, :] > 0)  # [B, B] small: B is rows, not tokens
  count = jnp.sum(same, axis=1).astype(jnp.float32)
  earlier = jnp.tril(same, k=-1)  # row j < i of the same chain
  first = (~jnp.any(earlier, axis=1)) & (valid > 0)
  return count, first.astype(jnp.float32)


def segment_sum_by(ids: jax.Array, values: jax.Array, valid: jax.Array) -> jax.Array:
  """Per row, the sum of `values` over the valid rows sharing its id: ids [B], values [B] -> [B]."""
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
