"""A chat format over a tokenizer: the token-level pieces the agent engine and the single-turn tasks use (report
section 4: RL episodes are agent sessions, in the model's own chat format when it has one).

  chat = ChatTokens.of("kimi_k2", tokenizer)   # or "brief" over any tokenizer
  prompt = chat.prompt(first_observation)      # [P] ids: system + user (tools declared) + generation prompt
  text = chat.turn_text(ids)                   # a sampled turn as the environment parses it
  ids = chat.turn_ids(text)                    # a forced (scripted) turn, ended as the model ends one
  chat.end_of_turn_id                          # the stop token of a turn

brief is today's raw framing, bit for bit: BOS + the first observation; a turn ends with the tokenizer's EOS, which
decoding leaves out. A native format (`ChatFormat.native`) renders the prompt with the model's template (whose text
holds its own BOS), ends a turn with the format's end-of-turn control token, and decodes turns with their control
tokens kept (native tool calls are written with them) but without the end-of-turn token.

The tokenizer must carry every control token of a native format as one token of its own: the pieces of an episode
are tokenized apart, and only then does their concatenation equal the whole conversation's tokenization (zero
drift, `c2jax.envs.chat.chat_format`). A tokenizer without them (the byte tokenizer, a model's tokenizer of another
family) is refused when the pair is made.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, ChatFormat, chat_format


@dataclasses.dataclass(frozen=True)
class ChatTokens:
  """A chat format and the tokenizer that encodes it (see the module docstring).

  Attributes:
    format: the chat format.
    tokenizer: a `c2jax.data.tokenizer.Tokenizer`; for a native format it must have `token_id(text)`.
    system: the system message of native prompts.
  """

  format: ChatFormat
  tokenizer: object
  system: str = SYSTEM_PROMPT

  def __post_init__(self):
    if not self.format.native:
      return
    lookup = getattr(self.tokenizer, "token_id", None)
    if lookup is None:
      raise ValueError(f"Chat format {self.format.name!r} needs a tokenizer holding its control tokens (the model's "
                       f"own tokenizer.json); {type(self.tokenizer).__name__} has none.")
    missing = [t for t in self.format.control_tokens if lookup(t) is None]
    if missing:
      raise ValueError(f"Chat format {self.format.name!r} needs its control tokens as single tokens of the tokenizer, "
                       f"but {getattr(self.tokenizer, 'path', 'it')} lacks {', '.join(missing)}; give the model's own "
                       "tokenizer, or the format its family speaks.")

  @classmethod
  def of(cls, name: str, tokenizer) -> ChatTokens:
    """The format registered as `name` over `tokenizer`."""
    return cls(chat_format(name), tokenizer)

  @property
  def native(self) -> bool:
    return self.format.native

  @property
  def end_of_turn_id(self) -> int:
    """The token that ends a model turn: the tokenizer's EOS for brief, the format's end-of-turn token else."""
    if not self.native:
      return int(self.tokenizer.eos_id)
    return int(self.tokenizer.token_id(self.format.end_of_turn))

  def encode(self, text: str) -> np.ndarray:
    """[N] int32: a piece of text (an observation, a notice), no BOS or EOS."""
    if not text:
      return np.zeros(0, np.int32)
    return np.asarray(self.tokenizer.encode(text, bos=False, eos=False), np.int32)

  def prompt_text(self, first_observation: str) -> str:
    """The text of an episode's prompt (brief: the first observation; BOS is an id of its own)."""
    return self.format.prompt(self.system, first_observation) if self.native else first_observation

  def prompt(self, first_observation: str) -> np.ndarray:
    """[P] int32: an episode's prompt ids."""
    if not self.native:
      return np.asarray(self.tokenizer.encode(first_observation, bos=True, eos=False), np.int32)
    return self.encode(self.prompt_text(first_observation))

  def segment_prompt(self, first_observation: str, summary: str) -> np.ndarray:
    """[P'] int32: the prompt of a segment after a self-summary (native formats: the user message holds the first
    observation and the framed summary, `ChatFormat.segment_prompt`); it shares a prefix with `prompt`."""
    if not self.native:
      raise ValueError("The brief format appends the framed summary after the prompt; it has no segment prompt.")
    return self.encode(self.format.segment_prompt(self.system, first_observation, summary))

  def turn_text(self, ids: Sequence[int]) -> str:
    """A sampled turn's text, without the token that ended it (control tokens kept for native formats)."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if not self.native:
      return self.tokenizer.decode(ids)
    if ids and ids[-1] == self.end_of_turn_id:
      ids = ids[:-1]
    return self.tokenizer.decode(ids, skip_special_tokens=False)

  def turn_ids(self, text: str) -> np.ndarray:
    """[N + 1] int32: a turn's text and the token that ends it."""
    return np.concatenate([self.encode(text), np.asarray([self.end_of_turn_id], np.int32)])


def prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
  """The length of the longest common prefix of two id sequences."""
  a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
  n = min(len(a), len(b))
  differ = np.flatnonzero(a[:n] != b[:n])
  return int(differ[0]) if len(differ) else n
