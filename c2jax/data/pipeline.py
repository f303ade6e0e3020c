"""The language-model data pipeline: sources -> shard -> shuffle -> epochs -> tokenize -> chunk -> mix -> window
shuffle -> pack -> batch (report section 3: continued pretraining on code; the same pipeline serves the bulk,
long-context and SFT phases with other sources and sequence lengths).

  ds = lm_dataset([{"kind": "stdlib", "split": "train", "max_files": 400}], ByteTokenizer(),
                  seq_len=128, batch_size=8, seed=0, **host_shard())
  it = iter(ds)
  batch = next(it)              # {"tokens", "positions", "segment_ids", "loss_mask"}: [B, T] numpy (packing.py)
  state = it.get_state()        # JSON-serializable; store it with the model checkpoint
  it = iter(lm_dataset(...same arguments...)); it.set_state(state)   # continues exactly where it was

  heldout = eval_batches({"kind": "stdlib", "split": "heldout"}, ByteTokenizer(), seq_len=128, batch_size=8,
                         n_batches=4)

Order of operations, and why:
  * Each source's documents are sharded by index (documents shard_index + k * shard_count: hosts read disjoint
    documents that together cover the source), then shuffled by a seeded permutation that changes every epoch,
    and repeated `num_epochs` times (None: forever).
  * A document is read and tokenized in one call per visit, on grain's read threads, and cut into pieces of <= T
    tokens.
  * Sources are mixed by weight at the piece level (grain's IterDataset.mix), so a weight is a share of pieces:
    of tokens, when documents are long compared to T. With a finite `num_epochs` the mixture ends when the first
    source runs out (grain's mix), which for one source is exactly `num_epochs` passes.
  * Pieces are shuffled in windows of about `shuffle_window_tokens` tokens, so that a batch does not hold
    consecutive pieces of one long document, then packed and batched. The last batch of a finite run is padded
    with empty rows (loss_mask 0) to keep B.
Every stage is a grain dataset whose iterator state is a small dict of ints (stages that buffer, the window
shuffle and the packer, store their parent's state where the buffer began and replay it on restore), so the state
is JSON and a restored iterator yields bitwise the batches the uninterrupted one would have.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import grain
import numpy as np

from c2jax.data import packing
from c2jax.data import sources as sources_lib
from c2jax.data.tokenizer import Tokenizer
from c2jax.data.window_shuffle import WindowShuffleIterDataset

# grain's read threads per source: tokenization and file reads overlap with the training step. Few, since the
# hosts this runs on for tests have two cores.
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)


def host_shard() -> dict[str, int]:
  """{"shard_index": jax.process_index(), "shard_count": jax.process_count()}: one shard per host."""
  import jax  # the pipeline itself does not need jax
  return {"shard_index": jax.process_index(), "shard_count": jax.process_count()}


def _seed(seed: int, *salt: int) -> int:
  """A 32-bit seed derived from (seed, salt...) (grain's shuffles take seeds below 2**32)."""
  return int(np.random.SeedSequence([int(seed) % 2**32, *salt]).generate_state(1)[0])


def _check_args(seq_len: int, batch_size: int, shard_index: int, shard_count: int, num_epochs: int | None) -> None:
  if seq_len < 2:
    raise ValueError(f"seq_len={seq_len}: a row needs at least 2 tokens (one to predict from, one to predict).")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size}: use a positive batch size.")
  if shard_count < 1 or not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} must lie in [0, shard_count={shard_count}); use host_shard().")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs={num_epochs}: use a positive number of epochs, or None to repeat forever.")


class _Shard:
  """Documents shard_index, shard_index + shard_count, ... of a source, as a random-access sequence. (A fresh
  source rather than `docs[shard_index::shard_count]`: how a slice maps the indices of later epochs that a shuffle
  and a repeat above it ask for has changed between grain versions.)"""

  def __init__(self, docs: grain.MapDataset, shard_index: int, shard_count: int):
    self._docs, self._first, self._step = docs, shard_index, shard_count
    self._len = len(range(shard_index, len(docs), shard_count))

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, i: int):
    return self._docs[self._first + i * self._step]


def _source_pieces(spec: Mapping, index: int, tokenizer: Tokenizer, *, seq_len: int, seed: int, shard_index: int,
                   shard_count: int, num_epochs: int | None) -> grain.IterDataset:
  """One source's shard -> shuffled, repeated, tokenized pieces of <= seq_len tokens."""
  docs = sources_lib.open_source(spec)
  if len(docs) < shard_count:  # some hosts would get no documents at all
    raise ValueError(f"Data source {sources_lib.describe(spec)} has {len(docs)} documents, fewer than the "
                     f"{shard_count} shards; give it more documents or run on fewer hosts.")
  shard = grain.MapDataset.source(_Shard(docs, shard_index, shard_count))
  shard = shard.shuffle(seed=_seed(seed, index)).repeat(num_epochs)
  tokens = shard.map(lambda doc: packing.tokenize(doc, tokenizer))
  return packing.chunk_documents(tokens.to_iter_dataset(read_options=_READ_OPTIONS), seq_len)


def _weights(specs: Sequence[dict]) -> list[float]:
  weights = []
  for spec in specs:
    w = spec.get("weight", 1.0)
    if not isinstance(w, (int, float)) or isinstance(w, bool) or not w > 0:
      raise ValueError(f"Data source {sources_lib.describe(spec)} has weight {w!r}; weights must be positive "
                       "numbers (drop a source instead of weighting it 0).")
    weights.append(float(w))
  return weights


def lm_dataset(sources: Sequence[Mapping], tokenizer: Tokenizer, *, seq_len: int, batch_size: int, seed: int,
               shard_index: int = 0, shard_count: int = 1, num_epochs: int | None = None,
               shuffle_window_tokens: int = 1 << 20, num_bins: int | None = None) -> grain.IterDataset:
  """Batches of packed rows from a weighted mixture of sources (see the module docstring).

  Args:
    sources: source dicts (c2jax/data/sources.py), each with an optional mixing "weight" (default 1).
    tokenizer: a `Tokenizer` (c2jax/data/tokenizer.py).
    seq_len: T, tokens per row.
    batch_size: B, rows per batch (per host: each host draws its own batches from its shard).
    seed: drives the document shuffles and the piece shuffle; the same seed gives the same batches.
    shard_index, shard_count: this host's shard (`host_shard()`).
    num_epochs: passes over each source; None repeats forever.
    shuffle_window_tokens: the piece shuffle's window, in tokens (it holds about 8 bytes per token).
    num_bins: rows the packer fills at once (more: less padding); default max(B, 16).

  Returns:
    A grain IterDataset of {"tokens", "positions", "segment_ids", "loss_mask"} numpy batches [B, T]; its
    iterators' `get_state()` is JSON-serializable and `set_state` restores it exactly.
  """
  _check_args(seq_len, batch_size, shard_index, shard_count, num_epochs)
  specs = [sources_lib.as_dict(s) for s in sources]
  if not specs:
    raise ValueError("lm_dataset needs at least one data source, e.g. {'kind': 'stdlib', 'split': 'train'}.")
  weights = _weights(specs)
  parts = [_source_pieces(spec, i, tokenizer, seq_len=seq_len, seed=seed, shard_index=shard_index,
                          shard_count=shard_count, num_epochs=num_epochs) for i, spec in enumerate(specs)]
  pieces = parts[0] if len(parts) == 1 else grain.IterDataset.mix(parts, weights)
  window = max(1, shuffle_window_tokens // seq_len)
  if window > 1:
    pieces = WindowShuffleIterDataset(pieces, window_size=window, seed=_seed(seed, 1 << 20))
  rows = packing.pack_rows(pieces, seq_len, tokenizer.pad_id, num_bins or max(batch_size, 16))
  pad_id = tokenizer.pad_id
  return rows.batch(batch_size).map(lambda b: packing.finish_batch(b, batch_size, pad_id))


def eval_batches(source: Mapping, tokenizer: Tokenizer, *, seq_len: int, batch_size: int, n_batches: int,
                 seed: int = 0) -> list[dict[str, np.ndarray]]:
  """The first `n_batches` batches of one seeded pass over `source` (one shard, the training pipeline's shuffles):
  the same held-out batches on every call, drawn from across the source rather than from its first documents
  (the piece shuffle's window spans ~1M tokens). Fewer when the source holds fewer."""
  if n_batches < 1:
    raise ValueError(f"n_batches={n_batches}: ask for at least one evaluation batch.")
  out = []
  for batch in lm_dataset([source], tokenizer, seq_len=seq_len, batch_size=batch_size, seed=seed, num_epochs=1):
    out.append(batch)
    if len(out) == n_batches:
      break
  return out
