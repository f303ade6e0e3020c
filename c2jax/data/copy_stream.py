"""The copying probe's data: rows of random strings each written twice, and which tokens are which copy.

  stream = CopyStream(seed=0)
  rows = stream.batch(16)                      # CopyRows: tokens [B, T] int32, part [B, T] int8 (a `Part` per token)
  rows = CopyStream(seed=12345).batch(32)      # a fixed held-out batch
  rows = CopyStream(seed=12345, tokenizer=tok).batch(8)   # the same strings in a run's own tokenizer, BOS first
  text = copy_text(np.random.default_rng(0), n_chars=4096)  # a document of copies (the "copy" data source)

A row is `s:s\\n t:t\\n ...` cut at T tokens: each string s is 24-48 symbols drawn uniformly from a 32-symbol alphabet
('a'-'z', '0'-'5', as bytes, so any vocabulary >= 256 holds them; `alphabet_size` takes fewer or, in byte rows,
more). The first copy of a symbol can be predicted no better than ln 32 = 3.47 nats; the second copy is fully
determined by the first, so a model with an in-context copying (induction) circuit drives its cross-entropy toward 0
while one without stays at ln 32. The gap between the two is what `tools/copy_probe.py` measures
(docs/experiments/copying.md). Each string's first symbol is `Part.OTHER` in both copies: the first symbol of the
second copy follows the separator, which an induction head cannot key on.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import numpy as np

from c2jax.data.tokenizer import Tokenizer

ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz012345", np.uint8).astype(np.int32)
SEPARATOR = ord(":")  # between the two copies of a string
END = ord("\n")  # after the second copy
# Symbols of a wider byte alphabet (`CopyStream.alphabet_size` > 32): ALPHABET, then every other byte from '!' up
# but the separator; 222 in all. Byte rows only: bytes above 127 have no text form for a tokenizer.
WIDE_ALPHABET = np.concatenate(
    [ALPHABET, np.asarray([b for b in range(33, 256) if b != SEPARATOR and b not in ALPHABET], np.int32)])


class Part(enum.IntEnum):
  """What a token of a copy row is, for scoring."""

  OTHER = 0  # separators and each copy's first symbol
  FIRST = 1  # a symbol of a string's first copy (unpredictable: ln 32 at best)
  SECOND = 2  # the same symbol in the second copy (determined by the first)


@dataclasses.dataclass(frozen=True)
class CopyRows:
  """tokens: [B, T] int32 byte ids; part: [B, T] int8, the `Part` of each token."""

  tokens: np.ndarray
  part: np.ndarray


@dataclasses.dataclass
class CopyStream:
  """A seeded stream of copy rows (one numpy generator: the same seed gives the same rows in every framework).

  Attributes:
    seed: the generator's seed.
    seq_len: T, tokens per row.
    min_len / max_len: the length range of a string (inclusive).
    alphabet_size: the strings' symbols are the first this many of WIDE_ALPHABET (32: ALPHABET; more only without a
      tokenizer); the first copy then costs ln(alphabet_size) at best.
  """

  seed: int = 0
  seq_len: int = 256
  min_len: int = 24
  max_len: int = 48
  tokenizer: Tokenizer | None = None
  alphabet_size: int = len(ALPHABET)

  def __post_init__(self):
    if not 2 <= self.min_len <= self.max_len:
      raise ValueError(f"string lengths [{self.min_len}, {self.max_len}] must satisfy 2 <= min_len <= max_len.")
    if self.seq_len < 2 * self.min_len + 2:
      raise ValueError(f"seq_len={self.seq_len} holds no whole pair of {self.min_len}-symbol copies; use >= "
                       f"{2 * self.min_len + 2}.")
    limit = len(ALPHABET) if self.tokenizer is not None else len(WIDE_ALPHABET)
    if not 2 <= self.alphabet_size <= limit:
      why = " with a tokenizer (wider alphabets hold bytes with no text form)." if self.tokenizer else "."
      raise ValueError(f"alphabet_size={self.alphabet_size} must be in [2, {limit}]{why}")
    self._rng = np.random.default_rng(self.seed)

  def _row(self) -> tuple[np.ndarray, np.ndarray]:
    encode: Callable[[np.ndarray], list[int]] = list  # bytes are the ids
    tokens, part = [], []
    if self.tokenizer is not None:
      tok = self.tokenizer
      encode = lambda symbols: [int(t) for t in tok.encode_text(symbols.astype(np.uint8).tobytes().decode("ascii"))]
      tokens, part = [tok.bos_id], [Part.OTHER]
    sep, end = encode(np.asarray([SEPARATOR])), encode(np.asarray([END]))
    while len(tokens) < self.seq_len:
      s = encode(_string(self._rng, self.min_len, self.max_len, WIDE_ALPHABET[:self.alphabet_size]))
      tokens += [*s, *sep, *s, *end]
      part += ([Part.OTHER] + [Part.FIRST] * (len(s) - 1) + [Part.OTHER] * len(sep) + [Part.OTHER]
               + [Part.SECOND] * (len(s) - 1) + [Part.OTHER] * len(end))
    return np.asarray(tokens[:self.seq_len], np.int32), np.asarray(part[:self.seq_len], np.int8)

  def batch(self, batch_size: int) -> CopyRows:
    """The next `batch_size` rows."""
    rows = [self._row() for _ in range(batch_size)]
    return CopyRows(tokens=np.stack([r[0] for r in rows]), part=np.stack([r[1] for r in rows]))


def _string(rng: np.random.Generator, min_len: int, max_len: int, alphabet: np.ndarray = ALPHABET) -> np.ndarray:
  """[n] symbol bytes of one random string, n uniform in [min_len, max_len], drawn uniformly from `alphabet`."""
  n = int(rng.integers(min_len, max_len + 1))
  return alphabet[rng.integers(0, len(alphabet), n)]


def copy_text(rng: np.random.Generator, n_chars: int, min_len: int = 24, max_len: int = 48) -> str:
  """Text of copy pairs (`s:s\\n`, the rows' format) until it holds at least `n_chars` characters: a document of the
  "copy" data source (c2jax/data/sources.py), which mixes copying into a pretraining phase's code."""
  out, size = [], 0
  while size < n_chars:
    s = _string(rng, min_len, max_len).astype(np.uint8).tobytes().decode("ascii")
    out.append(f"{s}{chr(SEPARATOR)}{s}{chr(END)}")
    size += len(out[-1])
  return "".join(out)


def copy_losses(token_ce: np.ndarray, part: np.ndarray) -> tuple[float, float]:
  """Mean cross-entropy of the first and of the second copies.

  Args:
    token_ce: [B, T-1] cross-entropy of predicting tokens[:, 1:] (nats).
    part: [B, T] the rows' `Part`s.
  Returns:
    (first-copy CE, second-copy CE).
  """
  target = np.asarray(part)[:, 1:]
  token_ce = np.asarray(token_ce, np.float64)
  return (float(token_ce[target == Part.FIRST].mean()), float(token_ce[target == Part.SECOND].mean()))
