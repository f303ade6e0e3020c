"""Copying inside real code: which tokens of a document continue a name it used before, and which a new name.

  rows = name_rows(docs, tok, seq_len=256, n_rows=8)   # NameRows: tokens [B, T] int32, part [B, T] int8 (`NamePart`)
  part = label_names("x = 1\nx += 2\n", token_ends)     # [N] the `NamePart` of each token, from its character ends

A name is an identifier (`[A-Za-z_][A-Za-z0-9_]*`) that is not one of the language's keywords (Python's by default).
An occurrence of a name is FIRST where the name does not occur earlier in the same row (what the model has seen of
the document), LATER where it does: a later use can be copied from context, a first one cannot. The tokens that count
are those lying wholly inside the occurrence after its first token: the first token is where the name is chosen (or
where a byte-level BPE's leading space joins it); the rest is what copying writes, the same convention as the copy
stream's (`c2jax.data.copy_stream`: each copy's first symbol is not scored). A name of one token has no token that
counts. The CE of LATER tokens against FIRST tokens is the "copying span in real code" probe
(`c2jax.services.copy_metrics`).

Documents are read as ASCII (other characters dropped) so that a token's characters are its decoded text; a
document whose tokens do not decode back to its text is skipped.
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
import re
from typing import Iterable, Sequence

import numpy as np

from c2jax.data.tokenizer import Tokenizer

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PYTHON_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)


class NamePart(enum.IntEnum):
  """What a token of a code row is, for scoring."""

  OTHER = 0  # not inside a name, or a name's first token
  FIRST = 1  # inside the first occurrence of a name in the row
  LATER = 2  # inside an occurrence of a name that occurred earlier in the row


@dataclasses.dataclass(frozen=True)
class NameRows:
  """tokens: [B, T] int32 (BOS first, PAD after a short document); part: [B, T] int8, the `NamePart` of each."""

  tokens: np.ndarray
  part: np.ndarray


def label_names(text: str, token_ends: Sequence[int], keywords: Iterable[str] = PYTHON_KEYWORDS) -> np.ndarray:
  """[N] int8 `NamePart` of each of N tokens that spell `text`, token i being text[token_ends[i-1]:token_ends[i]]."""
  ends = np.asarray(token_ends, np.int64)
  starts = np.concatenate([[0], ends[:-1]])
  part = np.zeros(len(ends), np.int8)
  keywords, seen = frozenset(keywords), set()
  for m in NAME.finditer(text):
    name = m.group()
    if name in keywords:
      continue
    inside = (starts > m.start()) & (ends <= m.end())  # wholly inside, first token left out
    part[inside] = NamePart.LATER if name in seen else NamePart.FIRST
    seen.add(name)
  return part


def _row(text: str, tokenizer: Tokenizer, seq_len: int, keywords) -> tuple[np.ndarray, np.ndarray] | None:
  """BOS + the first seq_len - 1 tokens of `text` and their parts; None if the tokens do not spell the text."""
  ids = [int(t) for t in tokenizer.encode_text(text)[:seq_len - 1]]
  pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
  seen = "".join(pieces)
  if not text.startswith(seen):
    return None
  part = label_names(seen, np.cumsum([len(p) for p in pieces]), keywords)
  tokens = np.full(seq_len, tokenizer.pad_id, np.int32)
  parts = np.zeros(seq_len, np.int8)
  tokens[0], tokens[1:len(ids) + 1], parts[1:len(ids) + 1] = tokenizer.bos_id, ids, part
  return tokens, parts


def name_rows(docs: Iterable[str], tokenizer: Tokenizer, *, seq_len: int, n_rows: int,
              keywords: Iterable[str] = PYTHON_KEYWORDS) -> NameRows:
  """One row per document (its start, in the order given) for the first `n_rows` documents that fill a row and whose
  row holds both FIRST and LATER tokens (so that every row scores both).

  Raises:
    ValueError: fewer than `n_rows` such documents.
  """
  rows = []
  for doc in docs:
    text = doc.encode("ascii", errors="ignore").decode("ascii")
    row = _row(text, tokenizer, seq_len, keywords)
    if row is not None and row[0][-1] != tokenizer.pad_id and {NamePart.FIRST, NamePart.LATER} <= set(row[1]):
      rows.append(row)
    if len(rows) == n_rows:
      return NameRows(tokens=np.stack([r[0] for r in rows]), part=np.stack([r[1] for r in rows]))
  raise ValueError(f"Only {len(rows)} documents fill a {seq_len}-token row of the name probe with a first and a "
                   f"later use of a name (of {n_rows} wanted); give the held-out source more or longer documents.")
