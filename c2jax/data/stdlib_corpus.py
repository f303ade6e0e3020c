"""A real code corpus present on every machine: the running Python's standard-library sources.

Files are split into train / held-out by a hash of their relative path (stable across machines and runs), so
held-out perplexity is measured on files the model never trained on.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import sysconfig

import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer


def stdlib_files(split: str, heldout_fraction: float = 0.05, max_bytes: int = 200_000) -> list[pathlib.Path]:
  """Sorted stdlib .py files of `split` ('train' or 'heldout'); files over max_bytes are skipped."""
  if split not in ("train", "heldout"):
    raise ValueError(f"split={split!r}: use 'train' or 'heldout'.")
  return list(_splits(heldout_fraction, max_bytes)[split])


@functools.lru_cache(maxsize=4)
def _splits(heldout_fraction: float, max_bytes: int) -> dict[str, tuple[pathlib.Path, ...]]:
  # One walk for both splits, cached: walking the standard library takes a second or more on a busy machine.
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  out = {"train": [], "heldout": []}
  for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root).as_posix()
    if "site-packages" in rel or path.stat().st_size > max_bytes:
      continue
    bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    out["heldout" if bucket < heldout_fraction else "train"].append(path)
  if not out["train"] or not out["heldout"]:
    raise FileNotFoundError(f"no standard-library sources found under {root}; is this Python installed with them?")
  return {k: tuple(v) for k, v in out.items()}


def token_stream(split: str, tokenizer: ByteTokenizer, max_files: int | None = None) -> np.ndarray:
  """All files of a split tokenized and concatenated (BOS/EOS around each file): [N] int32."""
  files = stdlib_files(split)[:max_files]
  return np.concatenate([tokenizer.encode(f.read_text(encoding="utf-8", errors="replace")) for f in files])


def random_windows(stream: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
  """[batch, seq_len] int32 windows at random offsets of the stream."""
  if stream.size <= seq_len:
    raise ValueError(f"the corpus has {stream.size} tokens, fewer than seq_len={seq_len}; lower seq_len.")
  starts = rng.integers(0, stream.size - seq_len, size=batch)
  return np.stack([stream[s:s + seq_len] for s in starts]).astype(np.int32)
