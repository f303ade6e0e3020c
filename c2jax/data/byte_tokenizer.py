"""Byte-level tokenizer with special tokens: the self-contained default (no vocabulary files to download).

Ids 0..255 are bytes; specials follow: PAD=256, BOS=257, EOS=258, then any extra specials. Any model with
vocab_size >= 259 can be trained on it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """UTF-8 bytes as tokens. `extra_specials` are named tokens appended after EOS."""

  extra_specials: tuple[str, ...] = ()

  PAD = 256
  BOS = 257
  EOS = 258

  @property
  def vocab_size(self) -> int:
    return 259 + len(self.extra_specials)

  @property
  def pad_id(self) -> int:
    return self.PAD

  @property
  def bos_id(self) -> int:
    return self.BOS

  @property
  def eos_id(self) -> int:
    return self.EOS

  def special_id(self, name: str) -> int:
    return 259 + self.extra_specials.index(name)

  def encode(self, text: str, bos: bool = True, eos: bool = True) -> np.ndarray:
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
    parts = ([np.array([self.BOS], np.int32)] if bos else []) + [ids] + (
        [np.array([self.EOS], np.int32)] if eos else [])
    return np.concatenate(parts)

  def encode_text(self, text: str, controls: Sequence[str] = ()) -> np.ndarray:
    """[N] int32: the text's bytes; no text is ever a special token here (`controls` have no ids of their own)."""
    del controls
    return self.encode(text, bos=False, eos=False)

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    del skip_special_tokens  # PAD, BOS and EOS have no text of their own
    ids = np.asarray(ids).reshape(-1)
    data = ids[(ids >= 0) & (ids < 256)].astype(np.uint8).tobytes()
    return data.decode("utf-8", errors="replace")
