"""Markup: a rendered chat text split into the control tokens its template wrote and plain text, so that text from
the environment never becomes a control token (report section 4: the policy reads tool results, files and task
statements that anyone may have written).

  pieces = split_controls(rendered, fmt.control_tokens)   # every control token of a TRUSTED text (the template's)
  pieces = plain(tool_output)                             # environment text: one TEXT piece, whatever it holds
  ids = chat_tokens.encode_markup(pieces)                 # CONTROL -> its one id; TEXT -> special-token matching off

A `Piece` is either a CONTROL token (one id of the tokenizer, written by the template or the format's own
structure) or TEXT (encoded with no added token matched: the literal string `<|im_end|>` in a repository file is
ordinary text tokens, as the bytes it is). Pieces are kept with adjacent TEXT merged (`merge`), so text only meets a
tokenization boundary at a control token, where the whole conversation's tokenization has one anyway: with no
control string inside environment text, `encode_markup(pieces)` equals the plain tokenization of `text_of(pieces)`.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Iterable, Sequence


class Kind(enum.Enum):
  """What a piece of a rendered conversation is to the tokenizer."""

  CONTROL = "control"  # a control token the template (or the format) wrote: exactly one id
  TEXT = "text"  # text: encoded with special-token matching off, so no control id can come of it


@dataclasses.dataclass(frozen=True)
class Piece:
  """One run of a rendered conversation: a control token (`text` is its string) or plain text."""

  text: str
  kind: Kind = Kind.TEXT


Markup = tuple[Piece, ...]


def text_of(pieces: Iterable[Piece]) -> str:
  """The text the pieces spell (what the template rendered)."""
  return "".join(p.text for p in pieces)


def plain(text: str) -> Markup:
  """Environment text as markup: one TEXT piece (none for ""), whatever control strings it holds."""
  return (Piece(text),) if text else ()


def merge(pieces: Iterable[Piece]) -> Markup:
  """The pieces with empty ones dropped and adjacent TEXT joined (one tokenization run between control tokens)."""
  out: list[Piece] = []
  for p in pieces:
    if not p.text:
      continue
    if p.kind is Kind.TEXT and out and out[-1].kind is Kind.TEXT:
      out[-1] = Piece(out[-1].text + p.text)
    else:
      out.append(p)
  return tuple(out)


def split_controls(text: str, controls: Sequence[str]) -> Markup:
  """A TRUSTED text (the template's own, the format's system prompt, a model's turn) split at every occurrence of
  `controls` (longest first where two start at one place). Never call it on environment text: that is `plain`."""
  if not controls:
    return plain(text)
  pattern = re.compile("|".join(re.escape(c) for c in sorted(set(controls), key=len, reverse=True)))
  out, pos = [], 0
  for m in pattern.finditer(text):
    out += [Piece(text[pos:m.start()]), Piece(m.group(), Kind.CONTROL)]
    pos = m.end()
  out.append(Piece(text[pos:]))
  return merge(out)


def cut(pieces: Sequence[Piece], start: int, end: int | None = None) -> Markup:
  """The pieces covering characters [start, end) of `text_of(pieces)`; a TEXT piece may be cut, a control token
  never is (a cut inside one raises ValueError)."""
  total = sum(len(p.text) for p in pieces)
  end = total if end is None else end
  if not 0 <= start <= end <= total:
    raise ValueError(f"Cannot cut characters [{start}, {end}) of markup holding {total}.")
  out, pos = [], 0
  for p in pieces:
    lo, hi = max(start, pos), min(end, pos + len(p.text))
    if lo < hi:
      if p.kind is Kind.CONTROL and (lo, hi) != (pos, pos + len(p.text)):
        raise ValueError(f"Cannot cut markup inside the control token {p.text!r}.")
      out.append(Piece(p.text[lo - pos:hi - pos], p.kind))
    pos += len(p.text)
  return merge(out)
