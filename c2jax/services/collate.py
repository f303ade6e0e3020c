"""From buffer groups to the RL training batch (c2jax/rl/batch.py), and the staleness of their tokens (report
section 6: PipelineRL-style in-flight updates make tokens of one batch come from several policy versions).

  groups = reader.take(8)
  batch = groups_to_batch(groups, rows=64)           # [64, T] arrays, padding rows have group_id -1
  zeros = empty_batch(spec, rows=64)                 # the same shapes, all zeros (a multi-host broadcast template)
  lag = staleness(batch, trainer_version=step)       # per action token: trainer version - sampling version
  lengths = sequence_lengths(groups, rows=64)        # [64] tokens of each row, 0 on padding rows
  packed = lay_out(batch, lengths, buckets=(16, 32, 64))   # the same 64 sequences in 16 (or 32, 64) packed rows
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from c2jax.rl import batch as batch_lib
from c2jax.rl import packing
from c2jax.rollouts.buffer import Group
from c2jax.rollouts.schema import BufferSpec

_TOKEN = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version")


def empty_batch(spec: BufferSpec, rows: int) -> dict:
  """Zeros shaped like a collated batch of `rows` rows of `spec`: what processes other than 0 of a multi-host
  trainer pass to the broadcast of process 0's batch."""
  t = spec.seq_len
  batch = {"tokens": np.zeros((rows, t), np.int32), "loss_mask": np.zeros((rows, t), np.float32),
           "behaviour_logprobs": np.zeros((rows, t), np.float32), "policy_version": np.zeros((rows, t), np.int32),
           "group_id": np.zeros((rows,), np.int32), "chain_id": np.zeros((rows,), np.int32),
           "reward_terms": {n: np.zeros((rows,), np.float32) for n in spec.reward_terms},
           "truncated": np.zeros((rows,), np.float32)}
  if spec.n_moe_layers:
    batch["expert_ids"] = np.zeros((spec.n_moe_layers, rows, t, spec.experts_per_tok), np.int32)
  return batch


def groups_to_batch(groups: Sequence[Group], rows: int | None = None) -> dict:
  """Concatenates the groups' rows into one RL host batch (numpy).

  Args:
    groups: committed groups (all of one buffer spec).
    rows: B, pad to this many rows with padding rows (zeros, loss_mask 0, group_id and chain_id -1); None: no
      padding. ValueError if the groups hold more rows.

  Returns:
    The batch of c2jax/rl/batch.py: tokens, loss_mask, behaviour_logprobs, policy_version [B, T]; group_id (the
    group's index in `groups`), chain_id (unique across the batch: the group's offset plus its local chain id),
    truncated [B]; reward_terms {name: [B]}; expert_ids [Lm, B, T, K] when the groups carry them.
  """
  if not groups:
    raise ValueError("groups_to_batch needs at least one group.")
  datas = [g.data for g in groups]
  n = sum(int(d["tokens"].shape[0]) for d in datas)
  b = n if rows is None else rows
  if n > b:
    raise ValueError(f"The {len(groups)} groups hold {n} rows, more than the batch's rows={rows}; take fewer groups "
                     f"or raise rows.")
  terms = sorted(datas[0]["reward_terms"])
  for i, d in enumerate(datas):
    if sorted(d["reward_terms"]) != terms:
      raise ValueError(f"Group {i} has reward terms {sorted(d['reward_terms'])}, group 0 has {terms}.")
  pad = b - n

  def cat(parts, fill, dtype):
    parts = list(parts)
    if pad:
      shape = (pad,) + parts[0].shape[1:]
      parts.append(np.full(shape, fill, dtype))
    return np.concatenate(parts).astype(dtype)

  batch = {f: cat((d[f] for d in datas), 0, np.float32 if f in ("loss_mask", "behaviour_logprobs") else np.int32)
           for f in _TOKEN}
  batch["group_id"] = cat((np.full(d["tokens"].shape[0], i, np.int32) for i, d in enumerate(datas)), -1, np.int32)
  chain_ids, offset = [], 0
  for i, d in enumerate(datas):
    local = np.asarray(d["chain_id"], np.int64)
    if local.min() < 0:
      raise ValueError(f"Group {i} has a negative chain_id {local.min()}; local chain ids are >= 0.")
    chain_ids.append((local + offset).astype(np.int32))
    offset += int(local.max()) + 1
  batch["chain_id"] = cat(chain_ids, -1, np.int32)
  batch["truncated"] = cat((d["truncated"] for d in datas), 0, np.float32)
  batch["reward_terms"] = {t: cat((d["reward_terms"][t] for d in datas), 0, np.float32) for t in terms}
  if "expert_ids" in datas[0]:
    ids = np.concatenate([d["expert_ids"] for d in datas], axis=1).astype(np.int32)
    if pad:
      ids = np.concatenate([ids, np.zeros((ids.shape[0], pad) + ids.shape[2:], np.int32)], axis=1)
    batch["expert_ids"] = ids
    batch_lib.check_batch(batch, ids.shape[0], ids.shape[3])
  else:
    batch_lib.check_batch(batch)
  return batch


def sequence_lengths(groups: Sequence[Group], rows: int | None = None) -> np.ndarray:
  """[B] int32: the tokens of each row of `groups_to_batch(groups, rows)` (its prompt_length + length; 0 on padding
  rows): where each sequence ends, which packing needs."""
  parts = [np.asarray(g.data["prompt_length"], np.int64) + np.asarray(g.data["length"], np.int64) for g in groups]
  lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
  n = lengths.shape[0]
  b = n if rows is None else rows
  if n > b:
    raise ValueError(f"The {len(groups)} groups hold {n} rows, more than rows={rows}.")
  return np.concatenate([lengths, np.zeros(b - n, np.int64)]).astype(np.int32)


def lay_out(batch: dict, lengths: np.ndarray, buckets: Sequence[int] | None) -> dict:
  """A padded batch as the trainer's layout: itself (buckets None), or packed (`c2jax.rl.packing`) into the smallest
  of `buckets` rows its sequences fit in."""
  if buckets is None:
    return batch
  return packing.pack_batch(batch, lengths, packing.pick_rows(lengths * (np.asarray(batch["group_id"]) >= 0),
                                                              np.shape(batch["tokens"])[1], buckets))


def staleness(batch_or_groups: dict | Sequence[Group], trainer_version: int) -> np.ndarray:
  """Per action token, how many updates behind the consuming trainer version its sampling policy was.

  Args:
    batch_or_groups: an RL batch (padding rows, group_id < 0, are left out) or a list of groups.
    trainer_version: the weights version of the update that consumes them.

  Returns:
    [N] int32, trainer_version - policy_version over the tokens with loss_mask 1 (row-major order).
  """
  if isinstance(batch_or_groups, dict):
    mask = np.asarray(batch_or_groups["loss_mask"]) > 0
    mask &= (np.asarray(batch_or_groups["group_id"]) >= 0)[:, None]
    version = np.asarray(batch_or_groups["policy_version"])
  else:
    if not batch_or_groups:
      return np.zeros(0, np.int32)
    mask = np.concatenate([np.asarray(g.data["loss_mask"]) > 0 for g in batch_or_groups])
    version = np.concatenate([np.asarray(g.data["policy_version"]) for g in batch_or_groups])
  return (int(trainer_version) - version[mask]).astype(np.int32)
