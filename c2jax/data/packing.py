"""Tokenized documents -> fixed rows of T tokens with segment ids and per-segment positions (report section 3:
pretraining on packed sequences; attention never crosses documents).

The steps, each a grain transformation whose state checkpoints (grain replays from the parent's state):
  1. `tokenize`: a document -> {"tokens": [N] int32, "weights": [N] float32}: BOS + text + EOS; weights are the
     loss weight of each token (1 for plain text; 0 on the prompt and 1 on the response for chat documents).
  2. `ChunkDocument`: a document longer than T is cut into pieces of T tokens (the last one shorter). Each piece is
     its own segment, positions restarting at 0: simple and honest, the model never attends from one piece to
     another, and the first token of a piece is never a target (it would need the previous piece's context).
     A chat document (one with a weight-0 prompt part) longer than T is refused with one sentence instead: its
     answer would train without the prompt it answers.
  3. `pack_rows`: grain's first-fit packer places whole pieces into `num_bins` open rows (a piece never straddles
     two rows); a row holds several segments, padded at its end.
  4. `finish_batch`: rows -> the training batch below, with a short last batch padded by empty rows.

A batch (all numpy, B rows of T):
  tokens      [B, T] int32    token ids; the tokenizer's pad id on padding.
  segment_ids [B, T] int32    1, 2, ... for the segments of a row in order; 0 on padding.
  positions   [B, T] int32    0, 1, ... within each segment; padding counts on from 0 (so positions increase).
  loss_mask   [B, T] float32  the weight of predicting token i from tokens < i of its segment: 0 on padding, 0 at
                              the first token of every segment, the document's weight elsewhere.
"""

from __future__ import annotations

from typing import Sequence

import grain
import numpy as np

from c2jax.data.sources import Document, TokenDocument
from c2jax.data.tokenizer import Tokenizer

BATCH_KEYS = ("tokens", "positions", "segment_ids", "loss_mask")


def tokenize(doc: Document, tokenizer: Tokenizer) -> dict[str, np.ndarray]:
  """One document -> {"tokens": [N] int32, "weights": [N] float32}.

  Plain text: BOS + text + EOS, weight 1. Chat parts ((text, weight), ...): each part tokenized on its own (BOS
  before the first, EOS after the last, which takes the last part's weight: the sampler stops by emitting it).
  A `TokenDocument` is taken as it is (its ids must be in the tokenizer's vocabulary).
  """
  if isinstance(doc, TokenDocument):
    tokens = np.asarray(doc.tokens, np.int32)
    if tokens.min() < 0 or tokens.max() >= tokenizer.vocab_size:
      raise ValueError(f"A token document holds ids in [{tokens.min()}, {tokens.max()}], outside the tokenizer's "
                       f"{tokenizer.vocab_size} ids; it was recorded with another tokenizer.")
    return {"tokens": tokens, "weights": np.asarray(doc.weights, np.float32)}
  if isinstance(doc, str):
    tokens = tokenizer.encode(doc, bos=True, eos=True)
    return {"tokens": tokens, "weights": np.ones(tokens.shape, np.float32)}
  tokens, weights = [], []
  for i, (text, weight) in enumerate(doc):
    ids = tokenizer.encode(text, bos=i == 0, eos=i == len(doc) - 1)
    tokens.append(ids)
    weights.append(np.full(ids.shape, weight, np.float32))
  return {"tokens": np.concatenate(tokens).astype(np.int32), "weights": np.concatenate(weights)}


class ChunkDocument(grain.experimental.FlatMapTransform):
  """A tokenized document -> pieces of at most `seq_len` tokens (see the module docstring, step 2)."""

  def __init__(self, seq_len: int):
    self.seq_len = int(seq_len)
    self.max_fan_out = 1 << 30  # only MapDataset flat maps preallocate by this; documents have any length

  def flat_map(self, element: dict[str, np.ndarray]) -> Sequence[dict[str, np.ndarray]]:
    n, t = len(element["tokens"]), self.seq_len
    if n > t and np.any(element["weights"] == 0):
      # A chat document (a prompt part with weight 0) cut in pieces would train its answer without the prompt.
      raise ValueError(f"A chat demonstration of {n} tokens is longer than seq_len={t}: raise seq_len to >= {n} "
                       "(or shorten the prompts, e.g. instructions='brief' for coding-suite SFT).")
    return [{k: v[s:s + t] for k, v in element.items()} for s in range(0, n, t)]


def chunk_documents(ds: grain.IterDataset, seq_len: int) -> grain.IterDataset:
  """Step 2 over a dataset of tokenized documents."""
  return grain.experimental.FlatMapIterDataset(ds, ChunkDocument(seq_len))


def pack_rows(ds: grain.IterDataset, seq_len: int, pad_id: int, num_bins: int) -> grain.IterDataset:
  """Step 3: pieces of <= seq_len tokens -> rows {"tokens", "tokens_segment_ids", "tokens_positions",
  "weights"} of seq_len (grain's FirstFitPackIterDataset; more bins, less padding)."""
  return grain.experimental.FirstFitPackIterDataset(
      ds, length_struct={"tokens": seq_len, "weights": seq_len}, num_packing_bins=num_bins, shuffle_bins=False,
      meta_features=("weights",), padding_struct={"tokens": pad_id, "weights": 0.0})


def finish_batch(rows: dict[str, np.ndarray], batch_size: int, pad_id: int) -> dict[str, np.ndarray]:
  """Step 4: stacked packer rows [b <= B, T] -> the batch of the module docstring, [B, T]."""
  tokens = np.asarray(rows["tokens"], np.int32)
  segment_ids = np.asarray(rows["tokens_segment_ids"], np.int32)
  positions = np.asarray(rows["tokens_positions"], np.int32)
  weights = np.asarray(rows["weights"], np.float32)
  missing = batch_size - tokens.shape[0]
  if missing > 0:  # the last batch of a finite run: empty rows keep the shape (and the jitted step) fixed
    pad = lambda x, v: np.concatenate([x, np.full((missing,) + x.shape[1:], v, x.dtype)])
    tokens, segment_ids, positions, weights = (pad(tokens, pad_id), pad(segment_ids, 0), pad(positions, 0),
                                               pad(weights, 0.0))
  padding = segment_ids == 0
  # Padding sits at the end of a row: count it on from 0 so positions increase along the padding too.
  first_pad = np.argmax(np.concatenate([padding, np.ones_like(padding[:, :1])], axis=1), axis=1)
  positions = np.where(padding, np.arange(tokens.shape[1])[None, :] - first_pad[:, None], positions)
  loss_mask = np.where(padding | (positions == 0), 0.0, weights).astype(np.float32)
  return {"tokens": tokens, "positions": positions.astype(np.int32), "segment_ids": segment_ids,
          "loss_mask": loss_mask}


def packed_rows(docs: grain.IterDataset, tokenizer: Tokenizer, *, seq_len: int,
                num_bins: int) -> grain.IterDataset:
  """Steps 1-3: documents -> packed rows (the caller batches and finishes them)."""
  ds = docs.map(lambda doc: tokenize(doc, tokenizer))
  return pack_rows(chunk_documents(ds, seq_len), seq_len, tokenizer.pad_id, num_bins)
