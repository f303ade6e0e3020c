"""Packed rows: the whole sequences of a padded RL batch placed, first-fit decreasing, into fewer rows of T.

  lengths = batch_lengths(...)                        # [N] tokens of each sequence (prompt + generation)
  rows = rows_needed(lengths, seq_len=T)              # how many rows of T first-fit decreasing needs
  packed = pack_batch(batch, lengths, rows=16)        # [16, T] token fields; the [N] sequence fields unchanged

A padded batch (`c2jax.rl.batch`) spends a row of T on every sequence; an agentic episode of ~370 tokens in a row of
1024 is two thirds padding, and the update's cost is the rows'. Packing moves each sequence's tokens (with their
loss mask, behaviour log-probs, policy versions and routed expert ids) into a row shared with other sequences,
writes `segment_ids` (the token's sequence: an index into the [N] fields; -1 on padding) and `positions` that
restart at 0 in each sequence, and leaves every per-sequence field as it is. The model then sees each sequence as
it saw it alone (same positions, attention never crossing sequences), and the update computes its per-sequence
terms on the [N] fields, so the packed update equals the padded one to float tolerance (tests/rl/packing_test.py).

A sequence never straddles two rows. Padding sequences (group_id < 0) and empty ones hold no tokens and take no
room. Fixed shapes: the caller picks the packed row count from a short ladder (`row_buckets`), and a batch that
does not fit the rows it is given is refused in one sentence, never cut.
"""

from __future__ import annotations

import enum
from typing import Any, Mapping, Sequence

import numpy as np


class RowLayout(enum.Enum):
  """How a trainer lays its sequences out in rows (`c2jax.rl.batch`): one per row, or packed."""

  PADDED = "padded"
  PACKED = "packed"

# Token fields [B, T] that move with their tokens (expert_ids [Lm, B, T, K] too, on its own axes).
_MOVED = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version")


def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int) -> list[list[int]]:
  """Bins of item indices: longest item first, each into the first bin with room (items of length 0 go nowhere).

  Args:
    lengths: [N] non-negative item lengths, each <= capacity.
    capacity: a bin's size.
  Returns:
    The bins in the order they were opened, each a list of item indices in the order placed.
  """
  sizes = np.asarray(lengths, np.int64)
  if sizes.size and (sizes.min() < 0 or sizes.max() > capacity):
    raise ValueError(f"Sequence lengths span [{sizes.min()}, {sizes.max()}]; each must be in [0, {capacity}] "
                     "(a sequence longer than a row cannot be packed whole).")
  bins: list[list[int]] = []
  room: list[int] = []
  # A stable sort, longest first: ties keep the batch's order, so packing is deterministic.
  for i in np.argsort(-sizes, kind="stable"):
    n = int(sizes[i])
    if n == 0:
      continue
    for j, r in enumerate(room):
      if n <= r:
        bins[j].append(int(i))
        room[j] -= n
        break
    else:
      bins.append([int(i)])
      room.append(capacity - n)
  return bins


def rows_needed(lengths: Sequence[int], seq_len: int) -> int:
  """Rows of `seq_len` that `pack_batch` needs for sequences of these lengths."""
  return len(first_fit_decreasing(lengths, seq_len))


def row_buckets(first: int, limit: int) -> tuple[int, ...]:
  """The packed row counts a trainer compiles for: first, 2 first, 4 first, ... below limit, then limit (the padded
  row count, which always fits). A few shapes, each compiled once."""
  if first < 1 or limit < 1:
    raise ValueError(f"Packed rows first={first} and limit={limit} must be >= 1.")
  out, b = [], first
  while b < limit:
    out.append(b)
    b *= 2
  return tuple(out) + (limit,)


def pick_rows(lengths: Sequence[int], seq_len: int, buckets: Sequence[int]) -> int:
  """The smallest bucket the sequences fit in; ValueError naming the need when none does."""
  need = rows_needed(lengths, seq_len)
  for b in sorted(buckets):
    if need <= b:
      return int(b)
  raise ValueError(f"The batch's sequences need {need} packed rows of {seq_len}, more than the largest bucket "
                   f"{max(buckets)}; raise the packed row count.")


def pack_batch(batch: Mapping, lengths: Sequence[int], rows: int) -> dict:
  """A padded RL host batch (numpy, one sequence per row) -> the same sequences packed into `rows` rows.

  Args:
    batch: the padded layout of `c2jax.rl.batch`: token fields [N, T], sequence fields [N], expert_ids
      [Lm, N, T, K] optionally; no segment_ids.
    lengths: [N] tokens of each sequence from the start of its row (prompt + generation); what lies past it is
      padding. Padding sequences (group_id < 0) are left out whatever their length.
    rows: B', the packed rows (the caller's fixed shape; `pick_rows`).

  Returns:
    The packed layout: token fields and expert_ids with B' rows, `segment_ids` and `positions` [B', T], the [N]
    sequence fields as given. Padding tokens carry zeros, segment -1, and positions counting on from 0.

  Raises:
    ValueError: a padded batch that is not one (segment_ids present), lengths out of [0, T], a loss-mask token past
      its sequence's length (it would be lost), or sequences that need more than `rows` rows.
  """
  if "segment_ids" in batch:
    raise ValueError("pack_batch takes a padded batch (one sequence per row, no segment_ids); this one is packed.")
  n, t = np.shape(batch["tokens"])
  sizes = np.asarray(lengths, np.int64)
  if sizes.shape != (n,):
    raise ValueError(f"pack_batch got {sizes.shape} lengths for a batch of {n} sequences; give one per row.")
  valid = np.asarray(batch["group_id"]) >= 0
  sizes = np.where(valid, sizes, 0)
  if sizes.min(initial=0) < 0 or sizes.max(initial=0) > t:
    raise ValueError(f"Sequence lengths span [{sizes.min()}, {sizes.max()}]; each must be in [0, T = {t}].")
  past = (np.arange(t)[None, :] >= sizes[:, None]) & (np.asarray(batch["loss_mask"]) != 0) & valid[:, None]
  if past.any():
    i = int(np.argmax(past.any(axis=1)))
    raise ValueError(f"Sequence {i} has loss-mask tokens past its length {sizes[i]}; its lengths are wrong (they "
                     "come from the buffer's prompt_length + length).")
  bins = first_fit_decreasing(sizes, t)
  if len(bins) > rows:
    raise ValueError(f"The batch's {int((sizes > 0).sum())} sequences ({int(sizes.sum())} tokens) need "
                     f"{len(bins)} packed rows of {t}, more than rows={rows}; raise rows (row_buckets, pick_rows).")
  out: dict[str, Any] = {f: np.zeros((rows, t), np.asarray(batch[f]).dtype) for f in _MOVED}
  segment_ids = np.full((rows, t), -1, np.int32)
  positions = np.zeros((rows, t), np.int32)
  ids = None
  if "expert_ids" in batch:
    src_ids = np.asarray(batch["expert_ids"])
    ids = np.zeros((src_ids.shape[0], rows, t, src_ids.shape[3]), src_ids.dtype)
  for r, members in enumerate(bins):
    at = 0
    for i in sorted(members):  # the batch's order within a row
      k = int(sizes[i])
      for f in _MOVED:
        out[f][r, at:at + k] = np.asarray(batch[f])[i, :k]
      segment_ids[r, at:at + k] = i
      positions[r, at:at + k] = np.arange(k)
      if ids is not None:
        ids[:, r, at:at + k] = src_ids[:, i, :k]
      at += k
    positions[r, at:] = np.arange(t - at)  # padding counts on from 0, so positions increase along it too
  out.update(segment_ids=segment_ids, positions=positions)
  if ids is not None:
    out["expert_ids"] = ids
  for f in ("group_id", "chain_id", "truncated"):
    out[f] = np.asarray(batch[f])
  out["reward_terms"] = {k: np.asarray(v) for k, v in batch["reward_terms"].items()}
  return out
